/* FlushGate: the place where SYNC producers wait for their bytes to be durable, with the GIL let go, and where
 * the leader flushes.
 *
 * A gate holds the durable position, whether a thread holds the lead (is flushing), and the highest position
 * any waiter asked for, and its waiters: a list ordered by position, each entry on its waiter's stack with a
 * condition variable of its own. `wait` blocks on it without the GIL until the position is durable, or (when
 * asked to) the lead is free and the caller takes it or is handed it, or the timeout passes, or the gate is
 * closed. `advance` (by the leader, after its flush) moves the durable position and wakes only the waiters it
 * covers (the front of the list), after letting go of the mutex; a leader that lets go wakes the lowest waiter
 * that may lead, to take the lead, and no other; close wakes all. A thread is woken only with a result, and only threads with a result
 * come back to the interpreter (docs/decisions/0043-covered-wake-ups.md). What the Python
 * version did per put and per flush under the GIL (a lock per waiter, a parked list the leader walked) is here
 * a few instructions under a mutex.
 *
 * Once bound to the store's CommitLog and checkpoint (`bind`), the leader's flush is C too (`lead`): the log's
 * flush lock, its end and last store time read from its __dict__, fdatasync of the current segment without the
 * GIL, flushed_position and flushed_timestamp_ms moved, the checkpoint's two fields raised in its mapping, the
 * duration recorded here (the service's stats read it). That is the Python path's `_flush_once` with
 * CommitLog.flush, MappedFile.flush and the store's `_checkpoint_log`, step for step; a flush across a roll, a
 * closed segment, a busy flush lock or a test's stand-in for either flush goes to that Python path instead.
 * The compiled put entry (put_entry.c) waits and leads here directly (`mq_gate_sync_wait`), so one SYNC put
 * does not enter the interpreter after its append (docs/decisions/0030-sync-lead-in-c.md).
 *
 * Policy stays in Python (flush/services.py): when a caller may lead, how many flushes a leader runs, timeouts,
 * what a failed flush means: its numbers are passed to `bind`, and every case the C side does not take is
 * handed back to it.
 */
#include "flushwait.h"

#include <errno.h>
#include <fcntl.h>
#include <structmember.h>
#include <limits.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* wait()'s outcomes; flush/services.py names the same numbers */
#define GATE_DURABLE 0
#define GATE_LEAD 1
#define GATE_TIMEOUT 2
#define GATE_CLOSED 3
#define GATE_IDLE 4

#define GATE_SLICE_NS 100000000LL /* a wait looks for signals (Ctrl-C in the main thread) this often */
#define GATE_DURATIONS_KEPT 64     /* recent flush durations kept (services.py's FLUSH_DURATIONS_KEPT) */
#define GATE_SIGNAL_SPINS 4096     /* a woken waiter spins this often for its waker's last store, then yields */

/* gate_flush's outcomes */
#define FLUSH_DONE 1    /* flushed (or nothing to flush), the checkpoint raised, the flush recorded */
#define FLUSH_PYTHON 0  /* not a case for C (a flush across segments, a test's stand-in): the Python path flushes */
#define FLUSH_FAILED -1 /* the flush failed: the error is set (an Exception) and nothing was made durable */
#define FLUSH_REPORTED -2 /* the fdatasync failed and `service._flush_failed` was told under the flush lock */

/* What the leader's flush in C works on (bind()); every object held. `log_state` is the CommitLog's __dict__. */
typedef struct {
    PyObject *service;     /* the GroupCommitService: its Python lead, and where a failed flush is recorded */
    PyObject *log, *log_state, *flush_lock;  /* the CommitLog, its __dict__, its flush lock (a WriterLock) */
    PyObject *log_flush;   /* CommitLog.flush as bound: while the log's type still has it, the flush is done here */
    PyObject *segment_type, *segment_flush;  /* MappedFile, MappedFile.flush: the same test for its segments */
    PyObject *checkpoint;  /* the checkpoint's MappedFile: its `view`, where the flushed offset and time go */
    /* where MappedFile's slots `_fd`, `_closed`, `view`, `base_offset`, `size_bytes` lie in an instance (read
     * directly: a MappedFile has __slots__, and only instances of exactly that type are read) */
    Py_ssize_t fd_at, closed_at, view_at, base_at, size_at;
    PyObject *on_flushed;  /* the store's _checkpoint_log: what the checkpoint write above stands for */
    int rounds_max;        /* services.py's LEADER_FLUSH_ROUNDS_MAX */
    double inline_share;   /* services.py's FLUSH_INLINE_TIMEOUT_SHARE */
} gate_binding;

/* One thread blocked in wait(): on its own stack, linked into the gate's list while it waits, and woken through
 * its own condition variable, only by a flush that covers its position, by a lead handed to it, or by close. */
typedef struct gate_waiter {
    struct gate_waiter *previous, *next;  /* the gate's list, ordered by position (lowest first) */
    long long position;
    int lead;      /* may take the lead */
    int called;    /* woken by a leader that let go, to take the lead (`gate_hand_over`) */
    int listed;    /* in the list (a waker takes a covered waiter off before it signals it) */
    int woken;     /* taken off by `gate_take_covered`: signalled after the mutex is let go */
    int signalled; /* (atomic) that signal is done: the waker no longer touches this entry */
    pthread_cond_t cond;
} gate_waiter;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mutex;
    pthread_condattr_t cond_attributes;  /* CLOCK_MONOTONIC, for each waiter's condition variable */
    gate_waiter *first, *last;  /* the waiters, ordered by position */
    long long durable;  /* everything below is durable */
    long long wanted;   /* the highest position a waiter asked for */
    long long waiting;  /* threads in the waiters' list now */
    long long wakeups;        /* waiters signalled (counted by their wakers) */
    long long wakeups_empty;  /* waiters woken by a signal without a result (they wait on) */
    long long handovers; /* how many times the lead was let go */
    int leader;         /* 1 while a thread holds the lead */
    int closed;         /* stopped or failed: every wait returns GATE_CLOSED unless its position is durable */
    int ready;          /* mutex and cond initialised */
    gate_binding bound; /* bound.service NULL: not bound, the leader flushes in Python */
    /* The C leader's own duplicate of the descriptor of the segment it last flushed (-1: none), and that segment
     * (held): fdatasync runs on it without the GIL, so a MappedFile.close meanwhile cannot make it sync another
     * file that reused the number. Changed only by a leader holding the log's flush lock, and by unbind (which
     * takes that lock), dealloc and clear (no leader then). */
    int sync_fd;
    long long sync_fd_of;  /* the segment's `_fd` that sync_fd duplicates (a new `_fd` is duplicated anew) */
    PyObject *sync_segment;
    /* The flushes' statistics and the callers' leads (changed and read with the GIL held). */
    long long flushes, leads, last_ns, max_ns;  /* last_ns -1: no flush timed yet */
    long long recent_ns[GATE_DURATIONS_KEPT];
    int recent_count, recent_next;
} FlushGate;

enum {
    G_END, G_FLUSHED, G_FLUSHED_TS, G_LAST_TS, G_SEGMENT, G_FD, G_CLOSED, G_VIEW, G_BASE, G_SIZE, G_FLUSH,
    G_LEAD_PYTHON, G_FAILED, G_PATH, G_FLUSH_ERROR, G_COUNT
};
static const char *gate_key_names[G_COUNT] = {
    "_end", "flushed_position", "flushed_timestamp_ms", "last_store_timestamp_ms", "_segment", "_fd", "_closed",
    "view", "base_offset", "size_bytes", "flush", "_lead_gate_python", "_flush_failed", "path", "flush_error"};
static PyObject *gate_keys[G_COUNT];

static void binding_hold(gate_binding *b) {
    Py_XINCREF(b->service);
    Py_XINCREF(b->log);
    Py_XINCREF(b->log_state);
    Py_XINCREF(b->flush_lock);
    Py_XINCREF(b->log_flush);
    Py_XINCREF(b->segment_type);
    Py_XINCREF(b->segment_flush);
    Py_XINCREF(b->checkpoint);
    Py_XINCREF(b->on_flushed);
}

static void binding_drop(gate_binding *b) {
    Py_CLEAR(b->service);
    Py_CLEAR(b->log);
    Py_CLEAR(b->log_state);
    Py_CLEAR(b->flush_lock);
    Py_CLEAR(b->log_flush);
    Py_CLEAR(b->segment_type);
    Py_CLEAR(b->segment_flush);
    Py_CLEAR(b->checkpoint);
    Py_CLEAR(b->on_flushed);
}

static int gate_traverse(FlushGate *self, visitproc visit, void *arg) {
    Py_VISIT(self->bound.service);
    Py_VISIT(self->bound.log);
    Py_VISIT(self->bound.log_state);
    Py_VISIT(self->bound.flush_lock);
    Py_VISIT(self->bound.log_flush);
    Py_VISIT(self->bound.segment_type);
    Py_VISIT(self->bound.segment_flush);
    Py_VISIT(self->bound.checkpoint);
    Py_VISIT(self->bound.on_flushed);
    Py_VISIT(self->sync_segment);
    return 0;
}

/* Close the leader's descriptor (see FlushGate.sync_fd), for a caller that holds the log's flush lock, or when no
 * leader can run. */
static void sync_descriptor_drop(FlushGate *self) {
    if (self->sync_fd >= 0) close(self->sync_fd);
    self->sync_fd = -1;
    Py_CLEAR(self->sync_segment);
}

static int gate_clear(FlushGate *self) {
    binding_drop(&self->bound);
    sync_descriptor_drop(self);
    return 0;
}

static void gate_dealloc(FlushGate *self) {
    PyObject_GC_UnTrack(self);
    binding_drop(&self->bound);
    sync_descriptor_drop(self);
    if (self->ready) {
        pthread_condattr_destroy(&self->cond_attributes);
        pthread_mutex_destroy(&self->mutex);
    }
    PyObject_GC_Del(self);
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* One decision under the mutex for `waiter`: an outcome, or -1 to keep waiting. A caller that may not lead
 * comes back with GATE_IDLE when the lead was let go since it came (`handovers` moved) and nobody took it:
 * Python then asks its flush thread again, or leads itself. */
static int gate_outcome(FlushGate *self, gate_waiter *waiter, long long handovers) {
    if (self->durable >= waiter->position) return GATE_DURABLE;
    if (self->closed) return GATE_CLOSED;
    if (!self->leader) {
        if (waiter->lead) {
            self->leader = 1;
            return GATE_LEAD;
        }
        if (self->handovers != handovers) return GATE_IDLE;
    }
    return -1;
}

/* Into the list, kept ordered by position: looked for from the end, where new (higher) positions go. */
static void waiter_link(FlushGate *self, gate_waiter *waiter) {
    gate_waiter *before = self->last;
    while (before != NULL && before->position > waiter->position) before = before->previous;
    waiter->previous = before;
    waiter->next = before != NULL ? before->next : self->first;
    if (waiter->next != NULL) waiter->next->previous = waiter;
    else self->last = waiter;
    if (before != NULL) before->next = waiter;
    else self->first = waiter;
    waiter->listed = 1;
    self->waiting++;
}

static void waiter_unlink(FlushGate *self, gate_waiter *waiter) {
    if (!waiter->listed) return;
    if (waiter->previous != NULL) waiter->previous->next = waiter->next;
    else self->first = waiter->next;
    if (waiter->next != NULL) waiter->next->previous = waiter->previous;
    else self->last = waiter->previous;
    waiter->previous = waiter->next = NULL;
    waiter->listed = 0;
    self->waiting--;
}

/* Take `waiter` off the list and wake it (under the mutex: once the mutex is let go it may return, and its
 * condition variable, on its stack, is gone). */
static void waiter_wake(FlushGate *self, gate_waiter *waiter) {
    waiter_unlink(self, waiter);
    self->wakeups++;
    pthread_cond_signal(&waiter->cond);
}

/* Under the mutex: take off the list the waiters that `durable` covers (the front of the list), and no other,
 * chained through `next`, for `gate_signal_taken` to wake once the mutex is let go: a thread woken while the
 * waker still holds the mutex would only block on it again. */
static gate_waiter *gate_take_covered(FlushGate *self) {
    gate_waiter *taken = NULL, **tail = &taken;
    while (self->first != NULL && self->first->position <= self->durable) {
        gate_waiter *waiter = self->first;
        waiter_unlink(self, waiter);
        self->wakeups++;
        waiter->woken = 1;
        *tail = waiter;
        tail = &waiter->next;
    }
    return taken;
}

/* Without the mutex: signal each waiter taken by `gate_take_covered`. Its entry is read for the last time by the
 * store of `signalled`, which its thread waits for before it returns (its entry is on its stack). */
static void gate_signal_taken(gate_waiter *taken) {
    while (taken != NULL) {
        gate_waiter *next = taken->next;
        pthread_cond_signal(&taken->cond);
        __atomic_store_n(&taken->signalled, 1, __ATOMIC_RELEASE);
        taken = next;
    }
}

/* Under the mutex, the lead just let go: wake the lowest waiter that may lead, to take it (a thread that comes
 * to the gate meanwhile may take it first: the lead is not kept for a thread still asleep), or, with none, wake
 * the waiters that may not lead (they come back with GATE_IDLE and ask for a flush). */
static void gate_hand_over(FlushGate *self) {
    self->leader = 0;
    self->handovers++;
    for (gate_waiter *waiter = self->first; waiter != NULL; waiter = waiter->next) {
        if (waiter->lead) {
            waiter->called = 1;
            waiter_wake(self, waiter);
            return;
        }
    }
    while (self->first != NULL) waiter_wake(self, self->first);
}

/* A deadline `timeout_s` from now (None: -1, none), or -2 with an error. */
static long long deadline_of(PyObject *timeout_obj) {
    if (timeout_obj == Py_None) return -1;
    double timeout_s = PyFloat_AsDouble(timeout_obj);
    if (timeout_s == -1.0 && PyErr_Occurred()) return -2;
    if (!isfinite(timeout_s) || timeout_s > 1e9) timeout_s = 1e9;
    if (timeout_s < 0) timeout_s = 0;
    return monotonic_ns() + (long long)(timeout_s * 1e9);
}

/* Leave the list for good with `outcome` (-1: an error is on its way out). A waiter called to take the lead that
 * leaves without it, the lead still free, calls the next one (else the lead could stay free with callers
 * asleep). */
static void waiter_leave(FlushGate *self, gate_waiter *waiter, int outcome) {
    waiter_unlink(self, waiter);
    if (waiter->called && outcome != GATE_LEAD && !self->leader && !self->closed) gate_hand_over(self);
}

/* wait()'s work, for a caller holding the GIL: an outcome, or -1 with an error (a signal handler raised). The
 * caller's entry in the gate's list lives on this stack frame; it waits on its own condition variable. */
static int gate_block(FlushGate *self, long long position, long long deadline, int lead) {
    /* The mutex is never held by a thread that waits for the GIL: taking it with the GIL held cannot deadlock. */
    gate_waiter waiter = {.position = position, .lead = lead};  /* the rest zero; `cond` set up below */
    int outcome;
    pthread_mutex_lock(&self->mutex);
    long long handovers = self->handovers;
    outcome = gate_outcome(self, &waiter, handovers);
    if (outcome < 0 && deadline >= 0 && monotonic_ns() >= deadline) outcome = GATE_TIMEOUT;
    if (outcome >= 0) {
        pthread_mutex_unlock(&self->mutex);
        return outcome;
    }
    if (position > self->wanted) self->wanted = position;
    pthread_cond_init(&waiter.cond, &self->cond_attributes);
    waiter_link(self, &waiter);
    pthread_mutex_unlock(&self->mutex);
    while (outcome < 0) {
        Py_BEGIN_ALLOW_THREADS
        long long slice_end = monotonic_ns() + GATE_SLICE_NS;
        if (deadline >= 0 && deadline < slice_end) slice_end = deadline;
        struct timespec until = {(time_t)(slice_end / 1000000000LL), (long)(slice_end % 1000000000LL)};
        pthread_mutex_lock(&self->mutex);
        for (;;) {
            outcome = gate_outcome(self, &waiter, handovers);
            if (outcome >= 0) break;
            if (!waiter.listed) {  /* called for the lead, and another thread took it first: wait on */
                waiter.called = 0;
                waiter_link(self, &waiter);
            }
            int timed_out = pthread_cond_timedwait(&waiter.cond, &self->mutex, &until) == ETIMEDOUT;
            outcome = gate_outcome(self, &waiter, handovers);
            if (!timed_out && outcome < 0) self->wakeups_empty++;
            if (outcome < 0 && timed_out && deadline >= 0 && monotonic_ns() >= deadline) outcome = GATE_TIMEOUT;
            if (outcome >= 0 || timed_out) break;
        }
        if (outcome >= 0) waiter_leave(self, &waiter, outcome);
        pthread_mutex_unlock(&self->mutex);
        Py_END_ALLOW_THREADS
        /* a slice ended without a result: signal handlers (Ctrl-C in the main thread) run, then wait on */
        if (outcome < 0 && PyErr_CheckSignals() < 0) {
            pthread_mutex_lock(&self->mutex);
            waiter_leave(self, &waiter, -1);
            pthread_mutex_unlock(&self->mutex);
            outcome = -1;
            break;
        }
    }
    /* Taken off by a flush that covered it: wait until its waker is done with the entry (one futex wake). Read
     * without the mutex: the entry left the list in this thread's last hold of it, so nobody sets `woken` now. */
    for (int spins = 0; waiter.woken && !__atomic_load_n(&waiter.signalled, __ATOMIC_ACQUIRE); spins++) {
        if (spins < GATE_SIGNAL_SPINS) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();  /* the waker was preempted between its signal and its store */
        }
    }
    pthread_cond_destroy(&waiter.cond);
    return outcome;
}

/* advance()'s work: the position to flush to next when the lead is kept, else 0 (the lead let go). Wakes only
 * the waiters the new durable position covers, and the one the lead is handed to. */
static long long gate_advance_to(FlushGate *self, long long durable, int keep) {
    long long more = 0;
    pthread_mutex_lock(&self->mutex);
    if (durable > self->durable) self->durable = durable;
    gate_waiter *covered = gate_take_covered(self);
    if (keep && self->wanted > self->durable && self->first != NULL && !self->closed) {
        more = self->wanted;
    } else if (self->leader) {
        gate_hand_over(self);
    }
    pthread_mutex_unlock(&self->mutex);
    gate_signal_taken(covered);
    return more;
}

static void gate_close_now(FlushGate *self) {
    pthread_mutex_lock(&self->mutex);
    self->closed = 1;
    self->leader = 0;
    self->handovers++;
    while (self->first != NULL) waiter_wake(self, self->first);
    pthread_mutex_unlock(&self->mutex);
}

static long long gate_durable_now(FlushGate *self) {
    pthread_mutex_lock(&self->mutex);
    long long value = self->durable;
    pthread_mutex_unlock(&self->mutex);
    return value;
}

static void gate_record(FlushGate *self, long long ns) {
    if (ns < 0) ns = 0;
    self->flushes++;
    self->last_ns = ns;
    if (ns > self->max_ns) self->max_ns = ns;
    self->recent_ns[self->recent_next] = ns;
    self->recent_next = (self->recent_next + 1) % GATE_DURATIONS_KEPT;
    if (self->recent_count < GATE_DURATIONS_KEPT) self->recent_count++;
}

/* --- the leader's flush in C ------------------------------------------------------------------------------- */

/* An exact int in range: 1 (in *out), else 0 (no error). */
static int int_value(PyObject *value, long long *out) {
    if (value == NULL || !PyLong_CheckExact(value)) return 0;
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = number;
    return 1;
}

/* An int item of the log's __dict__ (borrowed, in *object when asked): 1 (its value in *out), 0 when missing or
 * not an exact int in range (no error). */
static int state_int(PyObject *state, int key, long long *out, PyObject **object) {
    PyObject *value = PyDict_GetItemWithError(state, gate_keys[key]);
    if (value == NULL) PyErr_Clear();
    if (object != NULL) *object = value;
    return int_value(value, out);
}

/* A slot of a MappedFile (borrowed; NULL when unset). */
static PyObject *slot_of(PyObject *object, Py_ssize_t at) { return *(PyObject **)((char *)object + at); }

/* Whether `type` (a class) has `function` as its `flush` still: a test's stand-in goes through Python. (The
 * attribute of the class, not of an instance: a plain function comes back as itself, from the type's cache.) */
static int flush_is(PyObject *type, PyObject *function) {
    PyObject *found = PyObject_GetAttr(type, gate_keys[G_FLUSH]);
    if (found == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = found == function;
    Py_DECREF(found);
    return same;
}

/* The segment's `_fd`, and the log offsets it spans, when it is an open MappedFile: 1, else 0. */
static int segment_range(const gate_binding *b, PyObject *segment, long long *fd, long long *base, long long *end) {
    long long size;
    if (segment == NULL || Py_TYPE(segment) != (PyTypeObject *)b->segment_type
        || slot_of(segment, b->closed_at) != Py_False || !int_value(slot_of(segment, b->fd_at), fd)
        || !int_value(slot_of(segment, b->base_at), base) || !int_value(slot_of(segment, b->size_at), &size))
        return 0;
    *end = *base + size;
    return *fd >= 0 && *fd <= INT_MAX && *base >= 0;
}

/* Checkpoint.raise_log(ms, offset) into the checkpoint's mapping: 1, or 0 when its view cannot be had (closed:
 * the Python callback then does it, and raises what it raises). */
static int checkpoint_raise(const gate_binding *b, long long ms, long long offset) {
    PyObject *view = slot_of(b->checkpoint, b->view_at);
    if (view == NULL || view == Py_None) return 0;
    Py_INCREF(view);
    Py_buffer buffer;
    if (PyObject_GetBuffer(view, &buffer, PyBUF_WRITABLE) < 0) {
        Py_DECREF(view);
        PyErr_Clear();
        return 0;
    }
    int done = 0;
    if (buffer.len >= 32) {  /* physic_msg_timestamp at 0, physic_flushed_offset at 24 (flush/checkpoint.py) */
        uint8_t *fields = (uint8_t *)buffer.buf;
        if (ms > mq_get_i64(fields)) mq_put_i64(fields, ms);
        if (offset > mq_get_i64(fields + 24)) mq_put_i64(fields + 24, offset);
        done = 1;
    }
    PyBuffer_Release(&buffer);
    Py_DECREF(view);
    return done;
}

/* Report the fdatasync failure set as the current exception to `service._flush_failed`, for a caller holding the
 * log's flush lock, and keep what it returns (the FlushFailedError) as the log's `flush_error`: no flush after this
 * one, in C or in Python, can then claim the bytes it failed on durable (CommitLog.flush raises while it is set).
 * FLUSH_REPORTED, or FLUSH_FAILED with an error (the report itself failed). */
static int report_failed_sync(const gate_binding *b) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject *kept = PyObject_CallMethodOneArg(b->service, gate_keys[G_FAILED], value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (kept == NULL) return FLUSH_FAILED;
    int failed = PyDict_SetItem(b->log_state, gate_keys[G_FLUSH_ERROR], kept);
    Py_DECREF(kept);
    return failed ? FLUSH_FAILED : FLUSH_REPORTED;
}

/* The descriptor the leader syncs `segment` (whose `_fd` is `fd`) with: the gate's own duplicate, made when the
 * segment changes (once a roll; a dup and a close cost about 1.4 us here, 1% of a SYNC put, so not once a flush),
 * or, once unbound, a duplicate for this flush alone (*own set: close it after). -1 when none can be had. For a
 * leader holding the log's flush lock, with the GIL, right after `segment_range` read the slots: MappedFile.close
 * sets `_closed` before it closes `_fd` (and lets go of the GIL in os.close), so the duplicate is always of the
 * segment's own file. */
static int sync_descriptor(FlushGate *self, PyObject *segment, long long fd, int *own) {
    *own = self->bound.service == NULL;
    if (!*own && segment == self->sync_segment && fd == self->sync_fd_of) return self->sync_fd;
    int duplicate = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
    if (duplicate < 0 || *own) return duplicate;
    PyObject *old = self->sync_segment;
    if (self->sync_fd >= 0) close(self->sync_fd);
    Py_INCREF(segment);
    self->sync_segment = segment;
    self->sync_fd = duplicate;
    self->sync_fd_of = fd;
    Py_XDECREF(old);
    return duplicate;
}

/* One flush by the leader, as the Python path's `_flush_once` with CommitLog.flush and MappedFile.flush and the
 * store's `_checkpoint_log` after it: under the log's flush lock, read the last store time and the end, fdatasync
 * the segment without the GIL when [flushed, end) lies in it (on the gate's duplicate of its descriptor:
 * `sync_descriptor`), move flushed_position and flushed_timestamp_ms, raise the checkpoint, record the duration.
 * FLUSH_PYTHON, before anything is done, for every other case (a log whose flush failed before among them:
 * CommitLog.flush raises that failure again). */
static int gate_flush(FlushGate *self, const gate_binding *b, long long *durable_out) {
    long long started = monotonic_ns();
    PyObject *state = b->log_state;
    if (!flush_is((PyObject *)Py_TYPE(b->log), b->log_flush) || !flush_is(b->segment_type, b->segment_flush))
        return FLUSH_PYTHON;
    PyObject *own = PyDict_GetItemWithError(state, gate_keys[G_FLUSH]);  /* log.flush = a test's spy */
    if (own != NULL || PyErr_Occurred()) {
        PyErr_Clear();
        return FLUSH_PYTHON;
    }
    if (!mq_writer_lock_try(b->flush_lock)) return FLUSH_PYTHON;  /* another flush runs: Python waits for it */
    long long timestamp, end, flushed, flushed_ms;
    PyObject *timestamp_value, *end_value;
    PyObject *earlier_failure = PyDict_GetItemWithError(state, gate_keys[G_FLUSH_ERROR]);
    if (earlier_failure != Py_None || !state_int(state, G_LAST_TS, &timestamp, &timestamp_value)
        || !state_int(state, G_END, &end, &end_value) || !state_int(state, G_FLUSHED, &flushed, NULL)
        || !state_int(state, G_FLUSHED_TS, &flushed_ms, NULL)) {
        PyErr_Clear();
        mq_writer_lock_release(b->flush_lock);
        return FLUSH_PYTHON;
    }
    long long durable = flushed, durable_ms = flushed_ms;
    if (end > flushed) {
        PyObject *segment = PyDict_GetItemWithError(state, gate_keys[G_SEGMENT]);
        long long fd, base, limit;
        int sync_fd = -1, own_fd = 0;
        if (!segment_range(b, segment, &fd, &base, &limit) || base > flushed || end > limit
            || (sync_fd = sync_descriptor(self, segment, fd, &own_fd)) < 0) {
            PyErr_Clear();
            mq_writer_lock_release(b->flush_lock);
            return FLUSH_PYTHON;  /* no segment, a closed one, the range spans a roll, or no descriptor to be had */
        }
        /* held through the fdatasync, as the Python path's names hold them (the ints are set below) */
        Py_INCREF(segment);  /* also for the error below, which names its file */
        Py_INCREF(end_value);
        Py_INCREF(timestamp_value);
        int failed, error = 0;
        Py_BEGIN_ALLOW_THREADS
        failed = fdatasync(sync_fd);
        if (failed) error = errno;
        if (own_fd) close(sync_fd);
        Py_END_ALLOW_THREADS
        int outcome = FLUSH_DONE;
        if (!failed) {
            durable = end;
            failed = PyDict_SetItem(state, gate_keys[G_FLUSHED], end_value);
            if (!failed && timestamp > flushed_ms) {
                durable_ms = timestamp;
                failed = PyDict_SetItem(state, gate_keys[G_FLUSHED_TS], timestamp_value);
            }
            if (failed) outcome = FLUSH_FAILED;
        } else {  /* an OSError with the segment's path as its filename, as MappedFile.flush reports it */
            PyObject *path = PyObject_GetAttr(segment, gate_keys[G_PATH]);
            PyErr_Clear();
            errno = error;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
            Py_XDECREF(path);
            outcome = report_failed_sync(b);  /* still under the flush lock */
        }
        Py_DECREF(segment);
        Py_DECREF(end_value);
        Py_DECREF(timestamp_value);
        if (outcome != FLUSH_DONE) {
            mq_writer_lock_release(b->flush_lock);
            return outcome;
        }
    }
    mq_writer_lock_release(b->flush_lock);
    if (!checkpoint_raise(b, durable_ms, durable)) {
        PyObject *done = PyObject_CallNoArgs(b->on_flushed);  /* the checkpoint's Python path */
        if (done == NULL) return FLUSH_FAILED;
        Py_DECREF(done);
    }
    gate_record(self, monotonic_ns() - started);
    *durable_out = durable;
    return FLUSH_DONE;
}

/* Holding the lead: flush, wake the callers it made durable, and flush again while callers wait (at most
 * `rounds_max` flushes), then let go of the lead: services.py's `_lead_gate`, in C. A case for Python hands the
 * lead, still held, to `service._lead_gate_python()`; a failed flush goes to `service._flush_failed(error)` and
 * closes the gate. 0, or -1 with an error (the lead let go). */
static int gate_lead(FlushGate *self) {
    gate_binding b = self->bound;  /* held for the call: unbind() may run while the fdatasync lets go of the GIL */
    if (b.service == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FlushGate.lead() needs bind() first");
        gate_advance_to(self, self->durable, 0);
        return -1;
    }
    binding_hold(&b);
    int status = 0;
    for (int round = 1;; round++) {
        long long durable = 0;
        int flushed = gate_flush(self, &b, &durable);
        if (flushed == FLUSH_PYTHON) {
            PyObject *done = PyObject_CallMethodNoArgs(b.service, gate_keys[G_LEAD_PYTHON]);
            status = done == NULL ? -1 : 0;
            Py_XDECREF(done);
            break;
        }
        if (flushed == FLUSH_REPORTED) {  /* the failure is kept: every waiter and every later flush fails */
            gate_close_now(self);
            break;
        }
        if (flushed == FLUSH_FAILED) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {  /* KeyboardInterrupt and the like: let another lead */
                gate_advance_to(self, gate_durable_now(self), 0);
                status = -1;
                break;
            }
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (traceback != NULL) PyException_SetTraceback(value, traceback);
            PyObject *done = PyObject_CallMethodOneArg(b.service, gate_keys[G_FAILED], value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            gate_close_now(self);
            status = done == NULL ? -1 : 0;
            Py_XDECREF(done);
            break;
        }
        if (gate_advance_to(self, durable, round < b.rounds_max) == 0) break;
    }
    binding_drop(&b);
    return status;
}

/* --- for put_entry.c ----------------------------------------------------------------------------------------- */

/* The SYNC wait of a put whose record ends at `position`, as services.py's `_wait_gate`, for as long as it stays
 * in C: 1 durable; 0 for the Python path, with the time left of the timeout in *left_s (0 after a timeout or a
 * closed gate: Python tells durable from not); -1 with an error. */
int mq_gate_sync_wait(PyObject *object, long long position, double timeout_s, double *left_s) {
    FlushGate *self = (FlushGate *)object;
    *left_s = timeout_s;
    if (self->bound.service == NULL) return 0;
    if (!(timeout_s >= 0)) return 0;
    if (timeout_s > 1e9) timeout_s = 1e9;
    long long deadline = monotonic_ns() + (long long)(timeout_s * 1e9);
    double lead_below_ns = timeout_s * self->bound.inline_share * 1e9;
    for (;;) {
        /* a caller leads only while the last flush took under a share of its timeout (services.py) */
        if (self->last_ns < 0 || (double)self->last_ns >= lead_below_ns || self->bound.service == NULL) return 0;
        int outcome = gate_block(self, position, deadline, 1);
        if (outcome < 0) return -1;
        if (outcome == GATE_DURABLE) return 1;
        if (outcome != GATE_LEAD) {
            *left_s = 0;
            return 0;
        }
        self->leads++;
        if (gate_lead(self) < 0) return -1;
        if (gate_durable_now(self) >= position) return 1;
        long long left = deadline - monotonic_ns();
        *left_s = left > 0 ? left / 1e9 : 0;
        if (left <= 0) return 0;
    }
}

/* --- the Python methods -------------------------------------------------------------------------------------- */

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
    long long deadline = deadline_of(timeout_obj);
    if (deadline == -2) return NULL;
    int outcome = gate_block(self, position, deadline, lead);
    if (outcome < 0) return NULL;
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
    return PyLong_FromLongLong(gate_advance_to(self, durable, keep));
}

PyDoc_STRVAR(gate_close_doc,
"close() -> None\n\nStop (or fail) the gate: every wait returns, 3 where its position is not durable; the lead "
"is let go.");

static PyObject *gate_close(FlushGate *self, PyObject *Py_UNUSED(ignored)) {
    gate_close_now(self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gate_bind_doc,
"bind(service, log, flush_lock, log_flush, segment_type, segment_flush, checkpoint, on_flushed, rounds_max,\n"
"     inline_share) -> None\n\n"
"Let the leader flush the CommitLog `log` in C (lead(), and SYNC puts of the compiled put entry): what\n"
"`service._flush_once` does with `log.flush()` and `on_flushed()` (the checkpoint's physic time and flushed\n"
"offset, written into the MappedFile `checkpoint`), while `log`'s type has `log_flush` and `segment_type` has\n"
"`segment_flush` as their `flush`; every other case goes to `service._lead_gate_python()`.");

static PyObject *gate_bind(FlushGate *self, PyObject *args) {
    gate_binding b = {0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOid:bind", &b.service, &b.log, &b.flush_lock, &b.log_flush,
                          &b.segment_type, &b.segment_flush, &b.checkpoint, &b.on_flushed, &b.rounds_max,
                          &b.inline_share))
        return NULL;
    if (!mq_is_writer_lock(b.flush_lock) || !PyType_Check(b.segment_type) || !PyCallable_Check(b.on_flushed)
        || b.rounds_max < 1) {
        PyErr_SetString(PyExc_TypeError, "bind(service, log, WriterLock, function, type, function, checkpoint, "
                                         "callable, rounds_max >= 1, inline_share)");
        return NULL;
    }
    Py_ssize_t *offsets[] = {&b.fd_at, &b.closed_at, &b.view_at, &b.base_at, &b.size_at};
    int names[] = {G_FD, G_CLOSED, G_VIEW, G_BASE, G_SIZE};
    for (int i = 0; i < 5; i++) {
        PyObject *slot = PyObject_GetAttr(b.segment_type, gate_keys[names[i]]);  /* the class's member descriptor */
        if (slot == NULL || Py_TYPE(slot) != &PyMemberDescr_Type
            || ((PyMemberDescrObject *)slot)->d_member->type != T_OBJECT_EX) {
            Py_XDECREF(slot);
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "bind(): %R has no slot %R", b.segment_type, gate_keys[names[i]]);
            return NULL;
        }
        *offsets[i] = ((PyMemberDescrObject *)slot)->d_member->offset;
        Py_DECREF(slot);
    }
    if (Py_TYPE(b.checkpoint) != (PyTypeObject *)b.segment_type) {
        PyErr_SetString(PyExc_TypeError, "bind(): the checkpoint is not a segment_type");
        return NULL;
    }
    b.log_state = PyObject_GenericGetDict(b.log, NULL);
    if (b.log_state == NULL) return NULL;
    Py_DECREF(b.log_state);  /* held again below, with the others */
    binding_hold(&b);
    gate_binding old = self->bound;
    self->bound = b;
    binding_drop(&old);
    Py_RETURN_NONE;
}

static PyObject *gate_unbind(FlushGate *self, PyObject *Py_UNUSED(ignored)) {
    gate_binding old = self->bound;
    memset(&self->bound, 0, sizeof(self->bound));
    /* The leader's descriptor is closed under the log's flush lock: a leader that took the binding before may be
     * syncing on it now (leaders after this point use a duplicate of their own). */
    if (self->sync_fd >= 0 && old.flush_lock != NULL) {
        PyObject *taken = PyObject_CallMethod(old.flush_lock, "acquire", NULL);
        if (taken == NULL) {
            self->bound = old;  /* still bound: nothing changed */
            return NULL;
        }
        Py_DECREF(taken);
        sync_descriptor_drop(self);
        mq_writer_lock_release(old.flush_lock);
    }
    binding_drop(&old);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gate_lead_doc,
"lead() -> None\n\nBy the thread holding the lead (wait() returned 1), with bind() done: flush and advance as "
"services.py's\n_lead_gate does, in C; the lead is let go when it returns.");

static PyObject *gate_lead_method(FlushGate *self, PyObject *Py_UNUSED(ignored)) {
    if (gate_lead(self) < 0) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gate_record_doc,
"record(seconds) -> None\n\nCount one flush of the Python path and its duration (as the C flush does its own).");

static PyObject *gate_record_method(FlushGate *self, PyObject *seconds_obj) {
    double seconds = PyFloat_AsDouble(seconds_obj);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    gate_record(self, isfinite(seconds) ? (long long)(seconds * 1e9) : 0);
    Py_RETURN_NONE;
}

static PyObject *gate_get_durable(FlushGate *self, void *closure) {
    return PyLong_FromLongLong(gate_durable_now(self));
}

static PyObject *gate_get_waiting(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    long long value = self->waiting;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromLongLong(value);
}

static PyObject *gate_get_wakeups(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    PyObject *pair = Py_BuildValue("(LL)", self->wakeups, self->wakeups_empty);
    pthread_mutex_unlock(&self->mutex);
    return pair;
}

static PyObject *gate_get_leading(FlushGate *self, void *closure) {
    pthread_mutex_lock(&self->mutex);
    int value = self->leader;
    pthread_mutex_unlock(&self->mutex);
    return PyBool_FromLong(value);
}

static PyObject *gate_get_bound(FlushGate *self, void *closure) {
    return PyBool_FromLong(self->bound.service != NULL);
}

static PyObject *gate_get_flushes(FlushGate *self, void *closure) { return PyLong_FromLongLong(self->flushes); }

static PyObject *gate_get_leads(FlushGate *self, void *closure) { return PyLong_FromLongLong(self->leads); }

static PyObject *gate_get_last_flush_s(FlushGate *self, void *closure) {
    return PyFloat_FromDouble(self->last_ns < 0 ? INFINITY : self->last_ns / 1e9);
}

static PyObject *gate_get_max_flush_s(FlushGate *self, void *closure) {
    return PyFloat_FromDouble(self->max_ns / 1e9);
}

static PyObject *gate_get_recent_flush_s(FlushGate *self, void *closure) {
    PyObject *list = PyList_New(self->recent_count);
    if (list == NULL) return NULL;
    int first = (self->recent_next - self->recent_count + GATE_DURATIONS_KEPT) % GATE_DURATIONS_KEPT;
    for (int i = 0; i < self->recent_count; i++) {
        PyObject *value = PyFloat_FromDouble(self->recent_ns[(first + i) % GATE_DURATIONS_KEPT] / 1e9);
        if (value == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static PyObject *gate_get_kept(FlushGate *self, void *closure) { return PyLong_FromLong(GATE_DURATIONS_KEPT); }

static PyMethodDef gate_methods[] = {
    {"wait", (PyCFunction)gate_wait, METH_VARARGS, gate_wait_doc},
    {"advance", (PyCFunction)gate_advance, METH_VARARGS, gate_advance_doc},
    {"close", (PyCFunction)gate_close, METH_NOARGS, gate_close_doc},
    {"bind", (PyCFunction)gate_bind, METH_VARARGS, gate_bind_doc},
    {"unbind", (PyCFunction)gate_unbind, METH_NOARGS, "unbind() -> None\n\nUndo bind(): the leader flushes in Python."},
    {"lead", (PyCFunction)gate_lead_method, METH_NOARGS, gate_lead_doc},
    {"record", (PyCFunction)gate_record_method, METH_O, gate_record_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"durable", (getter)gate_get_durable, NULL, "everything below this position is durable", NULL},
    {"waiting", (getter)gate_get_waiting, NULL, "threads blocked in wait() now", NULL},
    {"wakeups", (getter)gate_get_wakeups, NULL,
     "(signalled, woken without a result): waiters signalled so far, and those that woke to wait on", NULL},
    {"leading", (getter)gate_get_leading, NULL, "whether a thread holds the lead", NULL},
    {"bound", (getter)gate_get_bound, NULL, "whether bind() is in force", NULL},
    {"flushes", (getter)gate_get_flushes, NULL, "flushes recorded (by the C flush, and record())", NULL},
    {"leads", (getter)gate_get_leads, NULL, "leads taken by SYNC puts of the compiled put entry", NULL},
    {"last_flush_s", (getter)gate_get_last_flush_s, NULL, "the last flush's duration (inf before the first)", NULL},
    {"max_flush_s", (getter)gate_get_max_flush_s, NULL, "the longest flush's duration", NULL},
    {"recent_flush_s", (getter)gate_get_recent_flush_s, NULL, "the durations of the last flushes, oldest first",
     NULL},
    {"durations_kept", (getter)gate_get_kept, NULL, "how many recent durations are kept", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FlushGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mqstore.commitlog._native.FlushGate",
    .tp_basicsize = sizeof(FlushGate),
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Where SYNC producers wait for durability without the GIL (made by flush_gate()).",
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_methods = gate_methods,
    .tp_getset = gate_getset,
};

int mq_is_flush_gate(PyObject *object) { return Py_TYPE(object) == &FlushGateType; }

static PyObject *native_flush_gate(PyObject *module, PyObject *args) {
    long long durable;
    if (!PyArg_ParseTuple(args, "L:flush_gate", &durable)) return NULL;
    if (gate_keys[0] == NULL) {
        for (int k = 0; k < G_COUNT; k++) {
            gate_keys[k] = PyUnicode_InternFromString(gate_key_names[k]);
            if (gate_keys[k] == NULL) return NULL;
        }
    }
    if (FlushGateType.tp_dict == NULL && PyType_Ready(&FlushGateType) < 0) return NULL;
    FlushGate *self = PyObject_GC_New(FlushGate, &FlushGateType);
    if (self == NULL) return NULL;
    self->ready = 0;
    self->durable = durable;
    self->wanted = durable;
    self->waiting = 0;
    self->leader = 0;
    self->handovers = 0;
    self->closed = 0;
    memset(&self->bound, 0, sizeof(self->bound));
    self->sync_fd = -1;
    self->sync_segment = NULL;
    self->flushes = self->leads = self->max_ns = 0;
    self->last_ns = -1;
    self->recent_count = self->recent_next = 0;
    self->first = self->last = NULL;
    self->wakeups = self->wakeups_empty = 0;
    if (pthread_condattr_init(&self->cond_attributes) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (pthread_condattr_setclock(&self->cond_attributes, CLOCK_MONOTONIC) != 0
        || pthread_mutex_init(&self->mutex, NULL) != 0) {
        pthread_condattr_destroy(&self->cond_attributes);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ready = 1;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* write_at(fd, data, offset): pwrite all of `data`, with the GIL let go (a stalled disk must not stop every
 * thread). `data`'s buffer is held (y*) until the end; the caller (CommitLog._write_through) holds the writer
 * lock, so that no other thread writes, rolls or closes the segment meanwhile. */
static PyObject *native_write_at(PyObject *module, PyObject *args) {
    int fd;
    Py_buffer view;
    long long offset;
    if (!PyArg_ParseTuple(args, "iy*L:write_at", &fd, &view, &offset)) return NULL;
    const char *data = (const char *)view.buf;
    Py_ssize_t left = view.len;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    while (left > 0) {
        ssize_t written = pwrite(fd, data, (size_t)left, (off_t)offset);
        if (written < 0) {
            if (errno == EINTR) continue;
            error = errno;
            break;
        }
        if (written == 0) {
            error = EIO;
            break;
        }
        data += written;
        left -= written;
        offset += written;
    }
    Py_END_ALLOW_THREADS
    Py_ssize_t total = view.len;
    PyBuffer_Release(&view);
    if (error != 0) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(total);
}

PyMethodDef mq_flush_methods[] = {
    {"write_at", native_write_at, METH_VARARGS,
     "write_at(fd, data, offset) -> int: pwrite all of `data` at `offset`, with the GIL let go."},
    {"flush_gate", native_flush_gate, METH_VARARGS,
     "flush_gate(durable) -> FlushGate: a new gate whose durable position starts at `durable`."},
    {NULL, NULL, 0, NULL},
};
