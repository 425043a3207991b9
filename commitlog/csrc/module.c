/* The module object of `mqstore.commitlog._native`: it only gathers the method tables of the other C files. */
#include "mq_native.h"
#include "flushwait.h"

static PyObject *native_crc32(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &value)) return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = mq_crc32(value, (const uint8_t *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef module_methods[] = {
    {"crc32", native_crc32, METH_VARARGS, "crc32(data, value=0) -> int: zlib.crc32's value, computed natively."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "mqstore's compiled core: per-message byte work of the CommitLog format (see commitlog/format.py).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) return NULL;
    if (PyModule_AddFunctions(module, mq_codec_methods) < 0 || PyModule_AddFunctions(module, mq_scan_methods) < 0 ||
        PyModule_AddFunctions(module, mq_message_methods) < 0 || mq_message_init(module) < 0 ||
        mq_unique_key_init(module) < 0 || mq_put_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddFunctions(module, mq_flush_methods) < 0) { Py_DECREF(module); return NULL; }
    return module;
}
