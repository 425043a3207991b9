/* The scans of the log as plain C (no Python API): the dispatch/recovery walk of one segment and the
 * property lookups. scan.c binds them to Python; commitlog/csrc/fuzz/fuzz_scan.c calls them directly.
 *
 * The record layout and the validity rule are commitlog/format.py's (rules (1) to (6)); the offsets are
 * mq_native.h's. Every length or offset read from the segment is checked against the segment's bounds
 * before it is used.
 */
#ifndef MQ_SCAN_CORE_H
#define MQ_SCAN_CORE_H

#include <stddef.h>
#include <stdint.h>

/* The columns mq_scan_segment writes, one int64 array of `capacity` rows each (column-major). Positions are
 * in the segment's bytes; MQ_COL_OFFSET is the commitlog offset. */
enum {
    MQ_COL_OFFSET = 0,
    MQ_COL_SIZE,
    MQ_COL_TOPIC_START,
    MQ_COL_TOPIC_LENGTH,
    MQ_COL_PROPERTIES_START,
    MQ_COL_PROPERTIES_END,       /* before the record-CRC pair when the record has one */
    MQ_COL_QUEUE_ID,
    MQ_COL_QUEUE_OFFSET,
    MQ_COL_STORE_TIMESTAMP,
    MQ_COL_SYS_FLAG,
    MQ_COL_TAGS_CODE,            /* the ConsumeQueue tag hash; see MQ_COL_TAGS_START */
    MQ_COL_TAGS_START,           /* the TAGS value's span, -1 without TAGS */
    MQ_COL_TAGS_END,
    MQ_COL_TOPIC_ID,             /* index into the scan's distinct topics (first-seen order), -1 on overflow */
    MQ_COL_BODY_START,
    MQ_COL_BODY_LENGTH,
    MQ_SCAN_COLUMNS
};

/* Why a scan stopped early (the Python path builds the same CorruptionError from the position). */
enum {
    MQ_SCAN_OK = 0,
    MQ_SCAN_ERR_SHORT = 1,     /* fewer than 8 bytes left in the segment: no room for a blank (rule "blank") */
    MQ_SCAN_ERR_PAST_END = 2,  /* a record runs past the scan's limit (rule 2) */
    MQ_SCAN_ERR_INVALID = 3,   /* rules 1-4 or 6's shape, or a missing required record CRC */
    MQ_SCAN_ERR_CRC = 4,       /* rule 5 or 6: a CRC that does not match */
};

#define MQ_SCAN_TOPICS_MAX 256  /* distinct topics a scan names; more set `topics_overflow` */

typedef struct {
    const uint8_t *data;     /* the segment's bytes */
    int64_t size_bytes;      /* the segment's size */
    int64_t base;            /* commitlog offset of data[0] */
    int64_t pos;             /* a record start */
    int64_t limit;           /* scan [pos, limit), limit <= size_bytes */
    int64_t records_max;     /* at most this many records (<= the columns' capacity) */
    int zeros_end;           /* eight zero bytes (or a record not complete by `limit`) end the data */
    int check_crc;           /* check rules (5) and (6)'s CRC values */
    int64_t required_from;   /* records at or after this commitlog offset need a record CRC (INT64_MAX: none) */
} mq_scan_in;

typedef struct {
    int64_t count;           /* records in the columns */
    int64_t stop;            /* where the scan stopped (segment position): the next record, or size_bytes */
    int error;               /* MQ_SCAN_* */
    int blank;               /* stopped after a valid end-of-segment blank */
    int topics_overflow;     /* more than MQ_SCAN_TOPICS_MAX distinct topics */
    int64_t topics;          /* distinct topics */
    int64_t topic_rows[MQ_SCAN_TOPICS_MAX];  /* the first row of each distinct topic */
    int64_t tags_non_ascii;  /* rows whose TAGS are not ASCII: their tag code is left 0 for the caller */
} mq_scan_out;

/* Walk and check the records of [in->pos, in->limit) of one segment, as commitlog.dispatch_batch.parse_records
 * does for one segment, writing MQ_SCAN_COLUMNS columns of `capacity` rows at `columns`. */
void mq_scan_segment(const mq_scan_in *in, int64_t *columns, int64_t capacity, mq_scan_out *out);

/* Rules (1) to (4) and (6)'s shape for the message record at `pos` (TOTALSIZE and the magic code already read
 * as a message's). Fills the spans; returns 0 when valid, -1 otherwise. `required`: a record CRC must be there. */
typedef struct {
    int64_t size, body_start, body_length, topic_start, topic_length, properties_start, properties_length;
    int64_t store_timestamp_at;  /* position of STORETIMESTAMP */
    int64_t store_host_at, store_host_length, born_host_at, born_host_length;
    int has_crc;                 /* the properties end with a record-CRC pair */
    uint32_t crc_value;          /* its value when has_crc */
    int32_t sys_flag;
    uint32_t magic;
} mq_scan_layout;

int mq_locate(const uint8_t *data, int64_t size_bytes, int64_t pos, int64_t commitlog_offset, int required,
              mq_scan_layout *layout);

/* Whether the record's CRC (record CRC when it has one, else BODYCRC) matches. */
int mq_crc_ok(const uint8_t *data, int64_t pos, const mq_scan_layout *layout);

/* The span of the first pair `name`\x01value of properties [start, end) (a pair starts at `start` or after
 * a 0x02): value_start/value_end, or -1 when none. */
void mq_property_span(const uint8_t *data, int64_t start, int64_t end, const uint8_t *name, int64_t name_length,
                      int64_t *value_start, int64_t *value_end);

/* The TOTALSIZE chain of complete message records tiling buf[0:length] from 0 (buf[0] at commitlog offset
 * buf_abs), as commitlog.arrow_decode._walk_python: magic code, RECORD_SIZE_MIN <= TOTALSIZE, the record inside
 * buf[0:length], PHYSICALOFFSET right. Writes at most `capacity` positions; returns their count and sets
 * *following to the position after the last. */
int64_t mq_walk_chain(const uint8_t *buf, int64_t length, int64_t buf_abs, int64_t *positions, int64_t capacity,
                      int64_t *following);

/* Java's String.hashCode of ASCII text; sets *ascii to 0 (and returns 0) when a byte is not ASCII. */
int32_t mq_java_ascii_hash(const uint8_t *text, int64_t length, int *ascii);

/* Two property values of each record a queue's entries locate (the timer's enqueue: TIMER_OUT_MS and REAL_TOPIC).
 * Columns of a row of `out`: */
enum {
    MQ_VALUE_NUMBER = 0,   /* the number property's value: ASCII digits up to INT64_MAX, else 0 */
    MQ_VALUE_NUMBER_OK,    /* 1 when the number property is there and is such digits */
    MQ_VALUE_TEXT_STATE,   /* MQ_TEXT_* of the text property */
    MQ_VALUE_TEXT_HASH,    /* Java's String.hashCode of its value when MQ_TEXT_HASHED, else 0 */
    MQ_VALUE_COLUMNS
};
enum { MQ_TEXT_ABSENT = 0, MQ_TEXT_HASHED = 1, MQ_TEXT_NOT_ASCII = 2 /* the caller hashes it */ };

typedef struct {
    const uint8_t *segment;    /* the segment's bytes */
    int64_t segment_length;
    int64_t segment_base;      /* commitlog offset of segment[0] */
    const int64_t *offsets;    /* commitlog offsets of the records, `count` of them */
    const int64_t *sizes;      /* TOTALSIZE as the entries give it */
    int64_t first, count;      /* read records [first, count) */
    int64_t required_from;     /* records from this commitlog offset on need a record CRC (INT64_MAX: none) */
    const uint8_t *topic;      /* NULL, or: each record must be entry first_entry + i of (topic, queue_id) */
    int64_t topic_length, queue_id, first_entry;
    const uint8_t *number_name, *text_name;  /* the two property names */
    int64_t number_name_length, text_name_length;
} mq_values_in;

/* For records first, first + 1, ...: checked as record.c's mq_locate_record (CRCs included, against the entry's
 * size and the queue when given), then the two values written to row i of `out` (count rows of
 * MQ_VALUE_COLUMNS). Stops at the first record outside the segment or not accepted; returns its index (count:
 * all done). No Python object is touched. */
int64_t mq_record_values(const mq_values_in *in, int64_t *out);

#endif
