/* FlushGate: the place where SYNC producers wait for their bytes to be durable, with the GIL let go.
 *
 * A gate holds the durable position, whether a thread holds the lead (is flushing), and the highest position
 * any waiter asked for. `wait` blocks on a pthread condition variable without the GIL until the position is
 * durable, or (when asked to) the lead is free and the caller takes it, or the timeout passes, or the gate is
 * closed. `advance` (by the leader, after its flush) moves the durable position and wakes every waiter at once;
 * each woken thread checks its own position under the gate's mutex, still without the GIL, and only threads
 * with a result come back to the interpreter. What the Python version did per put and per flush under the GIL
 * (a lock per waiter, a parked list walked by the leader) is here a few instructions under a mutex.
 *
 * Policy stays in Python (flush/services.py): who leads, how many flushes a leader runs, timeouts, errors.
 * Nothing here touches a file: the leader's flush is Python's (os.fdatasync lets go of the GIL itself).
 */
#include "flushwait.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* wait()'s outcomes; flush/services.py names the same numbers */
#define GATE_DURABLE 0
#define GATE_LEAD 1
#define GATE_TIMEOUT 2
#define GATE_CLOSED 3
#define GATE_IDLE 4

#define GATE_SLICE_NS 100000000LL /* a wait looks for signals (Ctrl-C in the main thread) this often */

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    long long durable;  /* everything below is durable */
    long long wanted;   /* the highest position a waiter asked for */
    long long waiting;  /* threads blocked in wait() now */
    long long handovers; /* how many times the lead was let go */
    int leader;         /* 1 while a thread holds the lead */
    int closed;         /* stopped or failed: every wait returns GATE_CLOSED unless its position is durable */
    int ready;          /* mutex and cond initialised */
} FlushGate;

static void gate_dealloc(FlushGate *self) {
    if (self->ready) {
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->mutex);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* One decision under the mutex: an outcome, or -1 to keep waiting. A caller that may not lead comes back with
 * GATE_IDLE when the lead was let go since it came (`handovers` moved) and nobody took it: Python then asks its
 * flush thread again, or leads itself. */
static int gate_outcome(FlushGate *self, long long position, int lead, long long handovers) {
    if (self->durable >= position) return GATE_DURABLE;
    if (self->closed) return GATE_CLOSED;
    if (!self->leader) {
        if (lead) {
            self->leader = 1;
            return GATE_LEAD;
        }
        if (self->handovers != handovers) return GATE_IDLE;
    }
    return -1;
}

PyDoc_STRVAR(gate_wait_doc,
"wait(position, timeout_s, lead) -> int\n\n"
"Block, without the GIL, until everything below `position` is durable (0), or, with `lead` true, the lead is\n"
"free and this thread took it (1: flush, then advance()), or `timeout_s` passed (2; None waits for ever), or\n"
"the gate was closed (3), or, with `lead` false, the lead was let go and nobody took it (4: ask for a flush).");

static PyObject *gate_wait(FlushGate *self, PyObject *args) {
    long long position;
    PyObject *timeout_obj;
    int lead;
    if (!PyArg_ParseTuple(args, "LOp:wait", &position, &timeout_obj, &lead)) return NULL;
    long long deadline = -1;
    if (timeout_obj != Py_None) {
        double timeout_s = PyFloat_AsDouble(timeout_obj);
        if (timeout_s == -1.0 && PyErr_Occurred()) return NULL;
        if (!isfinite(timeout_s) || timeout_s > 1e9) timeout_s = 1e9;
        if (timeout_s < 0) timeout_s = 0;
        deadline = monotonic_ns() + (long long)(timeout_s * 1e9);
    }
    /* The mutex is never held by a thread that waits for the GIL: taking it with the GIL held cannot deadlock. */
    int outcome;
    pthread_mutex_lock(&self->mutex);
    long long handovers = self->handovers;
    outcome = gate_outcome(self, position, lead, handovers);
    if (outcome < 0 && deadline >= 0 && monotonic_ns() >= deadline) outcome = GATE_TIMEOUT;
    if (outcome < 0 && position > self->wanted) self->wanted = position;
    pthread_mutex_unlock(&self->mutex);
    while (outcome < 0) {
        Py_BEGIN_ALLOW_THREADS
        long long slice_end = monotonic_ns() + GATE_SLICE_NS;
        if (deadline >= 0 && deadline < slice_end) slice_end = deadline;
        struct timespec until = {(time_t)(slice_end / 1000000000LL), (long)(slice_end % 1000000000LL)};
        pthread_mutex_lock(&self->mutex);
        self->waiting++;
        for (;;) {
            outcome = gate_outcome(self, position, lead, handovers);
            if (outcome >= 0) break;
            if (pthread_cond_timedwait(&self->cond, &self->mutex, &until) == ETIMEDOUT) {
                outcome = gate_outcome(self, position, lead, handovers);
                if (outcome < 0 && deadline >= 0 && monotonic_ns() >= deadline) outcome = GATE_TIMEOUT;
                break;
            }
        }
        self->waiting--;
        pthread_mutex_unlock(&self->mutex);
        Py_END_ALLOW_THREADS
        /* a slice ended without a result: signal handlers (Ctrl-C in the main thread) run, then wait on */
        if (outcome < 0 && PyErr_CheckSignals() < 0) return NULL;
    }
    return PyLong_FromLong(outcome);
}

PyDoc_STRVAR(gate_advance_doc,
"advance(durable, keep) -> int\n\n"
"By the thread holding the lead, after its flush: everything below `durable` is durable now; wake the waiters.\n"
"With `keep` true and a waiter wanting more than `durable`, keep the lead and return that position (flush\n"
"again); otherwise let go of the lead (a waiting thread that may lead takes it) and return 0.");

static PyObject *gate_advance(FlushGate *self, PyObject *args) {
    long long durable;
    int keep;
    if (!PyArg_ParseTuple(args, "Lp:advance", &durable, &keep)) return NULL;
    long long more = 0;
    pthread_mutex_lock(&self->mutex);
    if (durable > self->durable) self->durable = durable;
    if (keep && self->wanted > self->durable && self->waiting > 0 && !self->closed) {
        more = self->wanted;
    } else if (self->leader) {
        self->leader = 0;
        self->handovers++;
    }
    pthread_mutex_unlock(&self->mutex);
    pthread_cond_broadcast(&self->cond);
    return PyLong_FromLongLong(more);
}

PyDoc_STRVAR(gate_close_doc,
"close() -> None\n\nStop (or fail) the gate: every wait returns, 3 where its position is not durable; the lead "
"is let go.");

static PyObject *gate_close(FlushGate *self, PyObject *Py_UNUSED(ignored)) {
    pthread_mutex_lock(&self->mutex);
    self->closed = 1;
    self->leader = 0;
    self->handovers++;
    pthread_mutex_unlock(&self->mutex);
    pthread_cond_broadcast(&self->cond);
    Py_RETURN_NONE;
}

static PyObject *gate_get_durable(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    long long value = self->durable;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromLongLong(value);
}

static PyObject *gate_get_waiting(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    long long value = self->waiting;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromLongLong(value);
}

static PyObject *gate_get_leading(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    int value = self->leader;
    pthread_mutex_unlock(&self->mutex);
    return PyBool_FromLong(value);
}

static PyMethodDef gate_methods[] = {
    {"wait", (PyCFunction)gate_wait, METH_VARARGS, gate_wait_doc},
    {"advance", (PyCFunction)gate_advance, METH_VARARGS, gate_advance_doc},
    {"close", (PyCFunction)gate_close, METH_NOARGS, gate_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"durable", (getter)gate_get_durable, NULL, "everything below this position is durable", NULL},
    {"waiting", (getter)gate_get_waiting, NULL, "threads blocked in wait() now", NULL},
    {"leading", (getter)gate_get_leading, NULL, "whether a thread holds the lead", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FlushGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mqstore.commitlog._native.FlushGate",
    .tp_basicsize = sizeof(FlushGate),
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Where SYNC producers wait for durability without the GIL (made by flush_gate()).",
    .tp_methods = gate_methods,
    .tp_getset = gate_getset,
};

static PyObject *native_flush_gate(PyObject *module, PyObject *args) {
    long long durable;
    if (!PyArg_ParseTuple(args, "L:flush_gate", &durable)) return NULL;
    if (FlushGateType.tp_dict == NULL && PyType_Ready(&FlushGateType) < 0) return NULL;
    FlushGate *self = PyObject_New(FlushGate, &FlushGateType);
    if (self == NULL) return NULL;
    self->ready = 0;
    self->durable = durable;
    self->wanted = durable;
    self->waiting = 0;
    self->leader = 0;
    self->handovers = 0;
    self->closed = 0;
    pthread_condattr_t attributes;
    if (pthread_condattr_init(&attributes) != 0 || pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC) != 0
        || pthread_cond_init(&self->cond, &attributes) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    pthread_condattr_destroy(&attributes);
    if (pthread_mutex_init(&self->mutex, NULL) != 0) {
        pthread_cond_destroy(&self->cond);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ready = 1;
    return (PyObject *)self;
}

/* pwrite of a whole buffer with the GIL kept: for a SYNC append's few hundred bytes into the page cache (about
 * a microsecond), where os.pwrite's letting go of the GIL hands the interpreter to another thread in the middle
 * of the put (while it holds the writer lock) and the put then waits to get it back. */
static PyObject *native_write_at(PyObject *module, PyObject *args) {
    int fd;
    Py_buffer view;
    long long offset;
    if (!PyArg_ParseTuple(args, "iy*L:write_at", &fd, &view, &offset)) return NULL;
    const char *data = (const char *)view.buf;
    Py_ssize_t left = view.len;
    while (left > 0) {
        ssize_t written = pwrite(fd, data, (size_t)left, (off_t)offset);
        if (written < 0) {
            if (errno == EINTR) continue;
            PyBuffer_Release(&view);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (written == 0) {
            PyBuffer_Release(&view);
            errno = EIO;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        data += written;
        left -= written;
        offset += written;
    }
    Py_ssize_t total = view.len;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(total);
}

PyMethodDef mq_flush_methods[] = {
    {"write_at", native_write_at, METH_VARARGS,
     "write_at(fd, data, offset) -> int: pwrite all of `data` at `offset`, keeping the GIL (short writes only)."},
    {"flush_gate", native_flush_gate, METH_VARARGS,
     "flush_gate(durable) -> FlushGate: a new gate whose durable position starts at `durable`."},
    {NULL, NULL, 0, NULL},
};
