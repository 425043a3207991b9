/* The scans of the log as plain C: see scan_core.h. No Python API here (the fuzz target links this file
 * alone with crc32.c); every read is bounds-checked against the segment before it is made. */
#include <string.h>

#include "mq_native.h"
#include "scan_core.h"

static const uint8_t RECORD_CRC_PREFIX[9] = {'_', '_', 'C', 'R', 'C', '3', '2', '#', 0x01};
#define RECORD_CRC_DIGITS 10

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

void mq_property_span(const uint8_t *data, int64_t start, int64_t end, const uint8_t *name, int64_t name_length,
                      int64_t *value_start, int64_t *value_end) {
    *value_start = *value_end = -1;
    int64_t p = start;
    while (p < end) {
        if (p + name_length + 1 <= end && memcmp(data + p, name, (size_t)name_length) == 0 &&
            data[p + name_length] == 0x01) {
            int64_t v = p + name_length + 1;
            const uint8_t *sep = v < end ? memchr(data + v, 0x02, (size_t)(end - v)) : NULL;
            *value_start = v;
            *value_end = sep ? (int64_t)(sep - data) : end;
            return;
        }
        const uint8_t *next = memchr(data + p, 0x02, (size_t)(end - p));
        if (next == NULL) return;
        p = (int64_t)(next - data) + 1;
    }
}

int mq_locate(const uint8_t *data, int64_t size_bytes, int64_t pos, int64_t commitlog_offset, int required,
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
    for (int64_t i = 0; i < topic_length; i++)
        if (p[topic_start + i] >= 0x80) return -1;  /* rule 3: ASCII topic */
    if (mq_get_i64(p + MQ_OFFSET_PHYSICAL_OFFSET) != commitlog_offset) return -1;  /* rule 4 */
    /* rule 6's shape: '__CRC32#' 0x01, 10 digits, 0x02 at the end of the properties, after 0x02 or alone */
    int has_crc = 0;
    uint64_t value = 0;
    int64_t at = size - MQ_RECORD_CRC_LENGTH;
    if (properties_length >= MQ_RECORD_CRC_LENGTH && p[size - 1] == 0x02 &&
        memcmp(p + at, RECORD_CRC_PREFIX, sizeof RECORD_CRC_PREFIX) == 0 &&
        (at == properties_start || p[at - 1] == 0x02)) {
        has_crc = 1;
        uint64_t weight = 1;
        for (int i = 0; i < RECORD_CRC_DIGITS; i++) {
            uint8_t digit = p[at + (int64_t)sizeof RECORD_CRC_PREFIX + i];
            if (digit < '0' || digit > '9') return -1;  /* rule 6: not 10 digits */
            value += (uint64_t)(digit - '0') * weight;
            weight *= 10;
        }
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

int mq_crc_ok(const uint8_t *data, int64_t pos, const mq_scan_layout *layout) {
    if (layout->has_crc) {
        uint32_t actual = mq_crc32(0, data + pos, (size_t)(layout->size - MQ_RECORD_CRC_LENGTH)) & 0x7FFFFFFFu;
        return actual == layout->crc_value;
    }
    int64_t stored = mq_get_i32(data + pos + MQ_OFFSET_BODY_CRC);
    int64_t actual = mq_crc32(0, data + layout->body_start, (size_t)layout->body_length) & 0x7FFFFFFFu;
    return stored == actual;
}

/* --- distinct topics of a scan: open addressing over (start, length) spans of the segment --------------- */
#define TOPIC_SLOTS (4 * MQ_SCAN_TOPICS_MAX)

typedef struct {
    int64_t start[TOPIC_SLOTS];
    int64_t length[TOPIC_SLOTS];
    int32_t id[TOPIC_SLOTS];  /* -1: empty */
} topic_table;

static int64_t topic_id(topic_table *table, const uint8_t *data, int64_t start, int64_t length, int64_t row,
                        mq_scan_out *out) {
    uint32_t h = 2166136261u;
    for (int64_t i = 0; i < length; i++) h = (h ^ data[start + i]) * 16777619u;
    uint32_t slot = h & (TOPIC_SLOTS - 1);
    for (;;) {
        int32_t id = table->id[slot];
        if (id < 0) break;
        if (table->length[slot] == length && memcmp(data + table->start[slot], data + start, (size_t)length) == 0)
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
    out->topic_rows[out->topics] = row;
    return out->topics++;
}

static const uint8_t TAGS_NAME[4] = {'T', 'A', 'G', 'S'};

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
    while (pos >= 0 && pos < limit && n < records_max) {
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
            if (mq_locate(data, size_bytes, pos, offset, offset >= in->required_from, &layout) != 0) {
                out->error = MQ_SCAN_ERR_INVALID;
                break;
            }
            if (in->check_crc && !mq_crc_ok(data, pos, &layout)) {
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
            COL(MQ_COL_TOPIC_ID)[n] = topic_id(&table, data, layout.topic_start, layout.topic_length, n, out);
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

int64_t mq_walk_chain(const uint8_t *buf, int64_t length, int64_t buf_abs, int64_t *positions, int64_t capacity,
                      int64_t *following) {
    int64_t at = 0, n = 0;
    while (length - at >= MQ_RECORD_SIZE_MIN && n < capacity) {
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
