/* One record's checks and writes, in plain C (no Python object): codec.c calls them for put, put_batch, get and
 * read_at, and the fuzz target commitlog/csrc/fuzz/fuzz_codec.c runs them under AddressSanitizer.
 *
 * The layout is commitlog/format.py's "Record, version 1" table (mq_format.h names its offsets).
 */
#include <string.h>

#include "mq_format.h"

#define MQ_V6_FLAGS (MQ_SYS_FLAG_BORNHOST_V6 | MQ_SYS_FLAG_STOREHOST_V6)

/* The 10 ASCII digits of a record CRC, least significant first (format.record_crc_digits). */
static void put_crc_digits(uint8_t *at, uint32_t crc) {
    for (int i = 0; i < MQ_RECORD_CRC_DIGITS; i++) {
        at[i] = (uint8_t)('0' + crc % 10);
        crc /= 10;
    }
}

/* The value of 10 digits (least significant first), or -1 when they are not 10 ASCII digits. */
static int64_t crc_digits_value(const uint8_t *at) {
    int64_t value = 0;
    for (int i = MQ_RECORD_CRC_DIGITS - 1; i >= 0; i--) {
        if (at[i] < '0' || at[i] > '9') return -1;
        value = value * 10 + (at[i] - '0');
    }
    return value;
}

const char *mq_check_record(const mq_record *r, int record_crc) {
    if (r->body_length < 0 || r->tail_length < 0 || r->body_length > INT32_MAX || r->tail_length > INT32_MAX ||
        r->size != MQ_HEADER_SIZE + r->body_length + r->tail_length || r->size < MQ_RECORD_SIZE_MIN ||
        r->size > INT32_MAX)
        return "the record size is not 88 + body + tail, or out of range";
    if (r->body_crc < 0 || r->body_crc > INT32_MAX || r->queue_id < 0 || r->queue_id > INT32_MAX ||
        r->flag < INT32_MIN || r->flag > INT32_MAX || r->queue_offset < 0 || r->physical_offset < 0 ||
        r->born_timestamp < 0 || r->store_timestamp < 0)
        return "a record field is out of its range";
    if (record_crc && r->tail_length < 1 + 1 + 2 + MQ_RECORD_CRC_LENGTH)
        return "record_crc needs the placeholder at the end of the tail";
    return NULL;
}

void mq_write_record(uint8_t *at, const mq_record *r, const uint8_t *born_host, const uint8_t *store_host,
                     int record_crc) {
    mq_put_u32(at + MQ_OFFSET_TOTAL_SIZE, (uint32_t)r->size);
    mq_put_u32(at + MQ_OFFSET_MAGIC_CODE, MQ_MESSAGE_MAGIC_CODE);
    mq_put_u32(at + MQ_OFFSET_BODY_CRC, (uint32_t)r->body_crc);
    mq_put_u32(at + MQ_OFFSET_QUEUE_ID, (uint32_t)r->queue_id);
    mq_put_u32(at + MQ_OFFSET_FLAG, (uint32_t)r->flag);
    mq_put_i64(at + MQ_OFFSET_QUEUE_OFFSET, r->queue_offset);
    mq_put_i64(at + MQ_OFFSET_PHYSICAL_OFFSET, r->physical_offset);
    mq_put_u32(at + MQ_OFFSET_SYS_FLAG, 0);
    mq_put_i64(at + MQ_OFFSET_BORN_TIMESTAMP, r->born_timestamp);
    memcpy(at + MQ_OFFSET_BORN_HOST, born_host, MQ_HOST_V4_LENGTH);
    mq_put_i64(at + MQ_OFFSET_STORE_TIMESTAMP, r->store_timestamp);
    memcpy(at + MQ_OFFSET_STORE_HOST, store_host, MQ_HOST_V4_LENGTH);
    mq_put_u32(at + MQ_OFFSET_RECONSUME_TIMES, 0);
    mq_put_i64(at + MQ_OFFSET_PREPARED_TRANSACTION_OFFSET, 0);
    mq_put_u32(at + MQ_OFFSET_BODY_LENGTH, (uint32_t)r->body_length);
    if (r->body_length) memcpy(at + MQ_OFFSET_BODY, r->body, (size_t)r->body_length);
    if (r->tail_length) memcpy(at + MQ_OFFSET_BODY + r->body_length, r->tail, (size_t)r->tail_length);
    if (record_crc) {  /* format rule 6: the CRC of everything before the 20-byte pair, written last */
        uint8_t *end = at + r->size;
        uint32_t crc = mq_crc32(0, at, (size_t)(r->size - MQ_RECORD_CRC_LENGTH)) & 0x7FFFFFFFu;
        put_crc_digits(end - 1 - MQ_RECORD_CRC_DIGITS, crc);
    }
}

/* The rules of format.py as the Python fast paths check them (commitlog/message.py decode_message and
 * decode_records): a v1 record (rule 1) with IPv4 hosts, MIN <= TOTALSIZE <= limit (2) and == expected_size when
 * >= 0, BODYLENGTH, TOPICLENGTH and PROPERTIESLENGTH adding up to TOTALSIZE with an ASCII topic (3),
 * PHYSICALOFFSET == commitlog_offset (4); a record-CRC pair, when PROPERTIES end with one, holding 10 digits and
 * (when `check_crc`) the record's CRC (6); without one, none required at or past `required_from` (6) and the
 * body CRC right when `check_crc` (5). Every length read from the record is checked against TOTALSIZE, and
 * TOTALSIZE against `limit`, before any byte behind it is read. Every position is computed in 64 bits: TOTALSIZE
 * and BODYLENGTH may each be up to 2^31 - 1 and a position built from them (BODY + BODYLENGTH + 1 + TOPICLENGTH)
 * does not fit 32 bits (a segment may be larger than 2 GiB). */
int mq_locate_record(const uint8_t *record, int64_t limit, int64_t commitlog_offset, int64_t expected_size,
                     int check_crc, int64_t required_from, mq_layout *out) {
    if (limit < MQ_HEADER_SIZE + 4) return 0;
    int64_t size = mq_get_i32(record + MQ_OFFSET_TOTAL_SIZE);
    if (mq_get_u32(record + MQ_OFFSET_MAGIC_CODE) != MQ_MESSAGE_MAGIC_CODE) return 0;
    if (mq_get_i32(record + MQ_OFFSET_SYS_FLAG) & MQ_V6_FLAGS) return 0;
    if (size < MQ_RECORD_SIZE_MIN || size > limit) return 0;  /* from here [0, size) is readable */
    if (expected_size >= 0 && size != expected_size) return 0;
    if (mq_get_i64(record + MQ_OFFSET_PHYSICAL_OFFSET) != commitlog_offset) return 0;
    int64_t body_length = mq_get_i32(record + MQ_OFFSET_BODY_LENGTH);
    if (body_length < 0 || MQ_OFFSET_BODY + body_length + 3 > size) return 0;
    int64_t body_end = MQ_OFFSET_BODY + body_length;
    int64_t topic_length = record[body_end];
    int64_t properties_length_at = body_end + 1 + topic_length;
    if (topic_length == 0 || properties_length_at + 2 > size) return 0;
    int64_t properties_length = (int16_t)mq_get_u16(record + properties_length_at);
    if (properties_length < 0 || properties_length_at + 2 + properties_length != size) return 0;
    for (int64_t i = body_end + 1; i < properties_length_at; i++)
        if (record[i] >= 0x80) return 0;  /* rule 3: the topic is ASCII */
    int64_t properties_at = properties_length_at + 2;
    int64_t properties_end = size;
    int64_t crc_at = size - MQ_RECORD_CRC_LENGTH;
    if (crc_at >= properties_at && record[size - 1] == 2 &&
        memcmp(record + crc_at, MQ_RECORD_CRC_PREFIX, MQ_RECORD_CRC_PREFIX_LENGTH) == 0 &&
        (crc_at == properties_at || record[crc_at - 1] == 2)) {
        int64_t stored = crc_digits_value(record + crc_at + MQ_RECORD_CRC_PREFIX_LENGTH);
        if (stored < 0) return 0;
        /* all ten digits count: a value of 2^32 or more never matches (no truncation to 32 bits) */
        if (check_crc && stored != (int64_t)(mq_crc32(0, record, (size_t)crc_at) & 0x7FFFFFFFu)) return 0;
        properties_end = crc_at;
    } else {
        if (commitlog_offset >= required_from) return 0;
        if (check_crc && (uint32_t)mq_get_i32(record + MQ_OFFSET_BODY_CRC) !=
                             (mq_crc32(0, record + MQ_OFFSET_BODY, (size_t)body_length) & 0x7FFFFFFFu))
            return 0;
    }
    out->size = size;
    out->body_length = body_length;
    out->queue_id = mq_get_i32(record + MQ_OFFSET_QUEUE_ID);
    out->queue_offset = mq_get_i64(record + MQ_OFFSET_QUEUE_OFFSET);
    out->topic_at = body_end + 1;
    out->topic_length = topic_length;
    out->properties_at = properties_at;
    out->properties_end = properties_end;
    return 1;
}
