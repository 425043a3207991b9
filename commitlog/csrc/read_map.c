/* File-system calls made while the interpreter lock is held: a read-only mapping of a whole file
 * (`map_read_keep_lock`) and a directory's names (`listdir_keep_lock`).
 *
 * Why: a reader of a store another process writes (the writer's own dispatch process, or a read_only store) maps
 * each new ConsumeQueue file as the writer rolls to it. np.memmap makes about ten system calls for that (open,
 * fstat, lseek, dup, mmap, close ...), and the interpreter lock is let go around each. A thread that lets go of the
 * lock while a producer puts flat out waits out the producer's switch interval (5 ms) to get it back, so the
 * timer service took 5-60 ms to map the next file of its queue, and the timers due meanwhile fired that much
 * later (bench/timer.py section 5). Here open, fstat, mmap and close run under the lock: each takes microseconds on
 * a local file system.
 *
 * The mapping is a `ReadMapping`: a read-only buffer of exactly the file's size, unmapped when the last reference to
 * it goes (numpy arrays and memoryviews over it hold one), so that no view can outlive the memory it reads.
 */
#include "mq_native.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    void *address;    /* NULL after a failed map (never handed out then) */
    Py_ssize_t size;  /* > 0 */
} ReadMapping;

static int read_mapping_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    ReadMapping *mapping = (ReadMapping *)self;
    if (mapping->address == NULL) {
        PyErr_SetString(PyExc_ValueError, "ReadMapping: not mapped");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, self, mapping->address, mapping->size, 1, flags);  /* read-only */
}

static void read_mapping_dealloc(PyObject *self) {
    ReadMapping *mapping = (ReadMapping *)self;
    if (mapping->address != NULL) munmap(mapping->address, (size_t)mapping->size);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *read_mapping_len(PyObject *self, void *unused) {
    return PyLong_FromSsize_t(((ReadMapping *)self)->size);
}

static PyGetSetDef read_mapping_getset[] = {
    {"size", read_mapping_len, NULL, "the mapping's length in bytes (the file's size when it was mapped)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot read_mapping_slots[] = {
    {Py_tp_dealloc, read_mapping_dealloc},
    {Py_tp_getset, read_mapping_getset},
    {Py_bf_getbuffer, read_mapping_getbuffer},
    {Py_tp_doc, "A read-only mapping of a whole file (map_read_keep_lock); unmapped with its last reference."},
    {0, NULL},
};

static PyType_Spec read_mapping_spec = {
    "mqstore.commitlog._native.ReadMapping", sizeof(ReadMapping), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, read_mapping_slots,
};

static PyObject *read_mapping_type = NULL;  /* the module's, set at init */

PyDoc_STRVAR(map_read_keep_lock_doc,
"map_read_keep_lock(path, size) -> ReadMapping | int\n\n"
"Map the file at `path` (str or bytes) read-only and shared, keeping the interpreter lock (read_map.c says why).\n"
"The file must be a regular file of exactly `size` bytes (1 .. 2**62): otherwise its actual size is returned as\n"
"an int and nothing is mapped (a directory or other non-regular file raises OSError, EISDIR or EINVAL). OSError\n"
"with the errno and the path when it cannot be opened, examined or mapped.");

static PyObject *map_read_keep_lock(PyObject *self, PyObject *args) {
    PyObject *path = NULL, *path_object = NULL;  /* as given (for errors), and as bytes */
    long long size;
    if (!PyArg_ParseTuple(args, "OL", &path, &size) || !PyUnicode_FSConverter(path, &path_object)) return NULL;
    PyObject *result = NULL;
    ReadMapping *mapping = NULL;
    struct stat status;
    int fd = -1;
    if (size <= 0 || size > ((long long)1 << 62) || (unsigned long long)size > (unsigned long long)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_ValueError, "map_read_keep_lock: a size in 1 .. 2**62");
        goto done;
    }
    do {
        fd = open(PyBytes_AS_STRING(path_object), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) goto os_error;
    if (fstat(fd, &status) != 0) goto os_error;
    if (!S_ISREG(status.st_mode)) {
        errno = S_ISDIR(status.st_mode) ? EISDIR : EINVAL;
        goto os_error;
    }
    if ((long long)status.st_size != size) {
        result = PyLong_FromLongLong((long long)status.st_size);
        goto done;
    }
    mapping = PyObject_New(ReadMapping, (PyTypeObject *)read_mapping_type);
    if (mapping == NULL) goto done;
    mapping->size = (Py_ssize_t)size;
    mapping->address = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (mapping->address == MAP_FAILED) {
        int saved = errno;
        mapping->address = NULL;
        Py_DECREF(mapping);  /* dealloc unmaps nothing */
        errno = saved;
        goto os_error;
    }
    result = (PyObject *)mapping;
    goto done;
os_error:
    PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
done:
    if (fd >= 0) close(fd);  /* the mapping stays valid without it */
    Py_DECREF(path_object);
    return result;
}

PyDoc_STRVAR(listdir_keep_lock_doc,
"listdir_keep_lock(path) -> list of str\n\n"
"os.listdir(path) for a path (str or bytes; names as str, decoded as os.listdir decodes them), keeping the\n"
"interpreter lock: os.listdir lets go of it at every entry, and the schedule service lists its levels' queues on\n"
"every pass. For small directories on a local file system. OSError as os.listdir raises it.");

static PyObject *listdir_keep_lock(PyObject *self, PyObject *args) {
    PyObject *path = NULL, *path_object = NULL;  /* as given (for errors), and as bytes */
    if (!PyArg_ParseTuple(args, "O", &path) || !PyUnicode_FSConverter(path, &path_object)) return NULL;
    PyObject *names = NULL;
    DIR *directory = opendir(PyBytes_AS_STRING(path_object));
    if (directory == NULL) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        goto done;
    }
    names = PyList_New(0);
    if (names == NULL) goto done;
    for (;;) {
        errno = 0;
        struct dirent *entry = readdir(directory);
        if (entry == NULL) {
            if (errno != 0) {
                PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
                Py_CLEAR(names);
            }
            break;
        }
        const char *name = entry->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        PyObject *text = PyUnicode_DecodeFSDefault(name);
        if (text == NULL || PyList_Append(names, text) < 0) {
            Py_XDECREF(text);
            Py_CLEAR(names);
            break;
        }
        Py_DECREF(text);
    }
done:
    if (directory != NULL) closedir(directory);
    Py_DECREF(path_object);
    return names;
}

PyMethodDef mq_read_map_methods[] = {
    {"map_read_keep_lock", map_read_keep_lock, METH_VARARGS, map_read_keep_lock_doc},
    {"listdir_keep_lock", listdir_keep_lock, METH_VARARGS, listdir_keep_lock_doc},
    {NULL, NULL, 0, NULL},
};

int mq_read_map_init(PyObject *module) {
    read_mapping_type = PyType_FromSpec(&read_mapping_spec);
    if (read_mapping_type == NULL) return -1;
    return PyModule_AddObjectRef(module, "ReadMapping", read_mapping_type);
}
