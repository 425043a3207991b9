/* Arrow columns of located records, in plain C (no Python API): the buffers of commitlog/arrow_decode.py's
 * Decoder._fast_batch, built in two passes (measure, then fill the buffers the caller allocated).
 *
 * Only the common case is decoded here: every record a version-1 record with IPv4 hosts passing
 * arrow_decode.FastLayout's checks, ASCII topics, properties all 'name\x01value\x02' pairs of ASCII text. For
 * anything else mq_arrow_measure answers MQ_ARROW_FALLBACK and the caller runs the Python decoder on the same
 * records, which gives the rows (or the CorruptionError) the format defines: both codecs give the same table.
 */
#ifndef MQ_ARROW_CORE_H
#define MQ_ARROW_CORE_H

#include <stddef.h>
#include <stdint.h>

#define MQ_ARROW_OK 0
#define MQ_ARROW_FALLBACK 1
#define MQ_ARROW_NO_MEMORY (-1)

typedef struct {
    const int64_t *queue_ids;      /* sorted; NULL: no condition */
    int64_t queue_count;
    int has_offset_lo, has_offset_hi, has_time_lo, has_time_hi;
    int64_t offset_lo, offset_hi, time_lo_us, time_hi_us;  /* half-open ranges */
    const uint8_t *const *topics;  /* the topics kept; NULL: no condition */
    const int64_t *topic_lengths;
    int64_t topic_count;
    const uint8_t *expect_topic;   /* the ConsumeQueue path: every kept record must be of this topic */
    int64_t expect_topic_length;
    const int64_t *expect_sizes;   /* the ConsumeQueue path: each record's TOTALSIZE must be this */
    int has_record_crc_from;       /* records at or past record_crc_from must carry a record CRC (format rule 6) */
    int64_t record_crc_from;
} mq_arrow_filter;

typedef struct {  /* where one kept record's parts lie */
    int64_t pos, body_start, body_length, topic_start, topic_length, properties_start, properties_length;
    int32_t tags_start, tags_end, keys_start, keys_end;  /* in the properties; -1 without the property */
} mq_arrow_row;

typedef struct {  /* the sizes mq_arrow_measure finds */
    int64_t rows, topic_bytes, body_bytes, pairs, name_bytes, value_bytes, tags_bytes, keys, key_bytes;
    int64_t born_host_bytes, store_host_bytes;
    mq_arrow_row *kept;  /* malloc'ed by mq_arrow_measure (rows entries); the caller frees it */
} mq_arrow_sizes;

typedef struct {  /* the buffers mq_arrow_fill writes, each of the size its comment says */
    int32_t *topic_offsets; uint8_t *topic_data;          /* rows+1, topic_bytes */
    int32_t *queue_id; int64_t *queue_offset; int64_t *commitlog_offset;  /* rows each */
    int32_t *body_offsets; uint8_t *body_data;            /* rows+1, body_bytes */
    uint8_t *tags_validity; int32_t *tags_offsets; uint8_t *tags_data;  /* (rows+7)/8, rows+1, tags_bytes */
    int32_t *keys_list_offsets; int32_t *key_offsets; uint8_t *key_data;  /* rows+1, keys+1, key_bytes */
    int32_t *map_offsets;                                 /* rows+1 */
    int32_t *name_offsets; uint8_t *name_data;            /* pairs+1, name_bytes */
    int32_t *value_offsets; uint8_t *value_data;          /* pairs+1, value_bytes */
    int32_t *flag; int32_t *sys_flag; int64_t *born_timestamp_us; int64_t *store_timestamp_us;  /* rows each */
    int32_t *born_host_offsets; uint8_t *born_host_data;  /* rows+1, born_host_bytes */
    int32_t *store_host_offsets; uint8_t *store_host_data;
    int32_t *reconsume_times; int32_t *body_crc;          /* rows each */
    uint8_t *msg_id_data;                                 /* 32 * rows (fixed width: offsets i * 32) */
    int64_t tags_nulls;                                   /* written by mq_arrow_fill */
} mq_arrow_out;

/* The records at positions[i] of buf[0:length] (commitlog offsets offsets[i]): check, filter and measure. */
int mq_arrow_measure(const uint8_t *buf, int64_t length, const int64_t *positions, const int64_t *offsets,
                     int64_t count, const mq_arrow_filter *filter, mq_arrow_sizes *sizes);

/* Fill the buffers of the rows mq_arrow_measure kept. */
void mq_arrow_fill(const uint8_t *buf, const mq_arrow_sizes *sizes, mq_arrow_out *out);

#endif
