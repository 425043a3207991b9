/* Shared declarations of the compiled core (`mqstore.commitlog._native`).
 *
 * The record layout is described once, in commitlog/format.py; the offsets below name the same fields and
 * cite that table (v1 record, IPv4 hosts). A test ties them to format.py's constants.
 *
 * Each C file of the module contributes its functions through one PyMethodDef table declared here;
 * module.c adds every table to the module. Functions of a table are independent of the others.
 */
#ifndef MQ_NATIVE_H
#define MQ_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>

#include "mq_format.h"  /* the record layout, big-endian helpers and mq_crc32, without Python */

/* CPython's private API, where it was measured to matter (docs/decisions/0031-private-cpython-api.md), for the
 * versions it is there in; -DMQ_NO_DICT_VERSION / -DMQ_NO_KNOWN_HASH build the public path on any version.
 * MQ_DICT_VERSION: a dict's ma_version_tag (3.11; deprecated in 3.12, gone in 3.14). MQ_KNOWN_HASH:
 * _PyDict_GetItem_KnownHash / _PyDict_SetItem_KnownHash (3.11-3.12; internal from 3.13). */
#if PY_VERSION_HEX < 0x030C0000 && !defined(MQ_NO_DICT_VERSION)
#define MQ_DICT_VERSION 1
#endif
#if PY_VERSION_HEX < 0x030D0000 && !defined(MQ_NO_KNOWN_HASH)
#define MQ_KNOWN_HASH 1
#endif

/* --- buffers passed from Python: scan.c --------------------------------------------------------------- */
/* A C-contiguous int64 buffer (numpy int64) held in `view` (writable when asked), or -1 with TypeError. */
int mq_int64_buffer(PyObject *object, Py_buffer *view, int writable, const char *what);

/* --- the method tables, one per C file that exports functions ------------------------------------------- */
extern PyMethodDef mq_codec_methods[];   /* codec.c: encode records into segments, decode them for get */
extern PyMethodDef mq_scan_methods[];    /* scan.c: dispatch scan, recovery walk, Arrow columns */
extern PyMethodDef mq_message_methods[]; /* message_type.c: prepare of the common message shape */
extern PyMethodDef mq_batch_methods[];   /* batch.c: put_batch's PutResults */
extern PyMethodDef mq_read_path_methods[]; /* read_path.c: a queue's entries as lists, StoredMessage's TAGS, KEYS */
int mq_read_path_init(PyObject *module);
extern PyMethodDef mq_read_map_methods[]; /* read_map.c: a file mapped, a directory listed, keeping the lock */
int mq_read_map_init(PyObject *module);
extern PyMethodDef mq_timer_methods[];   /* timer_link.c: the timer service's enqueue of a batch */

/* message_type.c: a compiled Message of the common shape (no tags, keys or properties; a topic in the log's
 * topic tails), checked as CommitLog.prepare checks it. The objects are strong references taken from the message
 * before any check (a collection's finalizer may change or free the message's fields at any allocation after),
 * given back by mq_common_parts_release; `tail` is held through `tails`. */
typedef struct {
    PyObject *topic, *body, *queue_id, *tails;  /* tails: the topic's entry in CommitLog._topic_tails (4 bytes) */
    PyObject *tail;  /* tails[1]: the topic's TOPICLENGTH..PROPERTIES bytes (borrowed from `tails`) */
    int64_t queue_id_value, flag, born_timestamp_ms;  /* born -1: None (the store timestamp) */
} mq_common_parts;
int mq_common_message(PyObject *object, PyObject *tails_table, long long queues_max, long long body_max,
                      mq_common_parts *out);
void mq_common_parts_release(mq_common_parts *parts);

/* message_type.c: a compiled Message of any property shape, checked as CommitLog.prepare checks all but its
 * tags, keys and properties (put.c checks those); strong references as in mq_common_parts, given back by
 * mq_message_parts_release. A finalizer may still change the keys list or the properties dict in place: read
 * them only before the next point that can run Python code. */
typedef struct {  /* a property a delayed message's rewrite appends after the user properties (put_rewrite.c) */
    const char *name, *value;  /* name: a static text; value: the parts' own buffer, or real_topic's UTF-8 */
    Py_ssize_t name_length, value_length;
} mq_added_property;
#define MQ_ADDED_PROPERTIES_MAX 3
typedef struct {
    mq_common_parts common;  /* common.tail: the tail without user properties (tails[1]) */
    PyObject *tags, *keys, *properties;  /* tags: None or a value; properties: NULL when never made */
    /* Set by put_rewrite.c's mq_rewrite_direct only, else 0 and NULL: the message stored on the schedule or timer
     * topic with these properties after its own (what a rewritten Message's dict would hold, in order). */
    int added_count;
    mq_added_property added[MQ_ADDED_PROPERTIES_MAX];
    PyObject *real_topic;  /* held: the message's own topic, REAL_TOPIC's value */
    char added_text[2][24];  /* the decimals of TIMER_OUT_MS and REAL_QID */
} mq_message_parts;
int mq_message_fields(PyObject *object, PyObject *tails_table, long long queues_max, long long body_max,
                      mq_message_parts *out);
/* mq_message_fields in two steps, for a caller that finds the topic's tails itself (put.c): the fields taken and
 * checked (1, or 0 with nothing held), then `tails` (borrowed; NULL: not found) checked and held (1, or 0 with
 * the parts let go). */
int mq_message_take(PyObject *object, long long queues_max, long long body_max, mq_message_parts *out);
int mq_message_set_tails(mq_message_parts *out, PyObject *tails);
void mq_message_parts_release(mq_message_parts *parts);

/* message_type.c, for put_rewrite.c: a compiled Message's topic, queue id and properties (new references; the
 * properties NULL when never made), 1, or 0 for another object; and a new Message with the body, tags, keys,
 * flag and born timestamp of `object` (a compiled Message) and the given topic, queue id and properties. */
int mq_message_routing(PyObject *object, PyObject **topic, PyObject **queue_id, PyObject **properties);
PyObject *mq_message_moved(PyObject *object, PyObject *topic, PyObject *queue_id, PyObject *properties);

/* put_rewrite.c: the put-side rewrites of delayed messages (mqstore/schedule/service.py's and
 * mqstore/timer/rewrite.py's `rewrite`), done in the compiled put. The objects are held (strong references). */
typedef struct {
    PyObject *timer;         /* the TimerService; NULL: no timer rewrite */
    PyObject *schedule;      /* the ScheduleService; NULL: no delay-level rewrite */
    PyObject *timer_wake, *schedule_wake;  /* their `_wake` Events, read once (the services never replace them) */
    PyObject *system_clock;  /* SYSTEM_CLOCK: when it is the timer's clock, the time is read here */
    long long max_delay_ms, level_count, queues_max;  /* the timer's `_put_state` is read on every timer put */
} mq_rewrite;
int mq_rewrite_init(void);
/* Set from Python's arguments (timer, schedule, system_clock, max_delay_ms, level_count, queues_max), once; 0, or
 * -1 with an error. */
int mq_rewrite_set(mq_rewrite *rewrite, PyObject *args);
void mq_rewrite_clear(mq_rewrite *rewrite);
int mq_rewrite_traverse(mq_rewrite *rewrite, visitproc visit, void *arg);
/* The message to put for `message` (a new reference): itself, its rewritten copy, or None for the Python path
 * (a value it refuses, a timer thread not started, another type); NULL with an error. */
PyObject *mq_rewrite_apply(mq_rewrite *rewrite, PyObject *message);
/* The compiled put's rewrite, in two steps, with no new Message made for the common shapes (no property the
 * rewrite sets or drops is already there). mq_rewrite_prepare runs what may call Python code (the timer's clock,
 * waking the service) and decides: MQ_REWRITE_NONE (put `message` as it is), MQ_REWRITE_DIRECT (`decided`
 * filled; the caller takes the message's parts and calls mq_rewrite_direct) or MQ_REWRITE_FALLBACK (call
 * mq_rewrite_apply), or -1 with an error. mq_rewrite_direct, which runs no Python code, checks the parts taken
 * against what was decided (decides again from them unless they are the objects decided from, unchanged): when
 * that is what `decided` says, it moves the parts to the new topic and queue and adds the properties (1); else 0
 * (Python code run in between changed the message: the Python path puts it), or -1 with an error. */
enum { MQ_REWRITE_NONE, MQ_REWRITE_DIRECT, MQ_REWRITE_FALLBACK };
typedef struct {
    int kind;                        /* what was decided: the rewrite's own code (put_rewrite.c) */
    long long queue, level, out_ms;  /* the message's queue id; the delay level; TIMER_OUT_MS */
    long long now_ms, precision_ms;  /* the timer's clock and precision when they were read */
    int timer_ready;                 /* now_ms and precision_ms were read (a timer request) */
    /* With MQ_REWRITE_DIRECT: the topic, queue id and properties it was decided from, held until
     * mq_rewrite_decision_release, and the properties' dict version then (MQ_DICT_VERSION): mq_rewrite_direct
     * decides again only when the parts it is given are other objects or the dict changed. */
    PyObject *topic, *queue_id, *properties;
    uint64_t properties_version;
} mq_rewrite_decision;
int mq_rewrite_prepare(mq_rewrite *rewrite, PyObject *message, mq_rewrite_decision *decided);
int mq_rewrite_direct(const mq_rewrite *rewrite, const mq_rewrite_decision *decided, mq_message_parts *parts);
void mq_rewrite_decision_release(mq_rewrite_decision *decided);

/* put.c: what commitlog.py's _properties_text (+ the UNIQ_KEY and the record-CRC placeholder) gives a message, as
 * checked and measured by mq_plan_properties (1, or 0 when the Python path must run: another type, a value it
 * refuses, PROPERTIES over the limit); mq_write_tail then writes TOPICLENGTH + TOPIC + PROPERTIESLENGTH +
 * PROPERTIES into a new bytes object, the UNIQ_KEY's digits left as zeros at *key_at (NULL: no UNIQ_KEY), or
 * returns NULL with an error. Neither runs Python code nor allocates a tracked object: call mq_write_tail right
 * after mq_plan_properties, before anything that may (the keys list and the properties dict are read in place, and
 * the plan keeps pointers into their strs' UTF-8). */
#define MQ_PLAN_TEXTS 24
typedef struct {
    const char *text;  /* UTF-8, borrowed from the str it was read from */
    Py_ssize_t length;
} mq_text;
typedef struct {
    PyObject *tags;        /* an exact str, or NULL: no TAGS */
    PyObject *keys;        /* an exact tuple or list of exact strs, or NULL: no KEYS */
    PyObject *properties;  /* an exact dict of exact strs, or NULL: no user properties */
    int unique_key;        /* a UNIQ_KEY is added (the log adds them and the message has none) */
    const char *suffix;    /* the record-CRC placeholder, or "" */
    Py_ssize_t suffix_length, length;  /* length: all of PROPERTIES */
    /* The texts as checked, in the order they are written (the tags, each key, each property's name and value),
     * for mq_write_tail; `texts` -1: there were more than MQ_PLAN_TEXTS, and mq_write_tail reads them again. */
    int texts;
    Py_ssize_t key_count;
    mq_text text[MQ_PLAN_TEXTS];
} mq_properties_plan;
int mq_plan_properties(const mq_message_parts *m, int adds_unique_keys, mq_properties_plan *plan);
PyObject *mq_write_tail(const mq_message_parts *m, const mq_properties_plan *plan, char **key_at);

/* unique_key.c: the UNIQ_KEY generator (`UniqueKeys`). MQ_UNIQUE_KEY_DIGITS chars of the next key into `out`:
 * 0, or -1 with an error (no key used). */
#define MQ_UNIQUE_KEY_DIGITS 32
int mq_is_unique_keys(PyObject *object);
int mq_unique_key_next(PyObject *generator, char *out);
/* mq_unique_key_next with the real clock already read by the caller (`real_ms`, CLOCK_REALTIME in ms): used
 * as the key's time when the generator's clock is time.time_ns (one clock reading for the store time and the
 * key), else the generator reads its own clock (a test's). 0, or -1 with an error. */
int mq_unique_key_next_at(PyObject *generator, char *out, int64_t real_ms);
/* next_many in two steps: the clock read (0, or -1 with an error; `ran_python` says whether it called Python
 * code, a test's clock, rather than clock_gettime), then `count` keys for that reading into `out`
 * (count * MQ_UNIQUE_KEY_DIGITS), running no Python code. */
int mq_unique_key_clock(PyObject *generator, int64_t *now, int *ran_python);
void mq_unique_key_fill(PyObject *generator, int64_t now, char *out, Py_ssize_t count);
int mq_unique_key_init(PyObject *module);

/* put.c: adds the `Appender` type (the single-message put of the common shape) to the module. */
int mq_put_init(PyObject *module);
/* put.c: whether `object` is an Appender; its put(message) for a caller holding the writer lock (a new reference:
 * a PutResult, None for the Python path, or NULL with an error). */
int mq_is_appender(PyObject *object);
PyObject *mq_appender_put(PyObject *appender, PyObject *message);

/* put_entry.c: adds `WriterLock` and `PutEntry` (MessageStore.put's common case) to the module. A WriterLock
 * taken without waiting (1) or not (0), and released by a holder; no error either way. */
int mq_put_entry_init(PyObject *module);
int mq_is_writer_lock(PyObject *object);
int mq_writer_lock_held(PyObject *lock);  /* whether some thread holds it now (a WriterLock) */
int mq_writer_lock_try(PyObject *lock);
void mq_writer_lock_release(PyObject *lock);

/* message_type.c: adds the compiled `Message` type to the module; 0, or -1 with an exception set. */
int mq_message_init(PyObject *module);

#endif
