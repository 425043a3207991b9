/* Bulk scans of the log, bound to Python: the dispatch/recovery walk of a segment and property lookups.
 *
 * The loops are scan_core.c's (plain C). Each function here takes the segment's buffer through the buffer
 * protocol and holds it for the whole call, GIL released: a segment's mmap cannot be closed (retention,
 * close()) while a scan reads it, as mmap refuses to close with exported buffers. Errors are reported as
 * positions and kinds; the Python caller builds the CorruptionError with the Python path's own code.
 */
#include "mq_native.h"
#include "index_core.h"
#include "scan_core.h"

PyObject *mq_arrow_columns(PyObject *self, PyObject *args);  /* arrow.c */

int mq_int64_buffer(PyObject *object, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(object, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || (view->format[0] != 'q' && view->format[0] != 'l') ||
        view->format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 array", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *scan_segment(PyObject *self, PyObject *args) {
    PyObject *segment_object, *columns_object;
    mq_scan_in in;
    long long size_bytes, base, pos, limit, records_max, required_from;
    int zeros_end, check_crc;
    if (!PyArg_ParseTuple(args, "OLLLLLppLO", &segment_object, &size_bytes, &base, &pos, &limit, &records_max,
                          &zeros_end, &check_crc, &required_from, &columns_object))
        return NULL;
    Py_buffer segment, columns;
    if (PyObject_GetBuffer(segment_object, &segment, PyBUF_SIMPLE) < 0) return NULL;
    if (mq_int64_buffer(columns_object, &columns, 1, "columns") < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    int64_t capacity = (int64_t)(columns.len / 8 / MQ_SCAN_COLUMNS);
    if (size_bytes < 0 || size_bytes > segment.len || pos < 0 || limit > size_bytes || records_max < 0) {
        PyBuffer_Release(&segment);
        PyBuffer_Release(&columns);
        PyErr_SetString(PyExc_ValueError, "scan_segment: range outside the segment's buffer");
        return NULL;
    }
    in.data = (const uint8_t *)segment.buf;
    in.size_bytes = size_bytes;
    in.base = base;
    in.pos = pos;
    in.limit = limit;
    in.records_max = records_max;
    in.zeros_end = zeros_end;
    in.check_crc = check_crc;
    in.required_from = required_from;
    mq_scan_out out;
    Py_BEGIN_ALLOW_THREADS
    mq_scan_segment(&in, (int64_t *)columns.buf, capacity, &out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&segment);
    PyBuffer_Release(&columns);
    PyObject *topic_rows;
    if (out.topics_overflow) {
        topic_rows = Py_None;
        Py_INCREF(topic_rows);
    } else {
        topic_rows = PyTuple_New(out.topics);
        if (topic_rows == NULL) return NULL;
        for (int64_t i = 0; i < out.topics; i++) {
            PyObject *row = PyLong_FromLongLong(out.topic_rows[i]);
            if (row == NULL) {
                Py_DECREF(topic_rows);
                return NULL;
            }
            PyTuple_SET_ITEM(topic_rows, i, row);
        }
    }
    return Py_BuildValue("LLiiNL", (long long)out.count, (long long)out.stop, out.error, out.blank, topic_rows,
                         (long long)out.tags_non_ascii);
}

static PyObject *property_spans(PyObject *self, PyObject *args) {
    PyObject *data_object, *starts_object, *ends_object, *names, *out_object;
    if (!PyArg_ParseTuple(args, "OOOO!O", &data_object, &starts_object, &ends_object, &PyTuple_Type, &names,
                          &out_object))
        return NULL;
    Py_ssize_t name_count = PyTuple_GET_SIZE(names);
    if (name_count > 16) {
        PyErr_SetString(PyExc_ValueError, "property_spans: at most 16 names");
        return NULL;
    }
    const uint8_t *name_bytes[16];
    int64_t name_lengths[16];
    for (Py_ssize_t i = 0; i < name_count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "property_spans: names are bytes");
            return NULL;
        }
        name_bytes[i] = (const uint8_t *)PyBytes_AS_STRING(name);  /* the tuple keeps them alive */
        name_lengths[i] = PyBytes_GET_SIZE(name);
    }
    Py_buffer data, starts, ends, out;
    if (PyObject_GetBuffer(data_object, &data, PyBUF_SIMPLE) < 0) return NULL;
    if (mq_int64_buffer(starts_object, &starts, 0, "starts") < 0) goto fail_data;
    if (mq_int64_buffer(ends_object, &ends, 0, "ends") < 0) goto fail_starts;
    if (mq_int64_buffer(out_object, &out, 1, "out") < 0) goto fail_ends;
    Py_ssize_t n = starts.len / 8;
    if (ends.len != starts.len || out.len < (Py_ssize_t)(2 * name_count * n * 8)) {
        PyErr_SetString(PyExc_ValueError, "property_spans: starts, ends and out do not agree");
        goto fail_out;
    }
    const int64_t *s = starts.buf, *e = ends.buf;
    for (Py_ssize_t row = 0; row < n; row++) {  /* checked before the loop lets go of the GIL */
        if (s[row] < 0 || e[row] < s[row] || e[row] > data.len) {
            PyErr_SetString(PyExc_ValueError, "property_spans: a span outside the buffer");
            goto fail_out;
        }
    }
    int64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < name_count; k++) {
        int64_t *value_start = o + 2 * k * n, *value_end = value_start + n;
        for (Py_ssize_t row = 0; row < n; row++)
            mq_property_span((const uint8_t *)data.buf, s[row], e[row], name_bytes[k], name_lengths[k],
                             value_start + row, value_end + row);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
fail_out:
    PyBuffer_Release(&out);
fail_ends:
    PyBuffer_Release(&ends);
fail_starts:
    PyBuffer_Release(&starts);
fail_data:
    PyBuffer_Release(&data);
    return NULL;
}

static PyObject *walk_chain(PyObject *self, PyObject *args) {
    PyObject *buf_object, *out_object;
    long long length, buf_abs;
    if (!PyArg_ParseTuple(args, "OLLO", &buf_object, &length, &buf_abs, &out_object)) return NULL;
    Py_buffer buf, out;
    if (PyObject_GetBuffer(buf_object, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (mq_int64_buffer(out_object, &out, 1, "positions") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (length < 0 || length > buf.len) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "walk_chain: length outside the buffer");
        return NULL;
    }
    int64_t count, following;
    Py_BEGIN_ALLOW_THREADS
    count = mq_walk_chain(buf.buf, length, buf_abs, out.buf, out.len / 8, &following);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&buf);
    return Py_BuildValue("LL", (long long)count, (long long)following);
}

/* The (ptr, len) spans of a tuple of bytes-or-None (None: ptr NULL); -1 with TypeError for anything else. */
static int bytes_spans(PyObject *tuple, mq_span *spans, const char *what) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (item == Py_None) {
            spans[i].ptr = NULL;
            spans[i].len = 0;
        } else if (PyBytes_Check(item)) {
            spans[i].ptr = (const uint8_t *)PyBytes_AS_STRING(item);
            spans[i].len = PyBytes_GET_SIZE(item);
        } else {
            PyErr_Format(PyExc_TypeError, "index_place: %s holds %.80s, not bytes or None", what,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
    }
    return 0;
}

/* index_place and index_place_spans: the keys as tuples of bytes, or as spans of one buffer. */
static PyObject *index_place_any(PyObject *args, int from_spans) {
    PyObject *map_object, *prefixes_object, *topic_ids_object, *uniq_object, *keys_object, *offsets_object,
        *timestamps_object, *sys_flags_object;
    long long slot_count, entry_max, skip_mask, skip_value, row, key;
    if (!PyArg_ParseTuple(args, "OLLOOOOOOOLLLL", &map_object, &slot_count, &entry_max, &prefixes_object,
                          &topic_ids_object, &uniq_object, &keys_object, &offsets_object, &timestamps_object,
                          &sys_flags_object, &skip_mask, &skip_value, &row, &key))
        return NULL;
    PyObject *result = NULL, *prefixes = NULL, *uniq = NULL, *keys = NULL;
    mq_span *spans = NULL;
    Py_buffer map = {0}, topic_ids = {0}, offsets = {0}, timestamps = {0}, sys_flags = {0}, source = {0},
              key_spans = {0};
    /* tuples: they hold their items while the GIL is let go, whatever happens to the caller's lists */
    if ((prefixes = PySequence_Tuple(prefixes_object)) == NULL) goto done;
    if (from_spans) {
        if (PyObject_GetBuffer(uniq_object, &source, PyBUF_SIMPLE) < 0) goto done;
        if (mq_int64_buffer(keys_object, &key_spans, 0, "spans") < 0) goto done;
    } else if ((uniq = PySequence_Tuple(uniq_object)) == NULL || (keys = PySequence_Tuple(keys_object)) == NULL) {
        goto done;
    }
    if (PyObject_GetBuffer(map_object, &map, PyBUF_WRITABLE) < 0) goto done;
    if (mq_int64_buffer(topic_ids_object, &topic_ids, 0, "topic_ids") < 0) goto done;
    if (mq_int64_buffer(offsets_object, &offsets, 0, "offsets") < 0) goto done;
    if (mq_int64_buffer(timestamps_object, &timestamps, 0, "timestamps") < 0) goto done;
    if (mq_int64_buffer(sys_flags_object, &sys_flags, 0, "sys_flags") < 0) goto done;
    Py_ssize_t n = offsets.len / 8, prefix_count = PyTuple_GET_SIZE(prefixes);
    int keys_agree = from_spans ? key_spans.len == 4 * 8 * n : (PyTuple_GET_SIZE(uniq) == n && PyTuple_GET_SIZE(keys) == n);
    if (!keys_agree || topic_ids.len != 8 * n || timestamps.len != 8 * n || sys_flags.len != 8 * n || row < 0 ||
        row > n || key < 0) {
        PyErr_SetString(PyExc_ValueError, "index_place: the columns do not agree");
        goto done;
    }
    const int64_t *o = offsets.buf;
    for (Py_ssize_t i = 0; i < n; i++) {  /* checked before the loop lets go of the GIL */
        if (o[i] < 0 || (i && o[i] < o[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "index_place: commitlog offsets must be >= 0 and in log order");
            goto done;
        }
    }
    spans = PyMem_Malloc(sizeof(mq_span) * (size_t)(2 * n + prefix_count + 1));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (from_spans) {  /* spans[k*n + i]: start, end of UNIQ_KEY (k = 0, 1) and KEYS (k = 2, 3); -1: absent */
        const int64_t *ks = key_spans.buf;
        for (Py_ssize_t k = 0; k < 2; k++) {
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t start = ks[2 * k * n + i], end = ks[(2 * k + 1) * n + i];
                mq_span *span = &spans[k * n + i];
                if (start < 0) {
                    span->ptr = NULL;
                    span->len = 0;
                } else if (end < start || end > source.len) {
                    PyErr_SetString(PyExc_ValueError, "index_place_spans: a span outside the buffer");
                    goto done;
                } else {
                    span->ptr = (const uint8_t *)source.buf + start;
                    span->len = end - start;
                }
            }
        }
    } else if (bytes_spans(uniq, spans, "uniq_keys") < 0 || bytes_spans(keys, spans + n, "keys") < 0) {
        goto done;
    }
    if (bytes_spans(prefixes, spans + 2 * n, "prefixes") < 0) goto done;
    mq_index_rows rows = {
        .rows = n, .prefixes = spans + 2 * n, .prefix_count = prefix_count, .topic_ids = topic_ids.buf,
        .uniq_keys = spans, .keys = spans + n, .offsets = o, .timestamps = timestamps.buf,
        .sys_flags = sys_flags.buf, .skip_mask = skip_mask, .skip_value = skip_value,
    };
    mq_index_cursor cursor = {.row = row, .key = key};
    Py_BEGIN_ALLOW_THREADS
    mq_index_place(map.buf, map.len, slot_count, entry_max, &rows, &cursor);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("LLLiLL", (long long)cursor.row, (long long)cursor.key, (long long)cursor.placed,
                           cursor.status, (long long)cursor.detail, (long long)cursor.detail2);
done:
    PyMem_Free(spans);
    if (key_spans.obj) PyBuffer_Release(&key_spans);
    if (source.obj) PyBuffer_Release(&source);
    if (sys_flags.obj) PyBuffer_Release(&sys_flags);
    if (timestamps.obj) PyBuffer_Release(&timestamps);
    if (offsets.obj) PyBuffer_Release(&offsets);
    if (topic_ids.obj) PyBuffer_Release(&topic_ids);
    if (map.obj) PyBuffer_Release(&map);
    Py_XDECREF(keys);
    Py_XDECREF(uniq);
    Py_XDECREF(prefixes);
    return result;
}

static PyObject *index_place(PyObject *self, PyObject *args) { return index_place_any(args, 0); }

static PyObject *index_place_spans(PyObject *self, PyObject *args) { return index_place_any(args, 1); }

static PyObject *index_key_hash(PyObject *self, PyObject *args) {
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*", &key)) return NULL;
    int ok;
    uint32_t h = mq_java_hash_utf8(0, key.buf, key.len, &ok);
    PyBuffer_Release(&key);
    if (!ok) Py_RETURN_NONE;
    int32_t hash = (int32_t)h;
    return PyLong_FromLong(hash == INT32_MIN ? 0 : (hash < 0 ? -hash : hash));
}

static PyObject *index_layout(PyObject *self, PyObject *unused) {
    return Py_BuildValue("iiiiiiiiiii", MQ_INDEX_HEADER_SIZE, MQ_INDEX_SLOT_SIZE, MQ_INDEX_ENTRY_SIZE,
                         MQ_INDEX_OFF_BEGIN_TIMESTAMP, MQ_INDEX_OFF_END_TIMESTAMP, MQ_INDEX_OFF_BEGIN_PHY,
                         MQ_INDEX_OFF_END_PHY, MQ_INDEX_OFF_HASH_SLOT_COUNT, MQ_INDEX_OFF_INDEX_COUNT,
                         MQ_INDEX_TIME_DIFF_MAX, MQ_INDEX_BAD_INPUT);
}

static PyObject *scan_columns(PyObject *self, PyObject *unused) { return PyLong_FromLong(MQ_SCAN_COLUMNS); }

/* record_values: scan_core.c's mq_record_values over one segment, GIL released unless `keep_lock` (the timer's
 * enqueue, which would wait out a producer's switch interval to get it back: timer_link.c). Every argument is
 * taken and every buffer held before the loop; the bytes arguments are the caller's (held by its frame). */
static PyObject *record_values(PyObject *self, PyObject *args) {
    PyObject *segment_object, *offsets_object, *sizes_object, *topic_object, *out_object;
    const char *number_name, *text_name;
    Py_ssize_t number_name_length, text_name_length;
    long long segment_base, first, required_from, queue_id, first_entry;
    int keep_lock = 0;
    if (!PyArg_ParseTuple(args, "OLOOLLOLLy#y#O|p", &segment_object, &segment_base, &offsets_object, &sizes_object,
                          &first, &required_from, &topic_object, &queue_id, &first_entry, &number_name,
                          &number_name_length, &text_name, &text_name_length, &out_object, &keep_lock))
        return NULL;
    if (topic_object != Py_None && !PyBytes_CheckExact(topic_object)) {
        PyErr_SetString(PyExc_TypeError, "record_values: topic must be bytes or None");
        return NULL;
    }
    Py_buffer segment, offsets, sizes, out;
    if (PyObject_GetBuffer(segment_object, &segment, PyBUF_SIMPLE) < 0) return NULL;
    if (mq_int64_buffer(offsets_object, &offsets, 0, "offsets") < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (mq_int64_buffer(sizes_object, &sizes, 0, "sizes") < 0) {
        PyBuffer_Release(&segment);
        PyBuffer_Release(&offsets);
        return NULL;
    }
    if (mq_int64_buffer(out_object, &out, 1, "out") < 0) {
        PyBuffer_Release(&segment);
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&sizes);
        return NULL;
    }
    int64_t count = (int64_t)(offsets.len / 8);
    PyObject *result = NULL;
    if (sizes.len != offsets.len || out.len / 8 / MQ_VALUE_COLUMNS < count || first < 0 || first > count) {
        PyErr_SetString(PyExc_ValueError, "record_values: sizes, out or first do not match the offsets");
    } else {
        mq_values_in in = {
            .segment = (const uint8_t *)segment.buf, .segment_length = (int64_t)segment.len,
            .segment_base = segment_base, .offsets = (const int64_t *)offsets.buf,
            .sizes = (const int64_t *)sizes.buf, .first = first, .count = count,
            .required_from = required_from < 0 ? INT64_MAX : required_from,
            .topic = topic_object == Py_None ? NULL : (const uint8_t *)PyBytes_AS_STRING(topic_object),
            .topic_length = topic_object == Py_None ? 0 : (int64_t)PyBytes_GET_SIZE(topic_object),
            .queue_id = queue_id, .first_entry = first_entry,
            .number_name = (const uint8_t *)number_name, .number_name_length = (int64_t)number_name_length,
            .text_name = (const uint8_t *)text_name, .text_name_length = (int64_t)text_name_length};
        int64_t done;
        if (keep_lock) {
            done = mq_record_values(&in, (int64_t *)out.buf);
        } else {
            Py_BEGIN_ALLOW_THREADS
            done = mq_record_values(&in, (int64_t *)out.buf);
            Py_END_ALLOW_THREADS
        }
        result = PyLong_FromLongLong(done);
    }
    PyBuffer_Release(&segment);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    return result;
}

PyMethodDef mq_scan_methods[] = {
    {"record_values", record_values, METH_VARARGS,
     "record_values(buffer, segment_base, offsets, sizes, first, record_crc_from, topic_raw or None, queue_id,"
     " first_entry, number_name, text_name, out, keep_lock=False) -> int: for the records at offsets[first:]"
     " (int64 arrays, the segment's buffer starting at commitlog offset segment_base), checked as decode_run checks"
     " them, a row of out per record (scan_core.h, MQ_VALUE_*): the number property's value, whether it is digits,"
     " the text property's state and Java hash. Returns the index of the first record outside the segment or not"
     " accepted (len: all done). The interpreter lock is let go during the pass unless keep_lock."},
    {"scan_segment", scan_segment, METH_VARARGS,
     "scan_segment(buffer, size_bytes, base, pos, limit, records_max, zeros_end, check_crc, required_from, columns)"
     " -> (count, stop, error, blank, topic_rows or None, tags_non_ascii): walk and check the records of one"
     " segment into int64 columns (scan_core.h, MQ_COL_*)."},
    {"property_spans", property_spans, METH_VARARGS,
     "property_spans(buffer, starts, ends, names, out): for each name, the value span of its first pair in each"
     " properties span [starts[i], ends[i]) (-1 when absent), into out[2k] (starts) and out[2k+1] (ends)."},
    {"arrow_columns", mq_arrow_columns, METH_VARARGS,
     "arrow_columns(buf, positions, offsets, queue_ids, offset_lo, offset_hi, time_lo_us, time_hi_us, topics,"
     " expect_topic, expect_sizes) -> None or (rows, tags_nulls, keys, pairs, buffers): the Arrow buffers of"
     " arrow_decode.Decoder's columns for the records at `positions` (None: use the Python decoder)."},
    {"walk_chain", walk_chain, METH_VARARGS,
     "walk_chain(buf, length, buf_abs, positions) -> (count, following): the TOTALSIZE chain of complete records"
     " tiling buf[:length] (commitlog.arrow_decode._walk_python), positions written to the int64 array."},
    {"index_place", index_place, METH_VARARGS,
     "index_place(map, slot_count, entry_max, prefixes, topic_ids, uniq_keys, keys, offsets, timestamps, sys_flags,"
     " skip_mask, skip_value, row, key) -> (row, key, placed, status, detail, detail2): hash the index keys of"
     " the rows from the cursor (row, key) and place them into one IndexFile's mapping (index_core.h)."},
    {"index_place_spans", index_place_spans, METH_VARARGS,
     "index_place_spans(map, slot_count, entry_max, prefixes, topic_ids, buffer, spans, offsets, timestamps,"
     " sys_flags, skip_mask, skip_value, row, key): index_place with each row's UNIQ_KEY and KEYS values as spans"
     " of one buffer (property_spans' output for (UNIQ_KEY, KEYS): 4 int64 rows, start -1 when absent)."},
    {"index_layout", index_layout, METH_NOARGS,
     "index_layout() -> the IndexFile sizes and header offsets index_core.h uses, and its last status number."},
    {"index_key_hash", index_key_hash, METH_VARARGS,
     "index_key_hash(key: bytes) -> int or None: keyHash of a UTF-8 index key, None when not valid UTF-8."},
    {"scan_columns", scan_columns, METH_NOARGS, "scan_columns() -> int: how many columns scan_segment writes."},
    {NULL, NULL, 0, NULL},
};
