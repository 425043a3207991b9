/* Arrow columns of located records in plain C: see arrow_core.h. The checks are arrow_decode.FastLayout's and
 * Decoder._properties' (commitlog/arrow_decode.py); every position is checked against the buffer first. */
#include <stdlib.h>
#include <string.h>

#include "mq_native.h"
#include "arrow_core.h"

static const uint8_t CRC_NAME[9] = {'_', '_', 'C', 'R', 'C', '3', '2', '#', 0x01};

/* 'a.b.c.d:port' of 8 host bytes (IPv4 address, then the port as a big-endian i32), as format.decode_host */
static int format_host(const uint8_t *raw, char *out) {
    int n = 0;
    for (int i = 0; i < 4; i++) {
        unsigned v = raw[i];
        if (v >= 100) out[n++] = (char)('0' + v / 100);
        if (v >= 10) out[n++] = (char)('0' + v / 10 % 10);
        out[n++] = (char)('0' + v % 10);
        out[n++] = i < 3 ? '.' : ':';
    }
    int64_t port = mq_get_i32(raw + 4);
    if (port < 0) {
        out[n++] = '-';
        port = -port;
    }
    char digits[12];
    int d = 0;
    do {
        digits[d++] = (char)('0' + port % 10);
        port /= 10;
    } while (port);
    while (d) out[n++] = digits[--d];
    return n;
}

/* format_host with the last host remembered: a log's records mostly share their hosts */
typedef struct {
    uint8_t raw[8];
    char text[32];
    int length;  /* 0: nothing remembered */
} host_cache;

static int cached_host(host_cache *cache, const uint8_t *raw, char **text) {
    if (cache->length == 0 || memcmp(cache->raw, raw, 8) != 0) {
        memcpy(cache->raw, raw, 8);
        cache->length = format_host(raw, cache->text);
    }
    *text = cache->text;
    return cache->length;
}

static int queue_kept(const mq_arrow_filter *f, int64_t queue_id) {
    int64_t lo = 0, hi = f->queue_count;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (f->queue_ids[mid] < queue_id) lo = mid + 1;
        else hi = mid;
    }
    return lo < f->queue_count && f->queue_ids[lo] == queue_id;
}

/* The properties [start, start+length): 1 when they are 'name\x01value\x02' pairs of ASCII text, counting
 * pairs and bytes, and finding the last TAGS and KEYS pairs (value spans, -1 when none). */
typedef struct {
    int64_t pairs, name_bytes, value_bytes, tags_start, tags_end, keys_start, keys_end;
} props_info;

#define WORD_ONES 0x0101010101010101ull
#define WORD_HIGH_BITS 0x8080808080808080ull

/* Whether the n bytes at p are all ASCII, eight at a time. */
static inline int ascii_text(const uint8_t *p, int64_t n) {
    uint64_t seen = 0, word;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&word, p + i, sizeof word);
        seen |= word;
    }
    for (; i < n; i++) seen |= p[i];
    return (seen & WORD_HIGH_BITS) == 0;
}

/* The position of the first 0x01 or 0x02 in p[i, n), or n. Eight bytes a step on a little-endian machine: a
 * word's lowest byte below 0x03 is its lowest flagged byte ((w - 0x03..) & ~w & 0x80.., exact for the lowest
 * one); a 0x00 found that way is text, and the search goes on after it. */
static inline int64_t next_separator(const uint8_t *p, int64_t i, int64_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (i + 8 <= n) {
        uint64_t word;
        memcpy(&word, p + i, sizeof word);
        uint64_t low = (word - 3 * WORD_ONES) & ~word & WORD_HIGH_BITS;
        if (low == 0) {
            i += 8;
            continue;
        }
        i += __builtin_ctzll(low) >> 3;
        if (p[i] != 0x00) return i;
        i++;
    }
#endif
    for (; i < n; i++)
        if (p[i] == 0x01 || p[i] == 0x02) return i;
    return n;
}

/* Records are read in order but not side by side (a topic's records among others'), so the hardware's stream
 * prefetch, which follows adjacent lines, does not run ahead of them: each pass asks for the lines of the record
 * PREFETCH_RECORDS on while it decodes this one (a prefetch never faults). The measure pass asks for all of a
 * record whose size a ConsumeQueue unit gave (untrusted: it only bounds a prefetch, clamped to the buffer), else
 * for its first PREFETCH_BYTES (a log walk's records lie side by side); the fill pass asks for a kept record's
 * lines up to its properties' end, which measure found. Asking for the first 256 bytes only, both passes missed
 * the cache at the properties of a topic's 273-byte records on every line past them. */
#define PREFETCH_RECORDS 6
#define PREFETCH_BYTES 256  /* the first and the last bytes of a record asked for: all of a common record */

/* Every cache line of buf[start:start+bytes), clamped to buf[0:length] (start and bytes may be untrusted: no
 * sum overflows); the first and the last PREFETCH_BYTES of it when it is longer (a large body is copied by
 * memcpy, which streams). */
static inline void prefetch_span(const uint8_t *buf, int64_t length, int64_t start, int64_t bytes) {
    if (start < 0 || start >= length || bytes <= 0) return;
    int64_t end = bytes > length - start ? length : start + bytes;
    uintptr_t first = ((uintptr_t)(buf + start)) & ~(uintptr_t)63, last = ((uintptr_t)(buf + end - 1)) & ~(uintptr_t)63;
    if (last - first >= 2 * PREFETCH_BYTES) {
        for (uintptr_t line = first; line < first + PREFETCH_BYTES; line += 64) __builtin_prefetch((const void *)line);
        first = last - PREFETCH_BYTES + 64;
    }
    for (uintptr_t line = first; line <= last; line += 64) __builtin_prefetch((const void *)line);
}

/* Whether the 10 bytes at p are ASCII digits: two overlapping words, each byte b flagged by the high bit of
 * b - '0' (b < '0') or of b + 0x46 (b > '9'); the lowest non-digit byte is flagged exactly (no borrow or carry
 * reaches it from digits below it), and all-digit words flag nothing. */
static inline int ten_digits(const uint8_t *p) {
    uint64_t first, last;
    memcpy(&first, p, sizeof first);
    memcpy(&last, p + 2, sizeof last);
    uint64_t flags = ((first - 0x30 * WORD_ONES) | (first + 0x46 * WORD_ONES) |
                      (last - 0x30 * WORD_ONES) | (last + 0x46 * WORD_ONES)) & WORD_HIGH_BITS;
    return flags == 0;
}

static int read_properties(const uint8_t *p, int64_t length, props_info *info) {
    memset(info, 0, sizeof *info);
    info->tags_start = info->keys_start = info->tags_end = info->keys_end = -1;
    if (!ascii_text(p, length)) return 0;  /* not ASCII: the Python decoder checks the UTF-8 */
    int64_t pair_start = 0;
    while (pair_start < length) {
        int64_t name_end = next_separator(p, pair_start, length);
        if (name_end == length || p[name_end] != 0x01) return 0;
        int64_t value_end = next_separator(p, name_end + 1, length);
        if (value_end == length || p[value_end] != 0x02) return 0;
        int64_t name_length = name_end - pair_start;
        if (name_length == 4 && memcmp(p + pair_start, "TAGS", 4) == 0) {
            info->tags_start = name_end + 1;
            info->tags_end = value_end;
        } else if (name_length == 4 && memcmp(p + pair_start, "KEYS", 4) == 0) {
            info->keys_start = name_end + 1;
            info->keys_end = value_end;
        }
        info->pairs++;
        info->name_bytes += name_length;
        info->value_bytes += value_end - name_end - 1;
        pair_start = value_end + 1;
    }
    return 1;  /* ends with 0x02 (or is empty) */
}

int mq_arrow_measure(const uint8_t *buf, int64_t length, const int64_t *positions, const int64_t *offsets,
                     int64_t count, const mq_arrow_filter *f, mq_arrow_sizes *sizes) {
    memset(sizes, 0, sizeof *sizes);
    mq_arrow_row *kept = malloc((size_t)(count > 0 ? count : 1) * sizeof *kept);
    if (kept == NULL) return MQ_ARROW_NO_MEMORY;
    sizes->kept = kept;
    int64_t rows = 0;
    host_cache born_cache = {.length = 0}, store_cache = {.length = 0};
    char *host;
    for (int64_t i = 0; i < count; i++) {
        if (i + PREFETCH_RECORDS < count) {  /* the ConsumeQueue path knows the record's size: all of it */
            int64_t ahead = positions[i + PREFETCH_RECORDS];
            prefetch_span(buf, length, ahead,
                          f->expect_sizes != NULL ? f->expect_sizes[i + PREFETCH_RECORDS] : PREFETCH_BYTES);
        }
        int64_t pos = positions[i];
        if (pos < 0 || pos > length - MQ_HEADER_SIZE) return MQ_ARROW_FALLBACK;
        const uint8_t *p = buf + pos;
        int64_t size = mq_get_i32(p);
        if (f->expect_sizes != NULL && size != f->expect_sizes[i]) return MQ_ARROW_FALLBACK;
        /* arrow_decode.FastLayout: v1, IPv4 hosts, the parts adding up to TOTALSIZE, PHYSICALOFFSET right */
        int64_t body_length = mq_get_i32(p + MQ_OFFSET_BODY_LENGTH);
        if (mq_get_u32(p + MQ_OFFSET_MAGIC_CODE) != MQ_MESSAGE_MAGIC_CODE ||
            (mq_get_i32(p + MQ_OFFSET_SYS_FLAG) & (MQ_SYS_FLAG_BORNHOST_V6 | MQ_SYS_FLAG_STOREHOST_V6)) ||
            size < MQ_RECORD_SIZE_MIN || size > length - pos || body_length < 0 ||
            MQ_RECORD_SIZE_FIXED + body_length > size || mq_get_i64(p + MQ_OFFSET_PHYSICAL_OFFSET) != offsets[i])
            return MQ_ARROW_FALLBACK;
        int64_t topic_at = MQ_OFFSET_BODY + body_length;
        int64_t topic_length = p[topic_at];
        int64_t properties_at = topic_at + 1 + topic_length;
        if (topic_length < 1 || properties_at + 2 > size) return MQ_ARROW_FALLBACK;
        int64_t properties_length = mq_get_u16(p + properties_at);
        if (properties_length >= 0x8000 || properties_at + 2 + properties_length != size) return MQ_ARROW_FALLBACK;
        int64_t properties_start = properties_at + 2;
        int64_t at = size - MQ_RECORD_CRC_LENGTH;  /* the record-CRC pair is the store's: left out */
        if (properties_length >= MQ_RECORD_CRC_LENGTH && memcmp(p + at, CRC_NAME, sizeof CRC_NAME) == 0 &&
            p[size - 1] == 0x02 && (at == properties_start || p[at - 1] == 0x02)) {
            /* rule 6's shape includes 10 ASCII digits: anything else is reported by the Python decoder */
            if (!ten_digits(p + at + (int64_t)sizeof CRC_NAME)) return MQ_ARROW_FALLBACK;
            properties_length -= MQ_RECORD_CRC_LENGTH;
        } else if (f->has_record_crc_from && offsets[i] >= f->record_crc_from) {
            return MQ_ARROW_FALLBACK;  /* a record CRC is required there: the Python decoder raises rule 6 */
        }
        /* the row filter (arrow_decode.Decoder._numeric_mask) */
        if (f->queue_ids != NULL && !queue_kept(f, mq_get_i32(p + MQ_OFFSET_QUEUE_ID))) continue;
        if (f->has_offset_lo && offsets[i] < f->offset_lo) continue;
        if (f->has_offset_hi && offsets[i] >= f->offset_hi) continue;
        int64_t stored_us = (int64_t)((uint64_t)mq_get_i64(p + MQ_OFFSET_STORE_TIMESTAMP) * 1000u);
        if (f->has_time_lo && stored_us < f->time_lo_us) continue;
        if (f->has_time_hi && stored_us >= f->time_hi_us) continue;
        const uint8_t *topic = p + topic_at + 1;
        for (int64_t k = 0; k < topic_length; k++)
            if (topic[k] >= 0x80) return MQ_ARROW_FALLBACK;  /* the Python decoder raises rule 3 */
        if (f->expect_topic != NULL && (topic_length != f->expect_topic_length ||
                                        memcmp(topic, f->expect_topic, (size_t)topic_length) != 0))
            return MQ_ARROW_FALLBACK;  /* the Python decoder raises rule "cq" */
        if (f->topics != NULL) {
            int found = 0;
            for (int64_t k = 0; k < f->topic_count && !found; k++)
                found = f->topic_lengths[k] == topic_length && memcmp(f->topics[k], topic, (size_t)topic_length) == 0;
            if (!found) continue;
        }
        props_info info;
        if (!read_properties(p + properties_start, properties_length, &info)) return MQ_ARROW_FALLBACK;
        sizes->pairs += info.pairs;
        sizes->name_bytes += info.name_bytes;
        sizes->value_bytes += info.value_bytes;
        if (info.tags_start >= 0) sizes->tags_bytes += info.tags_end - info.tags_start;
        if (info.keys_start >= 0) {
            const uint8_t *keys = p + properties_start;
            int64_t run = 0;
            for (int64_t k = info.keys_start; k <= info.keys_end; k++) {
                if (k == info.keys_end || keys[k] == ' ') {
                    if (run) sizes->keys++;
                    sizes->key_bytes += run;
                    run = 0;
                } else {
                    run++;
                }
            }
        }
        sizes->topic_bytes += topic_length;
        sizes->body_bytes += body_length;
        sizes->born_host_bytes += cached_host(&born_cache, p + MQ_OFFSET_BORN_HOST, &host);
        sizes->store_host_bytes += cached_host(&store_cache, p + MQ_OFFSET_STORE_HOST, &host);
        mq_arrow_row *row = &kept[rows++];
        row->pos = pos;
        row->body_start = pos + MQ_OFFSET_BODY;
        row->body_length = body_length;
        row->topic_start = pos + topic_at + 1;
        row->topic_length = topic_length;
        row->properties_start = pos + properties_start;
        row->properties_length = properties_length;
        row->tags_start = (int32_t)info.tags_start;  /* within properties_length < 0x8000 */
        row->tags_end = (int32_t)info.tags_end;
        row->keys_start = (int32_t)info.keys_start;
        row->keys_end = (int32_t)info.keys_end;
    }
    sizes->rows = rows;
    const int64_t limit = INT32_MAX;
    if (sizes->topic_bytes > limit || sizes->body_bytes > limit || sizes->name_bytes > limit ||
        sizes->value_bytes > limit || sizes->tags_bytes > limit || sizes->key_bytes > limit || sizes->pairs > limit ||
        sizes->keys > limit || sizes->born_host_bytes > limit || sizes->store_host_bytes > limit)
        return MQ_ARROW_FALLBACK;  /* Arrow's 32-bit offsets: the Python decoder takes views */
    return MQ_ARROW_OK;
}

static const char HEX[16] = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'};

void mq_arrow_fill(const uint8_t *buf, const mq_arrow_sizes *sizes, mq_arrow_out *out) {
    int32_t topic_at = 0, body_at = 0, tags_at = 0, key_count = 0, key_at = 0, pair_count = 0, name_at = 0;
    int32_t value_at = 0, born_at = 0, store_at = 0;
    out->topic_offsets[0] = out->body_offsets[0] = out->tags_offsets[0] = out->keys_list_offsets[0] = 0;
    out->key_offsets[0] = out->map_offsets[0] = out->name_offsets[0] = out->value_offsets[0] = 0;
    out->born_host_offsets[0] = out->store_host_offsets[0] = 0;
    memset(out->tags_validity, 0, (size_t)((sizes->rows + 7) / 8));
    out->tags_nulls = 0;
    host_cache born_cache = {.length = 0}, store_cache = {.length = 0};
    char *host;
    int host_length;
    for (int64_t r = 0; r < sizes->rows; r++) {
        if (r + PREFETCH_RECORDS < sizes->rows) {  /* a kept record: its header to its properties' end */
            const mq_arrow_row *ahead = &sizes->kept[r + PREFETCH_RECORDS];
            int64_t ahead_end = ahead->properties_start + ahead->properties_length;
            prefetch_span(buf, ahead_end, ahead->pos, ahead_end - ahead->pos);
        }
        const mq_arrow_row *row = &sizes->kept[r];
        const uint8_t *p = buf + row->pos;
        memcpy(out->topic_data + topic_at, buf + row->topic_start, (size_t)row->topic_length);
        topic_at += (int32_t)row->topic_length;
        out->topic_offsets[r + 1] = topic_at;
        memcpy(out->body_data + body_at, buf + row->body_start, (size_t)row->body_length);
        body_at += (int32_t)row->body_length;
        out->body_offsets[r + 1] = body_at;
        out->queue_id[r] = mq_get_i32(p + MQ_OFFSET_QUEUE_ID);
        out->queue_offset[r] = mq_get_i64(p + MQ_OFFSET_QUEUE_OFFSET);
        out->commitlog_offset[r] = mq_get_i64(p + MQ_OFFSET_PHYSICAL_OFFSET);
        out->flag[r] = mq_get_i32(p + MQ_OFFSET_FLAG);
        out->sys_flag[r] = mq_get_i32(p + MQ_OFFSET_SYS_FLAG);
        out->born_timestamp_us[r] = (int64_t)((uint64_t)mq_get_i64(p + MQ_OFFSET_BORN_TIMESTAMP) * 1000u);
        out->store_timestamp_us[r] = (int64_t)((uint64_t)mq_get_i64(p + MQ_OFFSET_STORE_TIMESTAMP) * 1000u);
        out->reconsume_times[r] = mq_get_i32(p + MQ_OFFSET_RECONSUME_TIMES);
        out->body_crc[r] = mq_get_i32(p + MQ_OFFSET_BODY_CRC);
        host_length = cached_host(&born_cache, p + MQ_OFFSET_BORN_HOST, &host);
        memcpy(out->born_host_data + born_at, host, (size_t)host_length);
        born_at += host_length;
        out->born_host_offsets[r + 1] = born_at;
        host_length = cached_host(&store_cache, p + MQ_OFFSET_STORE_HOST, &host);
        memcpy(out->store_host_data + store_at, host, (size_t)host_length);
        store_at += host_length;
        out->store_host_offsets[r + 1] = store_at;
        uint8_t *id = out->msg_id_data + 32 * r;  /* store host (8 bytes), then PHYSICALOFFSET (8 bytes), in hex */
        for (int k = 0; k < 8; k++) {
            uint8_t h = p[MQ_OFFSET_STORE_HOST + k], o = p[MQ_OFFSET_PHYSICAL_OFFSET + k];
            id[2 * k] = (uint8_t)HEX[h >> 4];
            id[2 * k + 1] = (uint8_t)HEX[h & 15];
            id[16 + 2 * k] = (uint8_t)HEX[o >> 4];
            id[16 + 2 * k + 1] = (uint8_t)HEX[o & 15];
        }
        const uint8_t *props = buf + row->properties_start;
        int64_t props_length = row->properties_length;
        for (int64_t pair_start = 0; pair_start < props_length;) {  /* pairs checked by mq_arrow_measure */
            int64_t name_end = next_separator(props, pair_start, props_length);
            int64_t value_end = next_separator(props, name_end + 1, props_length);
            memcpy(out->name_data + name_at, props + pair_start, (size_t)(name_end - pair_start));
            name_at += (int32_t)(name_end - pair_start);
            memcpy(out->value_data + value_at, props + name_end + 1, (size_t)(value_end - name_end - 1));
            value_at += (int32_t)(value_end - name_end - 1);
            pair_count++;
            out->name_offsets[pair_count] = name_at;
            out->value_offsets[pair_count] = value_at;
            pair_start = value_end + 1;
        }
        out->map_offsets[r + 1] = pair_count;
        if (row->tags_start >= 0) {
            memcpy(out->tags_data + tags_at, props + row->tags_start, (size_t)(row->tags_end - row->tags_start));
            tags_at += row->tags_end - row->tags_start;
            out->tags_validity[r / 8] |= (uint8_t)(1u << (r % 8));
        } else {
            out->tags_nulls++;
        }
        out->tags_offsets[r + 1] = tags_at;
        if (row->keys_start >= 0) {
            int64_t run_start = row->keys_start;
            for (int64_t k = row->keys_start; k <= row->keys_end; k++) {
                if (k == row->keys_end || props[k] == ' ') {
                    if (k > run_start) {
                        memcpy(out->key_data + key_at, props + run_start, (size_t)(k - run_start));
                        key_at += (int32_t)(k - run_start);
                        out->key_offsets[++key_count] = key_at;
                    }
                    run_start = k + 1;
                }
            }
        }
        out->keys_list_offsets[r + 1] = key_count;
    }
}
