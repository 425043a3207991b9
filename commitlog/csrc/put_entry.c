/* The store's `put` without a Python frame: the writer lock (`WriterLock`) and the entry (`PutEntry`).
 *
 * `WriterLock()` is the CommitLog's writer lock when the compiled core is loaded: a lock with the interface of
 * `threading.Lock` (acquire(blocking=True, timeout=-1), release(), locked(), the `with` statement), so that every
 * holder written in Python (put_batch, close, truncate, the HandOff) keeps working, plus a try-acquire and a
 * release that C code calls directly. `threading.Lock` has no such C API, and its `acquire(False)` called from C
 * or Python parses its arguments from a tuple: about 0.8k instructions a put (docs/decisions/0028).
 *
 * `PutEntry(store, appender, lock, handoff, python_put, io_error, gate=None)` is made by MessageStore at open when the compiled
 * put exists (docs/decisions/0028-put-entry-in-c.md); its bound method `put` becomes the store's `put` (an
 * instance attribute). It runs the common case of MessageStore.put in C, in the same order:
 *
 *   1. the store's `_closed`, `_disk_full` and `_put_common` read from its __dict__: closed, a full disk, or a
 *      `_put_common` other than the Appender's put (a test's wrapper) -> the Python method, `python_put`;
 *   2. try the writer lock; busy -> the Python method (it tries again, then hands the put to the holder);
 *   3. the Appender's put (put.c); None -> `store._append_message_holding_lock(message)`, under the same hold;
 *   4. release the lock; parked puts (`handoff.pending` not empty) -> `handoff.drain()`;
 *   5. a StoreIOError -> `store._put_refused(exc)` (its refusal status); other errors are raised;
 *   6. `_lag_limit` set -> `store._after_append(result)`; else `_sync_flush` set -> the SYNC wait: in the
 *      FlushGate `gate` (flushwait.c's mq_gate_sync_wait, which also leads the flush), and where that hands
 *      the wait back, `store._sync_wait(result, seconds left)`.
 *
 * Every uncommon case is the Python code it was: this file decides nothing of its own.
 */
#include "mq_native.h"
#include "flushwait.h"

#include <time.h>

/* --- WriterLock ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked;  /* held by some thread (the lock itself cannot say without trying) */
} WriterLockObject;

static PyTypeObject *writer_lock_type = NULL;

static PyObject *writer_lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "WriterLock() takes no arguments");
        return NULL;
    }
    WriterLockObject *self = (WriterLockObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void writer_lock_dealloc(WriterLockObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    if (self->lock != NULL) {
        if (self->locked) PyThread_release_lock(self->lock);  /* PyThread_free_lock of a held lock is undefined */
        PyThread_free_lock(self->lock);
    }
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + now.tv_nsec / 1e9;
}

/* Take the lock, waiting up to `timeout_s` (< 0: forever) with the GIL released; signal handlers run while it
 * waits (as threading.Lock's acquire). 1 taken, 0 not, -1 with an error (a handler raised). */
static int writer_lock_acquire_timed(WriterLockObject *self, double timeout_s) {
    PyLockStatus status = PyThread_acquire_lock_timed(self->lock, 0, 0);
    if (status != PY_LOCK_ACQUIRED && timeout_s != 0) {
        double deadline = timeout_s > 0 ? monotonic_s() + timeout_s : 0;
        for (;;) {
            PY_TIMEOUT_T wait_us = -1;
            if (timeout_s > 0) {
                double left = deadline - monotonic_s();
                wait_us = left <= 0 ? 0 : (PY_TIMEOUT_T)(left * 1e6);
            }
            Py_BEGIN_ALLOW_THREADS
            status = PyThread_acquire_lock_timed(self->lock, wait_us, 1);
            Py_END_ALLOW_THREADS
            if (status != PY_LOCK_INTR) break;
            if (Py_MakePendingCalls() < 0) return -1;  /* a signal handler raised (KeyboardInterrupt) */
        }
    }
    if (status != PY_LOCK_ACQUIRED) return 0;
    self->locked = 1;
    return 1;
}

static int parse_bool(PyObject *value, int *out) {
    int truth = PyObject_IsTrue(value);
    if (truth < 0) return -1;
    *out = truth;
    return 0;
}

/* acquire(blocking=True, timeout=-1): threading.Lock's arguments and checks, parsed without a tuple. */
static PyObject *writer_lock_acquire(WriterLockObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
    PyObject *blocking_arg = nargs > 0 ? args[0] : NULL, *timeout_arg = nargs > 1 ? args[1] : NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "acquire() takes at most 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (PyUnicode_CompareWithASCIIString(name, "blocking") == 0 && blocking_arg == NULL) blocking_arg = value;
        else if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0 && timeout_arg == NULL) timeout_arg = value;
        else {
            PyErr_Format(PyExc_TypeError, "acquire() got an unexpected or repeated keyword argument '%U'", name);
            return NULL;
        }
    }
    int blocking = 1;
    double timeout = -1;
    if (blocking_arg != NULL && parse_bool(blocking_arg, &blocking) < 0) return NULL;
    if (timeout_arg != NULL) {
        timeout = PyFloat_AsDouble(timeout_arg);
        if (timeout == -1 && PyErr_Occurred()) return NULL;
    }
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout > (double)PY_TIMEOUT_MAX / 1e6) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    int taken = writer_lock_acquire_timed(self, blocking ? timeout : 0);
    if (taken < 0) return NULL;
    return PyBool_FromLong(taken);
}

static PyObject *writer_lock_enter(WriterLockObject *self, PyObject *unused) {
    int taken = writer_lock_acquire_timed(self, -1);
    if (taken < 0) return NULL;
    return PyBool_FromLong(taken);
}

static PyObject *writer_lock_release(WriterLockObject *self, PyObject *unused) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    Py_RETURN_NONE;
}

static PyObject *writer_lock_exit(WriterLockObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return writer_lock_release(self, NULL);
}

static PyObject *writer_lock_locked(WriterLockObject *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static PyObject *writer_lock_repr(WriterLockObject *self) {
    return PyUnicode_FromFormat("<%s WriterLock object at %p>", self->locked ? "locked" : "unlocked", self);
}

static PyMethodDef writer_lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))writer_lock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool: as threading.Lock's."},
    {"release", (PyCFunction)writer_lock_release, METH_NOARGS, "release(): as threading.Lock's."},
    {"locked", (PyCFunction)writer_lock_locked, METH_NOARGS, "locked() -> bool: as threading.Lock's."},
    {"__enter__", (PyCFunction)writer_lock_enter, METH_NOARGS, "acquire()"},
    {"__exit__", (PyCFunction)(void (*)(void))writer_lock_exit, METH_FASTCALL, "release()"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot writer_lock_slots[] = {
    {Py_tp_doc, "WriterLock(): the CommitLog's writer lock, with threading.Lock's interface and a C-level "
                "try-acquire for the compiled put entry (commitlog/csrc/put_entry.c)."},
    {Py_tp_new, writer_lock_new},
    {Py_tp_dealloc, writer_lock_dealloc},
    {Py_tp_repr, writer_lock_repr},
    {Py_tp_methods, writer_lock_methods},
    {0, NULL},
};

static PyType_Spec writer_lock_spec = {
    "mqstore.commitlog._native.WriterLock", sizeof(WriterLockObject), 0, Py_TPFLAGS_DEFAULT, writer_lock_slots,
};

/* --- PutEntry -------------------------------------------------------------------------------------------- */

enum {
    E_CLOSED, E_DISK_FULL, E_PUT_COMMON, E_LAG_LIMIT, E_SYNC_FLUSH, E_APPEND_PYTHON, E_REFUSED, E_AFTER, E_DRAIN,
    E_SYNC_TIMEOUT, E_SYNC_WAIT, E_COUNT
};
static const char *entry_key_names[E_COUNT] = {
    "_closed", "_disk_full", "_put_common", "_lag_limit", "_sync_flush", "_append_message_holding_lock",
    "_put_refused", "_after_append", "drain", "_sync_timeout_s", "_sync_wait"};
static PyObject *entry_keys[E_COUNT];

typedef struct {
    PyObject_HEAD
    PyObject *store;       /* the MessageStore */
    PyObject *state;       /* its __dict__: _closed, _disk_full, _put_common, _lag_limit, _sync_flush */
    PyObject *appender;    /* the CommitLog's Appender (put.c) */
    PyObject *put_common;  /* what store._put_common was at open: while it still is, the Appender is called here */
    PyObject *lock;        /* the writer lock, a WriterLock */
    PyObject *handoff;     /* the HandOff over it */
    PyObject *parked;      /* handoff.pending */
    PyObject *python_put;  /* MessageStore.put, the function: every uncommon case */
    PyObject *io_error;    /* StoreIOError: a refusal, not an error */
    PyObject *gate;        /* the group commit's FlushGate, or NULL: SYNC puts wait in Python */
    /* What the store's __dict__ said at `version` (see read_flags): puts take the common path (open, the disk not
     * full, _put_common the Appender's), puts wait after their append (_lag_limit or _sync_flush), the wait is
     * Python's (the lag bound, or a timeout that is not a float), the SYNC timeout. */
    uint64_t version;
    int version_known, common, waits, python_waits;
    double sync_timeout_s;
} PutEntryObject;

static int entry_traverse(PutEntryObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->store);
    Py_VISIT(self->state);
    Py_VISIT(self->appender);
    Py_VISIT(self->put_common);
    Py_VISIT(self->lock);
    Py_VISIT(self->handoff);
    Py_VISIT(self->parked);
    Py_VISIT(self->python_put);
    Py_VISIT(self->io_error);
    Py_VISIT(self->gate);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int entry_clear(PutEntryObject *self) {
    Py_CLEAR(self->store);
    Py_CLEAR(self->state);
    Py_CLEAR(self->appender);
    Py_CLEAR(self->put_common);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->handoff);
    Py_CLEAR(self->parked);
    Py_CLEAR(self->python_put);
    Py_CLEAR(self->io_error);
    Py_CLEAR(self->gate);
    return 0;
}

static void entry_dealloc(PutEntryObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *store, *appender, *lock, *handoff, *python_put, *io_error, *gate = Py_None;
    if (!PyArg_ParseTuple(args, "OOOOOO|O:PutEntry", &store, &appender, &lock, &handoff, &python_put, &io_error,
                          &gate))
        return NULL;
    if (!mq_is_appender(appender) || Py_TYPE(lock) != writer_lock_type || !PyCallable_Check(python_put) ||
        !PyExceptionClass_Check(io_error) || (gate != Py_None && !mq_is_flush_gate(gate))) {
        PyErr_SetString(PyExc_TypeError,
                        "PutEntry(store, Appender, WriterLock, handoff, put function, StoreIOError, FlushGate or None)");
        return NULL;
    }
    PyObject *state = PyObject_GenericGetDict(store, NULL);
    if (state == NULL) return NULL;
    /* held before the attribute lookup below, which may run Python code */
    PyObject *put_common = Py_XNewRef(PyDict_GetItemWithError(state, entry_keys[E_PUT_COMMON]));
    PyObject *parked = put_common == NULL ? NULL : PyObject_GetAttrString(handoff, "pending");
    if (parked == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the store has no _put_common");
        Py_DECREF(state);
        Py_XDECREF(put_common);
        return NULL;
    }
    PutEntryObject *self = (PutEntryObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(state);
        Py_DECREF(parked);
        Py_DECREF(put_common);
        return NULL;
    }
    self->store = Py_NewRef(store);
    self->state = state;
    self->appender = Py_NewRef(appender);
    self->put_common = put_common;
    self->lock = Py_NewRef(lock);
    self->handoff = Py_NewRef(handoff);
    self->parked = parked;
    self->python_put = Py_NewRef(python_put);
    self->io_error = Py_NewRef(io_error);
    self->gate = gate == Py_None ? NULL : Py_NewRef(gate);
    return (PyObject *)self;
}

/* An item of the store's __dict__ (borrowed), or NULL (missing: an error is set then, or already). */
static PyObject *store_item(PutEntryObject *self, int key) {
    PyObject *value = PyDict_GetItemWithError(self->state, entry_keys[key]);
    if (value == NULL && !PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, entry_keys[key]);
    return value;
}

/* The store's flags, read from its __dict__ (`common`, `waits`): 0, or -1 with an error. In CPython 3.11 a dict's
 * version tag changes with every change of it, so they are read again only after the store's attributes changed
 * (a close, retention's disk-full flag, a test's replacement of _put_common); later versions read them on every
 * put (five lookups, about 0.5k instructions). */
static int read_flags(PutEntryObject *self) {
#ifdef MQ_DICT_VERSION
    uint64_t version = ((PyDictObject *)self->state)->ma_version_tag;
    if (self->version_known && version == self->version) return 0;
#endif
    self->version_known = 0;
    PyObject *closed = store_item(self, E_CLOSED);
    PyObject *disk_full = closed == NULL ? NULL : store_item(self, E_DISK_FULL);
    PyObject *put_common = disk_full == NULL ? NULL : store_item(self, E_PUT_COMMON);
    PyObject *lag_limit = put_common == NULL ? NULL : store_item(self, E_LAG_LIMIT);
    PyObject *sync_flush = lag_limit == NULL ? NULL : store_item(self, E_SYNC_FLUSH);
    PyObject *timeout = sync_flush == NULL ? NULL : store_item(self, E_SYNC_TIMEOUT);
    if (timeout == NULL) return -1;
    self->common = closed == Py_False && disk_full == Py_False && put_common == self->put_common;
    /* only a float timeout is read (no Python code runs), before the truth tests, which may run some (a type
     * of the store's own): another type waits through Python */
    self->sync_timeout_s = PyFloat_CheckExact(timeout) ? PyFloat_AS_DOUBLE(timeout) : -1.0;
    Py_INCREF(lag_limit);  /* held: the dict's references may go while a truth test runs */
    Py_INCREF(sync_flush);
    int lag = PyObject_IsTrue(lag_limit), sync = lag < 0 ? -1 : PyObject_IsTrue(sync_flush);
    Py_DECREF(lag_limit);
    Py_DECREF(sync_flush);
    if (sync < 0) return -1;
    self->waits = lag || sync;
    self->python_waits = lag || self->sync_timeout_s < 0;
#ifdef MQ_DICT_VERSION
    self->version = version;  /* reading changed nothing (bools and ints: no Python code ran) */
    self->version_known = 1;
#endif
    return 0;
}

static PyObject *python_put(PutEntryObject *self, PyObject *message) {
    PyObject *args[2] = {self->store, message};
    return PyObject_Vectorcall(self->python_put, args, 2, NULL);
}

/* The number of puts parked behind the lock (`handoff.pending`, a deque), asked with no exception set: the put's
 * error, if any, is put aside and restored (a debug CPython aborts on a call made with one set). An error of
 * the length itself counts as parked: drain then runs and reports what is wrong. */
static Py_ssize_t parked_count(PutEntryObject *self) {
    if (!PyErr_Occurred()) {  /* the common case: nothing to put aside */
        Py_ssize_t count = PyObject_Size(self->parked);
        if (count >= 0) return count;
        PyErr_Clear();
        return 1;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_ssize_t count = PyObject_Size(self->parked);
    if (count < 0) {
        PyErr_Clear();
        count = 1;
    }
    PyErr_Restore(type, value, traceback);
    return count;
}

/* `handoff.drain()` after the release, as the `finally` of MessageStore.put: an error of it replaces the put's
 * result (or its error, which becomes its __context__). */
static PyObject *drain_parked(PutEntryObject *self, PyObject *result) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *drained = PyObject_CallMethodNoArgs(self->handoff, entry_keys[E_DRAIN]);
    if (drained != NULL) {
        Py_DECREF(drained);
        PyErr_Restore(type, value, traceback);
        return result;
    }
    Py_XDECREF(result);
    if (type != NULL) {
        PyObject *new_type, *new_value, *new_traceback;
        PyErr_Fetch(&new_type, &new_value, &new_traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        PyErr_NormalizeException(&new_type, &new_value, &new_traceback);
        if (traceback != NULL) PyException_SetTraceback(value, traceback);
        PyException_SetContext(new_value, value);  /* steals value */
        Py_DECREF(type);
        Py_XDECREF(traceback);
        PyErr_Restore(new_type, new_value, new_traceback);
    }
    return NULL;
}

/* A SYNC put's wait for its record (`result`, a PutResult: offset at 1, size at 3) to be durable: in the gate while it
 * can be, then `store._sync_wait(result, seconds left)` (MessageStore's, which reports a timeout). Steals `result`. */
static PyObject *sync_wait(PutEntryObject *self, PyObject *result) {
    long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(result, 1));
    long long size = offset == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(result, 3));
    if (size == -1 && PyErr_Occurred()) {
        Py_DECREF(result);
        return NULL;
    }
    double left_s;
    int durable = mq_gate_sync_wait(self->gate, offset + size, self->sync_timeout_s, &left_s);
    if (durable != 0) {
        if (durable > 0) return result;
        Py_DECREF(result);
        return NULL;
    }
    PyObject *left = PyFloat_FromDouble(left_s);
    if (left == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    PyObject *args[3] = {self->store, result, left};
    PyObject *waited = PyObject_VectorcallMethod(entry_keys[E_SYNC_WAIT], args, 3, NULL);
    Py_DECREF(left);
    Py_DECREF(result);
    return waited;
}

static PyObject *entry_put(PutEntryObject *self, PyObject *message) {
    if (read_flags(self) < 0) return NULL;
    if (!self->common || !mq_writer_lock_try(self->lock))
        return python_put(self, message);  /* closed, a full disk, a replaced _put_common, a busy writer */
    PyObject *result = mq_appender_put(self->appender, message);
    if (result == Py_None) {  /* the Python path, under the same hold */
        Py_DECREF(result);
        result = PyObject_CallMethodOneArg(self->store, entry_keys[E_APPEND_PYTHON], message);
    }
    mq_writer_lock_release(self->lock);
    if (parked_count(self) > 0) result = drain_parked(self, result);
    if (result == NULL) {
        if (!PyErr_ExceptionMatches(self->io_error)) return NULL;
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL) PyException_SetTraceback(value, traceback);
        PyObject *refused = PyObject_CallMethodOneArg(self->store, entry_keys[E_REFUSED], value);
        Py_DECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return refused;
    }
    if (read_flags(self) < 0) {  /* again: they may have changed while the put ran Python code or waited */
        Py_DECREF(result);
        return NULL;
    }
    if (!self->waits) return result;
    if (!self->python_waits && self->gate != NULL && PyTuple_Check(result) && PyTuple_GET_SIZE(result) >= 4)
        return sync_wait(self, result);
    PyObject *after = PyObject_CallMethodOneArg(self->store, entry_keys[E_AFTER], result);
    Py_DECREF(result);
    return after;
}

PyDoc_STRVAR(entry_put_doc,
"put(message) -> PutResult\n\n"
"Store one message; it becomes visible to get() once dispatched (MessageStore.put, its common case in C: see\n"
"commitlog/csrc/put_entry.c).");

static PyMethodDef entry_methods[] = {
    {"put", (PyCFunction)entry_put, METH_O, entry_put_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot entry_slots[] = {
    {Py_tp_doc, "PutEntry(store, appender, lock, handoff, python_put, io_error): MessageStore.put's common case "
                "without a Python frame (commitlog/csrc/put_entry.c)."},
    {Py_tp_new, entry_new},
    {Py_tp_dealloc, entry_dealloc},
    {Py_tp_traverse, entry_traverse},
    {Py_tp_clear, entry_clear},
    {Py_tp_methods, entry_methods},
    {0, NULL},
};

static PyType_Spec entry_spec = {
    "mqstore.commitlog._native.PutEntry", sizeof(PutEntryObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    entry_slots,
};

/* --- for C callers --------------------------------------------------------------------------------------- */

int mq_is_writer_lock(PyObject *object) { return writer_lock_type != NULL && Py_TYPE(object) == writer_lock_type; }

int mq_writer_lock_held(PyObject *lock) { return ((WriterLockObject *)lock)->locked; }

int mq_writer_lock_try(PyObject *lock) {
    WriterLockObject *self = (WriterLockObject *)lock;
    if (PyThread_acquire_lock_timed(self->lock, 0, 0) != PY_LOCK_ACQUIRED) return 0;
    self->locked = 1;
    return 1;
}

void mq_writer_lock_release(PyObject *lock) {
    WriterLockObject *self = (WriterLockObject *)lock;
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

int mq_put_entry_init(PyObject *module) {
    for (int k = 0; k < E_COUNT; k++) {
        entry_keys[k] = PyUnicode_InternFromString(entry_key_names[k]);
        if (entry_keys[k] == NULL) return -1;
    }
    PyObject *lock_type = PyType_FromModuleAndSpec(module, &writer_lock_spec, NULL);
    if (lock_type == NULL) return -1;
    writer_lock_type = (PyTypeObject *)lock_type;  /* the module keeps it alive (added below) */
    int added = PyModule_AddObjectRef(module, "WriterLock", lock_type);
    Py_DECREF(lock_type);
    if (added < 0) return -1;
    PyObject *entry_type = PyType_FromModuleAndSpec(module, &entry_spec, NULL);
    if (entry_type == NULL) return -1;
    added = PyModule_AddObjectRef(module, "PutEntry", entry_type);
    Py_DECREF(entry_type);
    return added;
}
