/* Fuzz target of the compiled scans (scan_core.c): libFuzzer's entry point, also driven by driver.c where
 * clang is missing. Built with AddressSanitizer and UndefinedBehaviorSanitizer by `make fuzz-scan`.
 *
 * Input: a 16-byte header, then the bytes of one segment (seeds are real segments: make_seeds.py).
 *   0..7   i64  the segment's base offset (big-endian), so that PHYSICALOFFSET checks can pass
 *   8      u8   bit 0: zeros_end, bit 1: check_crc, bit 2: record CRCs required from the segment's middle
 *   9..10  u16  records_max (0: no limit)
 *   11..13 u24  where the scan starts (taken modulo the segment's size)
 *   14..15      unused
 * The segment is copied to a buffer of exactly its size, so any read past it is caught. Every record the
 * scan returns must lie inside the segment, and each must pass mq_locate again on its own.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../mq_native.h"
#include "../scan_core.h"

#define HEADER 16
#define CAPACITY 4096

static void check(int condition) {
    if (!condition) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t length) {
    if (length < HEADER) return 0;
    int64_t size_bytes = (int64_t)(length - HEADER);
    uint8_t *segment = malloc(size_bytes ? (size_t)size_bytes : 1);
    memcpy(segment, input + HEADER, (size_t)size_bytes);
    int64_t base = mq_get_i64(input);
    if (base < 0 || base > ((int64_t)1 << 50)) base = 0;
    uint8_t flags = input[8];
    int64_t records_max = mq_get_u16(input + 9);
    if (records_max == 0 || records_max > CAPACITY) records_max = CAPACITY;
    int64_t start = ((int64_t)input[11] << 16 | (int64_t)input[12] << 8 | input[13]);
    start = size_bytes ? start % size_bytes : 0;

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
            mq_layout layout;
            check(mq_locate(segment, size_bytes, at, at + base, 0, &layout) == 0 && layout.size == size);
            int64_t vs, ve;
            mq_property_span(segment, ps, pe, (const uint8_t *)"KEYS", 4, &vs, &ve);
            check(vs < 0 || (ps < vs && vs <= ve && ve <= pe));
        }
        if (out.error != MQ_SCAN_OK || out.blank || out.stop == pos) break;
        pos = out.stop;
    }
    /* the chain walk of a read buffer (columnar.locate_records), from `start` */
    int64_t following;
    int64_t chain = mq_walk_chain(segment + start, size_bytes - start, base + start, columns, CAPACITY, &following);
    check(chain >= 0 && chain <= CAPACITY && following >= 0 && following <= size_bytes - start);
    for (int64_t i = 0; i < chain; i++) check(columns[i] >= 0 && columns[i] + MQ_RECORD_SIZE_MIN <= following);
    /* mq_locate at arbitrary positions, for records the walk never reaches */
    for (int64_t at = start; at < size_bytes && at < start + 4096; at += 97) {
        mq_layout layout;
        if (mq_locate(segment, size_bytes, at, at + base, flags & 4, &layout) == 0) {
            check(at + layout.size <= size_bytes);
            (void)mq_crc_ok(segment, at, &layout);
        }
    }
    free(segment);
    return 0;
}
