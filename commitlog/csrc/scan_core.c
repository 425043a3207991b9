/* The scans of the log as plain C: see scan_core.h. No Python API here (the fuzz target links this file
 * alone with crc32.c); every read is bounds-checked against the segment before it is made. */
#include <string.h>

#include "mq_native.h"
#include "scan_core.h"

static const uint8_t RECORD_CRC_PREFIX[9] = {'_', '_', 'C', 'R', 'C', '3', '2', '#', 0x01};
#define RECORD_CRC_DIGITS 10
#define HIGH_BITS 0x8080808080808080ull

/* Eight bytes at p, in the host's order (for comparisons and hashing, never for a field's value). */
static inline uint64_t load_word(const uint8_t *p) {
    uint64_t word;
    memcpy(&word, p, sizeof word);
    return word;
}

/* The n < 8 bytes at p as one word, the other bytes zero, reading nothing at or past `readable` (the end of
 * what was checked to be inside the buffer): one load when eight bytes are readable there (a byte-wise copy
 * into a word on the stack would make the load wait on the stores), else byte by byte. */
static inline uint64_t load_short(const uint8_t *p, int64_t n, const uint8_t *readable) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (readable - p >= 8) return n == 0 ? 0 : load_word(p) & (~0ull >> (64 - 8 * n));
#endif
    uint64_t word = 0;
    for (int64_t i = 0; i < n; i++) word |= (uint64_t)p[i] << (8 * i);
    return word;
}

/* Whether the n bytes at p (p + n <= readable) are all ASCII, eight at a time. */
static inline int all_ascii(const uint8_t *p, int64_t n, const uint8_t *readable) {
    if (n < 8) return (load_short(p, n, readable) & HIGH_BITS) == 0;
    uint64_t seen = load_word(p + n - 8);
    for (int64_t i = 0; i + 8 <= n; i += 8) seen |= load_word(p + i);
    return (seen & HIGH_BITS) == 0;
}

/* The first byte `byte` in [p, end), or NULL: short spans inline, long ones through memchr. */
static inline const uint8_t *find_byte(const uint8_t *p, const uint8_t *end, uint8_t byte) {
    const uint8_t *inline_end = end - p > 24 ? p + 24 : end;
    for (; p < inline_end; p++)
        if (*p == byte) return p;
    return p < end ? memchr(p, byte, (size_t)(end - p)) : NULL;
}

int32_t mq_java_ascii_hash(const uint8_t *text, int64_t length, int *ascii) {
    uint32_t h = 0;
    *ascii = 1;
    for (int64_t i = 0; i < length; i++) {
        if (text[i] >= 0x80) {
            *ascii = 0;
            return 0;
        }
        h = 31u * h + text[i];
    }
    return (int32_t)h;
}

/* Whether the name_length bytes at p are `name` (names are a few bytes: a loop, not a call). */
static inline int same_name(const uint8_t *p, const uint8_t *name, int64_t name_length) {
    for (int64_t i = 0; i < name_length; i++)
        if (p[i] != name[i]) return 0;
    return 1;
}

void mq_property_span(const uint8_t *data, int64_t start, int64_t end, const uint8_t *name, int64_t name_length,
                      int64_t *value_start, int64_t *value_end) {
    *value_start = *value_end = -1;
    int64_t p = start;
    while (p < end) {
        if (p + name_length + 1 <= end && same_name(data + p, name, name_length) && data[p + name_length] == 0x01) {
            int64_t v = p + name_length + 1;
            const uint8_t *sep = find_byte(data + v, data + end, 0x02);
            *value_start = v;
            *value_end = sep ? (int64_t)(sep - data) : end;
            return;
        }
        const uint8_t *next = find_byte(data + p, data + end, 0x02);
        if (next == NULL) return;
        p = (int64_t)(next - data) + 1;
    }
}

static const uint64_t POWERS_OF_TEN[RECORD_CRC_DIGITS] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000,
};

/* mq_locate's body, inlined into the scan's loop. */
static inline __attribute__((always_inline)) int locate(const uint8_t *data, int64_t size_bytes, int64_t pos,
                                                        int64_t commitlog_offset, int required,
                                                        mq_scan_layout *layout) {
    int64_t remaining = size_bytes - pos;
    if (pos < 0 || remaining < MQ_END_FILE_MIN_BLANK_LENGTH) return -1;  /* rule 1 */
    const uint8_t *p = data + pos;
    int64_t size = mq_get_i32(p + MQ_OFFSET_TOTAL_SIZE);
    uint32_t magic = mq_get_u32(p + MQ_OFFSET_MAGIC_CODE);
    if (magic != MQ_MESSAGE_MAGIC_CODE && magic != MQ_MESSAGE_MAGIC_CODE_V2) return -1;  /* rule 1 */
    if (size < MQ_RECORD_SIZE_MIN || size > remaining) return -1;  /* rule 2; from here [pos, pos+size) is ours */
    int32_t sys_flag = mq_get_i32(p + MQ_OFFSET_SYS_FLAG);  /* 40 <= RECORD_SIZE_MIN */
    int64_t born_length = (sys_flag & MQ_SYS_FLAG_BORNHOST_V6) ? MQ_HOST_V6_LENGTH : MQ_HOST_V4_LENGTH;
    int64_t store_length = (sys_flag & MQ_SYS_FLAG_STOREHOST_V6) ? MQ_HOST_V6_LENGTH : MQ_HOST_V4_LENGTH;
    int64_t born_at = MQ_OFFSET_BORN_HOST;                 /* relative to the record from here on */
    int64_t store_at = born_at + born_length + 8;
    int64_t body_length_at = store_at + store_length + 4 + 8;
    int64_t fixed = body_length_at + 4;
    int64_t topic_length_bytes = magic == MQ_MESSAGE_MAGIC_CODE_V2 ? 2 : 1;
    if (fixed + topic_length_bytes + 2 > size) return -1;  /* rule 3 */
    int64_t body_length = mq_get_i32(p + body_length_at);
    int64_t body_start = fixed;
    if (body_length < 0 || fixed + body_length + topic_length_bytes + 2 > size) return -1;
    int64_t topic_length_at = body_start + body_length;
    int64_t topic_length = topic_length_bytes == 1 ? p[topic_length_at] : mq_get_u16(p + topic_length_at);
    int64_t topic_start = topic_length_at + topic_length_bytes;
    int64_t properties_length_at = topic_start + topic_length;
    if (topic_length < 1 || properties_length_at + 2 > size) return -1;
    int64_t properties_length = (int16_t)mq_get_u16(p + properties_length_at);
    int64_t properties_start = properties_length_at + 2;
    if (properties_length < 0 || properties_start + properties_length != size) return -1;
    if (!all_ascii(p + topic_start, topic_length, p + size)) return -1;  /* rule 3: ASCII topic */
    if (mq_get_i64(p + MQ_OFFSET_PHYSICAL_OFFSET) != commitlog_offset) return -1;  /* rule 4 */
    /* rule 6's shape: '__CRC32#' 0x01, 10 digits, 0x02 at the end of the properties, after 0x02 or alone */
    int has_crc = 0;
    uint64_t value = 0;
    int64_t at = size - MQ_RECORD_CRC_LENGTH;
    if (properties_length >= MQ_RECORD_CRC_LENGTH && p[size - 1] == 0x02 &&
        load_word(p + at) == load_word(RECORD_CRC_PREFIX) && p[at + 8] == RECORD_CRC_PREFIX[8] &&
        (at == properties_start || p[at - 1] == 0x02)) {
        has_crc = 1;
        const uint8_t *digits = p + at + (int64_t)sizeof RECORD_CRC_PREFIX;
        unsigned not_digits = 0;
        for (int i = 0; i < RECORD_CRC_DIGITS; i++) {  /* unrolled: no multiply waits for another */
            unsigned digit = (unsigned)digits[i] - '0';
            not_digits |= digit > 9;
            value += digit * POWERS_OF_TEN[i];
        }
        if (not_digits) return -1;  /* rule 6: not 10 digits */
    }
    if (!has_crc && required) return -1;  /* rule 6: a required record CRC is missing */
    layout->size = size;
    layout->magic = magic;
    layout->sys_flag = sys_flag;
    layout->born_host_at = pos + born_at;
    layout->born_host_length = born_length;
    layout->store_host_at = pos + store_at;
    layout->store_host_length = store_length;
    layout->store_timestamp_at = pos + store_at - 8;
    layout->body_start = pos + body_start;
    layout->body_length = body_length;
    layout->topic_start = pos + topic_start;
    layout->topic_length = topic_length;
    layout->properties_start = pos + properties_start;
    layout->properties_length = properties_length;
    layout->has_crc = has_crc;
    layout->crc_value = value > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)value;  /* > 0x7FFFFFFF never matches */
    return 0;
}

int mq_locate(const uint8_t *data, int64_t size_bytes, int64_t pos, int64_t commitlog_offset, int required,
              mq_scan_layout *layout) {
    return locate(data, size_bytes, pos, commitlog_offset, required, layout);
}

/* mq_crc_ok's body with the CRC function chosen once per scan. */
static inline int crc_ok(mq_crc32_fn crc32, const uint8_t *data, int64_t pos, const mq_scan_layout *layout) {
    if (layout->has_crc) {
        uint32_t actual = crc32(0, data + pos, (size_t)(layout->size - MQ_RECORD_CRC_LENGTH)) & 0x7FFFFFFFu;
        return actual == layout->crc_value;
    }
    int64_t stored = mq_get_i32(data + pos + MQ_OFFSET_BODY_CRC);
    int64_t actual = crc32(0, data + layout->body_start, (size_t)layout->body_length) & 0x7FFFFFFFu;
    return stored == actual;
}

int mq_crc_ok(const uint8_t *data, int64_t pos, const mq_scan_layout *layout) {
    return crc_ok(mq_crc32_function(), data, pos, layout);
}

/* --- distinct topics of a scan: open addressing over (start, length) spans of the segment --------------- */
#define TOPIC_SLOTS_LOG2 10
#define TOPIC_SLOTS (1 << TOPIC_SLOTS_LOG2)  /* 4 x MQ_SCAN_TOPICS_MAX: probes stay short */

typedef struct {
    int64_t start[TOPIC_SLOTS];
    int64_t length[TOPIC_SLOTS];
    uint64_t head[TOPIC_SLOTS], tail[TOPIC_SLOTS];  /* the topic's first and last eight bytes (see topic_id) */
    int32_t id[TOPIC_SLOTS];  /* -1: empty */
} topic_table;

/* The topic's id: its first and last eight bytes (overlapping, or its bytes zero-padded when shorter) and its
 * length pick the slot and, up to 16 bytes, decide equality alone; longer topics are compared in full. */
static int64_t topic_id(topic_table *table, const uint8_t *data, int64_t start, int64_t length,
                        const uint8_t *readable, int64_t row, mq_scan_out *out) {
    const uint8_t *topic = data + start;
    uint64_t head = length >= 8 ? load_word(topic) : load_short(topic, length, readable);
    uint64_t tail = length >= 8 ? load_word(topic + length - 8) : 0;
    uint64_t h = (head ^ (tail * 0x9E3779B97F4A7C15ull) ^ (uint64_t)length) * 0xFF51AFD7ED558CCDull;
    uint32_t slot = (uint32_t)(h >> (64 - TOPIC_SLOTS_LOG2));
    for (;;) {
        int32_t id = table->id[slot];
        if (id < 0) break;
        if (table->length[slot] == length && table->head[slot] == head && table->tail[slot] == tail &&
            (length <= 16 || memcmp(data + table->start[slot], topic, (size_t)length) == 0))
            return id;
        slot = (slot + 1) & (TOPIC_SLOTS - 1);
    }
    if (out->topics >= MQ_SCAN_TOPICS_MAX) {
        out->topics_overflow = 1;
        return -1;
    }
    table->id[slot] = (int32_t)out->topics;
    table->start[slot] = start;
    table->length[slot] = length;
    table->head[slot] = head;
    table->tail[slot] = tail;
    out->topic_rows[out->topics] = row;
    return out->topics++;
}

static const uint8_t TAGS_NAME[4] = {'T', 'A', 'G', 'S'};

/* How far ahead of the record it checks the scan asks for the log's cache lines: the walk reads a few bytes at
 * each end of a record, one record's position waits on the last one's TOTALSIZE, and the CPU's own prefetcher
 * stops at each 4 KiB page. */
#define SCAN_PREFETCH_BYTES 4096

void mq_scan_segment(const mq_scan_in *in, int64_t *columns, int64_t capacity, mq_scan_out *out) {
    const uint8_t *data = in->data;
    int64_t size_bytes = in->size_bytes, pos = in->pos;
    int64_t limit = in->limit < size_bytes ? in->limit : size_bytes;
    int64_t records_max = in->records_max < capacity ? in->records_max : capacity;
    int64_t n = 0;
    topic_table table;
    memset(table.id, 0xFF, sizeof table.id);
    memset(out, 0, sizeof *out);
    out->error = MQ_SCAN_OK;
#define COL(c) (columns + (int64_t)(c) * capacity)
    mq_crc32_fn crc32 = mq_crc32_function();
    int64_t prefetched = pos;  /* the log's lines up to here were asked for (SCAN_PREFETCH_BYTES ahead) */
    while (pos >= 0 && pos < limit && n < records_max) {
        int64_t ahead = pos + SCAN_PREFETCH_BYTES < limit ? pos + SCAN_PREFETCH_BYTES : limit;
        for (; prefetched < ahead; prefetched += 64) __builtin_prefetch(data + prefetched, 0, 3);
        int64_t remaining = size_bytes - pos;
        if (remaining < MQ_END_FILE_MIN_BLANK_LENGTH) {
            out->error = MQ_SCAN_ERR_SHORT;
            break;
        }
        int64_t size = mq_get_i32(data + pos);
        uint32_t magic = mq_get_u32(data + pos + MQ_OFFSET_MAGIC_CODE);
        if (magic == MQ_MESSAGE_MAGIC_CODE || magic == MQ_MESSAGE_MAGIC_CODE_V2) {
            if (size < MQ_RECORD_SIZE_MIN || size > remaining) {
                out->error = MQ_SCAN_ERR_INVALID;
                break;
            }
            if (pos + size > limit) {
                if (!in->zeros_end) out->error = MQ_SCAN_ERR_PAST_END;
                break;
            }
            int64_t offset = in->base + pos;
            mq_scan_layout layout;
            if (locate(data, size_bytes, pos, offset, offset >= in->required_from, &layout) != 0) {
                out->error = MQ_SCAN_ERR_INVALID;
                break;
            }
            if (in->check_crc && !crc_ok(crc32, data, pos, &layout)) {
                out->error = MQ_SCAN_ERR_CRC;
                break;
            }
            int64_t properties_end = pos + size - (layout.has_crc ? MQ_RECORD_CRC_LENGTH : 0);
            int64_t tags_start, tags_end, tags_code = 0;
            mq_property_span(data, layout.properties_start, properties_end, TAGS_NAME, 4, &tags_start, &tags_end);
            if (tags_start >= 0 && tags_end > tags_start) {
                int ascii;
                tags_code = mq_java_ascii_hash(data + tags_start, tags_end - tags_start, &ascii);
                if (!ascii) out->tags_non_ascii++;
            }
            COL(MQ_COL_OFFSET)[n] = offset;
            COL(MQ_COL_SIZE)[n] = size;
            COL(MQ_COL_TOPIC_START)[n] = layout.topic_start;
            COL(MQ_COL_TOPIC_LENGTH)[n] = layout.topic_length;
            COL(MQ_COL_PROPERTIES_START)[n] = layout.properties_start;
            COL(MQ_COL_PROPERTIES_END)[n] = properties_end;
            COL(MQ_COL_QUEUE_ID)[n] = mq_get_i32(data + pos + MQ_OFFSET_QUEUE_ID);
            COL(MQ_COL_QUEUE_OFFSET)[n] = mq_get_i64(data + pos + MQ_OFFSET_QUEUE_OFFSET);
            COL(MQ_COL_STORE_TIMESTAMP)[n] = mq_get_i64(data + layout.store_timestamp_at);
            COL(MQ_COL_SYS_FLAG)[n] = layout.sys_flag;
            COL(MQ_COL_TAGS_CODE)[n] = tags_code;
            COL(MQ_COL_TAGS_START)[n] = tags_start;
            COL(MQ_COL_TAGS_END)[n] = tags_end;
            COL(MQ_COL_TOPIC_ID)[n] = topic_id(&table, data, layout.topic_start, layout.topic_length,
                                                  data + pos + size, n, out);
            COL(MQ_COL_BODY_START)[n] = layout.body_start;
            COL(MQ_COL_BODY_LENGTH)[n] = layout.body_length;
            n++;
            pos += size;
        } else if (magic == MQ_BLANK_MAGIC_CODE && size == remaining) {
            out->blank = 1;
            pos = size_bytes;
            break;
        } else if (in->zeros_end && size == 0 && magic == 0) {
            break;
        } else {
            out->error = MQ_SCAN_ERR_INVALID;
            break;
        }
    }
#undef COL
    out->count = n;
    out->stop = pos;
}

#define WALK_PREFETCH_BYTES 2048  /* a few records ahead of the walk (prefetches never fault or read past) */

int64_t mq_walk_chain(const uint8_t *buf, int64_t length, int64_t buf_abs, int64_t *positions, int64_t capacity,
                      int64_t *following) {
    int64_t at = 0, n = 0;
    while (length - at >= MQ_RECORD_SIZE_MIN && n < capacity) {
        /* each TOTALSIZE is a load the next one waits on: ask for the lines WALK_PREFETCH_BYTES on meanwhile */
        if (length - at > WALK_PREFETCH_BYTES + 256) {
            __builtin_prefetch(buf + at + WALK_PREFETCH_BYTES);
            __builtin_prefetch(buf + at + WALK_PREFETCH_BYTES + 64);
            __builtin_prefetch(buf + at + WALK_PREFETCH_BYTES + 128);
            __builtin_prefetch(buf + at + WALK_PREFETCH_BYTES + 192);
        }
        int64_t size = mq_get_i32(buf + at);
        uint32_t magic = mq_get_u32(buf + at + MQ_OFFSET_MAGIC_CODE);
        if (magic != MQ_MESSAGE_MAGIC_CODE && magic != MQ_MESSAGE_MAGIC_CODE_V2) break;
        if (size < MQ_RECORD_SIZE_MIN || size > length - at ||
            mq_get_i64(buf + at + MQ_OFFSET_PHYSICAL_OFFSET) != buf_abs + at)
            break;
        positions[n++] = at;
        at += size;
    }
    *following = at;
    return n;
}

/* --- two property values of a queue's records (the timer's enqueue) ---------------------------------------- */

/* A run of ASCII digits as an int64: 1 with *value, 0 when empty, not all digits or over INT64_MAX (any number of
 * leading zeros, as Python's int() of bytes.isdigit() text takes them). */
static int parse_digits(const uint8_t *text, int64_t length, int64_t *value) {
    if (length <= 0) return 0;
    uint64_t magnitude = 0;
    for (int64_t i = 0; i < length; i++) {
        unsigned digit = (unsigned)text[i] - '0';
        if (digit > 9) return 0;
        if (magnitude > ((uint64_t)INT64_MAX - digit) / 10) return 0;
        magnitude = magnitude * 10 + digit;
    }
    *value = (int64_t)magnitude;
    return 1;
}

int64_t mq_record_values(const mq_values_in *in, int64_t *out) {
    int64_t i = in->first;
    for (; i < in->count; i++) {
        int64_t offset = in->offsets[i], expected_size = in->sizes[i];
        int64_t position;  /* another segment (or an offset no segment has): stop */
        if (__builtin_sub_overflow(offset, in->segment_base, &position) || position < 0 ||
            position >= in->segment_length)
            break;
        if (expected_size < MQ_RECORD_SIZE_MIN || expected_size > in->segment_length - position) break;
        const uint8_t *record = in->segment + position;
        mq_layout layout;  /* every span below is inside [record, record + expected_size) */
        if (!mq_locate_record(record, expected_size, offset, expected_size, 1, in->required_from, &layout)) break;
        if (in->topic != NULL) {  /* the record must be the queue's entry first_entry + i */
            int64_t entry;
            if (__builtin_add_overflow(in->first_entry, i, &entry) || layout.queue_id != in->queue_id ||
                layout.queue_offset != entry || layout.topic_length != in->topic_length ||
                memcmp(record + layout.topic_at, in->topic, (size_t)in->topic_length) != 0)
                break;
        }
        int64_t *row = out + i * MQ_VALUE_COLUMNS;
        int64_t start, end;
        mq_property_span(record, layout.properties_at, layout.properties_end, in->number_name,
                         in->number_name_length, &start, &end);
        row[MQ_VALUE_NUMBER] = 0;
        row[MQ_VALUE_NUMBER_OK] = start >= 0 && parse_digits(record + start, end - start, &row[MQ_VALUE_NUMBER]);
        if (!row[MQ_VALUE_NUMBER_OK]) row[MQ_VALUE_NUMBER] = 0;
        mq_property_span(record, layout.properties_at, layout.properties_end, in->text_name, in->text_name_length,
                         &start, &end);
        int ascii = 1;
        row[MQ_VALUE_TEXT_HASH] = start < 0 ? 0 : mq_java_ascii_hash(record + start, end - start, &ascii);
        row[MQ_VALUE_TEXT_STATE] = start < 0 ? MQ_TEXT_ABSENT : ascii ? MQ_TEXT_HASHED : MQ_TEXT_NOT_ASCII;
    }
    return i;
}
