/* The single-message put, as one call made while the writer lock is held.
 *
 * `Appender(log, clock_globals, time_ns, write_at, result_type, ok_status)` is made once per writable CommitLog
 * (CommitLog.compiled_put). Its `put(message)` does, for a compiled Message of a topic the log has seen, what
 * `prepare` + `append_holding_lock` + the PutResult of MessageStore.put do: the checks of prepare (the fields:
 * mq_message_fields; tags, keys and user properties: mq_plan_properties, as commitlog.py's _properties_text), the
 * PROPERTIES string in prepare's order (TAGS, KEYS, the user properties in dict order, the UNIQ_KEY when the log
 * adds them and the message has none, the record-CRC placeholder), the body CRC, the record encoded into the
 * mapped segment (or into the write-through scratch and pwrite), the queue offset assigned and advanced, the
 * record described in `written_records`, `last_store_timestamp_ms`, the end moved and published in `end_word`,
 * and the PutResult. UNIQ_KEYs come from the compiled state of the log's generator (unique_key.c), the one
 * that the Python path's next() and put_batch's next_many() draw from too.
 *
 * The CommitLog stays the one owner of the writer's state. What changes once a segment or less (`_view`,
 * `_segment_base`, `_append_limit`, `_segment_fd`, `_scratch`, `_flush_lock`, `written_records`, `end_word`,
 * whether `codec` is compiled, `unique_keys`) is copied here by `refresh()`, which the CommitLog calls after each
 * change of them (`_use_segment`, `_make_room`, the `write_through`, `written_records`, `end_word` and
 * `unique_keys` setters); what changes every put (`_end`, `queue_offsets`, `last_store_timestamp_ms`) is read
 * from and written to the log's __dict__ on every call, so that set_end, truncate, recovery and put_batch (which
 * set them in Python, under the same lock) are seen at once. The mapping is held (buffer protocol) while a record
 * is written; a close or a roll refreshes the copy before the old view could be written again.
 *
 * Anything else returns None before a byte is written, a number moves or a UNIQ_KEY is taken: a message that
 * is not a compiled Message, a field of another type (a str subclass, keys neither a tuple nor a list, ...), a
 * value prepare refuses, PROPERTIES over 32767 bytes, a topic not seen yet, a record that does not fit before
 * `_append_limit` (a roll, a disk reservation step, the near-end notice), a closed log, a UNIQ_KEY generator
 * without compiled state, the pure-Python codec, a failed pwrite (after its key was taken). The caller then runs
 * the Python path (the reference), which handles it and raises its errors. Nothing here decides policy: no
 * lock, no thread, no wait, no file opened.
 *
 * A delayed message (DELAY, TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS) is first rewritten onto
 * SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer by put_rewrite.c, once the engine called set_rewrite() with its
 * services: in the parts this put takes (mq_rewrite_direct: the topic and queue replaced, the rewrite's properties
 * written after the message's own), or, for the shapes that does not take, as a new Message put as any other.
 * What put_rewrite.c hands back (bad input, a timer thread not started) returns None here, and the Python path
 * rewrites it (or raises).
 */
#include "mq_native.h"

#include <errno.h>
#include <structmember.h>
#include <time.h>
#include <unistd.h>


enum {
    K_END, K_APPEND_LIMIT, K_SEGMENT_BASE, K_VIEW, K_SCRATCH, K_SEGMENT_FD, K_FLUSH_LOCK, K_QUEUE_OFFSETS,
    K_WRITTEN, K_END_WORD, K_CODEC, K_UNIQUE_KEYS, K_LAST_STORE_TS, K_TIME_NS, K_WRITE_AT, K_LOCKED, K_APPEND,
    K_CORE, K_COUNT
};
static const char *key_names[K_COUNT] = {
    "_end", "_append_limit", "_segment_base", "_view", "_scratch", "_segment_fd", "_flush_lock", "queue_offsets",
    "_written_records", "_end_word", "codec", "_unique_keys", "last_store_timestamp_ms", "_time_ns", "_write_at",
    "locked", "append", "core"};
static PyObject *keys[K_COUNT];
static PyObject *zero_index = NULL;

/* The writer's state that changes once a segment or less, as refresh() read it (held references). */
typedef struct {
    int64_t append_limit, segment_base;
    int segment_fd;  /* -1: none */
    PyObject *view, *scratch, *flush_lock, *written, *end_word;  /* NULL: None */
    PyObject *unique_keys;  /* the log's UNIQ_KEY generator's compiled state (UniqueKeys); NULL: no UNIQ_KEYs */
    int64_t *end_at;  /* end_word's word 0 when it is a numpy int64 array (written directly), else NULL */
    Py_buffer end_buffer;  /* held while end_at is set (of end_word, which `cached` holds) */
} writer_state;

/* A (topic, queue id) key of `queue_offsets` made before, with its hash and the topic's tails: a put of a topic
 * with the same text and the same queue id uses them again instead of making and hashing a new tuple and looking
 * the topic up (queue_key_of, topic_tails_of). A user's loop makes a new topic str for every message (an
 * f-string), so the slot is found by the topic's text, not its address. The key is the one `queue_offsets` holds
 * (queue_key_of puts it there), so the table's lookup and store find it by identity, without comparing tuples.
 * The tails are used while `_topic_tails` keeps the version tag it had when they were read. */
#define QUEUE_KEYS 256
typedef struct {
    PyObject *topic, *key, *tails;  /* held; NULL: empty (tails NULL: look the topic up) */
    int64_t queue_id;
    Py_hash_t hash;
    uint64_t tails_version;  /* `_topic_tails`' ma_version_tag when `tails` was read */
} queue_key_slot;

typedef struct {
    PyObject_HEAD
    PyObject *state;          /* the CommitLog's __dict__: the writer's state, read and written on every call */
    PyObject *clock_globals;  /* commitlog.py's module dict: `_time_ns`, `_write_at` (tests replace them), limits */
    PyObject *time_ns;        /* time.time_ns: when `_time_ns` is it, the clock is read here directly */
    PyObject *write_at;       /* the compiled write_at: when `_write_at` is another, write-through is left to Python */
    PyObject *topic_tails;    /* CommitLog._topic_tails */
    PyObject *result_type;    /* PutResult */
    PyObject *ok_status;      /* PutStatus.PUT_OK */
    long long queues_max, body_max;
    long long described_tail_max;  /* commitlog.py's DESCRIBED_TAIL_BYTES_MAX: longer tails are not described */
    long long write_through_max;   /* its WRITE_THROUGH_RECORD_BYTES_MAX: larger records go to the mapping */
    int record_crc;
    uint8_t born_host[MQ_HOST_V4_LENGTH], store_host[MQ_HOST_V4_LENGTH];
    char msg_id_prefix[2 * MQ_HOST_V4_LENGTH];  /* the store host's 8 bytes in upper-case hex */
    int usable;               /* refresh() found a state this path writes in (else every put returns None) */
    writer_state cached;      /* what refresh() read; its objects are held (strong references) */
    /* What this path last wrote into the log's __dict__ (`_end`, `last_store_timestamp_ms`) and read from it
     * (`queue_offsets`), valid while the dict's version tag is `known_version` (CPython 3.11: every change of a
     * dict gives it a new tag), so that nobody else has written it since: see read_end and publish. */
    int known;
    uint64_t known_version;
    int64_t known_end;
    PyObject *known_end_value, *known_ts_value;  /* held: the ints written */
    PyObject *known_queue_offsets;               /* borrowed from the dict, which holds it while the tag holds */
    int64_t known_ts;
    uint64_t read_version;  /* the tag when this put read `_end` (0: unknown) */
    uint64_t real_clock_version;  /* clock_globals' tag when `_time_ns` was time.time_ns (0: unknown) */
    queue_key_slot queue_keys[QUEUE_KEYS];  /* see queue_key_of */
    mq_rewrite rewrite;  /* the delayed messages' rewrites (put_rewrite.c), set by set_rewrite() */
    long long rewritten_in_place;  /* delayed messages put through mq_rewrite_direct (no new Message) */
} AppenderObject;

static void forget_state(AppenderObject *self);

static int appender_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->state);
    Py_VISIT(self->clock_globals);
    Py_VISIT(self->time_ns);
    Py_VISIT(self->write_at);
    Py_VISIT(self->topic_tails);
    Py_VISIT(self->result_type);
    Py_VISIT(self->ok_status);
    Py_VISIT(self->cached.view);
    Py_VISIT(self->cached.scratch);
    Py_VISIT(self->cached.flush_lock);
    Py_VISIT(self->cached.written);
    Py_VISIT(self->cached.end_word);
    Py_VISIT(self->cached.unique_keys);
    Py_VISIT(self->known_end_value);
    Py_VISIT(self->known_ts_value);
    int visited = mq_rewrite_traverse(&self->rewrite, visit, arg);
    if (visited) return visited;
    for (int i = 0; i < QUEUE_KEYS; i++) {
        Py_VISIT(self->queue_keys[i].topic);
        Py_VISIT(self->queue_keys[i].key);
        Py_VISIT(self->queue_keys[i].tails);
    }
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
    mq_rewrite_clear(&self->rewrite);
    for (int i = 0; i < QUEUE_KEYS; i++) {
        Py_CLEAR(self->queue_keys[i].topic);
        Py_CLEAR(self->queue_keys[i].key);
        Py_CLEAR(self->queue_keys[i].tails);
    }
    forget_state(self);
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

/* An int of commitlog.py's module dict (its named limits, read once: one definition of each). */
static int module_int(PyObject *globals, const char *name, long long *out) {
    PyObject *value = PyDict_GetItemString(globals, name);
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "the module dict has no int %s", name);
        return -1;
    }
    *out = PyLong_AsLongLong(value);
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
    self->topic_tails = self->state == NULL ? NULL : PyObject_GetAttrString(log, "_topic_tails");
    self->clock_globals = Py_NewRef(clock_globals);
    self->time_ns = Py_NewRef(time_ns);
    self->write_at = Py_NewRef(write_at);
    self->result_type = Py_NewRef(result_type);
    self->ok_status = Py_NewRef(ok_status);
    self->cached.segment_fd = -1;
    self->cached.append_limit = -1;
    PyObject *record_crc = self->topic_tails == NULL ? NULL : PyObject_GetAttrString(log, "record_crc");
    if (self->topic_tails == NULL || record_crc == NULL || !PyDict_Check(self->topic_tails) ||
        (self->record_crc = PyObject_IsTrue(record_crc)) < 0 ||
        attribute_int(log, "max_queues_per_topic", &self->queues_max) < 0 ||
        attribute_int(log, "max_message_size_bytes", &self->body_max) < 0 ||
        attribute_host(log, "born_host_raw", self->born_host) < 0 ||
        attribute_host(log, "store_host_raw", self->store_host) < 0 ||
        module_int(clock_globals, "DESCRIBED_TAIL_BYTES_MAX", &self->described_tail_max) < 0 ||
        module_int(clock_globals, "WRITE_THROUGH_RECORD_BYTES_MAX", &self->write_through_max) < 0) {
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


static void forget_state(AppenderObject *self) {
    writer_state *c = &self->cached;
    self->usable = 0;
    self->known = 0;
    Py_CLEAR(self->known_end_value);
    Py_CLEAR(self->known_ts_value);
    Py_CLEAR(c->view);
    Py_CLEAR(c->scratch);
    Py_CLEAR(c->flush_lock);
    Py_CLEAR(c->written);
    Py_CLEAR(c->end_word);
    Py_CLEAR(c->unique_keys);
    if (c->end_at != NULL) PyBuffer_Release(&c->end_buffer);
    c->end_at = NULL;
    c->append_limit = -1;
    c->segment_base = 0;
    c->segment_fd = -1;
}

static PyObject *held(PyObject *value) { return value == Py_None ? NULL : Py_NewRef(value); }

/* Read the state from the log's __dict__ into `cached`: 1 when it is one this path writes in, 0 when not (every
 * put then returns None until the next refresh), -1 with an error. */
static int read_state(AppenderObject *self) {
    forget_state(self);
    /* The UNIQ_KEY generator's compiled state first: its `core` may be Python code, after which the items read
     * below are read (and held) with no Python code run between. */
    PyObject *generator = PyDict_GetItemWithError(self->state, keys[K_UNIQUE_KEYS]);
    if (generator == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *unique_keys = NULL;
    if (generator != Py_None) {  /* UNIQ_KEYs: from the generator's compiled state, else Python's */
        unique_keys = PyObject_GetAttr(generator, keys[K_CORE]);
        if (unique_keys == NULL) return -1;
        if (!mq_is_unique_keys(unique_keys)) {
            Py_DECREF(unique_keys);
            return 0;
        }
    }
    PyObject *item[K_UNIQUE_KEYS + 1];
    for (int k = K_APPEND_LIMIT; k <= K_UNIQUE_KEYS; k++) {
        if (k == K_QUEUE_OFFSETS || k == K_UNIQUE_KEYS) continue;  /* read on every put; read above */
        item[k] = PyDict_GetItemWithError(self->state, keys[k]);
        if (item[k] == NULL || (k == K_CODEC && item[k] == Py_None)) {  /* None: the pure-Python codec */
            Py_XDECREF(unique_keys);
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    writer_state *c = &self->cached;
    c->unique_keys = unique_keys;  /* held; let go by forget_state */
    if (item[K_VIEW] == Py_None || !PyLong_CheckExact(item[K_APPEND_LIMIT]) ||
        !PyLong_CheckExact(item[K_SEGMENT_BASE]))
        return 0;  /* no segment (before the first append, closed, truncated) */
    int overflow = 0;
    c->append_limit = PyLong_AsLongLongAndOverflow(item[K_APPEND_LIMIT], &overflow);
    if (overflow) return 0;
    c->segment_base = PyLong_AsLongLongAndOverflow(item[K_SEGMENT_BASE], &overflow);
    if (overflow) return 0;
    if (PyLong_CheckExact(item[K_SEGMENT_FD])) {
        long fd = PyLong_AsLongAndOverflow(item[K_SEGMENT_FD], &overflow);
        c->segment_fd = overflow || fd < 0 || fd > INT32_MAX ? -1 : (int)fd;
    }
    c->view = Py_NewRef(item[K_VIEW]);
    c->scratch = held(item[K_SCRATCH]);
    c->flush_lock = held(item[K_FLUSH_LOCK]);
    c->written = held(item[K_WRITTEN]);
    c->end_word = held(item[K_END_WORD]);
    /* A numpy int64 array (the dispatch process's control words): word 0 is stored here directly (an aligned
     * 8-byte store, as numpy's setitem makes), not through setitem's index parsing (about 0.3k instructions).
     * The array cannot be resized, and it is held (with the buffer) while `cached` refers to it. */
    if (c->end_word != NULL && strcmp(Py_TYPE(c->end_word)->tp_name, "numpy.ndarray") == 0) {
        Py_buffer *view = &c->end_buffer;
        if (PyObject_GetBuffer(c->end_word, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND) < 0) {
            PyErr_Clear();  /* setitem then */
        } else if (view->itemsize == 8 && view->len >= 8 && view->format != NULL &&
                   (strcmp(view->format, "l") == 0 || strcmp(view->format, "q") == 0) &&
                   ((uintptr_t)view->buf & 7) == 0) {
            c->end_at = (int64_t *)view->buf;
        } else {
            PyBuffer_Release(view);
        }
    }
    self->usable = 1;
    return 1;
}

PyDoc_STRVAR(appender_refresh_doc,
"refresh() -> bool\n\n"
"Copy the writer's state that changes once a segment or less from the log (see commitlog/csrc/put.c); the log\n"
"calls it after each change of it. False when puts must take the Python path until the next refresh.");

static PyObject *appender_refresh(AppenderObject *self, PyObject *unused) {
    int usable = read_state(self);
    if (usable < 0) return NULL;
    return PyBool_FromLong(usable);
}

/* The store clock in ms, as `_time_ns() // 1_000_000` in commitlog.py; 0 with *ms set (*real: read from
 * CLOCK_REALTIME, the clock time.time_ns reads), or -1 with an error. The module dict's version tag, while it is
 * the one seen when `_time_ns` was time.time_ns, spares the lookup. */
static int store_clock_ms(AppenderObject *self, int64_t *ms, int *real) {
    uint64_t version = 0;
#ifdef MQ_DICT_VERSION
    version = ((PyDictObject *)self->clock_globals)->ma_version_tag;
#endif
    PyObject *clock = version != 0 && version == self->real_clock_version ? self->time_ns
                      : PyDict_GetItemWithError(self->clock_globals, keys[K_TIME_NS]);
    if (clock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "commitlog._time_ns is missing");
        return -1;
    }
    *real = clock == self->time_ns;
    if (*real) {  /* time.time_ns is clock_gettime(CLOCK_REALTIME) */
        self->real_clock_version = version;
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

/* Whether the record goes through the scratch and pwrite (CommitLog.write_through): 1, 0, 2 when `_write_at` is
 * not the compiled one (a test's fault injection: the Python path writes), or -1 on error. */
static int writes_through(AppenderObject *self, const writer_state *s, int64_t size) {
    if (s->scratch == NULL || size > self->write_through_max) return 0;
    PyObject *write_at = PyDict_GetItemWithError(self->clock_globals, keys[K_WRITE_AT]);
    if (write_at != self->write_at) return PyErr_Occurred() ? -1 : 2;
    if (mq_is_writer_lock(s->flush_lock)) return !mq_writer_lock_held(s->flush_lock);  /* no call: put_entry.c */
    PyObject *locked = PyObject_CallMethodNoArgs(s->flush_lock, keys[K_LOCKED]);
    if (locked == NULL) return -1;
    int held = PyObject_IsTrue(locked);
    Py_DECREF(locked);
    return held < 0 ? -1 : !held;
}

/* pwrite all of `data` at `position` of the segment's file, with the GIL let go (a stalled disk must not stop
 * every thread): 0, or -1 with errno set (nothing is published then; the Python path writes the record again and
 * reports the error). The caller holds the writer lock, so that no other thread writes, rolls or closes the
 * segment meanwhile, and a buffer of `data` (write_record), so that nothing can free or resize it. */
static int write_all(int fd, const uint8_t *data, int64_t length, int64_t position) {
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    while (length > 0) {
        ssize_t written = pwrite(fd, data, (size_t)length, (off_t)position);
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
        length -= written;
        position += written;
    }
    Py_END_ALLOW_THREADS
    errno = error;
    return error == 0 ? 0 : -1;
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
    /* each made only while the one before was (no call with an exception set) */
    PyObject *msg_id = PyUnicode_New(4 * MQ_HOST_V4_LENGTH, 127);
    PyObject *size_value = msg_id == NULL ? NULL : PyLong_FromLongLong(size);
    PyObject *result = size_value == NULL ? NULL
                       : ((PyTypeObject *)self->result_type)->tp_alloc((PyTypeObject *)self->result_type, 6);
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

/* A dict's get and set with the key's hash known (the queue key's, kept in its slot): the private calls of
 * CPython 3.11-3.12, else the public ones, which hash the tuple again. */
static PyObject *dict_get_known_hash(PyObject *dict, PyObject *key, Py_hash_t hash) {
#ifdef MQ_KNOWN_HASH
    return _PyDict_GetItem_KnownHash(dict, key, hash);
#else
    (void)hash;
    return PyDict_GetItemWithError(dict, key);
#endif
}

static int dict_set_known_hash(PyObject *dict, PyObject *key, PyObject *value, Py_hash_t hash) {
#ifdef MQ_KNOWN_HASH
    return _PyDict_SetItem_KnownHash(dict, key, value, hash);
#else
    (void)hash;
    return PyDict_SetItem(dict, key, value);
#endif
}

/* The slot of (topic, queue id), found by the topic's text: FNV-1a of its first 16 code units' bytes and its
 * length, mixed with the queue id and mixed again. `topic` is an exact str (mq_message_take checked it). */
static queue_key_slot *queue_slot(AppenderObject *self, PyObject *topic, int64_t queue_id) {
    Py_ssize_t length = PyUnicode_GET_LENGTH(topic), bytes = length * PyUnicode_KIND(topic);
    const uint8_t *text = (const uint8_t *)PyUnicode_DATA(topic);
    uint64_t hash = 1469598103934665603ull ^ (uint64_t)length;
    for (Py_ssize_t i = 0; i < bytes && i < 16; i++) hash = (hash ^ text[i]) * 1099511628211ull;
    hash ^= (uint64_t)queue_id * 0x9E3779B97F4A7C15ull;
    hash = (hash ^ (hash >> 33)) * 0xFF51AFD7ED558CCDull;  /* MurmurHash3's finaliser: every bit moves the index */
    return &self->queue_keys[(hash ^ (hash >> 33)) & (QUEUE_KEYS - 1)];
}

/* Whether `slot` holds (topic, queue id): the same str object, or one of the same text. */
static int slot_holds(const queue_key_slot *slot, PyObject *topic, int64_t queue_id) {
    if (slot->key == NULL || slot->queue_id != queue_id) return 0;
    PyObject *held = slot->topic;
    if (held == topic) return 1;
    Py_ssize_t length = PyUnicode_GET_LENGTH(topic);
    return PyUnicode_GET_LENGTH(held) == length && PyUnicode_KIND(held) == PyUnicode_KIND(topic) &&
           memcmp(PyUnicode_DATA(held), PyUnicode_DATA(topic), (size_t)length * PyUnicode_KIND(topic)) == 0;
}

/* The topic's tails (borrowed; NULL: not a known topic, or an error): the slot's while `_topic_tails` is as it
 * was when they were read, else looked up (a str key: no Python code runs). */
static PyObject *topic_tails_of(AppenderObject *self, PyObject *topic, int64_t queue_id) {
#ifdef MQ_DICT_VERSION
    queue_key_slot *slot = queue_slot(self, topic, queue_id);
    if (slot->tails != NULL && slot->tails_version == ((PyDictObject *)self->topic_tails)->ma_version_tag &&
        slot_holds(slot, topic, queue_id))
        return slot->tails;
#endif
    return PyDict_GetItemWithError(self->topic_tails, topic);
}

/* The (topic, queue id) key of `queue_offsets` (a new reference) and its hash, from its slot when the slot
 * holds this topic and queue id, else made, hashed and kept there (with the message's tails): NULL with an
 * error. A new slot's key replaces an equal key of the table (same value), so that the table holds the slot's.
 * `tails_version`: `_topic_tails`' tag when the message's tails were read. */
static PyObject *queue_key_of(AppenderObject *self, const mq_common_parts *m, PyObject *queue_offsets,
                              uint64_t tails_version, Py_hash_t *hash) {
    queue_key_slot *slot = queue_slot(self, m->topic, m->queue_id_value);
    if (slot_holds(slot, m->topic, m->queue_id_value)) {
        if (slot->tails != m->tails) {  /* read again after `_topic_tails` changed */
            PyObject *old_tails = slot->tails;
            slot->tails = Py_NewRef(m->tails);
            slot->tails_version = tails_version;
            Py_XDECREF(old_tails);
        } else {
            slot->tails_version = tails_version;
        }
        *hash = slot->hash;
        return Py_NewRef(slot->key);
    }
    PyObject *key = PyTuple_Pack(2, m->topic, m->queue_id);
    if (key == NULL) return NULL;
    *hash = PyObject_Hash(key);
    if (*hash == -1) {
        Py_DECREF(key);
        return NULL;
    }
    /* The table's own key: taken out here, the put stores this one with the next value (publish) */
    PyObject *value = dict_get_known_hash(queue_offsets, key, *hash);
    if (value == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    if (value != NULL) {
        Py_INCREF(value);
        int failed = PyDict_DelItem(queue_offsets, key) < 0 || dict_set_known_hash(queue_offsets, key, value,
                                                                                   *hash) < 0;
        Py_DECREF(value);
        if (failed) {
            Py_DECREF(key);
            return NULL;
        }
    }
    PyObject *old_topic = slot->topic, *old_key = slot->key, *old_tails = slot->tails;
    slot->topic = Py_NewRef(m->topic);
    slot->key = Py_NewRef(key);
    slot->tails = Py_NewRef(m->tails);
    slot->queue_id = m->queue_id_value;
    slot->hash = *hash;
    slot->tails_version = tails_version;  /* the tag when they were read: a change since shows */
    Py_XDECREF(old_topic);  /* after the slot is whole: freeing them runs no Python code (a str, a tuple, bytes) */
    Py_XDECREF(old_key);
    Py_XDECREF(old_tails);
    return key;
}

/* After the record is written: the queue offset advanced, the store time, the description for dispatch, the
 * end moved and published (in append_holding_lock's order); then the PutResult. */
static PyObject *publish(AppenderObject *self, const writer_state *s, PyObject *queue_offsets, PyObject *tail,
                         PyObject *queue_key, Py_hash_t queue_hash, PyObject *queue_found, int64_t offset,
                         int64_t queue_offset,
                         int64_t store_ts, int64_t size) {
    /* Unchanged: nobody wrote the log's __dict__ since this put read `_end` from it (a test's clock could have):
     * then `_end` and `last_store_timestamp_ms` hold the ints the last put wrote, which are used again here. */
    int unchanged = 0;
#ifdef MQ_DICT_VERSION
    unchanged = self->read_version != 0 && ((PyDictObject *)self->state)->ma_version_tag == self->read_version;
#endif
    int same_ts = unchanged && self->known && self->known_ts_value != NULL && self->known_ts == store_ts;
    int same_end = unchanged && self->known && self->known_end_value != NULL && self->known_end == offset;
    /* each made only while the ones before were (no call with an exception set) */
    PyObject *queue_value = queue_found != NULL ? Py_NewRef(queue_found) : PyLong_FromLongLong(queue_offset);
    PyObject *next_value = queue_value == NULL ? NULL : PyLong_FromLongLong(queue_offset + 1);
    PyObject *store_value = next_value == NULL ? NULL
                            : same_ts ? Py_NewRef(self->known_ts_value) : PyLong_FromLongLong(store_ts);
    PyObject *offset_value = store_value == NULL ? NULL
                             : same_end ? Py_NewRef(self->known_end_value) : PyLong_FromLongLong(offset);
    PyObject *end_value = offset_value == NULL ? NULL : PyLong_FromLongLong(offset + size);
    int failed = queue_value == NULL || next_value == NULL || store_value == NULL || offset_value == NULL ||
                 end_value == NULL;
    if (!failed) failed = dict_set_known_hash(queue_offsets, queue_key, next_value, queue_hash) < 0 ||
                          (!same_ts && PyDict_SetItem(self->state, keys[K_LAST_STORE_TS], store_value) < 0);
    if (!failed && s->written != NULL && PyBytes_GET_SIZE(tail) <= self->described_tail_max) {
        PyObject *size_value = PyLong_FromLongLong(size);
        PyObject *described = size_value == NULL ? NULL : PyTuple_Pack(6, offset_value, size_value, queue_key,
                                                                       queue_value, store_value, tail);
        Py_XDECREF(size_value);
        PyObject *done = described == NULL ? NULL : PyObject_CallMethodOneArg(s->written, keys[K_APPEND], described);
        Py_XDECREF(described);
        failed = done == NULL;
        Py_XDECREF(done);
    }
    if (!failed) failed = PyDict_SetItem(self->state, keys[K_END], end_value) < 0;
    self->known = 0;
#ifdef MQ_DICT_VERSION
    if (!failed && unchanged) {
        /* What this put wrote is what the dict holds now: the next put need not read it */
        self->known = 1;
        self->known_version = ((PyDictObject *)self->state)->ma_version_tag;
        self->known_end = offset + size;
        Py_XSETREF(self->known_end_value, Py_NewRef(end_value));
        Py_XSETREF(self->known_ts_value, Py_NewRef(store_value));
        self->known_ts = store_ts;
        self->known_queue_offsets = queue_offsets;
    }
#endif
    if (!failed && s->end_at != NULL) __atomic_store_n(s->end_at, offset + size, __ATOMIC_RELEASE);
    else if (!failed && s->end_word != NULL) failed = PyObject_SetItem(s->end_word, zero_index, end_value) < 0;
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
"Append a compiled Message of a known topic (see the module doc of commitlog/csrc/put.c) for a caller that\n"
"holds the writer lock: PutResult(PUT_OK, ...). None, with nothing written and nothing moved, for anything else:\n"
"the caller then runs prepare and append_holding_lock.");

/* The log's end and its queue offset table, read from its __dict__ on every put: 1, 0 (None: the Python path)
 * or -1 with an error. */
static int read_end(AppenderObject *self, int64_t *end, PyObject **queue_offsets) {
#ifdef MQ_DICT_VERSION
    if (self->known && ((PyDictObject *)self->state)->ma_version_tag == self->known_version) {
        *end = self->known_end;  /* what the last put wrote, and nobody since */
        *queue_offsets = self->known_queue_offsets;
        self->read_version = self->known_version;
        return 1;
    }
#endif
    self->known = 0;
    self->read_version = 0;
    PyObject *value = PyDict_GetItemWithError(self->state, keys[K_END]);
    PyObject *table = value == NULL ? NULL : PyDict_GetItemWithError(self->state, keys[K_QUEUE_OFFSETS]);
    if (table == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_CheckExact(value) || !PyDict_CheckExact(table)) return 0;
    int overflow;
    *end = PyLong_AsLongLongAndOverflow(value, &overflow);
    *queue_offsets = table;
#ifdef MQ_DICT_VERSION
    self->read_version = ((PyDictObject *)self->state)->ma_version_tag;
#endif
    return !overflow && *end >= 0;
}

/* --- PROPERTIES of a message with tags, keys, user properties or a UNIQ_KEY ------------------------------- */

static const char name_tags[] = "TAGS", name_keys[] = "KEYS", name_unique[] = "UNIQ_KEY", name_crc[] = "__CRC32#";
/* A message asking for a timer (mqstore/timer/format.py): appender_put rewrites it first (put_rewrite.c); one
 * still asking here (no rewrite set, or the Python path's to do) goes to the Python path. */
static const char name_deliver_ms[] = "TIMER_DELIVER_MS", name_delay_ms[] = "TIMER_DELAY_MS",
                  name_delay_sec[] = "TIMER_DELAY_SEC", name_out_ms[] = "TIMER_OUT_MS";
/* A message with a delay level (mqstore/schedule/format.py): as a timer request, stored on SCHEDULE_TOPIC_XXXX,
 * unless it carries REAL_TOPIC (rewritten already). */
static const char name_delay_level[] = "DELAY", name_real_topic[] = "REAL_TOPIC";

/* Whether `length` bytes hold neither separator, \x01 nor \x02 (nor a space, with `no_space`), byte by byte. */
static int bytes_separator_free(const char *text, Py_ssize_t length, int no_space) {
    for (Py_ssize_t i = 0; i < length; i++) {  /* UTF-8 puts no byte below 0x80 inside a longer character */
        char c = text[i];
        if (c == '\x01' || c == '\x02' || (no_space && c == ' ')) return 0;
    }
    return 1;
}

/* Whether a word of eight bytes may hold a separator: a byte below 3 (a \x00 too) or, with `no_space`, a space. */
static inline int word_suspect(uint64_t word, int no_space) {
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t suspect = (word - ones * 3) & ~word & highs;
    if (no_space) {
        uint64_t spaced = word ^ (ones * ' ');  /* a space becomes a zero byte */
        suspect |= (spaced - ones) & ~spaced & highs;
    }
    return suspect != 0;
}

/* bytes_separator_free eight bytes at a time (the last word overlapping the one before it; 4 to 7 bytes as two
 * overlapping halves of one word): a suspect word (word_suspect) sends the text to the byte-by-byte check, which
 * decides (a \x00 is allowed). */
static int separator_free(const char *text, Py_ssize_t length, int no_space) {
    uint64_t word;
    if (length >= 8) {
        for (Py_ssize_t i = 0; i < length; i += 8) {
            memcpy(&word, text + (length - i >= 8 ? i : length - 8), sizeof word);
            if (word_suspect(word, no_space)) return bytes_separator_free(text, length, no_space);
        }
        return 1;
    }
    if (length >= 4) {
        uint32_t low, high;
        memcpy(&low, text, sizeof low);
        memcpy(&high, text + length - 4, sizeof high);
        word = (uint64_t)high << 32 | low;
        return word_suspect(word, no_space) ? bytes_separator_free(text, length, no_space) : 1;
    }
    return bytes_separator_free(text, length, no_space);
}

/* The UTF-8 bytes of an exact str: an ASCII one's own, read in place; another's through the UTF-8 cache CPython
 * keeps on the str (NULL with an error when it cannot be encoded). */
static inline const char *utf8_of(PyObject *value, Py_ssize_t *length) {
    if (PyUnicode_IS_COMPACT_ASCII(value)) {
        *length = PyUnicode_GET_LENGTH(value);
        return (const char *)PyUnicode_DATA(value);
    }
    return PyUnicode_AsUTF8AndSize(value, length);
}

/* The UTF-8 bytes of `value` when it is an exact str without the separators \x01 and \x02 (nor a space, with
 * `no_space`): 1, else 0 (an error of the encoding is dropped: the Python path raises it). */
static int checked_text(PyObject *value, int no_space, const char **text, Py_ssize_t *length) {
    if (!PyUnicode_CheckExact(value)) return 0;
    *text = utf8_of(value, length);
    if (*text == NULL) {
        PyErr_Clear();
        return 0;
    }
    return separator_free(*text, *length, no_space);
}

static int is_name(const char *text, Py_ssize_t length, const char *name) {
    return (size_t)length == strlen(name) && memcmp(text, name, (size_t)length) == 0;
}

/* A checked text kept in the plan for mq_write_tail, while there is room (else texts -1: it reads them again). */
static inline void keep_text(mq_properties_plan *plan, const char *text, Py_ssize_t length) {
    if (plan->texts >= 0 && plan->texts < MQ_PLAN_TEXTS) {
        plan->text[plan->texts++] = (mq_text){text, length};
    } else {
        plan->texts = -1;
    }
}

/* Check the tags, keys and properties as _properties_text does and measure PROPERTIES: 1, or 0 when the Python
 * path must run (another type, a value it refuses, PROPERTIES over the limit). Used by put_batch's prepare_batch
 * too (message_type.c): one encoding of PROPERTIES for both compiled paths. */
int mq_plan_properties(const mq_message_parts *m, int adds_unique_keys, mq_properties_plan *plan) {
    const char *text;
    Py_ssize_t length, total = 0;
    /* each field set, the text array left as it is: keep_text fills what mq_write_tail reads */
    plan->tags = plan->keys = plan->properties = NULL;
    plan->unique_key = 0;
    plan->suffix = "";
    plan->suffix_length = plan->length = plan->key_count = 0;
    plan->texts = 0;
    if (m->tags != Py_None) {
        if (!checked_text(m->tags, 0, &text, &length) || length == 0) return 0;
        plan->tags = m->tags;
        keep_text(plan, text, length);
        total += sizeof name_tags + length + 1;  /* sizeof counts the \x01 after the name */
    }
    Py_ssize_t count = PyTuple_CheckExact(m->keys) ? PyTuple_GET_SIZE(m->keys)
                       : PyList_CheckExact(m->keys) ? PyList_GET_SIZE(m->keys) : -1;
    if (count < 0) return 0;
    if (count > 0) {
        plan->keys = m->keys;
        plan->key_count = count;
        total += sizeof name_keys + count;  /* the name, \x01, the spaces between keys and the \x02 */
        for (Py_ssize_t i = 0; i < count; i++) {
            if (!checked_text(PySequence_Fast_GET_ITEM(m->keys, i), 1, &text, &length) || length == 0) return 0;
            keep_text(plan, text, length);
            total += length;
        }
    }
    int has_unique_key = 0, timer_request = 0, timer_rewritten = 0, delay_request = 0, delay_rewritten = 0;
    if (m->properties != NULL) {
        if (!PyDict_CheckExact(m->properties)) return 0;
        Py_ssize_t at = 0;
        PyObject *name, *value;
        while (PyDict_Next(m->properties, &at, &name, &value)) {
            const char *value_text;
            Py_ssize_t value_length;
            if (!checked_text(name, 0, &text, &length) || length == 0 ||
                !checked_text(value, 0, &value_text, &value_length))
                return 0;
            if (is_name(text, length, name_tags) || is_name(text, length, name_keys) || is_name(text, length, name_crc))
                return 0;  /* reserved: the Python path says why */
            if (length >= 12 && text[0] == 'T') {  /* TIMER_*: a timer request unless already rewritten */
                timer_request |= is_name(text, length, name_deliver_ms) || is_name(text, length, name_delay_ms) ||
                                 is_name(text, length, name_delay_sec);
                timer_rewritten |= is_name(text, length, name_out_ms);
            }
            delay_request |= length == 5 && is_name(text, length, name_delay_level);
            delay_rewritten |= length == 10 && is_name(text, length, name_real_topic);
            has_unique_key |= is_name(text, length, name_unique);
            keep_text(plan, text, length);
            keep_text(plan, value_text, value_length);
            total += length + value_length + 2;
        }
        if (PyDict_GET_SIZE(m->properties) > 0) plan->properties = m->properties;
    }
    for (int i = 0; i < m->added_count; i++) {  /* a delayed message's rewrite, done in place (put_rewrite.c) */
        const mq_added_property *added = &m->added[i];
        if (!separator_free(added->value, added->value_length, 0)) return 0;
        timer_rewritten |= is_name(added->name, added->name_length, name_out_ms);
        delay_rewritten |= is_name(added->name, added->name_length, name_real_topic);
        total += added->name_length + added->value_length + 2;
    }
    if (timer_request && !timer_rewritten) return 0;  /* the Python path stores it on the timer topic */
    if (delay_request && !delay_rewritten) return 0;  /* the Python path stores it on the schedule topic */
    plan->unique_key = adds_unique_keys && !has_unique_key;
    if (plan->unique_key) total += sizeof name_unique + MQ_UNIQUE_KEY_DIGITS + 1;
    PyObject *after = PyTuple_GET_ITEM(m->common.tails, 3);  /* \x02 + the record-CRC placeholder (or nothing) */
    plan->suffix = PyBytes_AS_STRING(after) + 1;
    plan->suffix_length = PyBytes_GET_SIZE(after) - 1;
    total += plan->suffix_length;
    if (total > MQ_PROPERTIES_LENGTH_MAX) return 0;
    plan->length = total;
    return 1;
}

typedef struct {
    char *at, *end;
} cursor;

static void put_bytes(cursor *c, const char *data, Py_ssize_t length) {
    if (length > c->end - c->at) {  /* the values changed since they were measured: the caller finds it */
        c->at = c->end + 1;
        return;
    }
    memcpy(c->at, data, (size_t)length);
    c->at += length;
}

static void put_text(cursor *c, PyObject *value) {
    Py_ssize_t length;
    const char *text = utf8_of(value, &length);  /* checked by mq_plan_properties */
    if (text == NULL) {
        PyErr_Clear();
        c->at = c->end + 1;
        return;
    }
    put_bytes(c, text, length);
}

/* The tags, keys and user properties from the texts the plan kept (no Python object is read again). */
static void write_kept_texts(cursor *c, const mq_properties_plan *plan) {
    const mq_text *text = plan->text, *end = plan->text + plan->texts;
    if (plan->tags != NULL) {
        put_bytes(c, "TAGS\x01", sizeof name_tags);
        put_bytes(c, text->text, text->length);
        text++;
        put_bytes(c, "\x02", 1);
    }
    if (plan->keys != NULL) {
        put_bytes(c, "KEYS\x01", sizeof name_keys);
        for (Py_ssize_t i = 0; i < plan->key_count; i++, text++) {
            if (i > 0) put_bytes(c, " ", 1);
            put_bytes(c, text->text, text->length);
        }
        put_bytes(c, "\x02", 1);
    }
    for (; text + 1 < end; text += 2) {  /* the properties' names and values */
        put_bytes(c, text[0].text, text[0].length);
        put_bytes(c, "\x01", 1);
        put_bytes(c, text[1].text, text[1].length);
        put_bytes(c, "\x02", 1);
    }
}

/* The tags, keys and user properties read again from their objects (a plan with more texts than it keeps). */
static void write_texts(cursor *c, const mq_properties_plan *plan) {
    if (plan->tags != NULL) {
        put_bytes(c, "TAGS\x01", sizeof name_tags);
        put_text(c, plan->tags);
        put_bytes(c, "\x02", 1);
    }
    if (plan->keys != NULL) {
        put_bytes(c, "KEYS\x01", sizeof name_keys);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(plan->keys); i++) {
            if (i > 0) put_bytes(c, " ", 1);
            put_text(c, PySequence_Fast_GET_ITEM(plan->keys, i));
        }
        put_bytes(c, "\x02", 1);
    }
    if (plan->properties != NULL) {
        Py_ssize_t at = 0;
        PyObject *name, *value;
        while (PyDict_Next(plan->properties, &at, &name, &value)) {
            put_text(c, name);
            put_bytes(c, "\x01", 1);
            put_text(c, value);
            put_bytes(c, "\x02", 1);
        }
    }
}

/* TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES as prepare encodes them, into a new bytes object, with the
 * UNIQ_KEY's digits left as zeros at *key_at (NULL: no UNIQ_KEY); NULL with an error. */
PyObject *mq_write_tail(const mq_message_parts *m, const mq_properties_plan *plan, char **key_at) {
    PyObject *prefix = PyTuple_GET_ITEM(m->common.tails, 0);  /* TOPICLENGTH + TOPIC */
    Py_ssize_t prefix_length = PyBytes_GET_SIZE(prefix);
    PyObject *tail = PyBytes_FromStringAndSize(NULL, prefix_length + 2 + plan->length);
    if (tail == NULL) return NULL;
    cursor c = {PyBytes_AS_STRING(tail), PyBytes_AS_STRING(tail) + PyBytes_GET_SIZE(tail)};
    put_bytes(&c, PyBytes_AS_STRING(prefix), prefix_length);
    char length_bytes[2] = {(char)(plan->length >> 8), (char)(plan->length & 0xFF)};
    put_bytes(&c, length_bytes, 2);
    if (plan->texts >= 0) {
        write_kept_texts(&c, plan);
    } else {
        write_texts(&c, plan);
    }
    for (int i = 0; i < m->added_count; i++) {
        put_bytes(&c, m->added[i].name, m->added[i].name_length);
        put_bytes(&c, "\x01", 1);
        put_bytes(&c, m->added[i].value, m->added[i].value_length);
        put_bytes(&c, "\x02", 1);
    }
    *key_at = NULL;
    if (plan->unique_key) {
        put_bytes(&c, "UNIQ_KEY\x01", sizeof name_unique);
        if (c.at + MQ_UNIQUE_KEY_DIGITS <= c.end) *key_at = c.at;
        put_bytes(&c, "00000000000000000000000000000000", MQ_UNIQUE_KEY_DIGITS);
        put_bytes(&c, "\x02", 1);
    }
    put_bytes(&c, plan->suffix, plan->suffix_length);
    if (c.at != c.end) {
        Py_DECREF(tail);
        PyErr_SetString(PyExc_RuntimeError, "a message's properties changed while it was put");
        return NULL;
    }
    return tail;
}

/* --- the put ------------------------------------------------------------------------------------------------ */

/* The record's tail (a new reference; `key_at` where its UNIQ_KEY digits go, or NULL): 1, 0 for the Python path,
 * -1 with an error. Sets *size to the record's size. */
static int plan_record(AppenderObject *self, const writer_state *s, const mq_message_parts *m,
                       mq_properties_plan *plan, int64_t *size) {
    int simple = m->tags == Py_None && s->unique_keys == NULL && m->added_count == 0 &&
                 ((PyTuple_CheckExact(m->keys) && PyTuple_GET_SIZE(m->keys) == 0) ||
                  (PyList_CheckExact(m->keys) && PyList_GET_SIZE(m->keys) == 0)) &&
                 (m->properties == NULL || (PyDict_CheckExact(m->properties) && PyDict_GET_SIZE(m->properties) == 0));
    if (simple) {  /* the topic's cached tail, as it is */
        plan->length = -1;
        *size = MQ_HEADER_SIZE + PyBytes_GET_SIZE(m->common.body) + PyBytes_GET_SIZE(m->common.tail);
        return 1;
    }
    if (!mq_plan_properties(m, s->unique_keys != NULL, plan)) return 0;
    *size = MQ_HEADER_SIZE + PyBytes_GET_SIZE(m->common.body) +
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(m->common.tails, 0)) + 2 +
            plan->length;
    return 1;
}

/* The put, with `s` a copy of the cached state whose objects the caller holds. The message's fields are taken
 * (strong references) before they are checked, and the tail is built from its tags, keys and properties before
 * the first point that can run Python code (the queue key tuple, a test's clock, the PutResult: any allocation
 * of a tracked object may run a collection's finalizers): what is written is the message as it was taken. */
static PyObject *put_with(AppenderObject *self, const writer_state *s, PyObject *message,
                          const mq_rewrite_decision *decided) {
    mq_message_parts parts;
    const mq_common_parts *m = &parts.common;
    mq_properties_plan plan;  /* plan_record sets what is read of it */
    int64_t offset, size;
    PyObject *queue_offsets;
    int ready = read_end(self, &offset, &queue_offsets);
    if (ready <= 0) return ready < 0 ? NULL : Py_NewRef(Py_None);
    if (!mq_message_take(message, self->queues_max, self->body_max, &parts)) return Py_NewRef(Py_None);
    if (decided->kind != 0) {  /* a delayed message, moved to its service's topic in `parts` (no Python code) */
        int moved = mq_rewrite_direct(&self->rewrite, decided, &parts);
        if (moved <= 0) {
            mq_message_parts_release(&parts);
            return moved < 0 ? NULL : Py_NewRef(Py_None);
        }
    }
    uint64_t tails_version = 0;
#ifdef MQ_DICT_VERSION
    tails_version = ((PyDictObject *)self->topic_tails)->ma_version_tag;
#endif
    if (!mq_message_set_tails(&parts, topic_tails_of(self, m->topic, m->queue_id_value)))
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(queue_offsets);  /* the log's table: a finalizer may replace the attribute */
    PyObject *tail = NULL, *queue_key = NULL, *result = NULL, *found = NULL;
    if (!plan_record(self, s, &parts, &plan, &size) ||
        offset + size + MQ_END_FILE_MIN_BLANK_LENGTH > s->append_limit || offset < s->segment_base) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);  /* the Python path; a roll is _roll's work */
        goto done;
    }
    /* The tail is built right after the plan measured it, before anything that may run Python code (the keys
     * list and the properties dict are read in place) */
    char *key_at = NULL;
    tail = plan.length < 0 ? Py_NewRef(m->tail) : mq_write_tail(&parts, &plan, &key_at);
    if (tail == NULL) goto done;
    int through = writes_through(self, s, size);
    if (through < 0) goto done;
    if (through == 2 || (through && s->segment_fd < 0)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* From here on the put is made: the Python path is taken again only when a pwrite fails */
    Py_hash_t queue_hash = -1;
    queue_key = queue_key_of(self, m, queue_offsets, tails_version, &queue_hash);
    if (queue_key == NULL) goto done;
    int64_t queue_offset = 0, store_ts;
    found = dict_get_known_hash(queue_offsets, queue_key, queue_hash);
    if (found != NULL) {
        queue_offset = PyLong_AsLongLong(found);
        if (queue_offset == -1 && PyErr_Occurred()) {
            found = NULL;
            goto done;
        }
        found = PyLong_CheckExact(found) ? Py_NewRef(found) : NULL;  /* held: the PutResult's queue offset */
    } else if (PyErr_Occurred()) {
        goto done;
    }
    int real_clock;
    if (store_clock_ms(self, &store_ts, &real_clock) < 0) goto done;
    if (key_at != NULL && (real_clock ? mq_unique_key_next_at(s->unique_keys, key_at, store_ts)
                                      : mq_unique_key_next(s->unique_keys, key_at)) < 0)
        goto done;
    int64_t body_length = PyBytes_GET_SIZE(m->body);
    mq_record r = {
        .size = size, .queue_id = m->queue_id_value, .flag = m->flag, .queue_offset = queue_offset,
        .physical_offset = offset, .born_timestamp = m->born_timestamp_ms < 0 ? store_ts : m->born_timestamp_ms,
        .store_timestamp = store_ts, .body = (const uint8_t *)PyBytes_AS_STRING(m->body), .body_length = body_length,
        .tail = (const uint8_t *)PyBytes_AS_STRING(tail), .tail_length = PyBytes_GET_SIZE(tail)};
    r.body_crc = mq_crc32(0, r.body, (size_t)body_length) & 0x7FFFFFFFu;
    const char *problem = mq_check_record(&r, self->record_crc);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    int64_t position = offset - s->segment_base;
    int written = write_record(through ? s->scratch : s->view, through ? 0 : position, &r, self->born_host,
                               self->store_host, self->record_crc, through ? s->segment_fd : -1, position);
    if (written < 0) goto done;
    if (written == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = publish(self, s, queue_offsets, tail, queue_key, queue_hash, found, offset, queue_offset, store_ts,
                     size);
    if (result != NULL && decided->kind != 0) self->rewritten_in_place++;
done:
    Py_XDECREF(found);
    Py_XDECREF(queue_key);
    Py_XDECREF(tail);
    Py_DECREF(queue_offsets);
    mq_message_parts_release(&parts);
    return result;
}

static void hold_state(writer_state *s, int hold) {
    PyObject *objects[] = {s->view, s->scratch, s->flush_lock, s->written, s->end_word, s->unique_keys};
    for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++) {
        if (hold) Py_XINCREF(objects[i]);
        else Py_XDECREF(objects[i]);
    }
}

static PyObject *appender_put(AppenderObject *self, PyObject *message) {
    if (!self->usable) Py_RETURN_NONE;
    PyObject *rewritten = NULL;
    mq_rewrite_decision decided = {0};
    if (self->rewrite.timer != NULL || self->rewrite.schedule != NULL) {  /* before the state is copied: the
                                                                          * rewrite may run Python code */
        int planned = mq_rewrite_prepare(&self->rewrite, message, &decided);  /* DIRECT: `decided` holds */
        if (planned < 0) return NULL;
        if (planned == MQ_REWRITE_FALLBACK) {  /* a shape the put does not move in place: a new Message */
            rewritten = mq_rewrite_apply(&self->rewrite, message);
            if (rewritten == NULL || rewritten == Py_None) return rewritten;
            message = rewritten;
        }
    }
    /* A copy whose objects this call holds: a refresh() while Python code runs inside the call (a test's clock, a
     * collection's finalizer letting another thread in) cannot free what is being written. */
    writer_state s = self->cached;
    hold_state(&s, 1);
    PyObject *result = self->usable ? put_with(self, &s, message, &decided) : Py_NewRef(Py_None);
    hold_state(&s, 0);
    mq_rewrite_decision_release(&decided);
    Py_XDECREF(rewritten);
    return result;
}

PyDoc_STRVAR(appender_set_rewrite_doc,
"set_rewrite(timer, schedule, system_clock, max_delay_ms, level_count, queues_max)\n\n"
"Rewrite delayed messages in put() as the services' Python `rewrite` methods do (commitlog/csrc/put_rewrite.c):\n"
"timer and schedule are the TimerService and ScheduleService (None: that rewrite is left to Python).");

PyDoc_STRVAR(appender_rewrite_doc,
"rewrite(message) -> Message or None\n\n"
"The message put() would write for `message` (itself when it is not delayed), or None where the Python rewrite\n"
"must decide (put_batch's compiled prepare: commitlog/write_batch.py).");

static PyObject *appender_rewrite(AppenderObject *self, PyObject *message) {
    if (self->rewrite.timer == NULL && self->rewrite.schedule == NULL) return Py_NewRef(message);
    return mq_rewrite_apply(&self->rewrite, message);
}

static PyObject *appender_set_rewrite(AppenderObject *self, PyObject *args) {
    if (mq_rewrite_set(&self->rewrite, args) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyTypeObject *appender_type = NULL;  /* the module keeps it alive */

int mq_is_appender(PyObject *object) { return appender_type != NULL && Py_TYPE(object) == appender_type; }

PyObject *mq_appender_put(PyObject *appender, PyObject *message) {
    return appender_put((AppenderObject *)appender, message);
}

static PyMemberDef appender_members[] = {
    {"rewritten_in_place", T_LONGLONG, offsetof(AppenderObject, rewritten_in_place), READONLY,
     "how many delayed messages put() rewrote in place, with no new Message (put_rewrite.c)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef appender_methods[] = {
    {"put", (PyCFunction)appender_put, METH_O, appender_put_doc},
    {"refresh", (PyCFunction)appender_refresh, METH_NOARGS, appender_refresh_doc},
    {"set_rewrite", (PyCFunction)appender_set_rewrite, METH_VARARGS, appender_set_rewrite_doc},
    {"rewrite", (PyCFunction)appender_rewrite, METH_O, appender_rewrite_doc},
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
    {Py_tp_members, appender_members},
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
    if (zero_index == NULL || mq_rewrite_init() < 0) return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &appender_spec, NULL);
    if (type == NULL) return -1;
    appender_type = (PyTypeObject *)type;
    int added = PyModule_AddObjectRef(module, "Appender", type);
    Py_DECREF(type);
    return added;
}
