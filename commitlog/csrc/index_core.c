/* Index placement (index_core.h): the per-key byte work of indexfile/index_file.py's IndexFile.put_hashes and
 * indexfile/format.py's index_key_hash, for a batch of messages at once. Plain C: no Python API.
 *
 * Layout (indexfile/format.py): header 40 bytes, slot s at 40 + 4*s, entry i at 40 + 4*S + 20*i with keyHash
 * i32, phyOffset i64, timeDiff i32, prevIndex i32, all big-endian. One call:
 *   1. reads the header from the mapping and checks rules (2) and (3);
 *   2. walks the keys from the cursor, hashes each (Java String.hashCode over the UTF-16 code units of
 *      "topic#key", abs, 0 for Integer.MIN_VALUE), and links it to the previous key of its slot: a key placed
 *      earlier in this call, or the slot's head on disk, checked against indexCount (rule 4) — all before any
 *      write, as put_hashes checks every head first;
 *   3. writes the entries, then the header (beginTimestamp/beginPhyOffset on a file's first put, the put
 *      counter wrapped to a Java int, indexCount, endPhyOffset/endTimestamp), then the slots, the order
 *      IndexFile writes them in (a writer stopped between them leaves entries no slot reaches yet).
 */
#include "index_core.h"

#include <stdlib.h>
#include <string.h>

static inline uint32_t get_u32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline int64_t get_i64(const uint8_t *p) { return (int64_t)(((uint64_t)get_u32(p) << 32) | get_u32(p + 4)); }
static inline void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline void put_i64(uint8_t *p, int64_t v) {
    put_u32(p, (uint32_t)((uint64_t)v >> 32));
    put_u32(p + 4, (uint32_t)(uint64_t)v);
}

uint32_t mq_java_hash_utf8(uint32_t h, const uint8_t *d, int64_t len, int *ok) {
    int64_t i = 0;
    while (i < len) {  /* bounded: every step consumes 1 to 4 bytes */
        uint32_t c = d[i];
        if (c < 0x80) {
            h = 31u * h + c;
            i++;
            continue;
        }
        uint32_t cp;
        int64_t need;
        uint8_t lo = 0x80, hi = 0xBF;  /* the second byte's range (Python's strict decoder, RFC 3629) */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            cp = c & 0x0F;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;  /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            cp = c & 0x07;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;  /* at most U+10FFFF */
        } else {
            *ok = 0;
            return 0;
        }
        if (len - i <= need || d[i + 1] < lo || d[i + 1] > hi) {
            *ok = 0;
            return 0;
        }
        for (int64_t k = 1; k <= need; k++) {
            if ((d[i + k] & 0xC0) != 0x80) {
                *ok = 0;
                return 0;
            }
            cp = (cp << 6) | (d[i + k] & 0x3F);
        }
        i += need + 1;
        if (cp >= 0x10000) {  /* a surrogate pair in UTF-16 */
            cp -= 0x10000;
            h = 31u * h + (0xD800u + (cp >> 10));
            h = 31u * h + (0xDC00u + (cp & 0x3FF));
        } else {
            h = 31u * h + cp;
        }
    }
    *ok = 1;
    return h;
}

/* The index keys of one message, in RocketMQ's order: UNIQ_KEY when present, then each non-empty KEYS word. */
typedef struct {
    const mq_span *uniq, *keys;
    int uniq_done;
    int64_t pos;       /* next byte of the KEYS value to look at */
} key_iter;

static void iter_start(key_iter *it, const mq_index_rows *rows, int64_t row) {
    it->uniq = &rows->uniq_keys[row];
    it->keys = &rows->keys[row];
    it->uniq_done = it->uniq->ptr == NULL;
    it->pos = 0;
}

static int iter_next(key_iter *it, const uint8_t **at, int64_t *len) {
    if (!it->uniq_done) {
        it->uniq_done = 1;
        *at = it->uniq->ptr;
        *len = it->uniq->len;
        return 1;
    }
    const mq_span *keys = it->keys;
    if (keys->ptr == NULL) return 0;
    while (it->pos < keys->len) {  /* bounded by the KEYS value's length */
        int64_t i = it->pos;
        const uint8_t *space = memchr(keys->ptr + i, ' ', (size_t)(keys->len - i));
        int64_t end = space ? space - keys->ptr : keys->len;
        it->pos = end + 1;
        if (end > i) {
            *at = keys->ptr + i;
            *len = end - i;
            return 1;
        }
    }
    return 0;
}

/* The number of index keys of `row` (0 for a skipped row). */
static int64_t row_key_bound(const mq_index_rows *rows, int64_t row) {
    if ((rows->sys_flags[row] & rows->skip_mask) == rows->skip_value) return 0;
    int64_t bound = rows->uniq_keys[row].ptr != NULL;
    if (rows->keys[row].ptr != NULL) bound += (rows->keys[row].len + 1) / 2;  /* words of >= 1 byte, 1 space apart */
    return bound;
}

static int32_t time_diff_s(int64_t timestamp_ms, int64_t begin_ms) {  /* indexfile/format.py's time_diff_s */
    if (begin_ms <= 0 || timestamp_ms <= begin_ms) return 0;
    uint64_t diff = ((uint64_t)timestamp_ms - (uint64_t)begin_ms) / 1000u;  /* no overflow: timestamp > begin */
    return diff > (uint64_t)MQ_INDEX_TIME_DIFF_MAX ? MQ_INDEX_TIME_DIFF_MAX : (int32_t)diff;
}

static const mq_span NO_SPAN = {NULL, 0};

typedef struct {       /* one key of this call */
    int64_t row;
    int64_t slot;
    int32_t hash;
    int32_t prev;
} placed_key;

void mq_index_place(uint8_t *map, int64_t map_len, int64_t slot_count, int64_t entry_max, const mq_index_rows *rows,
                    mq_index_cursor *cursor) {
    cursor->placed = 0;
    cursor->detail = cursor->detail2 = 0;
    if (slot_count < 1 || slot_count > INT32_MAX || entry_max < 2 || entry_max > INT32_MAX || map_len < 0 ||
        cursor->row < 0 || cursor->key < 0 ||
        MQ_INDEX_HEADER_SIZE + MQ_INDEX_SLOT_SIZE * slot_count + MQ_INDEX_ENTRY_SIZE * entry_max > map_len) {
        cursor->status = MQ_INDEX_BAD_INPUT;
        return;
    }
    /* 1. the header (rules 2 and 3) */
    int64_t index_count = (int32_t)get_u32(map + MQ_INDEX_OFF_INDEX_COUNT);
    int64_t begin_phy = get_i64(map + MQ_INDEX_OFF_BEGIN_PHY), end_phy = get_i64(map + MQ_INDEX_OFF_END_PHY);
    if (index_count < 0 || index_count > entry_max) {
        cursor->status = MQ_INDEX_BAD_HEADER;
        cursor->detail = 2;
        cursor->detail2 = index_count;
        return;
    }
    if (begin_phy < 0 || end_phy < 0) {
        cursor->status = MQ_INDEX_BAD_HEADER;
        cursor->detail = 3;
        return;
    }
    if (index_count == 0) index_count = 1;  /* created, never written */
    int64_t room = entry_max - index_count;
    /* the keys left, bounded above, size the scratch: at most `room` of them are placed */
    int64_t bound = 0;
    for (int64_t row = cursor->row; row < rows->rows && bound < room; row++) bound += row_key_bound(rows, row);
    if (bound > room) bound = room;
    int64_t table_size = 16;
    while (table_size < 2 * bound) table_size <<= 1;  /* open addressing, load <= 1/2 */
    placed_key *keys = malloc((size_t)(bound ? bound : 1) * sizeof(placed_key));
    int64_t *table_slot = calloc((size_t)table_size, sizeof(int64_t));  /* slot + 1, 0 = empty */
    int32_t *table_head = malloc((size_t)table_size * sizeof(int32_t));  /* the newest number this call put there */
    if (keys == NULL || table_slot == NULL || table_head == NULL) {
        free(keys);
        free(table_slot);
        free(table_head);
        cursor->status = MQ_INDEX_BAD_INPUT;
        return;
    }
    uint8_t *slots = map + MQ_INDEX_HEADER_SIZE;
    uint8_t *entries = slots + MQ_INDEX_SLOT_SIZE * slot_count;

    /* 2. hash and link, reading only */
    int64_t count = 0, row = cursor->row, key = 0;
    int status = MQ_INDEX_DONE;
    int64_t bad_slot = -1, bad_value = 0;
    key_iter it;
    int started = 0;
    while (row < rows->rows) {  /* bounded: every step moves to the next key or the next row */
        const uint8_t *k;
        int64_t kl;
        if (!started) {
            started = 1;
            key = 0;
            if (row_key_bound(rows, row) == 0) {
                it.uniq_done = 1;
                it.keys = &NO_SPAN;
            } else {
                iter_start(&it, rows, row);
            }
            if (row == cursor->row) {  /* skip the keys before the cursor's */
                while (key < cursor->key && iter_next(&it, &k, &kl)) key++;
            }
        }
        if (!iter_next(&it, &k, &kl)) {
            row++;
            started = 0;
            key = 0;
            continue;
        }
        if (count >= bound) {
            status = MQ_INDEX_FULL;
            break;
        }
        int64_t topic = rows->topic_ids[row];
        if (topic < 0 || topic >= rows->prefix_count) {  /* no prefix known: the Python path decides */
            status = MQ_INDEX_PYTHON_KEY;
            break;
        }
        int ok_prefix, ok_key;
        uint32_t h = mq_java_hash_utf8(0, rows->prefixes[topic].ptr, rows->prefixes[topic].len, &ok_prefix);
        h = mq_java_hash_utf8(h, k, kl, &ok_key);
        if (!ok_prefix || !ok_key) {
            status = MQ_INDEX_PYTHON_KEY;
            break;
        }
        int32_t hash = (int32_t)h;
        hash = hash == INT32_MIN ? 0 : (hash < 0 ? -hash : hash);
        int64_t slot = hash % slot_count;
        uint64_t probe = ((uint64_t)slot * 0x9E3779B97F4A7C15ull) >> 7;
        int64_t prev;
        for (;;) {  /* bounded: the table is at most half full */
            int64_t t = (int64_t)(probe & (uint64_t)(table_size - 1));
            if (table_slot[t] == 0) {
                prev = (int32_t)get_u32(slots + MQ_INDEX_SLOT_SIZE * slot);
                if (prev < 0 || prev >= index_count) {  /* rule 4: keep the lowest bad slot, as put_hashes reports */
                    if (bad_slot < 0 || slot < bad_slot) {
                        bad_slot = slot;
                        bad_value = prev;
                    }
                    prev = 0;
                }
                table_slot[t] = slot + 1;
                table_head[t] = (int32_t)(index_count + count);
                break;
            }
            if (table_slot[t] == slot + 1) {
                prev = table_head[t];
                table_head[t] = (int32_t)(index_count + count);
                break;
            }
            probe++;
        }
        keys[count].row = row;
        keys[count].slot = slot;
        keys[count].hash = hash;
        keys[count].prev = (int32_t)prev;
        count++;
        key++;
    }
    free(table_slot);
    free(table_head);
    if (bad_slot >= 0) {
        free(keys);
        cursor->status = MQ_INDEX_BAD_SLOT;
        cursor->detail = bad_slot;
        cursor->detail2 = bad_value;
        return;
    }
    if (count == 0) {
        free(keys);
        cursor->row = row;
        cursor->key = key;
        cursor->status = status;
        return;
    }
    /* 3. entries, header, slots */
    int64_t begin_ms = get_i64(map + MQ_INDEX_OFF_BEGIN_TIMESTAMP);
    int64_t first_ms = rows->timestamps[keys[0].row];
    for (int64_t i = 0; i < count; i++) {
        int64_t number = index_count + i;  /* < entry_max: count <= room */
        uint8_t *entry = entries + MQ_INDEX_ENTRY_SIZE * number;
        put_u32(entry, (uint32_t)keys[i].hash);
        put_i64(entry + 4, rows->offsets[keys[i].row]);
        put_u32(entry + 12, (uint32_t)time_diff_s(rows->timestamps[keys[i].row], begin_ms));
        put_u32(entry + 16, (uint32_t)keys[i].prev);
        if (number <= 1) begin_ms = first_ms;  /* the file's first put resets beginTimestamp for the rows after it */
    }
    if (index_count <= 1) {
        put_i64(map + MQ_INDEX_OFF_BEGIN_PHY, rows->offsets[keys[0].row]);
        put_i64(map + MQ_INDEX_OFF_BEGIN_TIMESTAMP, first_ms);
    }
    uint32_t put_count = get_u32(map + MQ_INDEX_OFF_HASH_SLOT_COUNT) + (uint32_t)count;  /* a Java int, wrapping */
    put_u32(map + MQ_INDEX_OFF_HASH_SLOT_COUNT, put_count);
    put_u32(map + MQ_INDEX_OFF_INDEX_COUNT, (uint32_t)(index_count + count));
    put_i64(map + MQ_INDEX_OFF_END_PHY, rows->offsets[keys[count - 1].row]);
    put_i64(map + MQ_INDEX_OFF_END_TIMESTAMP, rows->timestamps[keys[count - 1].row]);
    for (int64_t i = 0; i < count; i++)  /* in key order: each slot ends at its newest entry */
        put_u32(slots + MQ_INDEX_SLOT_SIZE * keys[i].slot, (uint32_t)(index_count + i));
    free(keys);
    cursor->placed = count;
    cursor->row = row;
    cursor->key = key;
    cursor->status = status;
}
