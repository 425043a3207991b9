/* Fuzz target of the record decoder (record.c's mq_locate_record) and of its writer (mq_write_record).
 *
 * Input: one byte of flags, then the bytes of one record (seeds are real records, see make_codec_seeds.py).
 *   flags bit 0: check CRCs; bit 1: the size an index gives is TOTALSIZE (else none); bit 2: a commitlog offset
 *   one off PHYSICALOFFSET; bit 3: every record must carry a record CRC.
 * The record is copied into a buffer of exactly its length, so that AddressSanitizer reports any read past it.
 * An accepted record must have its parts inside it; written again from its parts (with the CRCs recomputed) it
 * must be accepted again with the same layout. A broken invariant aborts.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined where clang is, else with gcc and driver_codec.c
 * (make fuzz-codec).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mq_format.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    size -= 1;
    uint8_t *record = malloc(size ? size : 1);
    CHECK(record != NULL);
    memcpy(record, data + 1, size);
    int64_t commitlog_offset = size >= MQ_OFFSET_PHYSICAL_OFFSET + 8 ? mq_get_i64(record + MQ_OFFSET_PHYSICAL_OFFSET) : 0;
    if (flags & 4) commitlog_offset ^= 1;
    int64_t expected_size = (flags & 2) && size >= 4 ? mq_get_i32(record) : -1;
    int64_t required_from = (flags & 8) ? 0 : INT64_MAX;
    mq_layout layout;
    if (mq_locate_record(record, (int64_t)size, commitlog_offset, expected_size, flags & 1, required_from, &layout)) {
        check_layout(&layout, (int64_t)size);
        int has_record_crc = layout.properties_end != layout.size;
        round_trip(record, &layout, has_record_crc);
    }
    free(record);
    return 0;
}
