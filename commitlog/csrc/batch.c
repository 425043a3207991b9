/* put_batch's per-message object work: the list of PutResults of a batch, made in one call.
 *
 * MessageStore.put_batch gets the batch's commitlog offsets, queue offsets and sizes as int64 arrays from the
 * writer; a PutResult (commitlog/message.py, a NamedTuple) per stored message, with its offset message id
 * (format.py: the store host's 8 bytes and the commitlog offset's 8, big-endian, as 32 uppercase hex digits),
 * took about 0.25 us a message through map/zip/tuple.__new__ in Python; here about 0.05.
 *
 * The results hold only ints, a str and the shared status and are never changed, so no reference cycle can run
 * through them: they are untracked by the cyclic garbage collector, whose collections would otherwise visit
 * every result a program keeps (a full collection grows with the objects alive).
 *
 * The cyclic collector is also kept from running while the results are made (PyGC_Disable, then its state as it
 * was): each PutResult is a GC object, so a batch's 1000 allocations would start one or two young collections
 * here, while the caller's batch of Messages is still alive; those collections move the Messages into older
 * generations, and enough of them start full collections (50k objects after `import mqstore`: 10-70 ms each
 * here). Deferred, the collection runs at the caller's next allocation, after put_batch let go of its Messages:
 * with `mqstore demo`'s batches, 4 full collections in 300 batches took 0.29 s of the writer's 0.54 s of CPU
 * (issue 30). Nothing here runs Python code or lets go of the GIL, so no other thread sees the collector off.
 */
#include "mq_native.h"

#define MQ_PUT_RESULT_FIELDS 6   /* status, commitlog_offset, queue_offset, size_bytes, store_timestamp_ms, msg_id */
#define MQ_MSG_ID_PREFIX_DIGITS 16  /* the store host's 8 bytes in hex */
#define MQ_MSG_ID_DIGITS 32

static const char hex_digits[] = "0123456789ABCDEF";

PyDoc_STRVAR(put_results_doc,
"put_results(result_type, status, commitlog_offsets, queue_offsets, sizes, placed, store_timestamp_ms,\n"
"            msg_id_prefix) -> list\n\n"
"The first `placed` PutResults of a batch: result_type(status, commitlog_offsets[i], queue_offsets[i], sizes[i],\n"
"store_timestamp_ms, msg_id_prefix + the 16 uppercase hex digits of commitlog_offsets[i]). `result_type` is a\n"
"tuple subclass without instance attributes of its own (a NamedTuple of 6 fields); the int64 arrays hold at\n"
"least `placed` items; `msg_id_prefix` is 16 ASCII characters (the store host in hex).");

static PyObject *put_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "put_results takes 8 arguments");
        return NULL;
    }
    PyObject *type_object = args[0], *status = args[1], *store_ts = args[6], *prefix = args[7];
    if (!PyType_Check(type_object) || !PyType_IsSubtype((PyTypeObject *)type_object, &PyTuple_Type) ||
        ((PyTypeObject *)type_object)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "the result type must be a tuple subclass without instance attributes");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)type_object;
    if (!PyUnicode_Check(prefix) || PyUnicode_GET_LENGTH(prefix) != MQ_MSG_ID_PREFIX_DIGITS ||
        PyUnicode_KIND(prefix) != PyUnicode_1BYTE_KIND || PyUnicode_MAX_CHAR_VALUE(prefix) > 127) {
        PyErr_SetString(PyExc_ValueError, "the msg_id prefix must be 16 ASCII characters");
        return NULL;
    }
    if (!PyLong_Check(store_ts)) {
        PyErr_SetString(PyExc_TypeError, "store_timestamp_ms must be an int");
        return NULL;
    }
    Py_ssize_t placed = PyLong_AsSsize_t(args[5]);
    if (placed == -1 && PyErr_Occurred()) return NULL;
    Py_buffer arrays[3];
    const char *names[3] = {"commitlog_offsets", "queue_offsets", "sizes"};
    int held = 0, gc_was_enabled = 0;
    PyObject *results = NULL;
    for (; held < 3; held++)
        if (mq_int64_buffer(args[2 + held], &arrays[held], 0, names[held]) < 0) goto done;
    if (placed < 0 || placed > arrays[0].len / 8 || placed > arrays[1].len / 8 || placed > arrays[2].len / 8) {
        PyErr_SetString(PyExc_ValueError, "placed is outside the arrays");
        goto done;
    }
    const int64_t *offsets = arrays[0].buf, *queue_offsets = arrays[1].buf, *sizes = arrays[2].buf;
    const char *prefix_digits = (const char *)PyUnicode_DATA(prefix);
    gc_was_enabled = PyGC_Disable();  /* see the module doc; restored at done */
    results = PyList_New(placed);
    if (results == NULL) goto done;
    PyObject *size_object = NULL;  /* the last size made: a batch's records often have one size */
    int64_t size_value = -1;
    for (Py_ssize_t i = 0; i < placed; i++) {
        /* read once: a collection's finalizer (at an allocation below) may write the arrays */
        int64_t offset_value = offsets[i], queue_offset = queue_offsets[i], size = sizes[i];
        if (offset_value < 0 || queue_offset < 0 || size < 0) {
            PyErr_SetString(PyExc_ValueError, "a negative offset or size");
            goto fail;
        }
        if (size != size_value || size_object == NULL) {
            Py_XDECREF(size_object);
            size_value = size;
            if ((size_object = PyLong_FromLongLong(size_value)) == NULL) goto fail;
        }
        PyObject *msg_id = PyUnicode_New(MQ_MSG_ID_DIGITS, 127);
        if (msg_id == NULL) goto fail;
        Py_UCS1 *digits = PyUnicode_1BYTE_DATA(msg_id);
        memcpy(digits, prefix_digits, MQ_MSG_ID_PREFIX_DIGITS);
        uint64_t offset = (uint64_t)offset_value;
        for (int d = MQ_MSG_ID_DIGITS - 1; d >= MQ_MSG_ID_PREFIX_DIGITS; d--) {
            digits[d] = (Py_UCS1)hex_digits[offset & 0xF];
            offset >>= 4;
        }
        PyObject *offset_object = PyLong_FromLongLong(offset_value);
        PyObject *queue_object = offset_object == NULL ? NULL : PyLong_FromLongLong(queue_offset);
        PyObject *result = queue_object == NULL ? NULL : type->tp_alloc(type, MQ_PUT_RESULT_FIELDS);
        if (offset_object == NULL || queue_object == NULL || result == NULL) {
            Py_XDECREF(offset_object);
            Py_XDECREF(queue_object);
            Py_XDECREF(result);
            Py_DECREF(msg_id);
            goto fail;
        }
        PyTuple_SET_ITEM(result, 0, Py_NewRef(status));
        PyTuple_SET_ITEM(result, 1, offset_object);
        PyTuple_SET_ITEM(result, 2, queue_object);
        PyTuple_SET_ITEM(result, 3, Py_NewRef(size_object));
        PyTuple_SET_ITEM(result, 4, Py_NewRef(store_ts));
        PyTuple_SET_ITEM(result, 5, msg_id);
        if (PyType_IS_GC(type)) PyObject_GC_UnTrack(result);  /* no cycle can pass through it (see above) */
        PyList_SET_ITEM(results, i, result);
    }
    Py_XDECREF(size_object);
    goto done;
fail:
    Py_XDECREF(size_object);
    Py_CLEAR(results);  /* the list's dealloc skips the items not yet set (NULL) */
done:
    if (gc_was_enabled) PyGC_Enable();
    for (int i = 0; i < held; i++) PyBuffer_Release(&arrays[i]);
    return results;
}

PyMethodDef mq_batch_methods[] = {
    {"put_results", (PyCFunction)(void (*)(void))put_results, METH_FASTCALL, put_results_doc},
    {NULL, NULL, 0, NULL},
};
