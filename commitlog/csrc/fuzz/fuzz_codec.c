/* Fuzz target of the record decoder (record.c's mq_locate_record) and of its writer (mq_write_record).
 *
 * Input: one byte of flags, then the bytes of one record (seeds are real records, see make_codec_seeds.py).
 *   flags bit 0: check CRCs; bit 1: the size an index gives is TOTALSIZE (else none); bit 2: a commitlog offset
 *   one off PHYSICALOFFSET; bit 3: every record must carry a record CRC; bit 4: a large record (below).
 * The record is copied into a buffer of exactly its length, so that AddressSanitizer reports any read past it.
 *
 * A large record (flags bit 4) stands for a record of up to 4 GiB in a segment of more than 2 GiB, from a few
 * bytes: after the flags, u32 EXTRA and u16 HEAD_LENGTH (big-endian), HEAD_LENGTH bytes of the record's start
 * (its header and as much body as given), then the bytes from its TOPICLENGTH on (the tail). The record has
 * HEAD_LENGTH + EXTRA readable bytes, zeros where no input lies, in large_window.h's window (a read past them,
 * or gigabytes before them, faults); the tail is placed where the head's BODYLENGTH says the body ends (right
 * after the head when that is outside the record), so that the lengths near 2^31 meet a real tail.
 * An accepted record must have its parts inside it; written again from its parts (with the CRCs recomputed) it
 * must be accepted again with the same layout. A broken invariant aborts.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined where clang is, else with gcc and driver_codec.c
 * (make fuzz-codec).
 */
#define _DEFAULT_SOURCE  /* MAP_ANONYMOUS, MAP_NORESERVE under -std=c11 (large_window.h) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mq_format.h"
#include "large_window.h"

#define ROUND_TRIP_BYTES_MAX (1 << 20)  /* a larger accepted record is checked, not copied and written again */
#define LARGE_PREFIX 6                   /* EXTRA, HEAD_LENGTH */

#define CHECK(condition)                                                                          \
    do {                                                                                          \
        if (!(condition)) {                                                                       \
            fprintf(stderr, "fuzz_codec: invariant broken: %s (line %d)\n", #condition, __LINE__); \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

static const uint8_t HOST[MQ_HOST_V4_LENGTH] = {10, 0, 0, 7, 0, 0, 0x2a, 0x9f};

static void check_layout(const mq_layout *l, int64_t limit) {
    CHECK(l->size >= MQ_RECORD_SIZE_MIN && l->size <= limit);
    CHECK(l->body_length >= 0 && MQ_OFFSET_BODY + (int64_t)l->body_length < l->size);
    CHECK(l->topic_at == MQ_OFFSET_BODY + l->body_length + 1 && l->topic_length >= 1);
    CHECK(l->topic_at + l->topic_length + 2 == l->properties_at);
    CHECK(l->properties_at <= l->properties_end && l->properties_end <= l->size);
}

static void round_trip(const uint8_t *record, const mq_layout *l, int record_crc) {
    mq_record r;
    r.size = l->size;
    r.body = record + MQ_OFFSET_BODY;
    r.body_length = l->body_length;
    r.tail = record + MQ_OFFSET_BODY + l->body_length;
    r.tail_length = l->size - MQ_OFFSET_BODY - l->body_length;
    r.body_crc = mq_crc32(0, r.body, (size_t)r.body_length) & 0x7FFFFFFFu;
    r.queue_id = l->queue_id;
    r.flag = mq_get_i32(record + MQ_OFFSET_FLAG);
    r.queue_offset = l->queue_offset;
    r.physical_offset = mq_get_i64(record + MQ_OFFSET_PHYSICAL_OFFSET);
    r.born_timestamp = mq_get_i64(record + MQ_OFFSET_BORN_TIMESTAMP);
    r.store_timestamp = mq_get_i64(record + MQ_OFFSET_STORE_TIMESTAMP);
    if (mq_check_record(&r, record_crc) != NULL) return;  /* a field the writer never writes (negative, ...) */
    uint8_t *copy = malloc((size_t)r.size);
    CHECK(copy != NULL);
    mq_write_record(copy, &r, HOST, HOST, record_crc);
    mq_layout again;
    CHECK(mq_locate_record(copy, r.size, r.physical_offset, r.size, 1, record_crc ? 0 : INT64_MAX, &again));
    CHECK(again.size == l->size && again.body_length == l->body_length && again.topic_at == l->topic_at &&
          again.topic_length == l->topic_length && again.properties_at == l->properties_at &&
          again.properties_end == l->properties_end && again.queue_offset == l->queue_offset);
    free(copy);
}

/* Decode the record at `record` with `limit` readable bytes as the flags say, and check what is accepted. */
static void decode(const uint8_t *record, int64_t limit, uint8_t flags) {
    int64_t commitlog_offset = limit >= MQ_OFFSET_PHYSICAL_OFFSET + 8 ? mq_get_i64(record + MQ_OFFSET_PHYSICAL_OFFSET) : 0;
    if (flags & 4) commitlog_offset ^= 1;
    int64_t expected_size = (flags & 2) && limit >= 4 ? mq_get_i32(record) : -1;
    int64_t required_from = (flags & 8) ? 0 : INT64_MAX;
    mq_layout layout;
    if (mq_locate_record(record, limit, commitlog_offset, expected_size, flags & 1, required_from, &layout)) {
        check_layout(&layout, limit);
        int has_record_crc = layout.properties_end != layout.size;
        if (layout.size <= ROUND_TRIP_BYTES_MAX) round_trip(record, &layout, has_record_crc);
    }
}

static void decode_large(const uint8_t *data, size_t size, uint8_t flags) {
    if (size < LARGE_PREFIX) return;
    int64_t extra = mq_get_u32(data), head_length = mq_get_u16(data + 4);
    data += LARGE_PREFIX;
    size -= LARGE_PREFIX;
    if (head_length > (int64_t)size) head_length = (int64_t)size;
    int64_t limit = head_length + extra;
    if (limit > LARGE_WINDOW_MAX_BYTES) limit = LARGE_WINDOW_MAX_BYTES;
    uint8_t *record = large_window_open(limit);
    memcpy(record, data, (size_t)head_length);
    int64_t tail_at = head_length, tail_length = (int64_t)size - head_length;
    if (head_length >= MQ_OFFSET_BODY) {
        int64_t body_end = MQ_OFFSET_BODY + (int64_t)mq_get_i32(record + MQ_OFFSET_BODY_LENGTH);
        if (body_end >= head_length && body_end < limit) tail_at = body_end;
    }
    if (tail_length > limit - tail_at) tail_length = limit - tail_at;
    if (tail_length > 0) memcpy(record + tail_at, data + head_length, (size_t)tail_length);
    decode(record, limit, flags);
    large_window_close();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    size -= 1;
    if (flags & 16) {
        decode_large(data + 1, size, flags);
        return 0;
    }
    uint8_t *record = malloc(size ? size : 1);
    CHECK(record != NULL);
    memcpy(record, data + 1, size);
    decode(record, (int64_t)size, flags);
    free(record);
    return 0;
}
