/* The timer service's enqueue of one batch (mqstore/timer/service.py, `_link`), compiled: the slot of each timer,
 * its TimerLog unit and the wheel slots that link them, computed while the interpreter lock is held.
 *
 * Why compiled and why with the lock held: the Python path lets go of the lock at most of its numpy calls and at
 * each pwrite (about 40 times a batch of 8192), and a thread that lets go waits for a producer that never pauses
 * until its switch interval ends (5 ms). The batch then took 40-280 ms instead of 2-5 ms, and the wheel fell behind
 * a put loop (docs/decisions/0054-timer-wheel-in-rocketmq-5-format.md). Here a batch is three calls that keep the
 * lock: `timer_link` (the units and slot rows, into the caller's buffers), `pwrite_keep_lock` per TimerLog file, and
 * `timer_put_slots` (into the mapped wheel), in that order, so that the wheel never links a unit not yet written.
 *
 * The layouts are mqstore/timer/format.py's (big-endian; `timer_layout` gives the constants used here, and a test
 * ties them to format.py). The Python `_link` is the reference: a test compares the files both write.
 */
#include "mq_native.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define MQ_TIMER_UNIT_SIZE 52      /* format.py: UNIT_SIZE_BYTES */
#define MQ_TIMER_BLANK_SIZE 16     /* BLANK_SIZE_BYTES */
#define MQ_TIMER_SLOT_SIZE 32      /* SLOT_SIZE_BYTES */
#define MQ_TIMER_SLOT_COUNT (2 * 7 * 24 * 3600)  /* WHEEL_SLOT_COUNT */
#define MQ_TIMER_MAGIC_DEFAULT 0x1
#define MQ_TIMER_MAGIC_ROLL 0x2
#define MQ_TIMER_TIME_MAX (INT64_C(1) << 53)  /* write and read times (ms) accepted: far past any clock */
#define MQ_TIMER_PRECISION_MAX (INT64_C(1) << 31)

/* record_values.py's columns (scan_core.h's MQ_VALUE_*) */
#define MQ_ROW_NUMBER 0
#define MQ_ROW_NUMBER_OK 1
#define MQ_ROW_TEXT_STATE 2
#define MQ_ROW_TEXT_HASH 3
#define MQ_ROW_COLUMNS 4
#define MQ_ROW_TEXT_NOT_ASCII 2

/* Unit and slot fields (format.py's tables) */
#define MQ_UNIT_AT_SIZE 0
#define MQ_UNIT_AT_PREV 4
#define MQ_UNIT_AT_MAGIC 12
#define MQ_UNIT_AT_WRITE_TIME 16
#define MQ_UNIT_AT_DELAY 24
#define MQ_UNIT_AT_OFFSET 28
#define MQ_UNIT_AT_MESSAGE_SIZE 36
#define MQ_UNIT_AT_TOPIC_HASH 40
#define MQ_UNIT_AT_RESERVED 44
#define MQ_SLOT_AT_TIME 0
#define MQ_SLOT_AT_FIRST 8
#define MQ_SLOT_AT_LAST 16
#define MQ_SLOT_AT_COUNT 24
#define MQ_SLOT_AT_MAGIC 28

static inline void put_i32(uint8_t *p, int64_t value) { mq_put_u32(p, (uint32_t)(uint64_t)value); }  /* wraps */

/* Python's // for a positive divisor (the times are >= 0 here, but the rule holds for any) */
static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

typedef struct {
    int64_t slot_ms;  /* the slot the unit is linked into, in ms */
    int64_t index;    /* the unit's place among the linked ones: sorting by (slot_ms, index) is stable */
} slot_key;

static int slot_key_compare(const void *left, const void *right) {
    const slot_key *a = left, *b = right;
    if (a->slot_ms != b->slot_ms) return a->slot_ms < b->slot_ms ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Where `count` units go from `end` (files.py's TimerLog.positions_for): each file keeps room for a blank. */
static void unit_positions(int64_t end, int64_t file_size, int64_t count, int64_t *out) {
    int64_t per_file = (file_size - MQ_TIMER_BLANK_SIZE) / MQ_TIMER_UNIT_SIZE, position = end;
    for (int64_t done = 0; done < count;) {
        int64_t base = position - position % file_size;
        int64_t room = (base + file_size - MQ_TIMER_BLANK_SIZE - position) / MQ_TIMER_UNIT_SIZE;
        if (base + file_size - MQ_TIMER_BLANK_SIZE - position < 0) room = 0;
        if (room == 0) {
            position = base + file_size;
            room = per_file;
        }
        int64_t take = room < count - done ? room : count - done;
        for (int64_t k = 0; k < take; k++) out[done + k] = position + k * MQ_TIMER_UNIT_SIZE;
        done += take;
        position += take * MQ_TIMER_UNIT_SIZE;
    }
}

/* The slot and magic of the timer of row `row` (service.py's _link: a timer past the roll window is linked at
 * its edge, or half of it when it is near, with MAGIC_ROLL). out_ms >= 0, checked by the caller; taken as 0 if
 * not, since an allocation between the check and here may run a finalizer that changes the caller's rows (the
 * result is then wrong but defined, and the memory held). */
static void slot_of(int64_t out_ms, int64_t write_time, int64_t precision, int64_t window, int64_t *slot_ms,
                    int32_t *magic) {
    if (out_ms < 0) out_ms = 0;
    int64_t slot = floor_div(out_ms, precision) * precision;  /* <= out_ms: no overflow */
    int64_t span = window * precision;                        /* <= 2**52 (checked) */
    *magic = MQ_TIMER_MAGIC_DEFAULT;
    if (slot - write_time >= span) {                          /* slot >= 0, write_time <= 2**53 */
        int near = slot - write_time - span < window / 3 * precision;
        slot = write_time + (near ? window / 2 * precision : span);
        *magic |= MQ_TIMER_MAGIC_ROLL;
    }
    *slot_ms = slot;
}

PyDoc_STRVAR(timer_link_doc,
"timer_link(rows, offsets, sizes, count, write_time, read_time, precision, window, log_end, file_size, wheel,\n"
"           units_out, slots_out, skip_due) -> tuple\n\n"
"Link the first `count` timers of a batch (mqstore/timer/service.py's _link, with _enqueue's choice of rows):\n"
"rows is record_values' int64 rows (count x 4), offsets and sizes the records' commitlog offsets and sizes\n"
"(int64), wheel the mapped wheel file (read only here). A row whose number is not ok is skipped. Returns\n"
"  ('hash', [row]): rows kept whose REAL_TOPIC is not ASCII: the caller sets their hash and state, calls again;\n"
"  ('due', [row], [magic]): unless skip_due, the kept rows whose slot was read (read_time): the caller delivers\n"
"      them and calls again with skip_due;\n"
"  ('linked', units, slots, [skipped row], end): `units` TimerLog units from log_end, in row order, written to\n"
"      units_out (52 bytes each), and `slots` wheel slot rows (time_slot, first, last, count) to slots_out, for\n"
"      timer_put_slots after the units are written; end: the TimerLog's end after them.\n"
"Nothing is written to the wheel or a file. ValueError for arguments out of their bounds.");

static PyObject *timer_link(PyObject *self, PyObject *args) {
    PyObject *rows_object, *offsets_object, *sizes_object, *wheel_object, *units_object, *slots_object;
    long long count, write_time, read_time, precision, window, log_end, file_size;
    int skip_due;
    if (!PyArg_ParseTuple(args, "OOOLLLLLLLOOOp", &rows_object, &offsets_object, &sizes_object, &count,
                          &write_time, &read_time, &precision, &window, &log_end, &file_size, &wheel_object,
                          &units_object, &slots_object, &skip_due))
        return NULL;
    Py_buffer rows = {0}, offsets = {0}, sizes = {0}, wheel = {0}, units = {0}, slots = {0};
    PyObject *result = NULL, *listed = NULL, *magics = NULL;
    slot_key *keys = NULL;
    int64_t *positions = NULL;
    if (mq_int64_buffer(rows_object, &rows, 0, "rows") < 0) return NULL;
    if (mq_int64_buffer(offsets_object, &offsets, 0, "offsets") < 0) goto done;
    if (mq_int64_buffer(sizes_object, &sizes, 0, "sizes") < 0) goto done;
    if (PyObject_GetBuffer(wheel_object, &wheel, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(units_object, &units, PyBUF_WRITABLE) < 0) goto done;
    if (mq_int64_buffer(slots_object, &slots, 1, "slots_out") < 0) goto done;
    /* Every bound in 64 bits, each length divided rather than a count multiplied. */
    if (count < 0 || count > (long long)(rows.len / 8 / MQ_ROW_COLUMNS) || count > (long long)(offsets.len / 8) ||
        count > (long long)(sizes.len / 8) || count > (long long)(units.len / MQ_TIMER_UNIT_SIZE) ||
        count > (long long)(slots.len / 8 / 4)) {
        PyErr_SetString(PyExc_ValueError, "timer_link: a buffer is shorter than count");
        goto done;
    }
    if (wheel.len != (Py_ssize_t)MQ_TIMER_SLOT_COUNT * MQ_TIMER_SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "timer_link: the wheel is not a whole wheel file");
        goto done;
    }
    if (write_time < 0 || write_time > MQ_TIMER_TIME_MAX || read_time < 0 || read_time > MQ_TIMER_TIME_MAX ||
        precision < 1 || precision > MQ_TIMER_PRECISION_MAX || window < 2 || window > MQ_TIMER_SLOT_COUNT ||
        file_size < MQ_TIMER_UNIT_SIZE + MQ_TIMER_BLANK_SIZE || file_size > (INT64_C(1) << 40) || log_end < 0 ||
        log_end > (INT64_C(1) << 60)) {
        PyErr_SetString(PyExc_ValueError, "timer_link: a time, the precision, the window or the log is out of bounds");
        goto done;
    }
    const int64_t *row = (const int64_t *)rows.buf, *offset = (const int64_t *)offsets.buf;
    const int64_t *size = (const int64_t *)sizes.buf;
    for (long long i = 0; i < count; i++) {
        if (row[i * MQ_ROW_COLUMNS + MQ_ROW_NUMBER_OK] == 1 && row[i * MQ_ROW_COLUMNS + MQ_ROW_NUMBER] < 0) {
            PyErr_SetString(PyExc_ValueError, "timer_link: a row whose number is ok is negative");
            goto done;
        }
    }
    /* 1. Rows whose topic hash the caller must give (it decodes non-ASCII text by its own rule). */
    if ((listed = PyList_New(0)) == NULL) goto done;
    for (long long i = 0; i < count; i++) {
        const int64_t *r = row + i * MQ_ROW_COLUMNS;
        if (r[MQ_ROW_NUMBER_OK] == 1 && r[MQ_ROW_TEXT_STATE] == MQ_ROW_TEXT_NOT_ASCII) {
            PyObject *index = PyLong_FromLongLong(i);
            if (index == NULL || PyList_Append(listed, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
    }
    if (PyList_GET_SIZE(listed) > 0) {
        result = Py_BuildValue("(sO)", "hash", listed);
        goto done;
    }
    /* 2. Timers whose slot has been read: delivered by the caller before anything is linked. */
    if (!skip_due) {
        if ((magics = PyList_New(0)) == NULL) goto done;
        for (long long i = 0; i < count; i++) {
            const int64_t *r = row + i * MQ_ROW_COLUMNS;
            if (r[MQ_ROW_NUMBER_OK] != 1) continue;
            int64_t slot_ms;
            int32_t magic;
            slot_of(r[MQ_ROW_NUMBER], write_time, precision, window, &slot_ms, &magic);
            if (slot_ms >= read_time) continue;
            PyObject *index = PyLong_FromLongLong(i), *value = PyLong_FromLong(magic);
            int failed = index == NULL || value == NULL || PyList_Append(listed, index) < 0 ||
                         PyList_Append(magics, value) < 0;
            Py_XDECREF(index);
            Py_XDECREF(value);
            if (failed) goto done;
        }
        if (PyList_GET_SIZE(listed) > 0) {
            result = Py_BuildValue("(sOO)", "due", listed, magics);
            goto done;
        }
    }
    /* 3. The rest, linked: listed now gathers the skipped rows. */
    int64_t linked = 0;
    keys = PyMem_Malloc(sizeof(slot_key) * (size_t)(count > 0 ? count : 1));
    positions = PyMem_Malloc(sizeof(int64_t) * (size_t)(count > 0 ? count : 1));
    if (keys == NULL || positions == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *unit_out = (uint8_t *)units.buf;
    for (long long i = 0; i < count; i++) {
        const int64_t *r = row + i * MQ_ROW_COLUMNS;
        if (r[MQ_ROW_NUMBER_OK] != 1) {
            PyObject *index = PyLong_FromLongLong(i);
            if (index == NULL || PyList_Append(listed, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
            continue;
        }
        int64_t slot_ms;
        int32_t magic;
        slot_of(r[MQ_ROW_NUMBER], write_time, precision, window, &slot_ms, &magic);
        if (slot_ms < read_time) continue;  /* due, and delivered by the caller (skip_due) */
        uint8_t *unit = unit_out + linked * MQ_TIMER_UNIT_SIZE;
        memset(unit, 0, MQ_TIMER_UNIT_SIZE);
        put_i32(unit + MQ_UNIT_AT_SIZE, MQ_TIMER_UNIT_SIZE);
        put_i32(unit + MQ_UNIT_AT_MAGIC, magic);
        mq_put_i64(unit + MQ_UNIT_AT_WRITE_TIME, write_time);
        put_i32(unit + MQ_UNIT_AT_DELAY, slot_ms - write_time);  /* as numpy stores an int64 in an i4 field */
        mq_put_i64(unit + MQ_UNIT_AT_OFFSET, offset[i]);
        put_i32(unit + MQ_UNIT_AT_MESSAGE_SIZE, size[i]);
        put_i32(unit + MQ_UNIT_AT_TOPIC_HASH, r[MQ_ROW_TEXT_HASH]);
        keys[linked] = (slot_key){slot_ms, linked};
        linked++;
    }
    unit_positions(log_end, file_size, linked, positions);
    qsort(keys, (size_t)linked, sizeof(slot_key), slot_key_compare);
    /* Each run of one slot is a group: its units link to each other in order, its first to the slot's last. */
    const uint8_t *slot_table = (const uint8_t *)wheel.buf;
    int64_t *slot_row = (int64_t *)slots.buf, groups = 0;
    for (int64_t start = 0; start < linked;) {
        int64_t end = start + 1;
        while (end < linked && keys[end].slot_ms == keys[start].slot_ms) end++;
        int64_t time_slot = keys[start].slot_ms / precision;  /* slot_ms >= 0 */
        const uint8_t *old = slot_table + (time_slot % MQ_TIMER_SLOT_COUNT) * MQ_TIMER_SLOT_SIZE;
        int filled = mq_get_i64(old + MQ_SLOT_AT_TIME) == time_slot;
        int64_t previous = filled ? mq_get_i64(old + MQ_SLOT_AT_LAST) : -1;
        for (int64_t k = start; k < end; k++) {
            mq_put_i64(unit_out + keys[k].index * MQ_TIMER_UNIT_SIZE + MQ_UNIT_AT_PREV, previous);
            previous = positions[keys[k].index];
        }
        int64_t *out = slot_row + groups * 4;
        out[0] = time_slot;
        out[1] = filled ? mq_get_i64(old + MQ_SLOT_AT_FIRST) : positions[keys[start].index];
        out[2] = previous;
        out[3] = (filled ? (int64_t)mq_get_i32(old + MQ_SLOT_AT_COUNT) : 0) + (end - start);  /* <= 2**31 + 2**40 */
        groups++;
        start = end;
    }
    int64_t new_end = linked > 0 ? positions[linked - 1] + MQ_TIMER_UNIT_SIZE : log_end;
    result = Py_BuildValue("(sLLOL)", "linked", (long long)linked, (long long)groups, listed, (long long)new_end);
done:
    PyMem_Free(keys);
    PyMem_Free(positions);
    Py_XDECREF(listed);
    Py_XDECREF(magics);
    if (rows.obj != NULL) PyBuffer_Release(&rows);
    if (offsets.obj != NULL) PyBuffer_Release(&offsets);
    if (sizes.obj != NULL) PyBuffer_Release(&sizes);
    if (wheel.obj != NULL) PyBuffer_Release(&wheel);
    if (units.obj != NULL) PyBuffer_Release(&units);
    if (slots.obj != NULL) PyBuffer_Release(&slots);
    return result;
}

PyDoc_STRVAR(timer_put_slots_doc,
"timer_put_slots(wheel, slots, count, precision)\n\n"
"Write `count` slot rows (time_slot, first, last, units; int64, as timer_link gives them) into the mapped wheel\n"
"file `wheel` (files.py's TimerWheel.put_slots): each at index time_slot % WHEEL_SLOT_COUNT, its count stored\n"
"as an i4 (wrapping, as numpy stores it) and its magic 0. ValueError for a time_slot < 0 or a short buffer.");

static PyObject *timer_put_slots(PyObject *self, PyObject *args) {
    PyObject *wheel_object, *slots_object;
    long long count, precision;
    if (!PyArg_ParseTuple(args, "OOLL", &wheel_object, &slots_object, &count, &precision)) return NULL;
    Py_buffer wheel, slots;
    if (PyObject_GetBuffer(wheel_object, &wheel, PyBUF_WRITABLE) < 0) return NULL;
    if (mq_int64_buffer(slots_object, &slots, 0, "slots") < 0) {
        PyBuffer_Release(&wheel);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t *row = (const int64_t *)slots.buf;
    if (wheel.len != (Py_ssize_t)MQ_TIMER_SLOT_COUNT * MQ_TIMER_SLOT_SIZE || count < 0 ||
        count > (long long)(slots.len / 8 / 4) || precision < 1) {
        PyErr_SetString(PyExc_ValueError, "timer_put_slots: not a whole wheel, or fewer rows than count");
        goto done;
    }
    for (long long i = 0; i < count; i++) {
        if (row[i * 4] < 0) {
            PyErr_SetString(PyExc_ValueError, "timer_put_slots: a time_slot < 0");
            goto done;
        }
    }
    for (long long i = 0; i < count; i++) {
        const int64_t *r = row + i * 4;
        uint8_t *slot = (uint8_t *)wheel.buf + (r[0] % MQ_TIMER_SLOT_COUNT) * MQ_TIMER_SLOT_SIZE;
        mq_put_i64(slot + MQ_SLOT_AT_TIME, r[0]);
        mq_put_i64(slot + MQ_SLOT_AT_FIRST, r[1]);
        mq_put_i64(slot + MQ_SLOT_AT_LAST, r[2]);
        put_i32(slot + MQ_SLOT_AT_COUNT, r[3]);
        put_i32(slot + MQ_SLOT_AT_MAGIC, 0);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&wheel);
    PyBuffer_Release(&slots);
    return result;
}

#define MQ_TIMER_SCAN_SLOTS 65536  /* slots looked at in one call: a bound on the time the lock is kept */

PyDoc_STRVAR(timer_next_filled_doc,
"timer_next_filled(wheel, first, stop) -> int\n\n"
"The first time slot t in [first, min(stop, first + 65536)) whose wheel slot holds t (files.py's\n"
"TimerWheel.next_filled, in slots of the precision, not ms), or -1 when there is none in that range: the caller\n"
"goes on from first + 65536. ValueError when first < 0 or the wheel is not a whole wheel file.");

static PyObject *timer_next_filled(PyObject *self, PyObject *args) {
    PyObject *wheel_object;
    long long first, stop;
    if (!PyArg_ParseTuple(args, "OLL", &wheel_object, &first, &stop)) return NULL;
    Py_buffer wheel;
    if (PyObject_GetBuffer(wheel_object, &wheel, PyBUF_SIMPLE) < 0) return NULL;
    if (wheel.len != (Py_ssize_t)MQ_TIMER_SLOT_COUNT * MQ_TIMER_SLOT_SIZE || first < 0) {
        PyErr_SetString(PyExc_ValueError, "timer_next_filled: not a whole wheel, or a time slot < 0");
        PyBuffer_Release(&wheel);
        return NULL;
    }
    /* stop - first only when stop > first >= 0 (it cannot overflow then), and first + the bound only below stop */
    long long end = stop <= first ? first : stop - first > MQ_TIMER_SCAN_SLOTS ? first + MQ_TIMER_SCAN_SLOTS : stop;
    long long found = -1;
    for (long long t = first; t < end; t++) {
        if (mq_get_i64((const uint8_t *)wheel.buf + (t % MQ_TIMER_SLOT_COUNT) * MQ_TIMER_SLOT_SIZE) == t) {
            found = t;
            break;
        }
    }
    PyBuffer_Release(&wheel);
    return PyLong_FromLongLong(found);
}

PyDoc_STRVAR(pwrite_keep_lock_doc,
"pwrite_keep_lock(fd, data, offset)\n\n"
"pwrite all of `data` at `offset` of `fd`, keeping the interpreter lock (os.pwrite lets go of it, and a thread\n"
"that lets go waits out another's switch interval to get it back): for writes to the page cache, as the timer's\n"
"units are. OSError as os.pwrite raises it; a signal's handler runs between two partial writes.");

static PyObject *pwrite_keep_lock(PyObject *self, PyObject *args) {
    int fd;
    long long at;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*L", &fd, &data, &at)) return NULL;
    PyObject *result = NULL;
    if (at < 0 || data.len > INT64_MAX - at) {
        PyErr_SetString(PyExc_ValueError, "pwrite_keep_lock: the offset is negative or the write passes 2**63");
        goto done;
    }
    const char *from = data.buf;
    Py_ssize_t left = data.len;
    while (left > 0) {
        ssize_t written = pwrite(fd, from, (size_t)left, (off_t)at);
        if (written < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) goto done;  /* `data` is held: a handler cannot free it */
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        if (written == 0) {
            errno = EIO;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        from += written;
        left -= written;
        at += written;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    return result;
}

PyDoc_STRVAR(pread_keep_lock_doc,
"pread_keep_lock(fd, length, offset) -> bytes\n\n"
"os.pread, keeping the interpreter lock (pwrite_keep_lock says why): for the timer's reads of single units from\n"
"the page cache when it delivers a slot. Fewer bytes at the end of the file; OSError as os.pread raises it.");

static PyObject *pread_keep_lock(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t length;
    long long at;
    if (!PyArg_ParseTuple(args, "inL", &fd, &length, &at)) return NULL;
    if (length < 0 || length > (Py_ssize_t)1 << 20 || at < 0 || length > INT64_MAX - at) {
        PyErr_SetString(PyExc_ValueError, "pread_keep_lock: a length in 0..2**20, an offset >= 0, a sum < 2**63");
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, length);  /* this function's own until returned */
    if (result == NULL) return NULL;
    Py_ssize_t done = 0;
    while (done < length) {
        ssize_t got = pread(fd, PyBytes_AS_STRING(result) + done, (size_t)(length - done), (off_t)(at + done));
        if (got < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) goto failed;
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            goto failed;
        }
        if (got == 0) break;  /* the end of the file */
        done += got;
    }
    if (done < length) {  /* a new, shorter object (no private resize) */
        PyObject *shorter = PyBytes_FromStringAndSize(PyBytes_AS_STRING(result), done);
        Py_DECREF(result);
        return shorter;
    }
    return result;
failed:
    Py_DECREF(result);
    return NULL;
}

static PyObject *timer_layout(PyObject *self, PyObject *unused) {
    return Py_BuildValue("iiiiii", MQ_TIMER_UNIT_SIZE, MQ_TIMER_BLANK_SIZE, MQ_TIMER_SLOT_SIZE, MQ_TIMER_SLOT_COUNT,
                         MQ_TIMER_MAGIC_DEFAULT, MQ_TIMER_MAGIC_ROLL);
}

PyMethodDef mq_timer_methods[] = {
    {"timer_link", timer_link, METH_VARARGS, timer_link_doc},
    {"timer_put_slots", timer_put_slots, METH_VARARGS, timer_put_slots_doc},
    {"timer_next_filled", timer_next_filled, METH_VARARGS, timer_next_filled_doc},
    {"pwrite_keep_lock", pwrite_keep_lock, METH_VARARGS, pwrite_keep_lock_doc},
    {"pread_keep_lock", pread_keep_lock, METH_VARARGS, pread_keep_lock_doc},
    {"timer_layout", timer_layout, METH_NOARGS,
     "timer_layout() -> (unit size, blank size, slot size, wheel slots, MAGIC_DEFAULT, MAGIC_ROLL): the constants"
     " timer_link.c writes with (mqstore/timer/format.py's)."},
    {NULL, NULL, 0, NULL},
};
