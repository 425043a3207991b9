/* Fuzz target of the compiled scans (scan_core.c): libFuzzer's entry point, also driven by driver.c where
 * clang is missing. Built with AddressSanitizer and UndefinedBehaviorSanitizer by `make fuzz-scan`.
 *
 * Input: a 16-byte header, then the bytes of one segment (seeds are real segments: make_scan_seeds.py).
 *   0..7   i64  the segment's base offset (big-endian), so that PHYSICALOFFSET checks can pass
 *   8      u8   bit 0: zeros_end, bit 1: check_crc, bit 2: record CRCs required from the segment's middle,
 *               bit 3: a queue filter, bit 4: a time filter (Arrow), bit 5: the two-value read's names,
 *               bit 6: a large segment (below)
 *   9..10  u16  records_max (0: no limit)
 *   11..13 u24  where the scan starts (taken modulo the segment's size)
 *   14..15  u8   the index file fuzz_index.c places keys into (its S and N, which parts are hostile)
 * The segment is copied to a buffer of exactly its size, so any read past it is caught.
 *
 * A large segment (bit 6) is LARGE_SEGMENT_BYTES (4 GiB + 1 MiB) of zeros in large_window.h's window (a read past
 * its end, or gigabytes before its start, faults), with the input's bytes placed at a position P past 2^31 or
 * 2^32 or at the segment's end, chosen by bytes 11..13: the top 2 bits pick 2^31 - k, 2^31 + k, 2^32 - k or
 * the end, the other 22 bits are k. The base offset is moved back by P, so that the input's records keep their
 * commitlog offsets; the scans start at P. The CRC comparisons with zlib and the index placement are left out
 * there (they read the input's bytes alone). Every record the
 * scan returns must lie inside the segment, and each must pass mq_locate again on its own. The Arrow decoder
 * (arrow_core.c) is run over the chain's records and over arbitrary positions, its buffers allocated to the
 * sizes it measured, so a fill that writes more than it measured is caught too. Each CRC-32 path this CPU can
 * run (crc32.c) must give zlib's value over spans of the segment, the last of them ending at its last byte.
 * The two-value read of the timer's enqueue (mq_record_values) runs over the chain's records and over arbitrary
 * offsets and sizes (bit 5 picks the property names it looks for).
 */
#define _DEFAULT_SOURCE  /* MAP_ANONYMOUS, MAP_NORESERVE (large_window.h) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../arrow_core.h"
#include "../mq_native.h"
#include "../scan_core.h"
#include "large_window.h"

#define HEADER 16
#define LARGE_SEGMENT_BYTES (((int64_t)1 << 32) + ((int64_t)1 << 20))
#define ARROW_FILL_BYTES_MAX ((int64_t)64 << 20)  /* a larger measured body total is measured, not filled */

void fuzz_index(const uint8_t *input, size_t length, const uint8_t *segment, int64_t size_bytes);  /* fuzz_index.c */
#define CAPACITY 4096

static void check(int condition) {
    if (!condition) abort();
}

/* Every CRC path against zlib over a few spans of the segment: from `start`, record-sized ones, the last bytes. */
static void check_crc_paths(const uint8_t *segment, int64_t size_bytes, int64_t start, uint32_t initial) {
    int64_t spans[][2] = {{start, size_bytes - start}, {start, (size_bytes - start) % 1200},
                          {size_bytes - (size_bytes - start) % 300, (size_bytes - start) % 300},
                          {start / 2, (size_bytes - start / 2) % 64}};
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
        const uint8_t *at = segment + spans[i][0];
        uLong expected = crc32(initial, at, (uInt)spans[i][1]);
        for (int path = 0; path < MQ_CRC_PATHS; path++)
            if (mq_crc32_path_supported(path)) check(mq_crc32_with(path, initial, at, (size_t)spans[i][1]) == expected);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t length) {
    if (length < HEADER) return 0;
    int64_t data_bytes = (int64_t)(length - HEADER);
    int64_t base = mq_get_i64(input);
    if (base < 0 || base > ((int64_t)1 << 50)) base = 0;
    uint8_t flags = input[8];
    int large = (flags & 64) != 0;
    int64_t records_max = mq_get_u16(input + 9);
    if (records_max == 0 || records_max > CAPACITY) records_max = CAPACITY;
    int64_t start = ((int64_t)input[11] << 16 | (int64_t)input[12] << 8 | input[13]);
    int64_t size_bytes = data_bytes;
    uint8_t *segment;
    if (large) {
        int64_t k = start & 0x3FFFFF, place;
        switch (start >> 22) {
        case 0: place = ((int64_t)1 << 31) - k; break;
        case 1: place = ((int64_t)1 << 31) + k; break;
        case 2: place = ((int64_t)1 << 32) - k; break;
        default: place = LARGE_SEGMENT_BYTES - data_bytes - (k % 4096); break;
        }
        if (place > LARGE_SEGMENT_BYTES - data_bytes) place = LARGE_SEGMENT_BYTES - data_bytes;
        if (place < 0) place = 0;
        size_bytes = LARGE_SEGMENT_BYTES;
        segment = large_window_open(size_bytes);
        memcpy(segment + place, input + HEADER, (size_t)data_bytes);
        base -= place;
        start = place;
    } else {
        segment = malloc(size_bytes ? (size_t)size_bytes : 1);
        memcpy(segment, input + HEADER, (size_t)size_bytes);
        start = size_bytes ? start % size_bytes : 0;
    }

    static int64_t columns[MQ_SCAN_COLUMNS * CAPACITY];
    mq_scan_out out;
    int64_t pos = start;
    for (int round = 0; round < 64 && pos < size_bytes; round++) {  /* as parse_records: scan on from stop */
        mq_scan_in in = {
            .data = segment, .size_bytes = size_bytes, .base = base, .pos = pos, .limit = size_bytes,
            .records_max = records_max, .zeros_end = flags & 1, .check_crc = (flags >> 1) & 1,
            .required_from = (flags & 4) ? base + size_bytes / 2 : INT64_MAX,
        };
        mq_scan_segment(&in, columns, CAPACITY, &out);
        check(out.count >= 0 && out.count <= records_max);
        check(out.stop >= pos && out.stop <= size_bytes);
        for (int64_t i = 0; i < out.count; i++) {
            int64_t at = columns[MQ_COL_OFFSET * CAPACITY + i] - base;
            int64_t size = columns[MQ_COL_SIZE * CAPACITY + i];
            check(at >= pos && size >= MQ_RECORD_SIZE_MIN && at + size <= out.stop);
            int64_t ts = columns[MQ_COL_TOPIC_START * CAPACITY + i], tl = columns[MQ_COL_TOPIC_LENGTH * CAPACITY + i];
            check(ts > at && tl >= 1 && ts + tl <= at + size);
            int64_t ps = columns[MQ_COL_PROPERTIES_START * CAPACITY + i];
            int64_t pe = columns[MQ_COL_PROPERTIES_END * CAPACITY + i];
            check(ps <= pe && pe <= at + size);
            int64_t gs = columns[MQ_COL_TAGS_START * CAPACITY + i], ge = columns[MQ_COL_TAGS_END * CAPACITY + i];
            check(gs < 0 || (ps <= gs && gs <= ge && ge <= pe));
            mq_scan_layout layout;
            check(mq_locate(segment, size_bytes, at, at + base, 0, &layout) == 0 && layout.size == size);
            int64_t vs, ve;
            mq_property_span(segment, ps, pe, (const uint8_t *)"KEYS", 4, &vs, &ve);
            check(vs < 0 || (ps < vs && vs <= ve && ve <= pe));
        }
        if (out.error != MQ_SCAN_OK || out.blank || out.stop == pos) break;
        pos = out.stop;
    }
    /* the chain walk of a read buffer (arrow_decode.locate_records), from `start` */
    int64_t following;
    int64_t chain = mq_walk_chain(segment + start, size_bytes - start, base + start, columns, CAPACITY, &following);
    check(chain >= 0 && chain <= CAPACITY && following >= 0 && following <= size_bytes - start);
    for (int64_t i = 0; i < chain; i++) check(columns[i] >= 0 && columns[i] + MQ_RECORD_SIZE_MIN <= following);
    /* the Arrow decoder over the chain's records, then over arbitrary positions (its own checks must hold) */
    static int64_t arrow_positions[CAPACITY], arrow_offsets[CAPACITY], queue_filter[2] = {0, 2};
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = 0;
        for (int64_t i = 0; i < chain && n < CAPACITY; i++) {
            arrow_positions[n] = start + columns[i];
            arrow_offsets[n++] = base + start + columns[i];
        }
        if (pass == 1)
            for (n = 0; n < 64; n++) {
                arrow_positions[n] = (int64_t)((uint64_t)(n * 7919 + start) % (uint64_t)(size_bytes + 200)) - 100;
                arrow_offsets[n] = base + arrow_positions[n];
            }
        mq_arrow_filter filter;
        memset(&filter, 0, sizeof filter);
        if (flags & 8) {
            filter.queue_ids = queue_filter;
            filter.queue_count = 2;
        }
        filter.has_time_lo = (flags >> 4) & 1;
        mq_arrow_sizes sizes;
        int status = mq_arrow_measure(segment, size_bytes, arrow_positions, arrow_offsets, n, &filter, &sizes);
        if (status == MQ_ARROW_OK && sizes.body_bytes <= ARROW_FILL_BYTES_MAX) {
            int64_t r = sizes.rows;
            check(r >= 0 && r <= n);
            mq_arrow_out out;
#define ALLOC(field, count) out.field = malloc((size_t)((count) > 0 ? (count) : 1) * sizeof *out.field)
            ALLOC(topic_offsets, r + 1); ALLOC(topic_data, sizes.topic_bytes);
            ALLOC(queue_id, r); ALLOC(queue_offset, r); ALLOC(commitlog_offset, r);
            ALLOC(body_offsets, r + 1); ALLOC(body_data, sizes.body_bytes);
            ALLOC(tags_validity, (r + 7) / 8); ALLOC(tags_offsets, r + 1); ALLOC(tags_data, sizes.tags_bytes);
            ALLOC(keys_list_offsets, r + 1); ALLOC(key_offsets, sizes.keys + 1); ALLOC(key_data, sizes.key_bytes);
            ALLOC(map_offsets, r + 1); ALLOC(name_offsets, sizes.pairs + 1); ALLOC(name_data, sizes.name_bytes);
            ALLOC(value_offsets, sizes.pairs + 1); ALLOC(value_data, sizes.value_bytes);
            ALLOC(flag, r); ALLOC(sys_flag, r); ALLOC(born_timestamp_us, r); ALLOC(store_timestamp_us, r);
            ALLOC(born_host_offsets, r + 1); ALLOC(born_host_data, sizes.born_host_bytes);
            ALLOC(store_host_offsets, r + 1); ALLOC(store_host_data, sizes.store_host_bytes);
            ALLOC(reconsume_times, r); ALLOC(body_crc, r); ALLOC(msg_id_data, 32 * r);
#undef ALLOC
            mq_arrow_fill(segment, &sizes, &out);
            check(out.topic_offsets[r] == sizes.topic_bytes && out.body_offsets[r] == sizes.body_bytes);
            check(out.map_offsets[r] == sizes.pairs && out.keys_list_offsets[r] == sizes.keys);
            check(out.name_offsets[sizes.pairs] == sizes.name_bytes && out.key_offsets[sizes.keys] == sizes.key_bytes);
            check(out.tags_offsets[r] == sizes.tags_bytes && out.tags_nulls >= 0 && out.tags_nulls <= r);
            void *all[] = {out.topic_offsets, out.topic_data, out.queue_id, out.queue_offset, out.commitlog_offset,
                           out.body_offsets, out.body_data, out.tags_validity, out.tags_offsets, out.tags_data,
                           out.keys_list_offsets, out.key_offsets, out.key_data, out.map_offsets, out.name_offsets,
                           out.name_data, out.value_offsets, out.value_data, out.flag, out.sys_flag,
                           out.born_timestamp_us, out.store_timestamp_us, out.born_host_offsets, out.born_host_data,
                           out.store_host_offsets, out.store_host_data, out.reconsume_times, out.body_crc,
                           out.msg_id_data};
            for (size_t k = 0; k < sizeof all / sizeof *all; k++) free(all[k]);
        }
        free(sizes.kept);
    }
    /* the two-value read of the timer's enqueue (mq_record_values): the chain's records with their TOTALSIZE as
     * the entries' sizes, then arbitrary offsets and sizes; every row written must be of an accepted record */
    static int64_t value_offsets[CAPACITY], value_sizes[CAPACITY], value_rows[CAPACITY * MQ_VALUE_COLUMNS];
    static const uint8_t *const value_names[][2] = {{(const uint8_t *)"TIMER_OUT_MS", (const uint8_t *)"REAL_TOPIC"},
                                                     {(const uint8_t *)"TAGS", (const uint8_t *)"KEYS"}};
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = 0;
        for (int64_t i = 0; i < chain && n < CAPACITY; i++, n++) {
            value_offsets[n] = base + start + columns[i];
            value_sizes[n] = mq_get_i32(segment + start + columns[i]);
        }
        if (pass == 1)
            for (n = 0; n < 64; n++) {
                value_offsets[n] = base + (int64_t)((uint64_t)(n * 7919 + start) % (uint64_t)(size_bytes + 200)) - 100;
                value_sizes[n] = (int64_t)((uint64_t)(n * 104729 + length) % 5000) - 8;
            }
        const uint8_t *const *names = value_names[(flags >> 5) & 1];
        mq_values_in values = {.segment = segment, .segment_length = size_bytes, .segment_base = base,
                               .offsets = value_offsets, .sizes = value_sizes, .first = 0, .count = n,
                               .required_from = (flags & 4) ? base + size_bytes / 2 : INT64_MAX,
                               .topic = NULL, .number_name = names[0],
                               .number_name_length = (int64_t)strlen((const char *)names[0]),
                               .text_name = names[1], .text_name_length = (int64_t)strlen((const char *)names[1])};
        memset(value_rows, 0xAB, sizeof value_rows);
        int64_t done = mq_record_values(&values, value_rows);
        check(done >= 0 && done <= n);
        for (int64_t i = 0; i < done; i++) {
            int64_t *row = value_rows + i * MQ_VALUE_COLUMNS, at = value_offsets[i] - base;
            mq_layout layout;
            check(at >= 0 && value_sizes[i] <= size_bytes - at &&
                  mq_locate_record(segment + at, value_sizes[i], value_offsets[i], value_sizes[i], 1,
                                   values.required_from, &layout));
            check((row[MQ_VALUE_NUMBER_OK] == 0 || row[MQ_VALUE_NUMBER_OK] == 1) && row[MQ_VALUE_NUMBER] >= 0);
            check(row[MQ_VALUE_NUMBER_OK] || row[MQ_VALUE_NUMBER] == 0);
            check(row[MQ_VALUE_TEXT_STATE] >= MQ_TEXT_ABSENT && row[MQ_VALUE_TEXT_STATE] <= MQ_TEXT_NOT_ASCII);
            check(row[MQ_VALUE_TEXT_STATE] == MQ_TEXT_HASHED || row[MQ_VALUE_TEXT_HASH] == 0);
        }
    }
    /* mq_locate at arbitrary positions, for records the walk never reaches */
    for (int64_t at = start; at < size_bytes && at < start + 4096; at += 97) {
        mq_scan_layout layout;
        if (mq_locate(segment, size_bytes, at, at + base, flags & 4, &layout) == 0) {
            check(at + layout.size <= size_bytes);
            (void)mq_crc_ok(segment, at, &layout);
        }
    }
    if (large) {  /* the CRC paths and the index placement take the input's bytes as they are: no new reach */
        large_window_close();
        return 0;
    }
    check_crc_paths(segment, size_bytes, start, mq_get_u32(input + 4));
    fuzz_index(input, length, segment, size_bytes);  /* index placement (index_core.c) */
    free(segment);
    return 0;
}
