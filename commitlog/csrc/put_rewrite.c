/* The put-side rewrites of delayed messages, done inside the compiled put (put.c's appender_put).
 *
 * The references are the Python rewrites, applied in this order by the engine: ScheduleService.rewrite
 * (mqstore/schedule/service.py: a DELAY level >= 1 goes to SCHEDULE_TOPIC_XXXX queue level - 1, the timer
 * properties removed, REAL_TOPIC and REAL_QID added) and mqstore/timer/rewrite.py's `rewrite` (TIMER_DELAY_SEC,
 * TIMER_DELAY_MS or TIMER_DELIVER_MS in the future: to rmq_sys_wheel_timer queue 0 with TIMER_OUT_MS, REAL_TOPIC
 * and REAL_QID added). This file gives, for a compiled Message, the same new Message those give (the properties
 * dict copied, then the same deletions and assignments in the same order, so PROPERTIES is the same string), and
 * wakes the service as they do. Whatever they refuse, and whatever it is not sure to do as they do (a value that
 * does not parse, a level out of range, a delay past the maximum, an arithmetic overflow, a key or value that is
 * not an exact str, a timer thread not started yet, a clock that does not answer an int), gives None: the caller
 * then runs the Python path, which raises its own InvalidMessageError before anything is written. Nothing here is
 * policy: the level count, the precision and the maximum delay are the services' own, passed by the engine.
 *
 * Python code can run here (a test's clock, Event.set, any allocation's finalizers): the message's routing
 * fields and its properties are taken (strong references) first, the properties are read from a copy only this
 * call sees, and the new Message is made from references taken before its allocation.
 *
 * The compiled single put makes no new Message for the common shapes (no property the rewrite sets or drops is
 * there already): mq_rewrite_prepare decides and wakes the service (the steps that may run Python code), then
 * put.c takes the message's fields and mq_rewrite_direct checks them against the decision, running no Python
 * code up to the record's bytes: the parts are moved to the service's topic and queue, and the rewrite's
 * properties written after the message's own, as a new Message's dict would hold them. A message Python code
 * changed in between (the second decision differs) goes to the Python path. Against a new Message this saved
 * about 0.25 us of CPU a timer put and 0.15 us a DELAY put here (decision 0054), the dict, the Message and the
 * collections they set off.
 *
 * Each step reads only what it must (decision 0054): the decision holds the topic, queue id and properties it
 * was made from, and with the dict version (MQ_DICT_VERSION) a dict the clock or the wake-up left unchanged is
 * not scanned again, nor the parts taken when they are those objects; the services' `_wake` Events are read once,
 * by set_rewrite; the timer's thread, precision and clock are one attribute, `_put_state`.
 */
#include "mq_native.h"

#include <time.h>

enum { N_DELAY, N_REAL_TOPIC, N_REAL_QID, N_DELIVER_MS, N_DELAY_MS, N_DELAY_SEC, N_OUT_MS, N_SCHEDULE_TOPIC,
       N_TIMER_TOPIC, N_PUT_STATE, N_WAKE, N_FLAG, N_SET, N_NOW_MS, N_COUNT };
static const char *const name_texts[N_COUNT] = {
    "DELAY", "REAL_TOPIC", "REAL_QID", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_OUT_MS",
    "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "_put_state", "_wake", "_flag", "set", "now_ms"};
static PyObject *names[N_COUNT];
static PyObject *zero_queue = NULL;

/* The property names scan looks for (N_DELAY .. N_OUT_MS), by length: no two have the same (mq_rewrite_init). */
#define NAME_LENGTH_MIN 5
#define NAME_LENGTH_MAX 16
static int name_of_length[NAME_LENGTH_MAX + 1];

#define DELAY_LEVEL_DIGITS_MAX 10   /* Java's Integer.parseInt as schedule/format.py's parse_java_int takes it */
#define TIMER_DIGITS_MAX 19         /* Long.parseLong as timer/rewrite.py's _parse takes it */

int mq_rewrite_init(void) {
    for (int n = 0; n < N_COUNT; n++) {
        names[n] = PyUnicode_InternFromString(name_texts[n]);
        if (names[n] == NULL) return -1;
    }
    for (int length = 0; length <= NAME_LENGTH_MAX; length++) name_of_length[length] = -1;
    for (int n = N_DELAY; n <= N_OUT_MS; n++) {
        size_t length = strlen(name_texts[n]);
        if (length < NAME_LENGTH_MIN || length > NAME_LENGTH_MAX || name_of_length[length] >= 0) {
            PyErr_SetString(PyExc_SystemError, "put_rewrite.c: the property names' lengths must differ");
            return -1;
        }
        name_of_length[length] = n;
    }
    zero_queue = PyLong_FromLong(0);
    return zero_queue == NULL ? -1 : 0;
}

int mq_rewrite_set(mq_rewrite *rewrite, PyObject *args) {
    PyObject *timer, *schedule, *system_clock;
    long long max_delay_ms, level_count, queues_max;
    if (!PyArg_ParseTuple(args, "OOOLLL", &timer, &schedule, &system_clock, &max_delay_ms, &level_count,
                          &queues_max))
        return -1;
    if (max_delay_ms < 0 || level_count < 0 || level_count > INT32_MAX || queues_max <= 0) {
        PyErr_SetString(PyExc_ValueError, "set_rewrite: a limit out of range");
        return -1;
    }
    if (rewrite->system_clock != NULL) {  /* once: a put running Python code reads these without holding them */
        PyErr_SetString(PyExc_ValueError, "set_rewrite: set already");
        return -1;
    }
    PyObject *timer_wake = NULL, *schedule_wake = NULL;  /* read once: the services never replace their Event */
    if ((timer != Py_None && (timer_wake = PyObject_GetAttr(timer, names[N_WAKE])) == NULL) ||
        (schedule != Py_None && (schedule_wake = PyObject_GetAttr(schedule, names[N_WAKE])) == NULL)) {
        Py_XDECREF(timer_wake);
        return -1;
    }
    rewrite->timer = timer == Py_None ? NULL : Py_NewRef(timer);
    rewrite->schedule = schedule == Py_None ? NULL : Py_NewRef(schedule);
    rewrite->timer_wake = timer_wake;
    rewrite->schedule_wake = schedule_wake;
    rewrite->system_clock = Py_NewRef(system_clock);
    rewrite->max_delay_ms = max_delay_ms;
    rewrite->level_count = level_count;
    rewrite->queues_max = queues_max;
    return 0;
}

void mq_rewrite_clear(mq_rewrite *rewrite) {
    Py_CLEAR(rewrite->timer);
    Py_CLEAR(rewrite->schedule);
    Py_CLEAR(rewrite->timer_wake);
    Py_CLEAR(rewrite->schedule_wake);
    Py_CLEAR(rewrite->system_clock);
}

int mq_rewrite_traverse(mq_rewrite *rewrite, visitproc visit, void *arg) {
    Py_VISIT(rewrite->timer);
    Py_VISIT(rewrite->schedule);
    Py_VISIT(rewrite->timer_wake);
    Py_VISIT(rewrite->schedule_wake);
    Py_VISIT(rewrite->system_clock);
    return 0;
}

/* --- reading the properties ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject *values[N_OUT_MS + 1];  /* borrowed from the dict scanned; NULL: absent */
    int foreign;                     /* a key that is not an exact str: the Python path decides */
} found_names;

/* The names this file looks for, among `properties`' keys, compared by text (no Python code runs). */
static void scan(PyObject *properties, found_names *found) {
    *found = (found_names){{NULL}, 0};
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(properties, &at, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            found->foreign = 1;
            continue;
        }
        Py_ssize_t length = PyUnicode_GET_LENGTH(key);
        if (length < NAME_LENGTH_MIN || length > NAME_LENGTH_MAX || PyUnicode_KIND(key) != PyUnicode_1BYTE_KIND)
            continue;
        int n = name_of_length[length];  /* the names' lengths differ: one to compare */
        if (n >= 0 && memcmp(PyUnicode_1BYTE_DATA(names[n]), PyUnicode_1BYTE_DATA(key), (size_t)length) == 0)
            found->values[n] = value;
    }
}

/* A signed decimal of 1..`digits_max` ASCII digits in an exact str, as the Python rewrites accept it: 1 with
 * *out, else 0. The range is the caller's to check (int32 or int64 after the sign). */
static int parse_decimal(PyObject *value, int digits_max, long long *out) {
    if (value == NULL || !PyUnicode_CheckExact(value) || PyUnicode_KIND(value) != PyUnicode_1BYTE_KIND) return 0;
    Py_ssize_t length = PyUnicode_GET_LENGTH(value);
    const unsigned char *text = PyUnicode_1BYTE_DATA(value);
    Py_ssize_t at = 0;
    int negative = 0;
    if (length > 0 && (text[0] == '+' || text[0] == '-')) {
        negative = text[0] == '-';
        at = 1;
    }
    if (length - at < 1 || length - at > digits_max) return 0;
    unsigned long long magnitude = 0;  /* 19 digits stay below 10**19 < 2**64 */
    for (; at < length; at++) {
        if (text[at] < '0' || text[at] > '9') return 0;
        magnitude = magnitude * 10 + (unsigned long long)(text[at] - '0');
    }
    if (negative ? magnitude > (unsigned long long)INT64_MAX + 1 : magnitude > (unsigned long long)INT64_MAX)
        return 0;
    *out = negative ? (long long)(0 - magnitude) : (long long)magnitude;
    return 1;
}

/* `if not event.is_set(): event.set()` for a service's `_wake` Event: 0, or -1 with an error. */
static int wake(PyObject *event) {
    PyObject *flag = PyObject_GetAttr(event, names[N_FLAG]);
    int result = flag == NULL ? -1 : 0;
    if (flag != NULL && flag != Py_True) {
        PyObject *done = PyObject_CallMethodNoArgs(event, names[N_SET]);
        result = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_XDECREF(flag);
    return result;
}

/* `clock`'s time now: 1 with *now_ms, 0 for the Python path, -1 with an error. */
static int timer_now_ms(const mq_rewrite *rewrite, PyObject *clock, long long *now_ms) {
    if (clock == rewrite->system_clock) {  /* SystemClock.now_ms: time.time_ns() // 1_000_000 */
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0 || now.tv_sec < 0) return 0;
        *now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        return 1;
    }
    PyObject *value = PyObject_CallMethodNoArgs(clock, names[N_NOW_MS]);
    if (value == NULL) return -1;
    int overflow = 0;
    *now_ms = PyLong_CheckExact(value) ? PyLong_AsLongLongAndOverflow(value, &overflow) : 0;
    int usable = PyLong_CheckExact(value) && !overflow && !PyErr_Occurred();
    Py_DECREF(value);
    return usable;
}

/* The timer's precision and clock reading into `decided`, from its `_put_state` (None until its thread runs, then
 * (precision_ms, clock): TimerService._publish_put_state): 1, 0 when the Python path must decide (a thread not
 * started yet, a precision or a time that is not a usable int), -1 with an error. May run Python code (a test's
 * clock). */
static int read_timer_clock(const mq_rewrite *rewrite, mq_rewrite_decision *decided) {
    PyObject *state = PyObject_GetAttr(rewrite->timer, names[N_PUT_STATE]);
    if (state == NULL) return -1;
    int ready = 0;
    long long precision = 0, now_ms = 0;
    if (PyTuple_CheckExact(state) && PyTuple_GET_SIZE(state) == 2 && PyLong_CheckExact(PyTuple_GET_ITEM(state, 0))) {
        int overflow = 0;
        precision = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(state, 0), &overflow);
        if (!overflow && precision > 0)  /* the clock is borrowed from `state`, held across its call */
            ready = timer_now_ms(rewrite, PyTuple_GET_ITEM(state, 1), &now_ms);
    }
    Py_DECREF(state);
    if (ready <= 0) return ready;
    decided->now_ms = now_ms;
    decided->precision_ms = precision;
    decided->timer_ready = 1;
    return 1;
}

/* --- the two rewrites ------------------------------------------------------------------------------------------ */

#define EXTRA_PROPERTIES 3  /* the most a rewrite adds: TIMER_OUT_MS, REAL_TOPIC, REAL_QID */
#define QUEUE_TEXTS 64      /* REAL_QID values made once (queue ids below this) */
static PyObject *queue_texts[QUEUE_TEXTS];

static int is_timer_request_name(PyObject *key) {
    for (int n = N_DELIVER_MS; n <= N_DELAY_SEC; n++)
        if (key == names[n] || PyUnicode_Compare(key, names[n]) == 0) return 1;
    return 0;
}

/* dict(properties), without the timer request properties with `drop_timer` (as the Python rewrite pops them), in
 * a dict sized for the properties a rewrite adds: 1 with *copy, 0 for the Python path (a key that is not an exact
 * str), -1 with an error. The keys are exact str: copying them runs no Python code. */
static int copy_properties(PyObject *properties, int drop_timer, PyObject **copy) {
#ifdef MQ_KNOWN_HASH
    *copy = _PyDict_NewPresized(PyDict_GET_SIZE(properties) + EXTRA_PROPERTIES);
#else
    *copy = PyDict_New();
#endif
    if (*copy == NULL) return -1;
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(properties, &at, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            Py_CLEAR(*copy);
            return 0;
        }
        if (drop_timer && PyUnicode_GET_LENGTH(key) >= 14 && is_timer_request_name(key)) continue;
        if (PyDict_SetItem(*copy, key, value) < 0) {
            Py_CLEAR(*copy);
            return -1;
        }
    }
    return 1;
}

/* str(queue_id) for an exact int >= 0 (a new reference). */
static PyObject *queue_text(PyObject *queue_id, long long queue) {
    if (queue < 0 || queue >= QUEUE_TEXTS) return PyObject_Str(queue_id);
    if (queue_texts[queue] == NULL) {
        queue_texts[queue] = PyObject_Str(queue_id);
        if (queue_texts[queue] == NULL) return NULL;
    }
    return Py_NewRef(queue_texts[queue]);
}

/* REAL_TOPIC and REAL_QID into `copy` (the caller's own dict): 0, or -1 with an error. */
static int add_real(PyObject *copy, PyObject *topic, PyObject *queue_id, long long queue) {
    if (PyDict_SetItem(copy, names[N_REAL_TOPIC], topic) < 0) return -1;
    PyObject *text = queue_text(queue_id, queue);  /* an exact int: its decimal, as str() */
    if (text == NULL) return -1;
    int result = PyDict_SetItem(copy, names[N_REAL_QID], text);
    Py_DECREF(text);
    return result;
}

/* ScheduleService.rewrite for a level already parsed (1..level_count), with `copy` the properties without the
 * timer's (a delay level wins over a timer): the new message. */
static PyObject *to_schedule(mq_rewrite *rewrite, PyObject *message, PyObject *copy, long long level,
                             PyObject *topic, PyObject *queue_id, long long queue) {
    if (add_real(copy, topic, queue_id, queue) < 0) return NULL;
    PyObject *level_queue = PyLong_FromLongLong(level - 1);
    if (level_queue == NULL) return NULL;
    PyObject *moved = wake(rewrite->schedule_wake) < 0 ? NULL
                      : mq_message_moved(message, names[N_SCHEDULE_TOPIC], level_queue, copy);
    Py_DECREF(level_queue);
    return moved;
}

/* The delivery time asked (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS, in that order): 1, or 0 for the
 * Python path (a value it refuses, a negative delay, an overflow). */
static int delivery_time_ms(const found_names *found, long long now_ms, long long *deliver_ms) {
    long long value;
    if (found->values[N_DELAY_SEC] != NULL) {
        return parse_decimal(found->values[N_DELAY_SEC], TIMER_DIGITS_MAX, &value) && value >= 0 &&
               !__builtin_mul_overflow(value, 1000LL, &value) && !__builtin_add_overflow(now_ms, value, deliver_ms);
    }
    if (found->values[N_DELAY_MS] != NULL) {
        return parse_decimal(found->values[N_DELAY_MS], TIMER_DIGITS_MAX, &value) && value >= 0 &&
               !__builtin_add_overflow(now_ms, value, deliver_ms);
    }
    return parse_decimal(found->values[N_DELIVER_MS], TIMER_DIGITS_MAX, deliver_ms);
}

/* The timer's rewrite of a message that asks for a timer: the new message, the message itself (a delivery time
 * not in the future), None for the Python path, NULL with an error. */
static PyObject *to_timer(mq_rewrite *rewrite, PyObject *message, PyObject *properties, PyObject *topic,
                          PyObject *queue_id, long long queue) {
    mq_rewrite_decision clock = {0};
    int ready = read_timer_clock(rewrite, &clock);  /* not started: the Python path starts it */
    if (ready <= 0) return ready < 0 ? NULL : Py_NewRef(Py_None);
    long long now_ms = clock.now_ms, precision = clock.precision_ms, deliver_ms, waited_ms;
    PyObject *copy;  /* read from here on: no finalizer changes it */
    int copied = copy_properties(properties, 0, &copy);
    if (copied <= 0) return copied < 0 ? NULL : Py_NewRef(Py_None);
    found_names found;
    scan(copy, &found);
    PyObject *result = NULL;
    if (found.foreign || !delivery_time_ms(&found, now_ms, &deliver_ms) || deliver_ms < 0) {
        result = Py_NewRef(Py_None);
    } else if (deliver_ms <= now_ms) {
        result = Py_NewRef(message);
    } else if (__builtin_sub_overflow(deliver_ms, now_ms, &waited_ms) || waited_ms > rewrite->max_delay_ms) {
        result = Py_NewRef(Py_None);  /* the Python path refuses it */
    } else {  /* rewrite.py's out_time_ms (deliver_ms >= 0) */
        long long out_ms = deliver_ms % precision == 0 ? deliver_ms - precision : deliver_ms / precision * precision;
        PyObject *number = PyLong_FromLongLong(out_ms);
        PyObject *text = number == NULL ? NULL : PyObject_Str(number);
        Py_XDECREF(number);
        if (text != NULL && PyDict_SetItem(copy, names[N_OUT_MS], text) == 0 &&
            add_real(copy, topic, queue_id, queue) == 0 && wake(rewrite->timer_wake) == 0)
            result = mq_message_moved(message, names[N_TIMER_TOPIC], zero_queue, copy);
        Py_XDECREF(text);
    }
    Py_DECREF(copy);
    return result;
}

/* Whether `value` is an exact str equal to names[name] (compared in place: no Python code runs). */
static int text_is(PyObject *value, int name) {
    if (value == names[name]) return 1;
    if (!PyUnicode_CheckExact(value)) return 0;
    PyObject *other = names[name];  /* ASCII: an equal str is of the same kind and length */
    return PyUnicode_KIND(value) == PyUnicode_KIND(other) &&
           PyUnicode_GET_LENGTH(value) == PyUnicode_GET_LENGTH(other) &&
           memcmp(PyUnicode_DATA(value), PyUnicode_DATA(other), (size_t)PyUnicode_GET_LENGTH(other)) == 0;
}

/* What the properties `found` ask of the services this store has: a delay level (DELAY, not rewritten yet), a
 * timer (a timer property, not rewritten yet); `asks_timer`: a timer property, rewritten or not. */
typedef struct {
    int asks_timer, delay_request, timer_request;
} requests;

static requests requests_of(const mq_rewrite *rewrite, const found_names *found) {
    requests asked;
    asked.asks_timer = found->values[N_DELIVER_MS] != NULL || found->values[N_DELAY_MS] != NULL ||
                       found->values[N_DELAY_SEC] != NULL;
    asked.delay_request = rewrite->schedule != NULL && found->values[N_DELAY] != NULL &&
                          found->values[N_REAL_TOPIC] == NULL;
    asked.timer_request = asked.asks_timer && rewrite->timer != NULL && found->values[N_OUT_MS] == NULL;
    return asked;
}

/* The rewrites once the message's routing fields and properties are held. */
static PyObject *rewrite_held(mq_rewrite *rewrite, PyObject *message, PyObject *topic, PyObject *queue_id,
                              PyObject *properties) {
    found_names found;
    scan(properties, &found);
    requests asked = requests_of(rewrite, &found);
    int delay_request = asked.delay_request, timer_request = asked.timer_request;
    if (!delay_request && !timer_request) return Py_NewRef(message);
    if (found.foreign || !PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id)) return Py_NewRef(Py_None);
    int overflow = 0;
    long long queue = PyLong_AsLongLongAndOverflow(queue_id, &overflow);
    if (overflow || queue < 0 || queue >= rewrite->queues_max) return Py_NewRef(Py_None);
    if (delay_request && !text_is(topic, N_SCHEDULE_TOPIC)) {
        long long level;
        if (!parse_decimal(found.values[N_DELAY], DELAY_LEVEL_DIGITS_MAX, &level) || level < 0 ||
            level > rewrite->level_count)
            return Py_NewRef(Py_None);  /* the Python path raises */
        if (level > 0) {
            PyObject *copy;
            int copied = copy_properties(properties, 1, &copy);
            if (copied <= 0) return copied < 0 ? NULL : Py_NewRef(Py_None);
            PyObject *moved = to_schedule(rewrite, message, copy, level, topic, queue_id, queue);
            Py_DECREF(copy);
            return moved;
        }
    }
    if (!timer_request || text_is(topic, N_TIMER_TOPIC)) return Py_NewRef(message);
    return to_timer(rewrite, message, properties, topic, queue_id, queue);
}

/* --- the rewrite without a new Message: put.c's put, in two steps ------------------------------------------- */

enum { DECIDED_NONE, DECIDED_FALLBACK, DECIDED_NEEDS_NOW, DECIDED_LEVEL, DECIDED_TIMER };

/* What rewrite_held does with a message of this topic, queue id and properties (`found` by scan), decided from
 * the properties in place without running Python code: DECIDED_NONE (the message as it is), DECIDED_LEVEL or
 * DECIDED_TIMER (moved, its properties kept as they are and the rewrite's added after them, as none it sets or
 * drops is there: the level or TIMER_OUT_MS and the queue in `decided`), DECIDED_NEEDS_NOW (a timer request, and
 * `decided` has no reading of the timer's clock yet), or DECIDED_FALLBACK (anything else: mq_rewrite_apply
 * decides it, makes the new Message or hands the message to the Python path). */
static int decide_found(const mq_rewrite *rewrite, PyObject *topic, PyObject *queue_id, const found_names *found,
                        mq_rewrite_decision *decided) {
    requests asked = requests_of(rewrite, found);
    int asks_timer = asked.asks_timer, delay_request = asked.delay_request, timer_request = asked.timer_request;
    if (!delay_request && !timer_request) return DECIDED_NONE;
    if (found->foreign || !PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id)) return DECIDED_FALLBACK;
    int overflow = 0;
    long long queue = PyLong_AsLongLongAndOverflow(queue_id, &overflow);
    if (overflow || queue < 0 || queue >= rewrite->queues_max) return DECIDED_FALLBACK;
    decided->queue = queue;
    if (found->values[N_REAL_QID] != NULL) return DECIDED_FALLBACK;  /* a rewrite replaces it where it is */
    if (delay_request && !text_is(topic, N_SCHEDULE_TOPIC)) {
        long long level;
        if (!parse_decimal(found->values[N_DELAY], DELAY_LEVEL_DIGITS_MAX, &level) || level < 0 ||
            level > rewrite->level_count)
            return DECIDED_FALLBACK;  /* the Python path raises */
        if (level > 0) {
            if (asks_timer || level - 1 >= rewrite->queues_max) return DECIDED_FALLBACK;  /* drops the timer's */
            decided->level = level;
            return DECIDED_LEVEL;
        }
    }
    if (!timer_request || text_is(topic, N_TIMER_TOPIC)) return DECIDED_NONE;
    if (!decided->timer_ready) return DECIDED_NEEDS_NOW;
    if (found->values[N_REAL_TOPIC] != NULL) return DECIDED_FALLBACK;  /* replaced where it is */
    long long deliver_ms, waited_ms, now_ms = decided->now_ms, precision = decided->precision_ms;
    if (!delivery_time_ms(found, now_ms, &deliver_ms) || deliver_ms < 0) return DECIDED_FALLBACK;
    if (deliver_ms <= now_ms) return DECIDED_NONE;
    if (__builtin_sub_overflow(deliver_ms, now_ms, &waited_ms) || waited_ms > rewrite->max_delay_ms)
        return DECIDED_FALLBACK;  /* the Python path refuses it */
    /* rewrite.py's out_time_ms (deliver_ms >= 0, precision > 0) */
    decided->out_ms = deliver_ms % precision == 0 ? deliver_ms - precision : deliver_ms / precision * precision;
    return DECIDED_TIMER;
}

/* decide_found for these properties, scanned here. */
static int decide(const mq_rewrite *rewrite, PyObject *topic, PyObject *queue_id, PyObject *properties,
                  mq_rewrite_decision *decided) {
    if (properties == NULL || !PyDict_CheckExact(properties) || PyDict_GET_SIZE(properties) == 0)
        return DECIDED_NONE;
    found_names found;
    scan(properties, &found);
    return decide_found(rewrite, topic, queue_id, &found, decided);
}

/* The properties dict's version, for unchanged(); 0 without MQ_DICT_VERSION (then nothing is unchanged). */
static uint64_t version_of(PyObject *properties) {
#ifdef MQ_DICT_VERSION
    return properties != NULL && PyDict_CheckExact(properties) ? ((PyDictObject *)properties)->ma_version_tag : 0;
#else
    (void)properties;
    return 0;
#endif
}

/* Whether `properties` is the dict `version` was read from, unchanged since (a dict's version changes with every
 * change of it in 3.11, and a new dict has a new one): its borrowed values are still the ones read then. The
 * caller holds it. Always 0 without MQ_DICT_VERSION. */
static int unchanged(PyObject *properties, uint64_t version) {
    return version != 0 && version_of(properties) == version;
}

int mq_rewrite_prepare(mq_rewrite *rewrite, PyObject *message, mq_rewrite_decision *decided) {
    *decided = (mq_rewrite_decision){0};
    PyObject *topic, *queue_id, *properties;
    if (!mq_message_routing(message, &topic, &queue_id, &properties)) return MQ_REWRITE_NONE;
    int kind = DECIDED_NONE;
    found_names found;
    uint64_t version = version_of(properties);  /* before the scan: no Python code runs up to the decision */
    if (properties != NULL && PyDict_CheckExact(properties) && PyDict_GET_SIZE(properties) > 0) {
        scan(properties, &found);
        kind = decide_found(rewrite, topic, queue_id, &found, decided);
    }
    int result = MQ_REWRITE_FALLBACK;
    if (kind == DECIDED_NEEDS_NOW) {  /* the clock may run Python code: the properties are read again after it
                                       * unless their dict is known unchanged */
        int ready = read_timer_clock(rewrite, decided);
        if (ready < 0) {
            result = -1;
        } else if (ready == 0) {
            kind = DECIDED_FALLBACK;
        } else if (unchanged(properties, version)) {
            kind = decide_found(rewrite, topic, queue_id, &found, decided);
        } else {
            version = version_of(properties);
            kind = decide(rewrite, topic, queue_id, properties, decided);
        }
    }
    if (result >= 0 && kind == DECIDED_NONE) {
        result = MQ_REWRITE_NONE;
    } else if (result >= 0 && (kind == DECIDED_LEVEL || kind == DECIDED_TIMER)) {
        decided->kind = kind;
        result = wake(kind == DECIDED_LEVEL ? rewrite->schedule_wake : rewrite->timer_wake) < 0 ? -1
                 : MQ_REWRITE_DIRECT;
    }
    if (result == MQ_REWRITE_DIRECT) {  /* held for mq_rewrite_direct's check */
        decided->topic = topic;
        decided->queue_id = queue_id;
        decided->properties = properties;
        decided->properties_version = version;
        return result;
    }
    Py_DECREF(topic);
    Py_DECREF(queue_id);
    Py_XDECREF(properties);
    return result;
}

void mq_rewrite_decision_release(mq_rewrite_decision *decided) {
    Py_CLEAR(decided->topic);
    Py_CLEAR(decided->queue_id);
    Py_CLEAR(decided->properties);
}

/* str(value) into `out` (at least 21 bytes), without snprintf's cost, two digits a step: its length. */
static int decimal_text(char *out, long long value) {
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                "8081828384858687888990919293949596979899";
    char digits[20];
    unsigned long long magnitude = value < 0 ? 0 - (unsigned long long)value : (unsigned long long)value;
    int at = (int)sizeof digits;  /* digits fill from the end */
    while (magnitude >= 100) {
        unsigned pair = (unsigned)(magnitude % 100);
        magnitude /= 100;
        digits[--at] = pairs[2 * pair + 1];
        digits[--at] = pairs[2 * pair];
    }
    if (magnitude >= 10) {
        digits[--at] = pairs[2 * magnitude + 1];
        digits[--at] = pairs[2 * magnitude];
    } else {
        digits[--at] = (char)('0' + magnitude);
    }
    int length = 0;
    if (value < 0) out[length++] = '-';
    memcpy(out + length, digits + at, sizeof digits - (size_t)at);
    return length + (int)sizeof digits - at;
}

int mq_rewrite_direct(const mq_rewrite *rewrite, const mq_rewrite_decision *decided, mq_message_parts *parts) {
    mq_rewrite_decision again = *decided;
    int kind = decided->kind;
    if (parts->common.topic != decided->topic || parts->common.queue_id != decided->queue_id ||
        parts->properties != decided->properties || !unchanged(parts->properties, decided->properties_version)) {
        kind = decide(rewrite, parts->common.topic, parts->common.queue_id, parts->properties, &again);
        if (kind != decided->kind || again.queue != decided->queue ||
            (kind == DECIDED_LEVEL && again.level != decided->level) ||
            (kind == DECIDED_TIMER && again.out_ms != decided->out_ms))
            return 0;  /* changed since it was decided (and the service woken): the Python path decides again */
    }
    long long queue = kind == DECIDED_LEVEL ? again.level - 1 : 0;
    PyObject *queue_id = PyLong_FromLongLong(queue);  /* not a tracked object: no Python code runs */
    if (queue_id == NULL) return -1;
    parts->real_topic = parts->common.topic;  /* the reference moves */
    parts->common.topic = Py_NewRef(names[kind == DECIDED_LEVEL ? N_SCHEDULE_TOPIC : N_TIMER_TOPIC]);
    Py_SETREF(parts->common.queue_id, queue_id);
    parts->common.queue_id_value = queue;
    int count = 0;
    if (kind == DECIDED_TIMER) {
        int length = decimal_text(parts->added_text[0], again.out_ms);
        parts->added[count++] = (mq_added_property){"TIMER_OUT_MS", parts->added_text[0], 12, length};
    }
    Py_ssize_t topic_length;
    const char *topic_text = PyUnicode_AsUTF8AndSize(parts->real_topic, &topic_length);
    if (topic_text == NULL) {  /* a str UTF-8 cannot encode: the Python path says why */
        PyErr_Clear();
        return 0;
    }
    parts->added[count++] = (mq_added_property){"REAL_TOPIC", topic_text, 10, topic_length};
    int length = decimal_text(parts->added_text[1], again.queue);
    parts->added[count++] = (mq_added_property){"REAL_QID", parts->added_text[1], 8, length};
    parts->added_count = count;
    return 1;
}

PyObject *mq_rewrite_apply(mq_rewrite *rewrite, PyObject *message) {
    PyObject *topic, *queue_id, *properties;
    if (!mq_message_routing(message, &topic, &queue_id, &properties)) return Py_NewRef(message);
    PyObject *result;
    if (properties == NULL || !PyDict_CheckExact(properties) || PyDict_GET_SIZE(properties) == 0)
        result = Py_NewRef(message);
    else
        result = rewrite_held(rewrite, message, topic, queue_id, properties);
    Py_DECREF(topic);
    Py_DECREF(queue_id);
    Py_XDECREF(properties);
    return result;
}
