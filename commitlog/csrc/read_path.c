/* The get path's per-message work that is not a record's decoding (codec.c's decode_run does that): a
 * ConsumeQueue's entries as the two lists decode_run takes, and StoredMessage's lazy TAGS and KEYS.
 *
 * `queue_lists` reads consumequeue/format.py's 20-byte units (big-endian commitlog_offset i64, size i32,
 * tags_code i64); `stored_tags` and `stored_keys` are commitlog/message.py's StoredMessage.tags and .keys over the
 * raw PROPERTIES bytes (format.py's `property_value`), with the same results for any bytes: a test compares them
 * with the Python functions on arbitrary input. `directory_stamp` is the stat a reader makes of the log's
 * directory on every get (commitlog/segments.py's load_if_changed), without os.stat's result object.
 */
#include "mq_native.h"

#include <structmember.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define MQ_UNIT_SIZE_BYTES 20  /* consumequeue/format.py: UNIT_SIZE_BYTES */
#define MQ_UNIT_OFFSET_SIZE 8  /* the unit's `size` field */
#define MQ_STORED_PROPERTIES_ITEM 17  /* StoredMessage's raw PROPERTIES (commitlog/message.py) */
#define MQ_PROPERTY_NAME_SEPARATOR 0x01
#define MQ_PROPERTY_SEPARATOR 0x02

static PyObject *key_separator = NULL;  /* " ": format.py's KEY_SEPARATOR */

PyDoc_STRVAR(queue_lists_doc,
"queue_lists(buffer, first_unit, count) -> (commitlog_offsets, sizes, offset_min, offset_max) or None\n\n"
"The commitlog offsets and sizes of `count` ConsumeQueue units from unit `first_unit` of `buffer` (a queue file's\n"
"mapping) as two lists of int, with the least and greatest offset. None when a unit breaks the validity rule\n"
"(size > 0, commitlog_offset >= 0): the Python reader then reports it. ValueError when the units are not all in\n"
"the buffer or count < 1.");

static PyObject *queue_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_lists takes 3 arguments");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    long long count = PyLong_AsLongLong(args[2]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    int64_t units = (int64_t)view.len / MQ_UNIT_SIZE_BYTES;
    if (first < 0 || count < 1 || first > units || count > units - first) {
        /* no first + count here: both come from the caller and their sum may overflow */
        PyErr_Format(PyExc_ValueError, "%lld units from unit %lld are not all in a buffer of %lld units", count,
                     first, (long long)units);
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *at = (const uint8_t *)view.buf + first * MQ_UNIT_SIZE_BYTES;
    int64_t offset_min = INT64_MAX, offset_max = -1;
    PyObject *offsets = PyList_New((Py_ssize_t)count), *sizes = PyList_New((Py_ssize_t)count);
    PyObject *result = NULL;
    if (offsets == NULL || sizes == NULL) goto done;
    /* Each unit is read once (a writer may be writing the file), checked, then made into ints. The lists are
     * this function's own until returned, and the buffer is held: a finalizer run by an allocation changes
     * nothing here. */
    for (long long i = 0; i < count; i++) {
        const uint8_t *unit = at + i * MQ_UNIT_SIZE_BYTES;
        int64_t offset_value = mq_get_i64(unit);
        int32_t size_value = mq_get_i32(unit + MQ_UNIT_OFFSET_SIZE);
        if (offset_value < 0 || size_value <= 0) {  /* the Python reader reports it */
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (offset_value < offset_min) offset_min = offset_value;
        if (offset_value > offset_max) offset_max = offset_value;
        PyObject *offset = PyLong_FromLongLong(offset_value);
        if (offset == NULL) goto done;
        PyList_SET_ITEM(offsets, (Py_ssize_t)i, offset);
        PyObject *size = PyLong_FromLong(size_value);
        if (size == NULL) goto done;
        PyList_SET_ITEM(sizes, (Py_ssize_t)i, size);
    }
    result = Py_BuildValue("(OOLL)", offsets, sizes, (long long)offset_min, (long long)offset_max);
done:
    Py_XDECREF(offsets);  /* PyList_New fills with NULL, which list_dealloc skips */
    Py_XDECREF(sizes);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(queue_arrays_doc,
"queue_arrays(buffer, first_unit, count, offsets_out, sizes_out, at) -> (offset_min, offset_max) or None\n\n"
"queue_lists into int64 arrays: the commitlog offsets and sizes of `count` units from unit `first_unit` of\n"
"`buffer`, written to offsets_out[at:at + count] and sizes_out[at:at + count], with the least and greatest\n"
"offset. None when a unit breaks the validity rule (what was written before it stays). For a service that reads\n"
"a queue in bulk (the timer's enqueue): no list, no object per unit, and the interpreter lock kept.");

static PyObject *queue_arrays(PyObject *self, PyObject *args) {
    PyObject *buffer_object, *offsets_object, *sizes_object;
    long long first, count, at;
    if (!PyArg_ParseTuple(args, "OLLOOL", &buffer_object, &first, &count, &offsets_object, &sizes_object, &at))
        return NULL;
    Py_buffer view, offsets, sizes;
    if (PyObject_GetBuffer(buffer_object, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (mq_int64_buffer(offsets_object, &offsets, 1, "offsets_out") < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (mq_int64_buffer(sizes_object, &sizes, 1, "sizes_out") < 0) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&offsets);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t units = (int64_t)view.len / MQ_UNIT_SIZE_BYTES, room = (int64_t)(offsets.len / 8);
    if ((int64_t)(sizes.len / 8) < room) room = (int64_t)(sizes.len / 8);
    /* no first + count or at + count: they come from the caller and may overflow */
    if (first < 0 || count < 1 || first > units || count > units - first || at < 0 || at > room ||
        count > room - at) {
        PyErr_Format(PyExc_ValueError, "queue_arrays: %lld units from unit %lld of %lld, to %lld of %lld", count,
                     first, (long long)units, at, (long long)room);
        goto done;
    }
    const uint8_t *from = (const uint8_t *)view.buf + first * MQ_UNIT_SIZE_BYTES;
    int64_t *offset_out = (int64_t *)offsets.buf + at, *size_out = (int64_t *)sizes.buf + at;
    int64_t offset_min = INT64_MAX, offset_max = -1;
    for (long long i = 0; i < count; i++) {
        const uint8_t *unit = from + i * MQ_UNIT_SIZE_BYTES;  /* read once: a writer may be writing the file */
        int64_t offset_value = mq_get_i64(unit);
        int32_t size_value = mq_get_i32(unit + MQ_UNIT_OFFSET_SIZE);
        if (offset_value < 0 || size_value <= 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (offset_value < offset_min) offset_min = offset_value;
        if (offset_value > offset_max) offset_max = offset_value;
        offset_out[i] = offset_value;
        size_out[i] = size_value;
    }
    result = Py_BuildValue("(LL)", (long long)offset_min, (long long)offset_max);
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    return result;
}

PyDoc_STRVAR(queue_written_doc,
"queue_written(buffer, first_unit, count) -> int\n\n"
"consumequeue/format.py's written_count over units [first_unit, first_unit + count) of `buffer` (a queue file's\n"
"mapping): how many from the first have a size > 0. The caller reports a negative size where it stopped. For a\n"
"reader of a queue another process writes (ConsumeQueue.refresh), with the interpreter lock kept: numpy's\n"
"comparison of a big-endian field lets go of it, and a service thread then waits out a producer's switch\n"
"interval to get it back (timer_link.c). ValueError when the units are not all in the buffer.");

static PyObject *queue_written(PyObject *self, PyObject *args) {
    PyObject *buffer_object;
    long long first, count;
    if (!PyArg_ParseTuple(args, "OLL", &buffer_object, &first, &count)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer_object, &view, PyBUF_SIMPLE) < 0) return NULL;
    int64_t units = (int64_t)view.len / MQ_UNIT_SIZE_BYTES;
    if (first < 0 || count < 0 || first > units || count > units - first) {
        PyErr_Format(PyExc_ValueError, "queue_written: %lld units from unit %lld of %lld", count, first,
                     (long long)units);
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *at = (const uint8_t *)view.buf + first * MQ_UNIT_SIZE_BYTES + MQ_UNIT_OFFSET_SIZE;
    long long written = 0;
    while (written < count && mq_get_i32(at + written * MQ_UNIT_SIZE_BYTES) > 0) written++;
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(written);
}

/* format.py's property_value: where the value of property `name` lies in `raw` (1), or 0 when it has none. The
 * first "name\x01" at the start of `raw` or just after a \x02 is the one, that is the first item (the items
 * start at 0 and after each \x02) that begins with it; its value runs to the next \x02 or the end. */
static int property_value(const uint8_t *raw, Py_ssize_t length, const char *name, Py_ssize_t name_length,
                          Py_ssize_t *start, Py_ssize_t *end) {
    Py_ssize_t item = 0;
    for (;;) {
        const uint8_t *next = memchr(raw + item, MQ_PROPERTY_SEPARATOR, (size_t)(length - item));
        Py_ssize_t item_end = next == NULL ? length : next - raw;
        if (item_end - item > name_length && raw[item + name_length] == MQ_PROPERTY_NAME_SEPARATOR &&
            memcmp(raw + item, name, (size_t)name_length) == 0) {
            *start = item + name_length + 1;
            *end = item_end;
            return 1;
        }
        if (next == NULL) return 0;
        item = item_end + 1;
    }
}

/* bytes.decode("utf-8", "replace") of `length` bytes: ASCII (the common case) copied straight into a new str. */
static PyObject *text_of(const char *bytes, Py_ssize_t length) {
    for (Py_ssize_t i = 0; i < length; i++)
        if ((unsigned char)bytes[i] >= 0x80) return PyUnicode_DecodeUTF8(bytes, length, "replace");
    PyObject *text = PyUnicode_New(length, 127);
    if (text != NULL && length > 0) memcpy(PyUnicode_1BYTE_DATA(text), bytes, (size_t)length);
    return text;
}

/* The raw PROPERTIES of a StoredMessage (a new reference), or NULL with TypeError. */
static PyObject *properties_of(PyObject *message) {
    if (!PyTuple_Check(message) || PyTuple_GET_SIZE(message) <= MQ_STORED_PROPERTIES_ITEM ||
        !PyBytes_Check(PyTuple_GET_ITEM(message, MQ_STORED_PROPERTIES_ITEM))) {
        PyErr_SetString(PyExc_TypeError, "a StoredMessage holds its raw properties as bytes at index 17");
        return NULL;
    }
    PyObject *raw = PyTuple_GET_ITEM(message, MQ_STORED_PROPERTIES_ITEM);
    Py_INCREF(raw);
    return raw;
}

PyDoc_STRVAR(stored_tags_doc,
"stored_tags(message) -> str or None: StoredMessage.tags, the TAGS property of its raw properties (UTF-8, errors\n"
"replaced), None without one.");

static PyObject *stored_tags(PyObject *self, PyObject *message) {
    PyObject *raw = properties_of(message);
    if (raw == NULL) return NULL;
    Py_ssize_t start, end;
    PyObject *result;
    if (property_value((const uint8_t *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), "TAGS", 4, &start, &end))
        result = text_of(PyBytes_AS_STRING(raw) + start, end - start);
    else
        result = Py_NewRef(Py_None);
    Py_DECREF(raw);
    return result;
}

/* The non-empty words of `text` split at KEY_SEPARATOR, as a tuple (the general case of stored_keys). */
static PyObject *words(PyObject *text) {
    PyObject *parts = PyUnicode_Split(text, key_separator, -1);
    if (parts == NULL) return NULL;
    Py_ssize_t kept = 0, count = PyList_GET_SIZE(parts);
    for (Py_ssize_t i = 0; i < count; i++) {  /* the list is this function's own: nothing else changes it */
        PyObject *part = PyList_GET_ITEM(parts, i);
        if (PyUnicode_GET_LENGTH(part) > 0) PyList_SET_ITEM(parts, kept++, part);
        else Py_DECREF(part);
    }
    Py_SET_SIZE(parts, kept);
    PyObject *result = PyList_AsTuple(parts);
    Py_DECREF(parts);
    return result;
}

PyDoc_STRVAR(stored_keys_doc,
"stored_keys(message) -> tuple of str: StoredMessage.keys, the words of the KEYS property of its raw properties\n"
"(UTF-8, errors replaced; split at spaces, empty words left out), () without one.");

static PyObject *stored_keys(PyObject *self, PyObject *message) {
    PyObject *raw = properties_of(message);
    if (raw == NULL) return NULL;
    const char *bytes = PyBytes_AS_STRING(raw);
    Py_ssize_t start, end;
    PyObject *result = NULL;
    if (!property_value((const uint8_t *)bytes, PyBytes_GET_SIZE(raw), "KEYS", 4, &start, &end) || start == end) {
        result = PyTuple_New(0);
    } else {
        PyObject *text = text_of(bytes + start, end - start);
        /* a replaced byte never becomes a space, and a space byte is a space: one key when there is none */
        if (text != NULL && memchr(bytes + start, ' ', (size_t)(end - start)) == NULL) result = PyTuple_Pack(1, text);
        else if (text != NULL) result = words(text);
        Py_XDECREF(text);
    }
    Py_DECREF(raw);
    return result;
}

PyDoc_STRVAR(directory_stamp_doc,
"directory_stamp(path) -> (st_mtime_ns, st_ino)\n\n"
"os.stat(path)'s st_mtime_ns and st_ino, for `path` given as bytes (os.fsencode's), without os.stat's result\n"
"object; OSError as os.stat raises it.");

/* Seconds and nanoseconds as os.stat's st_mtime_ns: exact for any time (Python's arithmetic past what int64
 * nanoseconds hold, before 1677 or after 2262, as a file system may report). */
static PyObject *nanoseconds(long long seconds, long nanos) {
    long long product;
    if (!__builtin_mul_overflow(seconds, 1000000000LL, &product) &&
        !__builtin_add_overflow(product, (long long)nanos, &product))
        return PyLong_FromLongLong(product);
    PyObject *result = NULL, *whole = PyLong_FromLongLong(seconds), *billion = PyLong_FromLong(1000000000L),
             *part = PyLong_FromLong(nanos), *scaled = NULL;
    if (whole != NULL && billion != NULL && part != NULL && (scaled = PyNumber_Multiply(whole, billion)) != NULL)
        result = PyNumber_Add(scaled, part);
    Py_XDECREF(whole);
    Py_XDECREF(billion);
    Py_XDECREF(part);
    Py_XDECREF(scaled);
    return result;
}

static PyObject *directory_stamp(PyObject *self, PyObject *path) {
    if (!PyBytes_Check(path)) {
        PyErr_SetString(PyExc_TypeError, "directory_stamp takes the path as bytes");
        return NULL;
    }
    if (strlen(PyBytes_AS_STRING(path)) != (size_t)PyBytes_GET_SIZE(path)) {
        PyErr_SetString(PyExc_ValueError, "directory_stamp: embedded null byte");
        return NULL;
    }
    struct stat status;
    int failed, error = 0;
    Py_INCREF(path);  /* held while the interpreter lock is let go: its bytes are read outside it */
    Py_BEGIN_ALLOW_THREADS
    failed = stat(PyBytes_AS_STRING(path), &status) != 0;
    if (failed) error = errno;
    Py_END_ALLOW_THREADS
    if (failed) {
        errno = error;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    PyObject *mtime_ns = nanoseconds((long long)status.st_mtim.tv_sec, (long)status.st_mtim.tv_nsec);
    if (mtime_ns == NULL) return NULL;
    return Py_BuildValue("(NK)", mtime_ns, (unsigned long long)status.st_ino);
}

PyMethodDef mq_read_path_methods[] = {
    {"directory_stamp", directory_stamp, METH_O, directory_stamp_doc},
    {"queue_lists", (PyCFunction)(void (*)(void))queue_lists, METH_FASTCALL, queue_lists_doc},
    {"queue_arrays", queue_arrays, METH_VARARGS, queue_arrays_doc},
    {"queue_written", queue_written, METH_VARARGS, queue_written_doc},
    {"stored_tags", stored_tags, METH_O, stored_tags_doc},
    {"stored_keys", stored_keys, METH_O, stored_keys_doc},
    {NULL, NULL, 0, NULL},
};

/* --- StoredField: StoredMessage.tags and .keys as descriptors ------------------------------------------------
 *
 * `StoredField(name, doc)`, name "tags" or "keys": a data descriptor whose __get__ is stored_tags or stored_keys
 * of the instance, called from the attribute lookup without a property's call of a function object (about 0.2k
 * instructions a read). Read-only, as the property was. The type has no doc string of its own: `__doc__` is the
 * instance's, as a property's. */

typedef struct {
    PyObject_HEAD
    PyObject *(*read)(PyObject *, PyObject *);  /* stored_tags or stored_keys */
    PyObject *name, *doc;
} StoredFieldObject;

static PyObject *stored_field_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *name, *doc = Py_None;
    static char *names[] = {"name", "doc", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|O:StoredField", names, &name, &doc)) return NULL;
    PyObject *(*read)(PyObject *, PyObject *) = NULL;
    if (PyUnicode_CompareWithASCIIString(name, "tags") == 0) read = stored_tags;
    else if (PyUnicode_CompareWithASCIIString(name, "keys") == 0) read = stored_keys;
    if (read == NULL) {
        PyErr_SetString(PyExc_ValueError, "StoredField name must be \"tags\" or \"keys\"");
        return NULL;
    }
    StoredFieldObject *self = (StoredFieldObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->read = read;
    self->name = Py_NewRef(name);
    self->doc = Py_NewRef(doc);
    return (PyObject *)self;
}

static void stored_field_dealloc(StoredFieldObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    Py_CLEAR(self->name);
    Py_CLEAR(self->doc);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *stored_field_get(StoredFieldObject *self, PyObject *instance, PyObject *owner) {
    if (instance == NULL || instance == Py_None) return Py_NewRef(self);  /* looked up on the class */
    return self->read(NULL, instance);  /* properties_of checks the instance's shape */
}

static int stored_field_set(StoredFieldObject *self, PyObject *instance, PyObject *value) {
    PyErr_Format(PyExc_AttributeError, "can't %s attribute '%U'", value == NULL ? "delete" : "set", self->name);
    return -1;
}

static PyMemberDef stored_field_members[] = {
    {"__doc__", T_OBJECT, offsetof(StoredFieldObject, doc), READONLY, NULL},
    {"name", T_OBJECT, offsetof(StoredFieldObject, name), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot stored_field_slots[] = {
    {Py_tp_new, stored_field_new},
    {Py_tp_dealloc, stored_field_dealloc},
    {Py_tp_descr_get, stored_field_get},
    {Py_tp_descr_set, stored_field_set},
    {Py_tp_members, stored_field_members},
    {0, NULL},
};

static PyType_Spec stored_field_spec = {
    "mqstore.commitlog._native.StoredField", sizeof(StoredFieldObject), 0, Py_TPFLAGS_DEFAULT, stored_field_slots,
};

int mq_read_path_init(PyObject *module) {
    key_separator = PyUnicode_InternFromString(" ");
    if (key_separator == NULL) return -1;
    PyObject *type = PyType_FromSpec(&stored_field_spec);
    if (type == NULL) return -1;
    int added = PyModule_AddObjectRef(module, "StoredField", type);
    Py_DECREF(type);
    return added;
}
