/* Index placement under the fuzzer (index_core.c), called from fuzz_scan.c's entry point with the same input.
 *
 * Input bytes 14 and 15 (unused by the scans) choose the index file: S = 1 + byte14 % 61 slots, N = 2 +
 * byte15 % 97 entries. Bit 7 of byte 14 fills the whole mapping with the segment's bytes (hostile header
 * counters, slots and entries); else bit 7 of byte 15 copies only the header from them (hostile counters over
 * empty slots); else the file is a fresh one. The mapping is allocated at exactly 40 + 4S + 20N bytes, so any
 * access past it is caught. Message rows are cut from the segment too: per row, four control bytes (UNIQ_KEY
 * length or absent, KEYS length or absent with spaces sprinkled in, topic id — one past the prefixes as well —
 * and sys_flag), then the key bytes; store times are read from the segment (any int64). Python's loop is
 * replayed: a full file rolls to a fresh one, a key for the Python path is passed over, an error ends the run.
 * After every call: the cursor moved forward, indexCount grew by exactly the keys placed, and, for a file that
 * started sound, every slot and chain keeps rules (4), (5) and (9).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../index_core.h"

#define ROWS_MAX 64

static void check(int condition) {
    if (!condition) abort();
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void check_sound(const uint8_t *map, int64_t slot_count) {
    int64_t count = (int32_t)be32(map + MQ_INDEX_OFF_INDEX_COUNT);
    if (count == 0) count = 1;
    const uint8_t *slots = map + MQ_INDEX_HEADER_SIZE, *entries = slots + MQ_INDEX_SLOT_SIZE * slot_count;
    for (int64_t s = 0; s < slot_count; s++) {
        int64_t number = (int32_t)be32(slots + MQ_INDEX_SLOT_SIZE * s);
        check(number >= 0 && number < count);  /* rule 4 */
        for (int64_t step = 0; number != 0; step++) {  /* rules 5 and 9 along the chain */
            check(step < count);
            const uint8_t *entry = entries + MQ_INDEX_ENTRY_SIZE * number;
            int32_t hash = (int32_t)be32(entry), prev = (int32_t)be32(entry + 16);
            check(hash >= 0 && hash % slot_count == s && prev >= 0 && prev < number);
            check((int32_t)be32(entry + 12) >= 0);  /* rule 6 */
            number = prev;
        }
    }
}

void fuzz_index(const uint8_t *input, size_t length, const uint8_t *segment, int64_t size_bytes) {
    if (length < 16) return;
    int64_t slot_count = 1 + input[14] % 61, entry_max = 2 + input[15] % 97;
    int64_t map_len = MQ_INDEX_HEADER_SIZE + MQ_INDEX_SLOT_SIZE * slot_count + MQ_INDEX_ENTRY_SIZE * entry_max;
    int hostile_all = input[14] & 0x80, hostile_header = input[15] & 0x80;
    uint8_t *map = calloc((size_t)map_len, 1);
    if (hostile_all)
        for (int64_t i = 0; i < map_len && size_bytes; i++) map[i] = segment[i % size_bytes];
    else if (hostile_header)
        for (int64_t i = 0; i < MQ_INDEX_HEADER_SIZE && i < size_bytes; i++) map[i] = segment[i];
    int sound = !hostile_all && !hostile_header;

    static const mq_span prefixes[3] = {{(const uint8_t *)"t#", 2}, {(const uint8_t *)"\xd1\x82#", 3},
                                        {(const uint8_t *)"", 0}};
    mq_span uniq[ROWS_MAX], keys[ROWS_MAX];
    int64_t topic_ids[ROWS_MAX], offsets[ROWS_MAX], timestamps[ROWS_MAX], sys_flags[ROWS_MAX];
    uint8_t *key_bytes = malloc((size_t)(size_bytes ? size_bytes : 1));  /* the segment with spaces sprinkled in */
    memcpy(key_bytes, segment, (size_t)size_bytes);
    int64_t rows = 0, at = 0, offset = 0;
    while (rows < ROWS_MAX && at + 4 <= size_bytes) {
        const uint8_t *control = segment + at;
        at += 4;
        int64_t uniq_len = control[0] == 0xFF ? -1 : control[0] % 40, keys_len = control[1] == 0xFF ? -1 : control[1];
        uniq[rows].ptr = NULL;
        uniq[rows].len = 0;
        keys[rows] = uniq[rows];
        if (uniq_len >= 0 && at + uniq_len <= size_bytes) {
            uniq[rows].ptr = key_bytes + at;
            uniq[rows].len = uniq_len;
            at += uniq_len;
        }
        if (keys_len >= 0 && at + keys_len <= size_bytes) {
            for (int64_t i = at; i < at + keys_len; i += 1 + control[2] % 7) key_bytes[i] = ' ';
            keys[rows].ptr = key_bytes + at;
            keys[rows].len = keys_len;
            at += keys_len;
        }
        topic_ids[rows] = control[2] % 4;  /* 3: no such prefix */
        sys_flags[rows] = control[3];
        offset += control[3] & 3;  /* non-decreasing, as the caller checks */
        offsets[rows] = offset;
        int64_t ts = 0;
        if (at + 8 <= size_bytes)
            for (int i = 0; i < 8; i++) ts = (int64_t)(((uint64_t)ts << 8) | segment[at + i]);
        timestamps[rows] = ts;
        rows++;
    }
    mq_index_rows in = {
        .rows = rows, .prefixes = prefixes, .prefix_count = 3, .topic_ids = topic_ids, .uniq_keys = uniq,
        .keys = keys, .offsets = offsets, .timestamps = timestamps, .sys_flags = sys_flags, .skip_mask = 0xC,
        .skip_value = 0xC,
    };
    mq_index_cursor cursor = {.row = 0, .key = 0};
    for (int round = 0; round < 512; round++) {
        int64_t before_count = (int32_t)be32(map + MQ_INDEX_OFF_INDEX_COUNT);
        int64_t row = cursor.row, key = cursor.key;
        mq_index_place(map, map_len, slot_count, entry_max, &in, &cursor);
        check(cursor.placed >= 0 && cursor.row >= row && cursor.row <= rows);
        check(cursor.row > row || cursor.key >= key || cursor.status >= MQ_INDEX_BAD_SLOT);
        if (cursor.placed) {
            if (before_count == 0) before_count = 1;
            check((int32_t)be32(map + MQ_INDEX_OFF_INDEX_COUNT) == before_count + cursor.placed);
            check(before_count + cursor.placed <= entry_max);
        }
        if (sound) check_sound(map, slot_count);
        if (cursor.status == MQ_INDEX_DONE || cursor.status >= MQ_INDEX_BAD_SLOT) break;
        if (cursor.status == MQ_INDEX_PYTHON_KEY) {
            cursor.key++;
        } else {  /* full: a fresh file */
            check(cursor.status == MQ_INDEX_FULL);
            check((int32_t)be32(map + MQ_INDEX_OFF_INDEX_COUNT) == entry_max);
            memset(map, 0, (size_t)map_len);
            sound = 1;
        }
    }
    /* the hash on its own, over the raw segment: never reads past it */
    int ok;
    (void)mq_java_hash_utf8(0, segment, size_bytes, &ok);
    free(key_bytes);
    free(map);
}
