/* The compiled `Message` (commitlog/message.py's dataclass, field for field) and the put path's `prepare` of the
 * common message shape.
 *
 * Building the dataclass costs about 1.1 us here (its `properties` default is a new dict each time, and its
 * __init__ is Python code). This type takes the same arguments, positional or keyword, with the same defaults,
 * and makes `properties` only when it is first read. It keeps the dataclass's repr, ==, unhashability and
 * (set from Python at import) its __dataclass_fields__, so dataclasses.fields and replace work on it.
 *
 * prepare_message does CommitLog.prepare's work for a message without tags, keys or properties, of a known
 * topic: every check prepare makes, then the body CRC. Any other message returns None, and the Python prepare
 * handles it (and raises its InvalidMessageError), so both give the same result and the same errors.
 * prepare_batch does it for a whole put_batch, messages with tags, keys and properties included (their
 * PROPERTIES written by put.c's code, as the compiled single put writes them).
 */
#include "mq_native.h"

#include <structmember.h>

enum { F_TOPIC, F_BODY, F_QUEUE_ID, F_TAGS, F_KEYS, F_PROPERTIES, F_FLAG, F_BORN, F_COUNT };
static const char *field_names[F_COUNT] = {"topic", "body", "queue_id", "tags", "keys", "properties", "flag",
                                           "born_timestamp_ms"};

typedef struct {
    PyObject_HEAD
    PyObject *fields[F_COUNT];  /* properties may be NULL: made on first read */
} MessageObject;

static PyTypeObject *message_type = NULL;
static PyObject *field_strings[F_COUNT];
static PyObject *empty_tuple = NULL;
static PyObject *zero = NULL;

static int message_traverse(MessageObject *self, visitproc visit, void *arg) {
    for (int i = 0; i < F_COUNT; i++) Py_VISIT(self->fields[i]);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int message_clear(MessageObject *self) {
    for (int i = 0; i < F_COUNT; i++) Py_CLEAR(self->fields[i]);
    return 0;
}

static void message_dealloc(MessageObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    message_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* Fill the fields from positional `args` (count `nargs`) and keyword values; 0 or -1 with a TypeError like the
 * dataclass's __init__. `fresh`: the message was just made and has no field yet. */
static int set_fields(MessageObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject *const *kwvalues, PyObject *kwdict, int fresh) {
    PyObject *given[F_COUNT] = {NULL};
    if (nargs > F_COUNT) {
        PyErr_Format(PyExc_TypeError, "Message.__init__() takes from 3 to %d positional arguments but %zd were given",
                     F_COUNT + 1, nargs + 1);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    Py_ssize_t keywords = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t position = 0;
    PyObject *key, *value;
    for (Py_ssize_t k = 0;; k++) {
        if (kwnames != NULL) {
            if (k >= keywords) break;
            key = PyTuple_GET_ITEM(kwnames, k);
            value = kwvalues[k];
        } else if (kwdict != NULL) {
            if (!PyDict_Next(kwdict, &position, &key, &value)) break;
        } else {
            break;
        }
        int found = -1;
        for (int f = 0; f < F_COUNT; f++) {
            if (key == field_strings[f]) { found = f; break; }
        }
        if (found < 0) {
            for (int f = 0; f < F_COUNT; f++) {
                if (PyUnicode_Check(key) && PyUnicode_Compare(key, field_strings[f]) == 0) { found = f; break; }
            }
        }
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "Message.__init__() got an unexpected keyword argument '%S'", key);
            return -1;
        }
        if (given[found] != NULL) {
            PyErr_Format(PyExc_TypeError, "Message.__init__() got multiple values for argument '%s'",
                         field_names[found]);
            return -1;
        }
        given[found] = value;
    }
    if (given[F_TOPIC] == NULL || given[F_BODY] == NULL) {
        PyErr_Format(PyExc_TypeError, "Message.__init__() missing required positional argument: '%s'",
                     given[F_TOPIC] == NULL ? "topic" : "body");
        return -1;
    }
    PyObject *defaults[F_COUNT] = {NULL, NULL, zero, Py_None, empty_tuple, NULL, zero, Py_None};
    if (fresh) {  /* a message just made (message_vectorcall): no old values to let go of */
        for (int f = 0; f < F_COUNT; f++) self->fields[f] = Py_XNewRef(given[f] != NULL ? given[f] : defaults[f]);
        return 0;
    }
    /* Every new value is held before an old one is let go of: freeing an old value may run its finalizer, which
     * may change the arguments' containers or this message. */
    PyObject *old[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) given[f] = Py_XNewRef(given[f] != NULL ? given[f] : defaults[f]);
    for (int f = 0; f < F_COUNT; f++) {
        old[f] = self->fields[f];
        self->fields[f] = given[f];
    }
    for (int f = 0; f < F_COUNT; f++) Py_XDECREF(old[f]);
    return 0;
}

static PyObject *message_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    return type->tp_alloc(type, 0);
}

static int message_init(MessageObject *self, PyObject *args, PyObject *kwds) {
    return set_fields(self, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), NULL, NULL, kwds, 0);
}

static PyObject *message_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    MessageObject *self = (MessageObject *)((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (self == NULL) return NULL;
    if (set_fields(self, args, nargs, kwnames, args + nargs, NULL, 1) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *message_get_properties(MessageObject *self, void *closure) {
    if (self->fields[F_PROPERTIES] == NULL) {
        PyObject *made = PyDict_New();  /* may run a collection, whose finalizers may set the field */
        if (made == NULL) return NULL;
        if (self->fields[F_PROPERTIES] == NULL) self->fields[F_PROPERTIES] = made;
        else Py_DECREF(made);
    }
    return Py_NewRef(self->fields[F_PROPERTIES]);
}

static int message_set_properties(MessageObject *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "properties cannot be deleted");
        return -1;
    }
    Py_XSETREF(self->fields[F_PROPERTIES], Py_NewRef(value));
    return 0;
}

/* Every field as a tuple (properties made if not yet), for ==, repr and pickling. */
static PyObject *message_astuple(MessageObject *self) {
    PyObject *properties = message_get_properties(self, NULL);
    if (properties == NULL) return NULL;
    Py_DECREF(properties);
    PyObject *tuple = PyTuple_New(F_COUNT);
    if (tuple == NULL) return NULL;
    for (int f = 0; f < F_COUNT; f++) {
        if (self->fields[f] == NULL) {
            Py_DECREF(tuple);
            PyErr_Format(PyExc_AttributeError, "'Message' object has no attribute '%s'", field_names[f]);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, f, Py_NewRef(self->fields[f]));
    }
    return tuple;
}

static PyObject *message_repr(MessageObject *self) {
    PyObject *values = message_astuple(self);
    if (values == NULL) return NULL;
    PyObject *name = PyType_GetName(Py_TYPE(self));  /* the public API's _PyType_Name (3.11) */
    PyObject *result = name == NULL ? NULL : PyUnicode_FromFormat(
        "%U(topic=%R, body=%R, queue_id=%R, tags=%R, keys=%R, properties=%R, flag=%R, born_timestamp_ms=%R)",
        name, PyTuple_GET_ITEM(values, 0), PyTuple_GET_ITEM(values, 1),
        PyTuple_GET_ITEM(values, 2), PyTuple_GET_ITEM(values, 3), PyTuple_GET_ITEM(values, 4),
        PyTuple_GET_ITEM(values, 5), PyTuple_GET_ITEM(values, 6), PyTuple_GET_ITEM(values, 7));
    Py_XDECREF(name);
    Py_DECREF(values);
    return result;
}

static PyObject *message_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *left = message_astuple((MessageObject *)a);
    if (left == NULL) return NULL;
    PyObject *right = message_astuple((MessageObject *)b);
    if (right == NULL) {
        Py_DECREF(left);
        return NULL;
    }
    PyObject *result = PyObject_RichCompare(left, right, op);
    Py_DECREF(left);
    Py_DECREF(right);
    return result;
}

static PyObject *message_reduce(MessageObject *self, PyObject *unused) {
    PyObject *values = message_astuple(self);
    if (values == NULL) return NULL;
    return Py_BuildValue("(ON)", (PyObject *)Py_TYPE(self), values);
}

static PyMemberDef message_members[] = {
    {"topic", T_OBJECT_EX, offsetof(MessageObject, fields) + F_TOPIC * sizeof(PyObject *), 0, NULL},
    {"body", T_OBJECT_EX, offsetof(MessageObject, fields) + F_BODY * sizeof(PyObject *), 0, NULL},
    {"queue_id", T_OBJECT_EX, offsetof(MessageObject, fields) + F_QUEUE_ID * sizeof(PyObject *), 0, NULL},
    {"tags", T_OBJECT_EX, offsetof(MessageObject, fields) + F_TAGS * sizeof(PyObject *), 0, NULL},
    {"keys", T_OBJECT_EX, offsetof(MessageObject, fields) + F_KEYS * sizeof(PyObject *), 0, NULL},
    {"flag", T_OBJECT_EX, offsetof(MessageObject, fields) + F_FLAG * sizeof(PyObject *), 0, NULL},
    {"born_timestamp_ms", T_OBJECT_EX, offsetof(MessageObject, fields) + F_BORN * sizeof(PyObject *), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef message_getset[] = {
    {"properties", (getter)message_get_properties, (setter)message_set_properties, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef message_methods[] = {
    {"__reduce__", (PyCFunction)message_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot message_slots[] = {
    {Py_tp_doc, "A message to store. `tags` and `keys` become the TAGS and KEYS properties (compiled; see "
                "commitlog/message.py)."},
    {Py_tp_new, message_new},
    {Py_tp_init, message_init},
    {Py_tp_dealloc, message_dealloc},
    {Py_tp_traverse, message_traverse},
    {Py_tp_clear, message_clear},
    {Py_tp_repr, message_repr},
    {Py_tp_richcompare, message_richcompare},
    {Py_tp_hash, PyObject_HashNotImplemented},
    {Py_tp_members, message_members},
    {Py_tp_getset, message_getset},
    {Py_tp_methods, message_methods},
    {0, NULL},
};

static PyType_Spec message_spec = {
    "mqstore.commitlog._native.Message", sizeof(MessageObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, message_slots,
};

/* ------------------------------------------------------------------------------------------------------------ */
/* prepare                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

PyDoc_STRVAR(prepare_message_doc,
"prepare_message(topic_tails, max_queues_per_topic, max_message_size_bytes, message) -> record or None\n\n"
"CommitLog.prepare for a compiled Message of a topic in `topic_tails` (CommitLog._topic_tails), without tags,\n"
"keys, properties: ((topic, queue_id), flag, body, body_crc, born_timestamp_ms, tail, size). None for any\n"
"other message, or one that breaks a rule: the Python prepare then handles it (and raises its error).\n"
"Only for a log that adds no UNIQ_KEY.");

static PyObject *prepare_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "prepare_message takes 4 arguments");
        return NULL;
    }
    PyObject *object = args[3], *tails_table = args[0];
    if (Py_TYPE(object) != message_type || !PyDict_Check(tails_table)) Py_RETURN_NONE;
    long long queues_max = PyLong_AsLongLong(args[1]), body_max = PyLong_AsLongLong(args[2]);
    if ((queues_max == -1 || body_max == -1) && PyErr_Occurred()) return NULL;
    mq_common_parts m;  /* held: the tuples made below may run a collection, and its finalizers */
    if (!mq_common_message(object, tails_table, queues_max, body_max, &m)) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;  /* another shape, a bad value, a topic not checked yet: the Python prepare */
    }
    Py_ssize_t body_length = PyBytes_GET_SIZE(m.body);
    uint32_t crc = mq_crc32(0, (const uint8_t *)PyBytes_AS_STRING(m.body), (size_t)body_length) & 0x7FFFFFFFu;
    /* each made only while the ones before were (no call with an exception set) */
    PyObject *item[7] = {NULL};
    item[0] = PyTuple_Pack(2, m.topic, m.queue_id);
    item[1] = item[0] == NULL ? NULL : PyLong_FromLongLong(m.flag);
    item[2] = Py_NewRef(m.body);
    item[3] = item[1] == NULL ? NULL : PyLong_FromUnsignedLong(crc);
    item[4] = m.born_timestamp_ms < 0 ? Py_NewRef(Py_None)
              : item[3] == NULL ? NULL : PyLong_FromLongLong(m.born_timestamp_ms);
    item[5] = Py_NewRef(m.tail);
    item[6] = item[3] == NULL || item[4] == NULL ? NULL
              : PyLong_FromSsize_t(MQ_HEADER_SIZE + body_length + PyBytes_GET_SIZE(m.tail));
    PyObject *record = item[6] == NULL ? NULL : PyTuple_New(7);
    mq_common_parts_release(&m);
    for (int i = 0; i < 7; i++) {
        if (record == NULL) Py_XDECREF(item[i]);
        else PyTuple_SET_ITEM(record, i, item[i]);
    }
    return record;
}

/* The checks prepare makes of every field but tags, keys and properties: 1 when `object` is a compiled Message
 * that passes them, of a topic in `tails_table` (its parts in `out`, held), 0 when not (or a lookup failed:
 * PyErr_Occurred tells). put.c checks the tags, keys and properties itself. The fields kept are taken (strong
 * references) before anything that could run Python code: the checks and the caller see one state of the
 * message, whatever a finalizer run by a later allocation does to it. */
int mq_message_take(PyObject *object, long long queues_max, long long body_max, mq_message_parts *out) {
    if (Py_TYPE(object) != message_type) return 0;
    MessageObject *message = (MessageObject *)object;
    PyObject *topic = message->fields[F_TOPIC], *body = message->fields[F_BODY],
             *queue_id = message->fields[F_QUEUE_ID], *flag = message->fields[F_FLAG], *born = message->fields[F_BORN],
             *tags = message->fields[F_TAGS], *keys = message->fields[F_KEYS];
    /* The checks of the values, and the ints read, run no Python code: nothing can change the message until the
     * topic's lookup, before which the objects kept are taken. */
    if (topic == NULL || body == NULL || queue_id == NULL || flag == NULL || born == NULL || keys == NULL ||
        tags == NULL || !PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id) || !PyBytes_CheckExact(body) ||
        !PyLong_CheckExact(flag) || !(born == Py_None || PyLong_CheckExact(born)) || PyBytes_GET_SIZE(body) > body_max)
        return 0;
    int overflow;
    long long queue = PyLong_AsLongLongAndOverflow(queue_id, &overflow);
    if (overflow || queue < 0 || queue >= queues_max) return 0;
    long long flag_value = PyLong_AsLongLongAndOverflow(flag, &overflow);
    if (overflow || flag_value < INT32_MIN || flag_value > INT32_MAX) return 0;
    long long born_value = -1;
    if (born != Py_None) {
        born_value = PyLong_AsLongLongAndOverflow(born, &overflow);
        if (overflow || born_value < 0) return 0;
    }
    *out = (mq_message_parts){
        .common = {.topic = Py_NewRef(topic), .body = Py_NewRef(body), .queue_id = Py_NewRef(queue_id),
                   .queue_id_value = queue, .flag = flag_value, .born_timestamp_ms = born_value},
        .tags = Py_NewRef(tags), .keys = Py_NewRef(keys), .properties = Py_XNewRef(message->fields[F_PROPERTIES])};
    return 1;
}

int mq_message_routing(PyObject *object, PyObject **topic, PyObject **queue_id, PyObject **properties) {
    if (Py_TYPE(object) != message_type) return 0;
    MessageObject *message = (MessageObject *)object;
    if (message->fields[F_TOPIC] == NULL || message->fields[F_QUEUE_ID] == NULL) return 0;
    *topic = Py_NewRef(message->fields[F_TOPIC]);
    *queue_id = Py_NewRef(message->fields[F_QUEUE_ID]);
    *properties = Py_XNewRef(message->fields[F_PROPERTIES]);
    return 1;
}

PyObject *mq_message_moved(PyObject *object, PyObject *topic, PyObject *queue_id, PyObject *properties) {
    MessageObject *source = (MessageObject *)object;
    PyObject *kept[F_COUNT] = {NULL};
    for (int f = 0; f < F_COUNT; f++) {  /* taken before the allocation below can run a finalizer */
        if (f != F_TOPIC && f != F_QUEUE_ID && f != F_PROPERTIES && source->fields[f] == NULL) {
            for (int g = 0; g < f; g++) Py_XDECREF(kept[g]);
            PyErr_SetString(PyExc_AttributeError, "a Message field is missing");
            return NULL;
        }
        kept[f] = f == F_TOPIC ? Py_NewRef(topic) : f == F_QUEUE_ID ? Py_NewRef(queue_id)
                  : f == F_PROPERTIES ? Py_NewRef(properties) : Py_NewRef(source->fields[f]);
    }
    MessageObject *made = (MessageObject *)message_type->tp_alloc(message_type, 0);
    if (made == NULL) {
        for (int f = 0; f < F_COUNT; f++) Py_DECREF(kept[f]);
        return NULL;
    }
    for (int f = 0; f < F_COUNT; f++) made->fields[f] = kept[f];
    return (PyObject *)made;
}

int mq_message_set_tails(mq_message_parts *out, PyObject *tails) {
    int valid = tails != NULL && PyTuple_Check(tails) && PyTuple_GET_SIZE(tails) >= 4;
    for (int i = 0; valid && i < 4; i++) valid = PyBytes_Check(PyTuple_GET_ITEM(tails, i));
    if (!valid) {
        mq_message_parts_release(out);
        return 0;
    }
    out->common.tails = Py_NewRef(tails);
    out->common.tail = PyTuple_GET_ITEM(tails, 1);
    return 1;
}

int mq_message_fields(PyObject *object, PyObject *tails_table, long long queues_max, long long body_max,
                      mq_message_parts *out) {
    if (!mq_message_take(object, queues_max, body_max, out)) return 0;
    /* a str key: the lookup compares strs only, and runs no Python code */
    return mq_message_set_tails(out, PyDict_GetItemWithError(tails_table, out->common.topic));
}

void mq_common_parts_release(mq_common_parts *parts) {
    Py_CLEAR(parts->topic);
    Py_CLEAR(parts->body);
    Py_CLEAR(parts->queue_id);
    Py_CLEAR(parts->tails);
    parts->tail = NULL;
}

void mq_message_parts_release(mq_message_parts *parts) {
    mq_common_parts_release(&parts->common);
    Py_CLEAR(parts->tags);
    Py_CLEAR(parts->keys);
    Py_CLEAR(parts->properties);
    Py_CLEAR(parts->real_topic);
    parts->added_count = 0;
}

/* The checks prepare_message makes, for one message: 1 when it is a compiled Message of the common shape (no
 * tags, keys or properties) and valid (its parts in `out`, held), 0 when not (or a lookup failed: PyErr_Occurred
 * tells). */
int mq_common_message(PyObject *object, PyObject *tails_table, long long queues_max, long long body_max,
                      mq_common_parts *out) {
    mq_message_parts parts;
    if (!mq_message_fields(object, tails_table, queues_max, body_max, &parts)) return 0;
    PyObject *keys = parts.keys, *properties = parts.properties;
    int common = parts.tags == Py_None &&
                 (properties == NULL || (PyDict_CheckExact(properties) && PyDict_GET_SIZE(properties) == 0)) &&
                 ((PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == 0) ||
                  (PyList_CheckExact(keys) && PyList_GET_SIZE(keys) == 0));
    if (!common) {
        mq_message_parts_release(&parts);
        return 0;
    }
    *out = parts.common;  /* the common parts' references move to `out` */
    parts.common = (mq_common_parts){0};
    mq_message_parts_release(&parts);
    return 1;
}

/* Two topic strs of equal value (the same object, or the same characters). */
static int same_text(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return length == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)length * (size_t)kind) == 0;
}

/* The distinct (topic, queue_id) of a batch, numbered in the order first seen: up to KEYS_SEARCHED are found
 * by comparing values (no tuple made per message), more through a dict of (topic, queue_id) tuples. */
#define KEYS_SEARCHED 64
typedef struct {
    PyObject *keys;     /* list of (topic, queue_id), the result's queue_keys */
    PyObject *numbers;  /* dict (topic, queue_id) -> number, once there are over KEYS_SEARCHED keys */
    PyObject *topics[KEYS_SEARCHED];  /* borrowed from `keys` */
    int64_t queue_ids[KEYS_SEARCHED];
    Py_ssize_t last;    /* the key of the message before */
} key_table;

/* The number of (topic, queue_id), added when new; -1 with an exception set. */
static Py_ssize_t key_number(key_table *table, PyObject *topic, PyObject *queue_object, int64_t queue_id) {
    Py_ssize_t known = PyList_GET_SIZE(table->keys);
    Py_ssize_t last = table->last;
    if (last >= 0 && last < KEYS_SEARCHED && table->queue_ids[last] == queue_id &&
        same_text(table->topics[last], topic))
        return last;
    Py_ssize_t searched = known < KEYS_SEARCHED ? known : KEYS_SEARCHED;
    for (Py_ssize_t k = 0; k < searched; k++)
        if (table->queue_ids[k] == queue_id && same_text(table->topics[k], topic)) return table->last = k;
    PyObject *key = PyTuple_Pack(2, topic, queue_object);
    if (key == NULL) return -1;
    if (known >= KEYS_SEARCHED) {  /* many queues in one batch: the dict */
        PyObject *number = PyDict_GetItemWithError(table->numbers, key);
        if (number != NULL) {
            Py_DECREF(key);
            return table->last = PyLong_AsSsize_t(number);
        }
        if (PyErr_Occurred() || (number = PyLong_FromSsize_t(known)) == NULL) {
            Py_DECREF(key);
            return -1;
        }
        int failed = PyDict_SetItem(table->numbers, key, number);
        Py_DECREF(number);
        if (failed < 0) {
            Py_DECREF(key);
            return -1;
        }
    } else {
        table->topics[known] = topic;
        table->queue_ids[known] = queue_id;
        if (known == KEYS_SEARCHED - 1) {  /* the dict takes over after this one: give it every key so far */
            for (Py_ssize_t k = 0; k < known; k++) {
                PyObject *number = PyLong_FromSsize_t(k);
                if (number == NULL || PyDict_SetItem(table->numbers, PyList_GET_ITEM(table->keys, k), number) < 0) {
                    Py_XDECREF(number);
                    Py_DECREF(key);
                    return -1;
                }
                Py_DECREF(number);
            }
            PyObject *number = PyLong_FromSsize_t(known);
            if (number == NULL || PyDict_SetItem(table->numbers, key, number) < 0) {
                Py_XDECREF(number);
                Py_DECREF(key);
                return -1;
            }
            Py_DECREF(number);
        }
    }
    int failed = PyList_Append(table->keys, key);
    Py_DECREF(key);
    if (failed < 0) return -1;
    if (known < KEYS_SEARCHED) table->topics[known] = PyTuple_GET_ITEM(PyList_GET_ITEM(table->keys, known), 0);
    return table->last = known;
}

/* A message of a batch, taken and checked: its common parts and its own tail (all held). */
typedef struct {
    mq_common_parts common;
    PyObject *tail;  /* TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES: common.tail, or one made for it */
    char *key_at;    /* where its UNIQ_KEY's digits go in `tail` (zeros until the batch's keys are drawn), or NULL */
} batch_entry;

static void release_entry(batch_entry *entry) {
    mq_common_parts_release(&entry->common);
    Py_CLEAR(entry->tail);
    entry->key_at = NULL;
}

/* One message taken, checked and its tail built as the compiled put builds it (put.c's mq_plan_properties and
 * mq_write_tail: tags, keys, user properties, the UNIQ_KEY's place when `adds_unique_keys` and the message has
 * none, the record-CRC placeholder): 1, 0 when the Python path must prepare it, -1 with an error (nothing held
 * unless 1). The tail is written right after its plan, before anything that may run Python code. */
static int take_one(PyObject *object, PyObject *tails_table, long long queues_max, long long body_max,
                    int adds_unique_keys, batch_entry *entry) {
    mq_message_parts parts;
    if (!mq_message_fields(object, tails_table, queues_max, body_max, &parts)) return PyErr_Occurred() ? -1 : 0;
    PyObject *keys = parts.keys, *properties = parts.properties;
    int simple = !adds_unique_keys && parts.tags == Py_None &&
                 (properties == NULL || (PyDict_CheckExact(properties) && PyDict_GET_SIZE(properties) == 0)) &&
                 ((PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == 0) ||
                  (PyList_CheckExact(keys) && PyList_GET_SIZE(keys) == 0));
    PyObject *tail = NULL;
    char *key_at = NULL;
    mq_properties_plan plan;
    if (simple) {
        tail = Py_NewRef(parts.common.tail);
    } else if (mq_plan_properties(&parts, adds_unique_keys, &plan)) {
        tail = mq_write_tail(&parts, &plan, &key_at);
    }
    if (tail == NULL) {
        mq_message_parts_release(&parts);
        return PyErr_Occurred() ? -1 : 0;
    }
    entry->common = parts.common;  /* the common parts' references move to the entry */
    parts.common = (mq_common_parts){0};
    mq_message_parts_release(&parts);
    entry->tail = tail;
    entry->key_at = key_at;
    return 1;
}

/* Every message of the list taken and checked (`entries`, `count` of them): 1 when all are of a shape the compiled
 * path writes (their parts held, given back by release_all), 0 when one is not, -1 with an error (none held
 * either way). */
static int take_all(PyObject *messages, Py_ssize_t count, PyObject *tails_table, long long queues_max,
                    long long body_max, int adds_unique_keys, batch_entry *entries) {
    for (Py_ssize_t i = 0; i < count; i++) {
        /* nothing here allocates a tracked object or calls Python (the tails are bytes, untracked): the list
         * cannot change in this loop (checked all the same) */
        int taken = i < PyList_GET_SIZE(messages)
                    ? take_one(PyList_GET_ITEM(messages, i), tails_table, queues_max, body_max, adds_unique_keys,
                               &entries[i])
                    : 0;
        if (taken <= 0) {
            for (Py_ssize_t j = 0; j < i; j++) release_entry(&entries[j]);
            return taken;
        }
    }
    return 1;
}

static void release_all(batch_entry *entries, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) release_entry(&entries[i]);
}

/* The batch's UNIQ_KEYs, one clock reading for all as UniqueKeys.next_many takes them, written into the tails that
 * have a place for one, in order: 0, or -1 with an error (no key used then). */
static int draw_unique_keys(PyObject *unique_keys, batch_entry *entries, Py_ssize_t count) {
    Py_ssize_t wanted = 0;
    for (Py_ssize_t i = 0; i < count; i++) wanted += entries[i].key_at != NULL;
    if (wanted == 0) return 0;
    char *drawn = PyMem_Malloc((size_t)wanted * MQ_UNIQUE_KEY_DIGITS);
    if (drawn == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t now = 0;
    int ran_python = 0;
    if (mq_unique_key_clock(unique_keys, &now, &ran_python) < 0) {
        PyMem_Free(drawn);
        return -1;
    }
    mq_unique_key_fill(unique_keys, now, drawn, wanted);
    const char *next = drawn;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (entries[i].key_at != NULL) {
            memcpy(entries[i].key_at, next, MQ_UNIQUE_KEY_DIGITS);
            next += MQ_UNIQUE_KEY_DIGITS;
        }
    }
    PyMem_Free(drawn);
    return 0;
}

PyDoc_STRVAR(prepare_batch_doc,
"prepare_batch(topic_tails, max_queues_per_topic, max_message_size_bytes, messages, unique_keys=None)\n"
"    -> columns or None\n\n"
"write_batch.prepare_columns for a list of compiled Messages of topics in `topic_tails`, with or without tags,\n"
"keys and user properties: (queue_keys, key_ids, queue_ids, flags, born_ms, bodies, body_lengths, body_crcs,\n"
"tails, sizes), the int64 columns as bytes (native byte order), each tail as the compiled put writes it. None\n"
"when any message is of another type or breaks a rule: the Python path then handles the batch (and raises its\n"
"error). With `unique_keys` (the log's UniqueKeys) each message without a UNIQ_KEY property gets the next one,\n"
"the batch's keys taken at once as UniqueKeys.next_many takes them.");

static PyObject *prepare_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "prepare_batch takes 4 or 5 arguments");
        return NULL;
    }
    PyObject *tails_table = args[0], *messages = args[3];
    PyObject *unique_keys = nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    if (unique_keys != NULL && !mq_is_unique_keys(unique_keys)) {
        PyErr_SetString(PyExc_TypeError, "prepare_batch: unique_keys must be a UniqueKeys or None");
        return NULL;
    }
    if (!PyDict_Check(tails_table) || !PyList_CheckExact(messages) || PyList_GET_SIZE(messages) == 0) Py_RETURN_NONE;
    long long queues_max = PyLong_AsLongLong(args[1]), body_max = PyLong_AsLongLong(args[2]);
    if ((queues_max == -1 || body_max == -1) && PyErr_Occurred()) return NULL;
    /* Every message's parts are taken (strong references), checked and its tail written first; from then on only
     * they are read. The tuples, lists and bytes made below, and a test's clock, may run Python code (a
     * collection's finalizers) that changes the messages or the list: the batch prepared is the one taken here. */
    Py_ssize_t count = PyList_GET_SIZE(messages);
    if ((size_t)count > PY_SSIZE_T_MAX / sizeof(batch_entry)) return PyErr_NoMemory();
    batch_entry *entries = PyMem_Calloc((size_t)count, sizeof(batch_entry));
    if (entries == NULL) return PyErr_NoMemory();
    int taken = take_all(messages, count, tails_table, queues_max, body_max, unique_keys != NULL, entries);
    if (taken <= 0) {
        PyMem_Free(entries);
        if (taken < 0) return NULL;
        Py_RETURN_NONE;
    }
    enum { C_KEY, C_QUEUE, C_FLAG, C_BORN, C_LENGTH, C_CRC, C_SIZE, C_COUNT };
    PyObject *columns[C_COUNT] = {NULL};
    key_table table = {.keys = NULL, .numbers = NULL, .last = -1};
    PyObject *bodies = NULL, *tails = NULL;
    PyObject *result = NULL;
    /* The clock is read once the batch is known to be one this path writes (a batch left to the Python path reads
     * it there) */
    if (unique_keys != NULL && draw_unique_keys(unique_keys, entries, count) < 0) goto done;
    table.keys = PyList_New(0);
    table.numbers = table.keys == NULL ? NULL : PyDict_New();
    bodies = table.numbers == NULL ? NULL : PyList_New(count);
    tails = bodies == NULL ? NULL : PyList_New(count);
    if (table.keys == NULL || table.numbers == NULL || bodies == NULL || tails == NULL) goto done;
    for (int c = 0; c < C_COUNT; c++) {
        columns[c] = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
        if (columns[c] == NULL) goto done;
    }
    int64_t *column[C_COUNT];
    for (int c = 0; c < C_COUNT; c++) column[c] = (int64_t *)PyBytes_AS_STRING(columns[c]);
    for (Py_ssize_t i = 0; i < count; i++) {
        const mq_common_parts *m = &entries[i].common;
        Py_ssize_t key = key_number(&table, m->topic, m->queue_id, m->queue_id_value);
        if (key < 0) goto done;
        Py_ssize_t length = PyBytes_GET_SIZE(m->body);
        column[C_KEY][i] = key;
        column[C_QUEUE][i] = m->queue_id_value;
        column[C_FLAG][i] = m->flag;
        column[C_BORN][i] = m->born_timestamp_ms;
        column[C_LENGTH][i] = length;
        column[C_CRC][i] = mq_crc32(0, (const uint8_t *)PyBytes_AS_STRING(m->body), (size_t)length) & 0x7FFFFFFFu;
        column[C_SIZE][i] = MQ_HEADER_SIZE + length + PyBytes_GET_SIZE(entries[i].tail);
        PyList_SET_ITEM(bodies, i, Py_NewRef(m->body));
        PyList_SET_ITEM(tails, i, Py_NewRef(entries[i].tail));
    }
    result = Py_BuildValue("(OOOOOOOOOO)", table.keys, columns[C_KEY], columns[C_QUEUE], columns[C_FLAG],
                           columns[C_BORN], bodies, columns[C_LENGTH], columns[C_CRC], tails, columns[C_SIZE]);
done:
    release_all(entries, count);
    PyMem_Free(entries);
    Py_XDECREF(table.keys);
    Py_XDECREF(table.numbers);
    Py_XDECREF(bodies);
    Py_XDECREF(tails);
    for (int c = 0; c < C_COUNT; c++) Py_XDECREF(columns[c]);
    return result;
}

PyMethodDef mq_message_methods[] = {
    {"prepare_batch", (PyCFunction)(void (*)(void))prepare_batch, METH_FASTCALL, prepare_batch_doc},
    {"prepare_message", (PyCFunction)(void (*)(void))prepare_message, METH_FASTCALL, prepare_message_doc},
    {NULL, NULL, 0, NULL},
};

int mq_message_init(PyObject *module) {
    for (int f = 0; f < F_COUNT; f++) {
        field_strings[f] = PyUnicode_InternFromString(field_names[f]);
        if (field_strings[f] == NULL) return -1;
    }
    empty_tuple = PyTuple_New(0);
    zero = empty_tuple == NULL ? NULL : PyLong_FromLong(0);
    if (empty_tuple == NULL || zero == NULL) return -1;
    message_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &message_spec, NULL);
    if (message_type == NULL) return -1;
    message_type->tp_vectorcall = message_vectorcall;  /* Message(...) without a tuple and a dict of arguments */
    PyObject *match_args = Py_BuildValue("(ssssssss)", "topic", "body", "queue_id", "tags", "keys", "properties",
                                         "flag", "born_timestamp_ms");
    if (match_args == NULL || PyObject_SetAttrString((PyObject *)message_type, "__match_args__", match_args) < 0) {
        Py_XDECREF(match_args);
        return -1;
    }
    Py_DECREF(match_args);
    if (PyModule_AddObjectRef(module, "Message", (PyObject *)message_type) < 0) return -1;
    return 0;
}
