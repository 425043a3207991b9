/* The module object of `mqstore.commitlog._native`: it only gathers the method tables of the other C files. */
#include "mq_native.h"
#include "flushwait.h"

#include <string.h>

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

/* The path number of a name, or -1 with ValueError (unknown, or not on this CPU). */
static int crc32_path_of(const char *name) {
    for (int path = 0; path < MQ_CRC_PATHS; path++) {
        if (strcmp(name, mq_crc32_path_name(path)) != 0) continue;
        if (mq_crc32_path_supported(path)) return path;
        PyErr_Format(PyExc_ValueError, "crc32 path %s: this CPU lacks its instructions", name);
        return -1;
    }
    PyErr_Format(PyExc_ValueError, "no crc32 path named %.40s", name);
    return -1;
}

static PyObject *native_crc32_with(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "sy*|I", &name, &view, &value)) return NULL;
    int path = crc32_path_of(name);
    if (path < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = mq_crc32_with(path, value, (const uint8_t *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *native_crc32_paths(PyObject *self, PyObject *unused) {
    PyObject *names = PyList_New(0);
    for (int path = 0; names != NULL && path < MQ_CRC_PATHS; path++) {
        if (!mq_crc32_path_supported(path)) continue;
        PyObject *name = PyUnicode_FromString(mq_crc32_path_name(path));
        if (name == NULL || PyList_Append(names, name) < 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    if (names == NULL) return NULL;
    PyObject *paths = PyList_AsTuple(names);
    Py_DECREF(names);
    return paths;
}

static PyObject *native_crc32_path(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(mq_crc32_path_name(mq_crc32_path()));
}

static PyObject *native_crc32_use(PyObject *self, PyObject *args) {
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "z", &name)) return NULL;
    int previous = mq_crc32_path();
    int path = name == NULL ? -1 : crc32_path_of(name);
    if (name != NULL && path < 0) return NULL;
    mq_crc32_use(path);
    return PyUnicode_FromString(mq_crc32_path_name(previous));
}

static PyMethodDef module_methods[] = {
    {"crc32", native_crc32, METH_VARARGS, "crc32(data, value=0) -> int: zlib.crc32's value, computed natively."},
    {"crc32_with", native_crc32_with, METH_VARARGS,
     "crc32_with(path, data, value=0) -> int: crc32 by one path (a name from crc32_paths())."},
    {"crc32_paths", native_crc32_paths, METH_NOARGS,
     "crc32_paths() -> tuple of str: the CRC-32 paths this CPU can run, slowest first (crc32.c)."},
    {"crc32_path", native_crc32_path, METH_NOARGS, "crc32_path() -> str: the path crc32 and the scans take."},
    {"crc32_use", native_crc32_use, METH_VARARGS,
     "crc32_use(path or None) -> str: make crc32 and the scans take `path` (None: the CPU's best), for tests and"
     " benchmarks; returns the path taken before."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "mqstore's compiled core: per-message byte work of the CommitLog format (see commitlog/format.py).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) return NULL;
    if (PyModule_AddFunctions(module, mq_codec_methods) < 0 || PyModule_AddFunctions(module, mq_scan_methods) < 0 ||
        PyModule_AddFunctions(module, mq_message_methods) < 0 || mq_message_init(module) < 0 ||
        mq_unique_key_init(module) < 0 || mq_put_init(module) < 0 ||
        mq_put_entry_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddFunctions(module, mq_flush_methods) < 0) { Py_DECREF(module); return NULL; }
    if (PyModule_AddFunctions(module, mq_batch_methods) < 0) { Py_DECREF(module); return NULL; }
    if (PyModule_AddFunctions(module, mq_timer_methods) < 0) { Py_DECREF(module); return NULL; }
    if (PyModule_AddFunctions(module, mq_read_map_methods) < 0 || mq_read_map_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddFunctions(module, mq_read_path_methods) < 0 || mq_read_path_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
