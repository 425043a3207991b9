/* The UNIQ_KEY generator's state and its `next`, shared by the Python API (commitlog/unique_key.py's
 * UniqueKeyGenerator wraps a `UniqueKeys`) and the compiled put (put.c calls mq_unique_key_next), so that every
 * key of a store comes from one counter and one time prefix, whichever path made the record.
 *
 * The layout (32 upper-case hex digits) is unique_key.py's module doc: a fixed 20-digit prefix (address, process
 * id, instance id), then the milliseconds since the start of the current calendar month (UTC; i32, wrapping) and
 * a 16-bit counter. As RocketMQ's MessageClientIDSetter.setStartTime, the month's start moves when the clock
 * reaches the start of the next calendar month. unique_key.py's pure-Python generator makes the same sequence
 * from the same state (a test compares them).
 */
#include "mq_native.h"

#include <time.h>

#define PREFIX_DIGITS 20
#define TIME_DIGITS 8
#define COUNTER_DIGITS 4
_Static_assert(PREFIX_DIGITS + TIME_DIGITS + COUNTER_DIGITS == MQ_UNIQUE_KEY_DIGITS, "32 hex digits");

typedef struct {
    PyObject_HEAD
    PyObject *clock_globals;  /* unique_key.py's module dict: `_time_ns` (tests replace it) */
    PyObject *time_ns;        /* time.time_ns: when `_time_ns` is it, the clock is read here directly */
    int64_t month_start_ms, next_month_ms, last_ms;
    uint16_t counter;
    char time_prefix[PREFIX_DIGITS + TIME_DIGITS];  /* the prefix and the time digits of `last_ms` */
    uint64_t real_clock_version;  /* clock_globals' version tag when `_time_ns` was time.time_ns (0: unknown) */
} UniqueKeysObject;

static PyTypeObject *unique_keys_type = NULL;
static PyObject *time_ns_name = NULL;
static const char hex_digits[] = "0123456789ABCDEF";

static int unique_keys_traverse(UniqueKeysObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->clock_globals);
    Py_VISIT(self->time_ns);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int unique_keys_clear(UniqueKeysObject *self) {
    Py_CLEAR(self->clock_globals);
    Py_CLEAR(self->time_ns);
    return 0;
}

static void unique_keys_dealloc(UniqueKeysObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    unique_keys_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *unique_keys_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    const char *prefix;
    Py_ssize_t prefix_length;
    PyObject *clock_globals, *time_ns;
    if (!PyArg_ParseTuple(args, "y#O!O:UniqueKeys", &prefix, &prefix_length, &PyDict_Type, &clock_globals, &time_ns))
        return NULL;
    if (prefix_length != PREFIX_DIGITS) {
        PyErr_Format(PyExc_ValueError, "the prefix must be %d hex digits", PREFIX_DIGITS);
        return NULL;
    }
    UniqueKeysObject *self = (UniqueKeysObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->clock_globals = Py_NewRef(clock_globals);
    self->time_ns = Py_NewRef(time_ns);
    self->month_start_ms = self->next_month_ms = 0;
    self->last_ms = INT64_MIN;
    self->counter = 0;
    memcpy(self->time_prefix, prefix, PREFIX_DIGITS);
    memset(self->time_prefix + PREFIX_DIGITS, '0', TIME_DIGITS);
    return (PyObject *)self;
}

/* The clock in ms, as `_time_ns() // 1_000_000` in unique_key.py: 0, or -1 with an error. */
static int clock_ms(UniqueKeysObject *self, int64_t *ms) {
    PyObject *clock = PyDict_GetItemWithError(self->clock_globals, time_ns_name);
    if (clock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "unique_key._time_ns is missing");
        return -1;
    }
    if (clock == self->time_ns) {
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        *ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        return 0;
    }
    Py_INCREF(clock);  /* held while it runs: it may replace itself */
    PyObject *value = PyObject_CallNoArgs(clock);  /* a test's clock */
    Py_DECREF(clock);
    if (value == NULL) return -1;
    long long ns = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (ns == -1 && PyErr_Occurred()) return -1;
    *ms = ns >= 0 ? ns / 1000000 : -((-ns + 999999) / 1000000);  /* floor division, as Python's // */
    return 0;
}

/* The start of the calendar month (UTC) holding `ms` and of the next one, as unique_key.py's _month_bounds_ms. */
static void month_bounds(int64_t ms, int64_t *start, int64_t *next) {
    time_t seconds = (time_t)(ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000));
    struct tm moment;
    gmtime_r(&seconds, &moment);
    moment.tm_mday = 1;
    moment.tm_hour = moment.tm_min = moment.tm_sec = 0;
    *start = (int64_t)timegm(&moment) * 1000;
    moment.tm_mon += 1;  /* timegm carries December into January of the next year */
    *next = (int64_t)timegm(&moment) * 1000;
}

static void hex_fixed(char *out, uint64_t value, int digits) {
    for (int i = digits - 1; i >= 0; i--, value >>= 4) out[i] = hex_digits[value & 15];
}

/* Bring the time digits to `now` (unique_key.py's _refresh). */
static void refresh(UniqueKeysObject *self, int64_t now) {
    if (now >= self->next_month_ms) month_bounds(now, &self->month_start_ms, &self->next_month_ms);
    hex_fixed(self->time_prefix + PREFIX_DIGITS, (uint64_t)(now - self->month_start_ms) & 0xFFFFFFFFu, TIME_DIGITS);
    self->last_ms = now;
}

/* `count` keys for the clock reading `now` into `out` (count * 32 chars). Runs no Python code and lets go of
 * the GIL nowhere: the counter and the prefix move as one. */
static void fill_keys(UniqueKeysObject *self, int64_t now, char *out, Py_ssize_t count) {
    if (now != self->last_ms) refresh(self, now);
    for (Py_ssize_t i = 0; i < count; i++, out += MQ_UNIQUE_KEY_DIGITS) {
        memcpy(out, self->time_prefix, PREFIX_DIGITS + TIME_DIGITS);
        hex_fixed(out + PREFIX_DIGITS + TIME_DIGITS, self->counter++, COUNTER_DIGITS);
    }
}

/* `count` keys of one clock read into `out` (count * 32 chars): 0, or -1 with an error (no key used then). */
static int next_keys(UniqueKeysObject *self, char *out, Py_ssize_t count) {
    int64_t now;
    if (clock_ms(self, &now) < 0) return -1;
    fill_keys(self, now, out, count);
    return 0;
}

int mq_unique_key_next(PyObject *generator, char *out) {
    assert(mq_is_unique_keys(generator));
    return next_keys((UniqueKeysObject *)generator, out, 1);
}

int mq_unique_key_next_at(PyObject *generator, char *out, int64_t real_ms) {
    assert(mq_is_unique_keys(generator));
    UniqueKeysObject *self = (UniqueKeysObject *)generator;
#ifdef MQ_DICT_VERSION
    uint64_t version = ((PyDictObject *)self->clock_globals)->ma_version_tag;
    if (version != 0 && version == self->real_clock_version) {  /* the module dict unchanged since it was */
        fill_keys(self, real_ms, out, 1);
        return 0;
    }
#endif
    PyObject *clock = PyDict_GetItemWithError(self->clock_globals, time_ns_name);
    if (clock != NULL && clock == self->time_ns) {
#ifdef MQ_DICT_VERSION
        self->real_clock_version = version;
#endif
        fill_keys(self, real_ms, out, 1);
        return 0;
    }
    if (clock == NULL && PyErr_Occurred()) return -1;
    return next_keys(self, out, 1);  /* a test's clock: read it as the Python generator does */
}

int mq_unique_key_clock(PyObject *generator, int64_t *now, int *ran_python) {
    assert(mq_is_unique_keys(generator));
    UniqueKeysObject *self = (UniqueKeysObject *)generator;
    PyObject *clock = PyDict_GetItemWithError(self->clock_globals, time_ns_name);
    *ran_python = clock != self->time_ns;
    return clock_ms(self, now);
}

void mq_unique_key_fill(PyObject *generator, int64_t now, char *out, Py_ssize_t count) {
    assert(mq_is_unique_keys(generator));
    fill_keys((UniqueKeysObject *)generator, now, out, count);
}

int mq_is_unique_keys(PyObject *object) { return unique_keys_type != NULL && Py_TYPE(object) == unique_keys_type; }

static PyObject *unique_keys_next(UniqueKeysObject *self, PyObject *unused) {
    char key[MQ_UNIQUE_KEY_DIGITS];
    if (next_keys(self, key, 1) < 0) return NULL;
    return PyBytes_FromStringAndSize(key, MQ_UNIQUE_KEY_DIGITS);
}

static PyObject *unique_keys_next_many(UniqueKeysObject *self, PyObject *count_object) {
    Py_ssize_t count = PyLong_AsSsize_t(count_object);
    if (count == -1 && PyErr_Occurred()) return NULL;
    if (count < 0) count = 0;
    PyObject *keys = PyList_New(count);
    if (keys == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyBytes_FromStringAndSize(NULL, MQ_UNIQUE_KEY_DIGITS);
        if (key == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, i, key);
    }
    /* The keys are made in one step after the objects exist: a failed allocation uses no counter value. */
    int64_t now;
    if (clock_ms(self, &now) < 0) {
        Py_DECREF(keys);
        return NULL;
    }
    if (now != self->last_ms) refresh(self, now);
    for (Py_ssize_t i = 0; i < count; i++) {
        char *out = PyBytes_AS_STRING(PyList_GET_ITEM(keys, i));
        memcpy(out, self->time_prefix, PREFIX_DIGITS + TIME_DIGITS);
        hex_fixed(out + PREFIX_DIGITS + TIME_DIGITS, self->counter++, COUNTER_DIGITS);
    }
    return keys;
}

static PyMethodDef unique_keys_methods[] = {
    {"next", (PyCFunction)unique_keys_next, METH_NOARGS, "next() -> bytes: the next UNIQ_KEY (32 hex digits)."},
    {"next_many", (PyCFunction)unique_keys_next_many, METH_O,
     "next_many(count) -> list[bytes]: `count` keys of one clock read."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot unique_keys_slots[] = {
    {Py_tp_doc, "UniqueKeys(prefix, clock_globals, time_ns): the UNIQ_KEY generator's state (see "
                "commitlog/csrc/unique_key.c and commitlog/unique_key.py)."},
    {Py_tp_new, unique_keys_new},
    {Py_tp_dealloc, unique_keys_dealloc},
    {Py_tp_traverse, unique_keys_traverse},
    {Py_tp_clear, unique_keys_clear},
    {Py_tp_methods, unique_keys_methods},
    {0, NULL},
};

static PyType_Spec unique_keys_spec = {
    "mqstore.commitlog._native.UniqueKeys", sizeof(UniqueKeysObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    unique_keys_slots,
};

int mq_unique_key_init(PyObject *module) {
    time_ns_name = PyUnicode_InternFromString("_time_ns");
    if (time_ns_name == NULL) return -1;
    unique_keys_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &unique_keys_spec, NULL);
    if (unique_keys_type == NULL) return -1;
    return PyModule_AddObjectRef(module, "UniqueKeys", (PyObject *)unique_keys_type);
}
