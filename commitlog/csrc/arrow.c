/* The Arrow decoder's common case bound to Python (arrow_core.c does the work): the buffers of every column
 * of commitlog.arrow_decode.Decoder's schema, as bytearrays the caller wraps with pyarrow (no copy, no Python object
 * per row). The record buffer is held through the buffer protocol and the GIL let go while measuring and
 * filling. None means: decode these records with the Python decoder (see arrow_core.h). Exported through
 * scan.c's method table. */
#include "mq_native.h"
#include "arrow_core.h"

static int optional_int64(PyObject *object, int *has, int64_t *value) {
    *has = object != Py_None;
    if (!*has) return 0;
    long long v = PyLong_AsLongLong(object);
    if (v == -1 && PyErr_Occurred()) return -1;
    *value = v;
    return 0;
}

#define BUFFERS 30

PyObject *mq_arrow_columns(PyObject *self, PyObject *args) {
    PyObject *buf_object, *positions_object, *offsets_object, *queue_object, *olo, *ohi, *tlo, *thi, *topics_object;
    PyObject *expect_topic_object, *expect_sizes_object, *crc_from_object = Py_None;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOO|O", &buf_object, &positions_object, &offsets_object, &queue_object, &olo,
                          &ohi, &tlo, &thi, &topics_object, &expect_topic_object, &expect_sizes_object,
                          &crc_from_object))
        return NULL;
    mq_arrow_filter filter;
    memset(&filter, 0, sizeof filter);
    if (optional_int64(olo, &filter.has_offset_lo, &filter.offset_lo) < 0 ||
        optional_int64(ohi, &filter.has_offset_hi, &filter.offset_hi) < 0 ||
        optional_int64(tlo, &filter.has_time_lo, &filter.time_lo_us) < 0 ||
        optional_int64(thi, &filter.has_time_hi, &filter.time_hi_us) < 0 ||
        optional_int64(crc_from_object, &filter.has_record_crc_from, &filter.record_crc_from) < 0)
        return NULL;
    const uint8_t *topic_pointers[64];
    int64_t topic_lengths[64];
    if (topics_object != Py_None) {
        if (!PyTuple_Check(topics_object) || PyTuple_GET_SIZE(topics_object) > 64) Py_RETURN_NONE;  /* Python's way */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(topics_object); i++) {
            PyObject *topic = PyTuple_GET_ITEM(topics_object, i);
            if (!PyBytes_Check(topic)) {
                PyErr_SetString(PyExc_TypeError, "arrow_columns: topics are bytes");
                return NULL;
            }
            topic_pointers[i] = (const uint8_t *)PyBytes_AS_STRING(topic);
            topic_lengths[i] = PyBytes_GET_SIZE(topic);
        }
        filter.topics = topic_pointers;
        filter.topic_lengths = topic_lengths;
        filter.topic_count = PyTuple_GET_SIZE(topics_object);
    }
    if (expect_topic_object != Py_None) {
        if (!PyBytes_Check(expect_topic_object)) {
            PyErr_SetString(PyExc_TypeError, "arrow_columns: expect_topic is bytes");
            return NULL;
        }
        filter.expect_topic = (const uint8_t *)PyBytes_AS_STRING(expect_topic_object);
        filter.expect_topic_length = PyBytes_GET_SIZE(expect_topic_object);
    }
    Py_buffer buf, positions, offsets, queues = {0}, sizes_view = {0};
    if (PyObject_GetBuffer(buf_object, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    int have_positions = 0, have_offsets = 0, have_queues = 0, have_sizes = 0;
    if (mq_int64_buffer(positions_object, &positions, 0, "positions") < 0) goto done;
    have_positions = 1;
    if (mq_int64_buffer(offsets_object, &offsets, 0, "offsets") < 0) goto done;
    have_offsets = 1;
    int64_t count = positions.len / 8;
    if (offsets.len != positions.len) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: positions and offsets differ in length");
        goto done;
    }
    if (queue_object != Py_None) {
        if (mq_int64_buffer(queue_object, &queues, 0, "queue_ids") < 0) goto done;
        have_queues = 1;
        filter.queue_ids = queues.buf;
        filter.queue_count = queues.len / 8;
    }
    if (expect_sizes_object != Py_None) {
        if (mq_int64_buffer(expect_sizes_object, &sizes_view, 0, "expect_sizes") < 0) goto done;
        have_sizes = 1;
        if (sizes_view.len != positions.len) {
            PyErr_SetString(PyExc_ValueError, "arrow_columns: expect_sizes and positions differ in length");
            goto done;
        }
        filter.expect_sizes = sizes_view.buf;
    }
    mq_arrow_sizes sizes;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = mq_arrow_measure(buf.buf, buf.len, positions.buf, offsets.buf, count, &filter, &sizes);
    Py_END_ALLOW_THREADS
    if (status == MQ_ARROW_NO_MEMORY) {
        free(sizes.kept);
        PyErr_NoMemory();
        goto done;
    }
    if (status == MQ_ARROW_FALLBACK) {
        free(sizes.kept);
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    int64_t n = sizes.rows;
    Py_ssize_t lengths[BUFFERS] = {
        4 * (n + 1), sizes.topic_bytes, 4 * n, 8 * n, 8 * n, 4 * (n + 1), sizes.body_bytes, (n + 7) / 8,
        4 * (n + 1), sizes.tags_bytes, 4 * (n + 1), 4 * (sizes.keys + 1), sizes.key_bytes, 4 * (n + 1),
        4 * (sizes.pairs + 1), sizes.name_bytes, 4 * (sizes.pairs + 1), sizes.value_bytes, 4 * n, 4 * n, 8 * n,
        8 * n, 4 * (n + 1), sizes.born_host_bytes, 4 * (n + 1), sizes.store_host_bytes, 4 * n, 4 * n, 32 * n, 0,
    };
    PyObject *buffers = PyTuple_New(BUFFERS - 1);
    if (buffers == NULL) {
        free(sizes.kept);
        goto done;
    }
    void *pointers[BUFFERS];
    for (int i = 0; i < BUFFERS - 1; i++) {
        PyObject *array = PyByteArray_FromStringAndSize(NULL, lengths[i]);
        if (array == NULL) {
            Py_DECREF(buffers);
            free(sizes.kept);
            goto done;
        }
        PyTuple_SET_ITEM(buffers, i, array);
        pointers[i] = PyByteArray_AS_STRING(array);
    }
    mq_arrow_out out = {
        pointers[0], pointers[1], pointers[2], pointers[3], pointers[4], pointers[5], pointers[6], pointers[7],
        pointers[8], pointers[9], pointers[10], pointers[11], pointers[12], pointers[13], pointers[14], pointers[15],
        pointers[16], pointers[17], pointers[18], pointers[19], pointers[20], pointers[21], pointers[22],
        pointers[23], pointers[24], pointers[25], pointers[26], pointers[27], pointers[28], 0,
    };
    Py_BEGIN_ALLOW_THREADS
    mq_arrow_fill(buf.buf, &sizes, &out);
    Py_END_ALLOW_THREADS
    free(sizes.kept);
    result = Py_BuildValue("LLLLN", (long long)n, (long long)out.tags_nulls, (long long)sizes.keys,
                           (long long)sizes.pairs, buffers);
done:
    if (have_sizes) PyBuffer_Release(&sizes_view);
    if (have_queues) PyBuffer_Release(&queues);
    if (have_offsets) PyBuffer_Release(&offsets);
    if (have_positions) PyBuffer_Release(&positions);
    PyBuffer_Release(&buf);
    return result;
}
