/* The single-message put of the common message shape, as one call made while the writer lock is held.
 *
 * `Appender(log, clock_globals, time_ns, write_at, result_type, ok_status)` is made once per writable CommitLog
 * (CommitLog.compiled_put). Its `put(message)` does, for a compiled Message without tags, keys or properties, of
 * a topic the log has seen, what `prepare` + `append_holding_lock` + the PutResult of MessageStore.put do:
 * the checks of prepare (mq_common_message), the body CRC, the record encoded into the mapped segment (or into
 * the write-through scratch and pwrite), the queue offset assigned and advanced, the record described in
 * `written_records`, `last_store_timestamp_ms`, the end moved and published in `end_word`, and the PutResult.
 *
 * The CommitLog stays the one owner of the writer's state: every call reads `_end`, `_append_limit`,
 * `_segment_base`, `_view`, `_scratch`, `_segment_fd`, `queue_offsets`, `written_records`, `end_word`, `codec` and
 * `unique_keys` from the log's __dict__ and writes `_end`, `last_store_timestamp_ms` and `queue_offsets` back
 * there, so that a roll, set_end, truncate, recovery or close (which set them in Python, under the same lock) can
 * never leave a copy here out of step. The mapping is held (buffer protocol) while the record is written.
 *
 * Anything else returns None before a byte is written or a number moves: a message of another shape, a topic not
 * seen yet, a record that does not fit before `_append_limit` (a roll, a disk reservation step, the near-end
 * notice), a closed log, UNIQ_KEYs, the pure-Python codec, a failed pwrite. The caller then runs the Python path
 * (the reference), which handles it and raises its errors. Nothing here decides policy: no lock, no thread, no
 * wait, no file opened.
 */
#include "mq_native.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

#define DESCRIBED_TAIL_BYTES_MAX 4096          /* commitlog.py: tails above it are not described */
#define WRITE_THROUGH_RECORD_BYTES_MAX (64 * 1024)  /* commitlog.py: larger records are encoded in the mapping */

enum {
    K_END, K_APPEND_LIMIT, K_SEGMENT_BASE, K_VIEW, K_SCRATCH, K_SEGMENT_FD, K_FLUSH_LOCK, K_QUEUE_OFFSETS,
    K_WRITTEN, K_END_WORD, K_CODEC, K_UNIQUE_KEYS, K_LAST_STORE_TS, K_TIME_NS, K_WRITE_AT, K_LOCKED, K_APPEND,
    K_COUNT
};
static const char *key_names[K_COUNT] = {
    "_end", "_append_limit", "_segment_base", "_view", "_scratch", "_segment_fd", "_flush_lock", "queue_offsets",
    "written_records", "end_word", "codec", "unique_keys", "last_store_timestamp_ms", "_time_ns", "_write_at", "locked",
    "append"};
static PyObject *keys[K_COUNT];
static PyObject *zero_index = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *state;          /* the CommitLog's __dict__: the writer's state, read and written on every call */
    PyObject *clock_globals;  /* commitlog.py's module dict: `_time_ns` and `_write_at` (tests replace them) */
    PyObject *time_ns;        /* time.time_ns: when `_time_ns` is it, the clock is read here directly */
    PyObject *write_at;       /* the compiled write_at: when `_write_at` is another, write-through is left to Python */
    PyObject *topic_tails;    /* CommitLog._topic_tails */
    PyObject *result_type;    /* PutResult */
    PyObject *ok_status;      /* PutStatus.PUT_OK */
    long long queues_max, body_max;
    int record_crc;
    uint8_t born_host[MQ_HOST_V4_LENGTH], store_host[MQ_HOST_V4_LENGTH];
    char msg_id_prefix[2 * MQ_HOST_V4_LENGTH];  /* the store host's 8 bytes in upper-case hex */
} AppenderObject;

static int appender_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->state);
    Py_VISIT(self->clock_globals);
    Py_VISIT(self->time_ns);
    Py_VISIT(self->write_at);
    Py_VISIT(self->topic_tails);
    Py_VISIT(self->result_type);
    Py_VISIT(self->ok_status);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int appender_clear(AppenderObject *self) {
    Py_CLEAR(self->state);
    Py_CLEAR(self->clock_globals);
    Py_CLEAR(self->time_ns);
    Py_CLEAR(self->write_at);
    Py_CLEAR(self->topic_tails);
    Py_CLEAR(self->result_type);
    Py_CLEAR(self->ok_status);
    return 0;
}

static void appender_dealloc(AppenderObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static int attribute_int(PyObject *log, const char *name, long long *out) {
    PyObject *value = PyObject_GetAttrString(log, name);
    if (value == NULL) return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int attribute_host(PyObject *log, const char *name, uint8_t *out) {
    PyObject *value = PyObject_GetAttrString(log, name);
    if (value == NULL) return -1;
    if (!PyBytes_Check(value) || PyBytes_GET_SIZE(value) != MQ_HOST_V4_LENGTH) {
        Py_DECREF(value);
        PyErr_Format(PyExc_ValueError, "%s must be 8 bytes (an IPv4 host)", name);
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(value), MQ_HOST_V4_LENGTH);
    Py_DECREF(value);
    return 0;
}

static PyObject *appender_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *log, *clock_globals, *time_ns, *write_at, *result_type, *ok_status;
    if (!PyArg_ParseTuple(args, "OO!OOO!O:Appender", &log, &PyDict_Type, &clock_globals, &time_ns, &write_at,
                          &PyType_Type, &result_type, &ok_status))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "result_type must be a tuple type (PutResult)");
        return NULL;
    }
    AppenderObject *self = (AppenderObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->state = PyObject_GenericGetDict(log, NULL);
    self->topic_tails = PyObject_GetAttrString(log, "_topic_tails");
    self->clock_globals = Py_NewRef(clock_globals);
    self->time_ns = Py_NewRef(time_ns);
    self->write_at = Py_NewRef(write_at);
    self->result_type = Py_NewRef(result_type);
    self->ok_status = Py_NewRef(ok_status);
    PyObject *record_crc = self->state == NULL ? NULL : PyObject_GetAttrString(log, "record_crc");
    if (self->topic_tails == NULL || record_crc == NULL || !PyDict_Check(self->topic_tails) ||
        (self->record_crc = PyObject_IsTrue(record_crc)) < 0 ||
        attribute_int(log, "max_queues_per_topic", &self->queues_max) < 0 ||
        attribute_int(log, "max_message_size_bytes", &self->body_max) < 0 ||
        attribute_host(log, "born_host_raw", self->born_host) < 0 ||
        attribute_host(log, "store_host_raw", self->store_host) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the log's _topic_tails must be a dict");
        Py_XDECREF(record_crc);
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(record_crc);
    static const char hex[] = "0123456789ABCDEF";
    for (int i = 0; i < MQ_HOST_V4_LENGTH; i++) {
        self->msg_id_prefix[2 * i] = hex[self->store_host[i] >> 4];
        self->msg_id_prefix[2 * i + 1] = hex[self->store_host[i] & 15];
    }
    return (PyObject *)self;
}

/* The writer's state as this call sees it (borrowed from the log's __dict__). */
typedef struct {
    int64_t end, append_limit, segment_base;
    PyObject *view, *scratch, *segment_fd, *flush_lock, *queue_offsets, *written, *end_word;
} writer_state;

/* 1 with `out` filled when the log is in a state this path writes in, 0 when not (None: the Python path). */
static int read_state(PyObject *state, writer_state *out) {
    PyObject *item[K_END_WORD + 1];
    for (int k = 0; k <= K_UNIQUE_KEYS; k++) {
        PyObject *value = PyDict_GetItemWithError(state, keys[k]);
        if (value == NULL) return 0;  /* the caller checks PyErr_Occurred */
        if (k <= K_END_WORD) item[k] = value;
        else if (k == K_CODEC && value == Py_None) return 0;  /* the pure-Python codec */
        else if (k == K_UNIQUE_KEYS && value != Py_None) return 0;  /* UNIQ_KEYs are added by prepare */
    }
    int overflow = 0;
    if (!PyLong_CheckExact(item[K_END]) || !PyLong_CheckExact(item[K_APPEND_LIMIT]) ||
        !PyLong_CheckExact(item[K_SEGMENT_BASE]) || !PyDict_CheckExact(item[K_QUEUE_OFFSETS]) ||
        item[K_VIEW] == Py_None)
        return 0;
    out->end = PyLong_AsLongLongAndOverflow(item[K_END], &overflow);
    if (overflow) return 0;
    out->append_limit = PyLong_AsLongLongAndOverflow(item[K_APPEND_LIMIT], &overflow);
    if (overflow) return 0;
    out->segment_base = PyLong_AsLongLongAndOverflow(item[K_SEGMENT_BASE], &overflow);
    if (overflow) return 0;
    out->view = item[K_VIEW];
    out->scratch = item[K_SCRATCH] == Py_None ? NULL : item[K_SCRATCH];
    out->segment_fd = item[K_SEGMENT_FD];
    out->flush_lock = item[K_FLUSH_LOCK];
    out->queue_offsets = item[K_QUEUE_OFFSETS];
    out->written = item[K_WRITTEN] == Py_None ? NULL : item[K_WRITTEN];
    out->end_word = item[K_END_WORD] == Py_None ? NULL : item[K_END_WORD];
    return 1;
}

/* The store clock in ms, as `_time_ns() // 1_000_000` in commitlog.py; 0 with *ms set, or -1 with an error. */
static int store_clock_ms(AppenderObject *self, int64_t *ms) {
    PyObject *clock = PyDict_GetItemWithError(self->clock_globals, keys[K_TIME_NS]);
    if (clock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "commitlog._time_ns is missing");
        return -1;
    }
    if (clock == self->time_ns) {  /* time.time_ns is clock_gettime(CLOCK_REALTIME) */
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        *ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        return 0;
    }
    PyObject *value = PyObject_CallNoArgs(clock);  /* a test's clock */
    if (value == NULL) return -1;
    long long ns = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (ns == -1 && PyErr_Occurred()) return -1;
    *ms = ns >= 0 ? ns / 1000000 : -((-ns + 999999) / 1000000);  /* floor division, as Python's // */
    return 0;
}

/* Whether the record goes through the scratch and pwrite (CommitLog.write_through): 1, 0, 2 when `_write_at` is
 * not the compiled one (a test's fault injection: the Python path writes), or -1 on error. */
static int writes_through(AppenderObject *self, const writer_state *s, int64_t size) {
    if (s->scratch == NULL || size > WRITE_THROUGH_RECORD_BYTES_MAX) return 0;
    PyObject *write_at = PyDict_GetItemWithError(self->clock_globals, keys[K_WRITE_AT]);
    if (write_at != self->write_at) return PyErr_Occurred() ? -1 : 2;
    PyObject *locked = PyObject_CallMethodNoArgs(s->flush_lock, keys[K_LOCKED]);
    if (locked == NULL) return -1;
    int held = PyObject_IsTrue(locked);
    Py_DECREF(locked);
    return held < 0 ? -1 : !held;
}

/* pwrite all of `data` at `position` of the segment's file, keeping the GIL (as flushwait.c's write_at): 0, or -1
 * with errno set (nothing is published then; the Python path writes the record again and reports the error). */
static int write_all(int fd, const uint8_t *data, int64_t length, int64_t position) {
    while (length > 0) {
        ssize_t written = pwrite(fd, data, (size_t)length, (off_t)position);
        if (written < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (written == 0) {
            errno = EIO;
            return -1;
        }
        data += written;
        length -= written;
        position += written;
    }
    return 0;
}

/* Encode the record into `target` at `at` (bounds checked here) and, with `fd` >= 0, pwrite it at `file_pos`:
 * 1 written, 0 not (a failed pwrite: the Python path), -1 with an error. */
static int write_record(PyObject *target, int64_t at, const mq_record *r, const uint8_t *born_host,
                        const uint8_t *store_host, int record_crc, int fd, int64_t file_pos) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(target, &buffer, PyBUF_WRITABLE) < 0) return -1;  /* held while writing */
    if (at < 0 || at > (int64_t)buffer.len || r->size > (int64_t)buffer.len - at) {
        PyErr_Format(PyExc_ValueError, "a record of %lld bytes at %lld does not fit a buffer of %zd",
                     (long long)r->size, (long long)at, buffer.len);
        PyBuffer_Release(&buffer);
        return -1;
    }
    uint8_t *start = (uint8_t *)buffer.buf + at;
    mq_write_record(start, r, born_host, store_host, record_crc);
    int written = fd < 0 || write_all(fd, start, r->size, file_pos) == 0;
    PyBuffer_Release(&buffer);
    return written;
}

/* The PutResult: (PUT_OK, offset, queue_offset, size, store_ts, msg_id), msg_id the store host and the offset in
 * upper-case hex (format.py's offset message id). Steals the three ints. */
static PyObject *put_result(AppenderObject *self, int64_t offset, PyObject *offset_value, PyObject *queue_offset,
                            PyObject *store_ts, int64_t size) {
    static const char hex[] = "0123456789ABCDEF";
    PyObject *msg_id = PyUnicode_New(4 * MQ_HOST_V4_LENGTH, 127);
    PyObject *size_value = PyLong_FromLongLong(size);
    PyObject *result = ((PyTypeObject *)self->result_type)->tp_alloc((PyTypeObject *)self->result_type, 6);
    if (msg_id == NULL || size_value == NULL || result == NULL) {
        Py_XDECREF(msg_id);
        Py_XDECREF(size_value);
        Py_XDECREF(result);
        Py_DECREF(offset_value);
        Py_DECREF(queue_offset);
        Py_DECREF(store_ts);
        return NULL;
    }
    char *digits = (char *)PyUnicode_1BYTE_DATA(msg_id);
    memcpy(digits, self->msg_id_prefix, sizeof self->msg_id_prefix);
    for (int i = 0; i < 16; i++) digits[2 * MQ_HOST_V4_LENGTH + i] = hex[((uint64_t)offset >> (60 - 4 * i)) & 15];
    PyTuple_SET_ITEM(result, 0, Py_NewRef(self->ok_status));
    PyTuple_SET_ITEM(result, 1, offset_value);
    PyTuple_SET_ITEM(result, 2, queue_offset);
    PyTuple_SET_ITEM(result, 3, size_value);
    PyTuple_SET_ITEM(result, 4, store_ts);
    PyTuple_SET_ITEM(result, 5, msg_id);
    return result;
}

/* After the record is written: the queue offset advanced, the store time, the description for dispatch, the
 * end moved and published (in append_holding_lock's order); then the PutResult. */
static PyObject *publish(AppenderObject *self, const writer_state *s, const mq_common_parts *m, PyObject *queue_key,
                         int64_t offset, int64_t queue_offset, int64_t store_ts, int64_t size) {
    PyObject *queue_value = PyLong_FromLongLong(queue_offset), *next_value = PyLong_FromLongLong(queue_offset + 1);
    PyObject *store_value = PyLong_FromLongLong(store_ts), *offset_value = PyLong_FromLongLong(offset);
    PyObject *end_value = PyLong_FromLongLong(offset + size);
    int failed = queue_value == NULL || next_value == NULL || store_value == NULL || offset_value == NULL ||
                 end_value == NULL;
    if (!failed) failed = PyDict_SetItem(s->queue_offsets, queue_key, next_value) < 0 ||
                          PyDict_SetItem(self->state, keys[K_LAST_STORE_TS], store_value) < 0;
    if (!failed && s->written != NULL && PyBytes_GET_SIZE(m->tail) <= DESCRIBED_TAIL_BYTES_MAX) {
        PyObject *size_value = PyLong_FromLongLong(size);
        PyObject *described = size_value == NULL ? NULL : PyTuple_Pack(6, offset_value, size_value, queue_key,
                                                                       queue_value, store_value, m->tail);
        Py_XDECREF(size_value);
        PyObject *done = described == NULL ? NULL : PyObject_CallMethodOneArg(s->written, keys[K_APPEND], described);
        Py_XDECREF(described);
        failed = done == NULL;
        Py_XDECREF(done);
    }
    if (!failed) failed = PyDict_SetItem(self->state, keys[K_END], end_value) < 0;
    if (!failed && s->end_word != NULL) failed = PyObject_SetItem(s->end_word, zero_index, end_value) < 0;
    Py_XDECREF(next_value);
    Py_XDECREF(end_value);
    if (failed) {
        Py_XDECREF(queue_value);
        Py_XDECREF(store_value);
        Py_XDECREF(offset_value);
        return NULL;
    }
    return put_result(self, offset, offset_value, queue_value, store_value, size);
}

PyDoc_STRVAR(appender_put_doc,
"put(message) -> PutResult or None\n\n"
"Append a compiled Message of the common shape (see the module doc of commitlog/csrc/put.c) for a caller that\n"
"holds the writer lock: PutResult(PUT_OK, ...). None, with nothing written and nothing moved, for anything else:\n"
"the caller then runs prepare and append_holding_lock.");

static PyObject *appender_put(AppenderObject *self, PyObject *message) {
    mq_common_parts m;
    writer_state s;
    if (!mq_common_message(message, self->topic_tails, self->queues_max, self->body_max, &m) ||
        !read_state(self->state, &s)) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    int64_t body_length = PyBytes_GET_SIZE(m.body), tail_length = PyBytes_GET_SIZE(m.tail);
    int64_t size = MQ_HEADER_SIZE + body_length + tail_length, offset = s.end;
    if (offset + size + MQ_END_FILE_MIN_BLANK_LENGTH > s.append_limit) Py_RETURN_NONE;  /* _roll's work */
    int through = writes_through(self, &s, size);
    if (through < 0) return NULL;
    if (through == 2) Py_RETURN_NONE;
    int fd = -1;
    if (through) {
        if (!PyLong_CheckExact(s.segment_fd)) Py_RETURN_NONE;
        fd = (int)PyLong_AsLong(s.segment_fd);
        if (fd < 0) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
    }
    PyObject *queue_key = PyTuple_Pack(2, m.topic, m.queue_id);
    if (queue_key == NULL) return NULL;
    PyObject *result = NULL;
    int64_t queue_offset = 0, store_ts;
    PyObject *found = PyDict_GetItemWithError(s.queue_offsets, queue_key);
    if (found != NULL) {
        queue_offset = PyLong_AsLongLong(found);
        if (queue_offset == -1 && PyErr_Occurred()) goto done;
    } else if (PyErr_Occurred()) {
        goto done;
    }
    if (store_clock_ms(self, &store_ts) < 0) goto done;
    mq_record r = {
        .size = size, .queue_id = m.queue_id_value, .flag = m.flag, .queue_offset = queue_offset,
        .physical_offset = offset, .born_timestamp = m.born_timestamp_ms < 0 ? store_ts : m.born_timestamp_ms,
        .store_timestamp = store_ts, .body = (const uint8_t *)PyBytes_AS_STRING(m.body), .body_length = body_length,
        .tail = (const uint8_t *)PyBytes_AS_STRING(m.tail), .tail_length = tail_length};
    r.body_crc = mq_crc32(0, r.body, (size_t)body_length) & 0x7FFFFFFFu;
    const char *problem = mq_check_record(&r, self->record_crc);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    int written = write_record(through ? s.scratch : s.view, through ? 0 : offset - s.segment_base, &r,
                               self->born_host, self->store_host, self->record_crc, fd, offset - s.segment_base);
    if (written < 0) goto done;
    if (written == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = publish(self, &s, &m, queue_key, offset, queue_offset, store_ts, size);
done:
    Py_DECREF(queue_key);
    return result;
}

static PyMethodDef appender_methods[] = {
    {"put", (PyCFunction)appender_put, METH_O, appender_put_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot appender_slots[] = {
    {Py_tp_doc, "Appender(log, clock_globals, time_ns, write_at, result_type, ok_status): the compiled "
                "single-message put of a CommitLog (commitlog/csrc/put.c)."},
    {Py_tp_new, appender_new},
    {Py_tp_dealloc, appender_dealloc},
    {Py_tp_traverse, appender_traverse},
    {Py_tp_clear, appender_clear},
    {Py_tp_methods, appender_methods},
    {0, NULL},
};

static PyType_Spec appender_spec = {
    "mqstore.commitlog._native.Appender", sizeof(AppenderObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    appender_slots,
};

int mq_put_init(PyObject *module) {
    for (int k = 0; k < K_COUNT; k++) {
        keys[k] = PyUnicode_InternFromString(key_names[k]);
        if (keys[k] == NULL) return -1;
    }
    zero_index = PyLong_FromLong(0);
    if (zero_index == NULL) return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &appender_spec, NULL);
    if (type == NULL) return -1;
    int added = PyModule_AddObjectRef(module, "Appender", type);
    Py_DECREF(type);
    return added;
}
