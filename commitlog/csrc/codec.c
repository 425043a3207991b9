/* Encoding records into a mapped segment (put, put_batch) and decoding them for get and read_at.
 *
 * The layout is commitlog/format.py's "Record, version 1" table; the offsets are mq_native.h's MQ_OFFSET_*.
 * Python keeps the writer lock, the roll decision and the offsets; these functions get a buffer of the mapping
 * (held through the buffer protocol for the whole call, so that nothing can unmap it underneath), a position
 * and the fields, check every bound, and write or read bytes.
 *
 * Decoding accepts only what the pure-Python fast paths accept (commitlog/message.py decode_message and
 * decode_records: v1 records with IPv4 hosts, every rule checked). Anything else, a valid record of another
 * shape or a damaged one, is handed back undecoded, and the Python reference decodes it or raises its
 * CorruptionError (file, offset, rule): one source of error reports, so both codecs report damage alike.
 */
#include "mq_native.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define MQ_STORED_MESSAGE_FIELDS 18
/* Runs of records over this many bytes are written with the GIL let go (a thread switch costs about 25 us
 * here; a run this long takes longer than that to copy and checksum). */
#define MQ_RELEASE_GIL_BYTES (256 * 1024)

/* ------------------------------------------------------------------------------------------------------------ */
/* Helpers                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

static int get_writable(PyObject *object, Py_buffer *view) {
    if (PyObject_GetBuffer(object, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != 1) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the target must be a byte buffer");
        return -1;
    }
    return 0;
}

static int get_int64_array(PyObject *object, Py_buffer *view, Py_ssize_t count, const char *what) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *format = view->format == NULL ? "B" : view->format;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (view->itemsize != 8 || (strcmp(format, "q") != 0 && strcmp(format, "l") != 0) ||
        view->len / 8 < count) {
        PyErr_Format(PyExc_ValueError, "%s must be int64 with at least %zd items", what, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int as_int64(PyObject *object, int64_t *value) {
    long long v = PyLong_AsLongLong(object);
    if (v == -1 && PyErr_Occurred()) return -1;
    *value = (int64_t)v;
    return 0;
}

/* list[index] as an int64 and the item itself in *held (a new reference; NULL unless 1 is returned): 1 when the
 * list still has that item, 0 when it is shorter now, -1 with an exception. The item is held while it is
 * converted: its __index__ may run Python code that changes the list. */
static int list_item_held(PyObject *list, Py_ssize_t index, int64_t *value, PyObject **held) {
    *held = NULL;
    if (index >= PyList_GET_SIZE(list)) return 0;
    PyObject *item = PyList_GET_ITEM(list, index);
    Py_INCREF(item);
    if (as_int64(item, value) < 0) {
        Py_DECREF(item);
        return -1;
    }
    *held = item;
    return 1;
}

/* list[index] as an int64, as list_item_held, without keeping the item. */
static int list_item_int64(PyObject *list, Py_ssize_t index, int64_t *value) {
    PyObject *held;
    int status = list_item_held(list, index, value, &held);
    Py_XDECREF(held);
    return status;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Encoding                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

static int check_record_or_raise(const mq_record *r, int record_crc) {
    const char *problem = mq_check_record(r, record_crc);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return -1;
    }
    return 0;
}

static int get_host(PyObject *object, const uint8_t **host) {
    if (!PyBytes_Check(object) || PyBytes_GET_SIZE(object) != MQ_HOST_V4_LENGTH) {
        PyErr_SetString(PyExc_ValueError, "a host is 8 bytes (IPv4 address and port)");
        return -1;
    }
    *host = (const uint8_t *)PyBytes_AS_STRING(object);
    return 0;
}

PyDoc_STRVAR(encode_record_doc,
"encode_record(target, position, size, body_crc, queue_id, flag, queue_offset, commitlog_offset,\n"
"              born_timestamp_ms, born_host, store_timestamp_ms, store_host, body, tail, record_crc) -> None\n\n"
"Write one v1 record (format.py) at target[position:position + size]: the header, the body, `tail` (TOPICLENGTH,\n"
"TOPIC, PROPERTIESLENGTH, PROPERTIES) and, when `record_crc`, the record-CRC digits into the placeholder that\n"
"ends `tail`. ValueError when the record does not fit the target or a field is out of range.");

static PyObject *encode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "encode_record takes 15 arguments");
        return NULL;
    }
    mq_record r;
    int64_t position;
    const uint8_t *born_host, *store_host;
    if (as_int64(args[1], &position) < 0 || as_int64(args[2], &r.size) < 0 || as_int64(args[3], &r.body_crc) < 0 ||
        as_int64(args[4], &r.queue_id) < 0 || as_int64(args[5], &r.flag) < 0 ||
        as_int64(args[6], &r.queue_offset) < 0 || as_int64(args[7], &r.physical_offset) < 0 ||
        as_int64(args[8], &r.born_timestamp) < 0 || get_host(args[9], &born_host) < 0 ||
        as_int64(args[10], &r.store_timestamp) < 0 || get_host(args[11], &store_host) < 0)
        return NULL;
    int record_crc = PyObject_IsTrue(args[14]);
    if (record_crc < 0) return NULL;
    if (!PyBytes_Check(args[12]) || !PyBytes_Check(args[13])) {
        PyErr_SetString(PyExc_TypeError, "body and tail must be bytes");
        return NULL;
    }
    r.body = (const uint8_t *)PyBytes_AS_STRING(args[12]);
    r.body_length = PyBytes_GET_SIZE(args[12]);
    r.tail = (const uint8_t *)PyBytes_AS_STRING(args[13]);
    r.tail_length = PyBytes_GET_SIZE(args[13]);
    if (check_record_or_raise(&r, record_crc) < 0) return NULL;
    Py_buffer target;
    if (get_writable(args[0], &target) < 0) return NULL;
    if (position < 0 || position > (int64_t)target.len || r.size > (int64_t)target.len - position) {
        PyErr_Format(PyExc_ValueError, "a record of %lld bytes at %lld does not fit a buffer of %zd",
                     (long long)r.size, (long long)position, target.len);
        PyBuffer_Release(&target);
        return NULL;
    }
    mq_write_record((uint8_t *)target.buf + position, &r, born_host, store_host, record_crc);
    PyBuffer_Release(&target);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(encode_blank_doc,
"encode_blank(target, position, length) -> None\n\n"
"Write the end-of-segment blank (TOTALSIZE = length, MAGICCODE = 0xCBD43194) at target[position:]; `length` is\n"
"what is left of the segment, at least 8 bytes, all inside the target.");

static PyObject *encode_blank(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t position, length;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_blank takes 3 arguments");
        return NULL;
    }
    if (as_int64(args[1], &position) < 0 || as_int64(args[2], &length) < 0) return NULL;
    Py_buffer target;
    if (get_writable(args[0], &target) < 0) return NULL;
    if (position < 0 || length < MQ_END_FILE_MIN_BLANK_LENGTH || length > INT32_MAX ||
        position > (int64_t)target.len || length > (int64_t)target.len - position) {
        PyErr_Format(PyExc_ValueError, "a blank of %lld bytes at %lld does not fit a buffer of %zd",
                     (long long)length, (long long)position, target.len);
        PyBuffer_Release(&target);
        return NULL;
    }
    uint8_t *at = (uint8_t *)target.buf + position;
    mq_put_u32(at + MQ_OFFSET_TOTAL_SIZE, (uint32_t)length);
    mq_put_u32(at + MQ_OFFSET_MAGIC_CODE, MQ_BLANK_MAGIC_CODE);
    PyBuffer_Release(&target);
    Py_RETURN_NONE;
}

/* pwrite all `length` bytes at `position`, retrying short writes and EINTR; 0 or the errno. */
static int write_all(int fd, const uint8_t *data, int64_t length, int64_t position) {
    while (length > 0) {
        ssize_t written = pwrite(fd, data, (size_t)length, (off_t)position);
        if (written < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (written == 0) return EIO;
        data += written;
        length -= written;
        position += written;
    }
    return 0;
}

PyDoc_STRVAR(encode_run_doc,
"encode_run(target, position, commitlog_offsets, sizes, body_crcs, queue_ids, flags, queue_offsets, born_ms,\n"
"           store_timestamp_ms, born_host, store_host, bodies, tails, first, record_crc, write_to=None) -> int\n\n"
"Write a run of records of a batch (commitlog/write_batch.py's Columns) one after the other from target[position]:\n"
"record i of the run is bodies[first + i] and tails[first + i] with the i-th item of each int64 array\n"
"(born_ms -1: the store timestamp). The commitlog offsets must follow each other by the sizes. Every argument\n"
"is checked before a byte is written; returns the bytes written. With write_to = (fd, file_position), the\n"
"encoded bytes are then written to the file with pwrite (all of them, or OSError), in the same stretch without\n"
"the GIL: `target` is then a scratch buffer.");

static PyObject *encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16 && nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "encode_run takes 16 or 17 arguments");
        return NULL;
    }
    int fd = -1;
    long long file_position = 0;
    if (nargs == 17 && args[16] != Py_None) {
        if (!PyArg_ParseTuple(args[16], "iL:encode_run write_to", &fd, &file_position)) return NULL;
        if (fd < 0 || file_position < 0) {
            PyErr_SetString(PyExc_ValueError, "write_to needs a file descriptor and a position, both >= 0");
            return NULL;
        }
    }
    int64_t position, store_ts, first;
    const uint8_t *born_host, *store_host;
    if (as_int64(args[1], &position) < 0 || as_int64(args[9], &store_ts) < 0 || get_host(args[10], &born_host) < 0 ||
        get_host(args[11], &store_host) < 0 || as_int64(args[14], &first) < 0)
        return NULL;
    int record_crc = PyObject_IsTrue(args[15]);
    if (record_crc < 0) return NULL;
    PyObject *bodies = args[12], *tails = args[13];
    if (!PyList_Check(bodies) || !PyList_Check(tails)) {
        PyErr_SetString(PyExc_TypeError, "bodies and tails must be lists");
        return NULL;
    }
    Py_buffer arrays[7];
    const char *names[7] = {"commitlog_offsets", "sizes", "body_crcs", "queue_ids", "flags", "queue_offsets", "born_ms"};
    int held = 0;
    PyObject *result = NULL;
    mq_record *records = NULL;
    PyObject **strong = NULL;
    Py_ssize_t held_items = 0;
    Py_buffer target;
    int have_target = 0;
    /* the run's length is the offsets array's */
    if (PyObject_GetBuffer(args[2], &arrays[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t count = arrays[0].len / (arrays[0].itemsize ? arrays[0].itemsize : 1);
    PyBuffer_Release(&arrays[0]);
    for (held = 0; held < 7; held++)
        if (get_int64_array(args[2 + held], &arrays[held], count, names[held]) < 0) goto done;
    if (first < 0 || first > PyList_GET_SIZE(bodies) - count || first > PyList_GET_SIZE(tails) - count) {
        PyErr_SetString(PyExc_ValueError, "the run goes past the bodies or tails");
        goto done;
    }
    records = PyMem_Malloc(sizeof(mq_record) * (size_t)(count ? count : 1));
    /* strong references to the bodies and tails the records point into, for the whole call: the GIL is let go
     * while they are copied, and another thread may change the caller's lists meanwhile */
    strong = PyMem_Malloc(sizeof(PyObject *) * (size_t)(2 * count + 1));
    if (records == NULL || strong == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *offsets = arrays[0].buf, *sizes = arrays[1].buf, *crcs = arrays[2].buf, *queue_ids = arrays[3].buf,
                  *flags = arrays[4].buf, *queue_offsets = arrays[5].buf, *born = arrays[6].buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (first + i >= PyList_GET_SIZE(bodies) || first + i >= PyList_GET_SIZE(tails)) {
            PyErr_SetString(PyExc_ValueError, "the run goes past the bodies or tails");
            goto done;
        }
        PyObject *body = PyList_GET_ITEM(bodies, first + i), *tail = PyList_GET_ITEM(tails, first + i);
        if (!PyBytes_Check(body) || !PyBytes_Check(tail)) {
            PyErr_SetString(PyExc_TypeError, "bodies and tails must be bytes");
            goto done;
        }
        Py_INCREF(body);
        Py_INCREF(tail);
        strong[held_items++] = body;
        strong[held_items++] = tail;
        mq_record *r = &records[i];
        r->size = sizes[i];
        r->body_crc = crcs[i];
        r->queue_id = queue_ids[i];
        r->flag = flags[i];
        r->queue_offset = queue_offsets[i];
        r->physical_offset = offsets[i];
        r->born_timestamp = born[i] < 0 ? store_ts : born[i];
        r->store_timestamp = store_ts;
        r->body = (const uint8_t *)PyBytes_AS_STRING(body);
        r->body_length = PyBytes_GET_SIZE(body);
        r->tail = (const uint8_t *)PyBytes_AS_STRING(tail);
        r->tail_length = PyBytes_GET_SIZE(tail);
        if (check_record_or_raise(r, record_crc) < 0) goto done;
        if (offsets[i] != offsets[0] + total) {
            PyErr_SetString(PyExc_ValueError, "the commitlog offsets of a run must follow each other by the sizes");
            goto done;
        }
        total += r->size;
    }
    if (get_writable(args[0], &target) < 0) goto done;
    have_target = 1;
    if (position < 0 || position > (int64_t)target.len || total > (int64_t)target.len - position) {
        PyErr_Format(PyExc_ValueError, "a run of %lld bytes at %lld does not fit a buffer of %zd",
                     (long long)total, (long long)position, target.len);
        goto done;
    }
    uint8_t *at = (uint8_t *)target.buf + position;
    if (fd >= 0) {  /* encode into the scratch buffer, then pwrite it: one stretch without the GIL */
        int error = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) {
            mq_write_record(at, &records[i], born_host, store_host, record_crc);
            at += records[i].size;
        }
        error = write_all(fd, (const uint8_t *)target.buf + position, total, (int64_t)file_position);
        Py_END_ALLOW_THREADS
        if (error != 0) {
            errno = error;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
    } else if (total > MQ_RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) {
            mq_write_record(at, &records[i], born_host, store_host, record_crc);
            at += records[i].size;
        }
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < count; i++) {
            mq_write_record(at, &records[i], born_host, store_host, record_crc);
            at += records[i].size;
        }
    }
    result = PyLong_FromLongLong((long long)total);
done:
    if (have_target) PyBuffer_Release(&target);
    for (int i = 0; i < held; i++) PyBuffer_Release(&arrays[i]);
    PyMem_Free(records);
    for (Py_ssize_t k = 0; k < held_items; k++) Py_DECREF(strong[k]);
    PyMem_Free(strong);
    return result;
}

PyDoc_STRVAR(crc32_zlib_doc, "crc32_zlib(data, value=0) -> int: zlib.crc32 through the linked zlib alone (for "
             "the measurements that chose mq_crc32), with the GIL held.");

static PyObject *crc32_zlib_function(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &value)) return NULL;
    uint32_t crc = mq_crc32_zlib(value, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32_held_doc, "crc32_held(data, value=0) -> int: zlib.crc32's value through mq_crc32, with the GIL "
             "held (crc32() lets it go).");

static PyObject *crc32_held(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &value)) return NULL;
    uint32_t crc = mq_crc32(value, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(body_crc_doc, "body_crc(data) -> int: zlib.crc32(data) & 0x7FFFFFFF, computed with the GIL held.");

static PyObject *body_crc(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    uint32_t crc = mq_crc32(0, (const uint8_t *)view.buf, (size_t)view.len) & 0x7FFFFFFFu;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Decoding                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

/* Host bytes, shared between consecutive records with the same host (bytes are immutable). */
static PyObject *host_bytes(const uint8_t *raw, PyObject **cache) {
    if (*cache != NULL && memcmp(PyBytes_AS_STRING(*cache), raw, MQ_HOST_V4_LENGTH) == 0) {
        Py_INCREF(*cache);
        return *cache;
    }
    PyObject *made = PyBytes_FromStringAndSize((const char *)raw, MQ_HOST_V4_LENGTH);
    if (made == NULL) return NULL;
    Py_XDECREF(*cache);
    Py_INCREF(made);
    *cache = made;
    return made;
}

/* The MAGICCODE of every record build_message gets (mq_locate_record accepts version 1 alone). */
static PyObject *magic_v1 = NULL;

/* A StoredMessage (a tuple subclass: the record's fields in log order, then body, topic and raw properties)
 * for an accepted record. `topic` is the topic's str when the caller knows it, else NULL. `size` and `offset`,
 * when not NULL, are ints (exactly) the caller holds whose values are the record's TOTALSIZE and PHYSICALOFFSET
 * (checked by mq_locate_record): the message takes them instead of new ones, as it shares one object for the two
 * timestamps when they are equal (ints are immutable; a tuple's items are compared by value). */
/* What consecutive messages of one decode share: their hosts' bytes and the last timestamp's int (a batch's
 * messages are mostly born in one millisecond). Ints and bytes are immutable; a tuple's items compare by value. */
typedef struct {
    PyObject *born;
    PyObject *store;
    PyObject *time;
    int64_t time_value;
} mq_message_cache;

static void message_cache_clear(mq_message_cache *cache) {
    Py_CLEAR(cache->born);
    Py_CLEAR(cache->store);
    Py_CLEAR(cache->time);
}

/* The timestamp's int: the cached one when the value repeats, else a new one, then cached. */
static PyObject *time_int(int64_t value, mq_message_cache *cache) {
    if (cache->time != NULL && cache->time_value == value) return Py_NewRef(cache->time);
    PyObject *made = PyLong_FromLongLong(value);
    if (made == NULL) return NULL;
    Py_XSETREF(cache->time, Py_NewRef(made));
    cache->time_value = value;
    return made;
}

static PyObject *build_message(PyTypeObject *type, const uint8_t *record, const mq_layout *l, PyObject *topic,
                               mq_message_cache *cache, PyObject *size, PyObject *offset) {
    if (magic_v1 == NULL && (magic_v1 = PyLong_FromUnsignedLong(MQ_MESSAGE_MAGIC_CODE)) == NULL) return NULL;
    PyObject *message = type->tp_alloc(type, MQ_STORED_MESSAGE_FIELDS);
    if (message == NULL) return NULL;
    PyObject *items[MQ_STORED_MESSAGE_FIELDS];
    int64_t born_timestamp = mq_get_i64(record + MQ_OFFSET_BORN_TIMESTAMP);
    int64_t store_timestamp = mq_get_i64(record + MQ_OFFSET_STORE_TIMESTAMP);
    items[0] = size != NULL ? Py_NewRef(size) : PyLong_FromLongLong(l->size);
    items[1] = Py_NewRef(magic_v1);
    items[2] = PyLong_FromLong(mq_get_i32(record + MQ_OFFSET_BODY_CRC));
    items[3] = PyLong_FromLong(l->queue_id);
    items[4] = PyLong_FromLong(mq_get_i32(record + MQ_OFFSET_FLAG));
    items[5] = PyLong_FromLongLong(l->queue_offset);
    items[6] = offset != NULL ? Py_NewRef(offset)
                              : PyLong_FromLongLong(mq_get_i64(record + MQ_OFFSET_PHYSICAL_OFFSET));
    items[7] = PyLong_FromLong(mq_get_i32(record + MQ_OFFSET_SYS_FLAG));
    items[8] = time_int(born_timestamp, cache);
    items[9] = host_bytes(record + MQ_OFFSET_BORN_HOST, &cache->born);
    items[10] = store_timestamp == born_timestamp && items[8] != NULL ? Py_NewRef(items[8])
                                                                      : time_int(store_timestamp, cache);
    items[11] = host_bytes(record + MQ_OFFSET_STORE_HOST, &cache->store);
    items[12] = PyLong_FromLong(mq_get_i32(record + MQ_OFFSET_RECONSUME_TIMES));
    items[13] = PyLong_FromLongLong(mq_get_i64(record + MQ_OFFSET_PREPARED_TRANSACTION_OFFSET));
    items[14] = PyLong_FromLongLong(l->body_length);
    items[15] = PyBytes_FromStringAndSize((const char *)record + MQ_OFFSET_BODY, (Py_ssize_t)l->body_length);
    if (topic != NULL) {
        Py_INCREF(topic);
        items[16] = topic;
    } else {
        items[16] = PyUnicode_DecodeASCII((const char *)record + l->topic_at, (Py_ssize_t)l->topic_length, NULL);
    }
    items[17] = PyBytes_FromStringAndSize((const char *)record + l->properties_at,
                                         (Py_ssize_t)(l->properties_end - l->properties_at));
    int failed = 0;
    for (int i = 0; i < MQ_STORED_MESSAGE_FIELDS; i++) {
        if (items[i] == NULL) failed = 1;
        PyTuple_SET_ITEM(message, i, items[i]);  /* NULL items are fine: the tuple's dealloc skips them */
    }
    if (failed) {
        Py_DECREF(message);
        return NULL;
    }
    return message;
}

static int check_message_type(PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the message type must be a tuple subclass");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(decode_record_doc,
"decode_record(buffer, position, remaining, commitlog_offset, check_crc, record_crc_from, message_type)\n"
"    -> message or None\n\n"
"decode_message's fast path: the v1 IPv4 record at buffer[position:] (`remaining` bytes of its segment from\n"
"there) as a `message_type` (StoredMessage), checked by format.py's rules (CRCs when `check_crc`; records at or\n"
"past `record_crc_from`, -1 for none, must carry a record CRC). None for anything else: the Python reference\n"
"then decodes it or raises the CorruptionError.");

static PyObject *decode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_record takes 7 arguments");
        return NULL;
    }
    int64_t position, remaining, commitlog_offset, required_from;
    if (as_int64(args[1], &position) < 0 || as_int64(args[2], &remaining) < 0 ||
        as_int64(args[3], &commitlog_offset) < 0 || as_int64(args[5], &required_from) < 0 ||
        check_message_type(args[6]) < 0)
        return NULL;
    int check_crc = PyObject_IsTrue(args[4]);
    if (check_crc < 0) return NULL;
    if (required_from < 0) required_from = INT64_MAX;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *result = Py_None;
    mq_layout layout;
    if (position >= 0 && position <= (int64_t)view.len) {
        int64_t limit = (int64_t)view.len - position;
        if (remaining < limit) limit = remaining;
        const uint8_t *record = (const uint8_t *)view.buf + position;
        if (mq_locate_record(record, limit, commitlog_offset, -1, check_crc, required_from, &layout)) {
            mq_message_cache cache = {0};
            result = build_message((PyTypeObject *)args[6], record, &layout, NULL, &cache, NULL, NULL);
            message_cache_clear(&cache);
            PyBuffer_Release(&view);
            return result;
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(decode_run_doc,
"decode_run(buffer, segment_base_offset, commitlog_offsets, sizes, first, record_crc_from, topic, topic_raw,\n"
"           queue_id, queue_offsets, messages, message_type) -> int\n\n"
"decode_records' fast path over one segment (`buffer`, starting at `segment_base_offset`): decode the records at\n"
"commitlog_offsets[first:] whose TOTALSIZE an index gives in `sizes`, CRCs checked, appending each to `messages`,\n"
"until one lies outside the segment or is not accepted; returns the index of that one (len: all done).\n"
"With `topic` (str; `topic_raw` its bytes), each record must be entry queue_offsets[i] (a list, or an int: the\n"
"entry of the first, consecutive) of (topic, queue_id). A record not accepted goes to the Python reference.");

static PyObject *decode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "decode_run takes 12 arguments");
        return NULL;
    }
    int64_t segment_base, first, required_from, expect_queue_id = 0, queue_start = 0;
    PyObject *offsets = args[2], *sizes = args[3], *topic = args[6], *topic_raw = args[7], *queue_offsets = args[9],
             *messages = args[10];
    if (as_int64(args[1], &segment_base) < 0 || as_int64(args[4], &first) < 0 ||
        as_int64(args[5], &required_from) < 0 || check_message_type(args[11]) < 0)
        return NULL;
    if (required_from < 0) required_from = INT64_MAX;
    if (!PyList_Check(offsets) || !PyList_Check(sizes) || !PyList_Check(messages) ||
        PyList_GET_SIZE(sizes) != PyList_GET_SIZE(offsets)) {
        PyErr_SetString(PyExc_TypeError, "offsets and sizes must be lists of one length, messages a list");
        return NULL;
    }
    int with_queue = topic != Py_None;
    if (with_queue) {
        if (!PyUnicode_Check(topic) || !PyBytes_Check(topic_raw) || as_int64(args[8], &expect_queue_id) < 0)
            return NULL;
        if (PyLong_Check(queue_offsets)) {
            if (as_int64(queue_offsets, &queue_start) < 0) return NULL;
        } else if (!PyList_Check(queue_offsets) || PyList_GET_SIZE(queue_offsets) != PyList_GET_SIZE(offsets)) {
            PyErr_SetString(PyExc_TypeError, "queue_offsets must be an int or a list as long as the offsets");
            return NULL;
        }
    }
    Py_ssize_t count = PyList_GET_SIZE(offsets);
    if (first < 0 || first > count) {
        PyErr_SetString(PyExc_ValueError, "first is outside the offsets");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const uint8_t *base = (const uint8_t *)view.buf;
    int64_t segment_length = (int64_t)view.len;
    mq_message_cache cache = {0};
    Py_ssize_t i = (Py_ssize_t)first;
    int failed = 0, status;
    /* The lists are read item by item, each length checked again before each read: building a message
     * allocates, a collection that starts can run finalizers, and they (or an item's __index__) can change the
     * caller's lists. A list that no longer has item i ends the run there. */
    PyObject *offset_item = NULL, *size_item = NULL;  /* the lists' items i, held for the message to take */
    for (;; i++) {
        int64_t offset, expected_size;
        Py_CLEAR(offset_item);
        Py_CLEAR(size_item);
        if ((status = list_item_held(offsets, i, &offset, &offset_item)) <= 0 ||
            (status = list_item_held(sizes, i, &expected_size, &size_item)) <= 0) {
            failed = status < 0;
            break;
        }
        if (offset < segment_base || offset - segment_base >= segment_length) break;  /* another segment */
        int64_t position = offset - segment_base;
        if (expected_size < MQ_RECORD_SIZE_MIN || expected_size > segment_length - position) break;
        mq_layout layout;
        if (!mq_locate_record(base + position, expected_size, offset, expected_size, 1, required_from, &layout)) break;
        if (with_queue) {
            int64_t expected_entry;
            if (PyLong_Check(queue_offsets)) {
                expected_entry = queue_start + (i - (Py_ssize_t)first);
            } else if ((status = list_item_int64(queue_offsets, i, &expected_entry)) <= 0) {
                failed = status < 0;
                break;
            }
            if (layout.queue_id != expect_queue_id || layout.queue_offset != expected_entry ||
                layout.topic_length != PyBytes_GET_SIZE(topic_raw) ||
                memcmp(base + position + layout.topic_at, PyBytes_AS_STRING(topic_raw), (size_t)layout.topic_length) != 0)
                break;
        }
        PyObject *message = build_message((PyTypeObject *)args[11], base + position, &layout,
                                          with_queue ? topic : NULL, &cache,
                                          PyLong_CheckExact(size_item) ? size_item : NULL,
                                          PyLong_CheckExact(offset_item) ? offset_item : NULL);
        if (message == NULL || PyList_Append(messages, message) < 0) {
            Py_XDECREF(message);
            failed = 1;
            break;
        }
        Py_DECREF(message);
    }
    Py_XDECREF(offset_item);
    Py_XDECREF(size_item);
    message_cache_clear(&cache);
    PyBuffer_Release(&view);
    if (failed) return NULL;
    return PyLong_FromSsize_t(i);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* The layout constants, for the test that ties them to format.py                                                */
/* ------------------------------------------------------------------------------------------------------------ */

PyDoc_STRVAR(layout_doc, "layout() -> dict: the record layout constants of mq_native.h, by format.py's names.");

static PyObject *layout(PyObject *self, PyObject *unused) {
    return Py_BuildValue(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,"
        "s:k,s:k,s:k,s:i,s:i,s:i,s:y}",
        "OFFSET_TOTAL_SIZE", MQ_OFFSET_TOTAL_SIZE, "OFFSET_MAGIC_CODE", MQ_OFFSET_MAGIC_CODE,
        "OFFSET_BODY_CRC", MQ_OFFSET_BODY_CRC, "OFFSET_QUEUE_ID", MQ_OFFSET_QUEUE_ID, "OFFSET_FLAG", MQ_OFFSET_FLAG,
        "OFFSET_QUEUE_OFFSET", MQ_OFFSET_QUEUE_OFFSET, "OFFSET_PHYSICAL_OFFSET", MQ_OFFSET_PHYSICAL_OFFSET,
        "OFFSET_SYS_FLAG", MQ_OFFSET_SYS_FLAG, "OFFSET_BORN_TIMESTAMP", MQ_OFFSET_BORN_TIMESTAMP,
        "OFFSET_BORN_HOST", MQ_OFFSET_BORN_HOST, "OFFSET_STORE_TIMESTAMP", MQ_OFFSET_STORE_TIMESTAMP,
        "OFFSET_STORE_HOST", MQ_OFFSET_STORE_HOST, "OFFSET_RECONSUME_TIMES", MQ_OFFSET_RECONSUME_TIMES,
        "OFFSET_PREPARED_TRANSACTION_OFFSET", MQ_OFFSET_PREPARED_TRANSACTION_OFFSET,
        "OFFSET_BODY_LENGTH", MQ_OFFSET_BODY_LENGTH, "OFFSET_BODY", MQ_OFFSET_BODY, "HEADER_SIZE", MQ_HEADER_SIZE,
        "HOST_V4_LENGTH", MQ_HOST_V4_LENGTH, "HOST_V6_LENGTH", MQ_HOST_V6_LENGTH, "RECORD_SIZE_MIN", MQ_RECORD_SIZE_MIN,
        "RECORD_SIZE_FIXED", MQ_RECORD_SIZE_FIXED, "TOPIC_LENGTH_MAX", MQ_TOPIC_LENGTH_MAX,
        "PROPERTIES_LENGTH_MAX", MQ_PROPERTIES_LENGTH_MAX, "END_FILE_MIN_BLANK_LENGTH", MQ_END_FILE_MIN_BLANK_LENGTH,
        "MESSAGE_MAGIC_CODE", (unsigned long)MQ_MESSAGE_MAGIC_CODE,
        "MESSAGE_MAGIC_CODE_V2", (unsigned long)MQ_MESSAGE_MAGIC_CODE_V2,
        "BLANK_MAGIC_CODE", (unsigned long)MQ_BLANK_MAGIC_CODE,
        "SYS_FLAG_BORNHOST_V6", MQ_SYS_FLAG_BORNHOST_V6, "SYS_FLAG_STOREHOST_V6", MQ_SYS_FLAG_STOREHOST_V6,
        "RECORD_CRC_LENGTH", MQ_RECORD_CRC_LENGTH,
        "RECORD_CRC_PREFIX", MQ_RECORD_CRC_PREFIX);
}

PyMethodDef mq_codec_methods[] = {
    {"encode_record", (PyCFunction)(void (*)(void))encode_record, METH_FASTCALL, encode_record_doc},
    {"encode_blank", (PyCFunction)(void (*)(void))encode_blank, METH_FASTCALL, encode_blank_doc},
    {"encode_run", (PyCFunction)(void (*)(void))encode_run, METH_FASTCALL, encode_run_doc},
    {"body_crc", body_crc, METH_O, body_crc_doc},
    {"crc32_zlib", crc32_zlib_function, METH_VARARGS, crc32_zlib_doc},
    {"crc32_held", crc32_held, METH_VARARGS, crc32_held_doc},
    {"decode_record", (PyCFunction)(void (*)(void))decode_record, METH_FASTCALL, decode_record_doc},
    {"decode_run", (PyCFunction)(void (*)(void))decode_run, METH_FASTCALL, decode_run_doc},
    {"layout", layout, METH_NOARGS, layout_doc},
    {NULL, NULL, 0, NULL},
};
