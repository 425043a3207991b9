/* The CommitLog record layout in C, without Python: what the module and the fuzz targets share.
 *
 * The record layout is described once, in commitlog/format.py; the offsets below name the same fields and
 * cite that table (v1 record, IPv4 hosts). A test ties them to format.py's constants (codec.c's layout()).
 * record.c holds the per-record checks and writes that need no Python object (locate, write), so that a fuzz
 * target (commitlog/csrc/fuzz/) can run them under AddressSanitizer without an interpreter.
 */
#ifndef MQ_FORMAT_H
#define MQ_FORMAT_H

#include <stdint.h>
#include <stddef.h>

/* --- record layout: commitlog/format.py, "Record, version 1" ------------------------------------------ */
#define MQ_OFFSET_TOTAL_SIZE 0
#define MQ_OFFSET_MAGIC_CODE 4
#define MQ_OFFSET_BODY_CRC 8
#define MQ_OFFSET_QUEUE_ID 12
#define MQ_OFFSET_FLAG 16
#define MQ_OFFSET_QUEUE_OFFSET 20
#define MQ_OFFSET_PHYSICAL_OFFSET 28
#define MQ_OFFSET_SYS_FLAG 36
#define MQ_OFFSET_BORN_TIMESTAMP 40
#define MQ_OFFSET_BORN_HOST 48
#define MQ_OFFSET_STORE_TIMESTAMP 56
#define MQ_OFFSET_STORE_HOST 64
#define MQ_OFFSET_RECONSUME_TIMES 72
#define MQ_OFFSET_PREPARED_TRANSACTION_OFFSET 76
#define MQ_OFFSET_BODY_LENGTH 84
#define MQ_OFFSET_BODY 88
#define MQ_HEADER_SIZE 88
#define MQ_HOST_V4_LENGTH 8
#define MQ_HOST_V6_LENGTH 20
#define MQ_RECORD_SIZE_MIN (MQ_HEADER_SIZE + 1 + 1 + 2)
#define MQ_RECORD_SIZE_FIXED (MQ_HEADER_SIZE + 1 + 2)
#define MQ_TOPIC_LENGTH_MAX 127
#define MQ_PROPERTIES_LENGTH_MAX 32767
#define MQ_END_FILE_MIN_BLANK_LENGTH 8
#define MQ_RECORD_CRC_LENGTH 20

#define MQ_MESSAGE_MAGIC_CODE 0xDAA320A7u
#define MQ_MESSAGE_MAGIC_CODE_V2 0xDAA320ABu
#define MQ_BLANK_MAGIC_CODE 0xCBD43194u

#define MQ_SYS_FLAG_BORNHOST_V6 0x10
#define MQ_SYS_FLAG_STOREHOST_V6 0x20

/* --- big-endian access; callers check bounds before every call ------------------------------------------ */
static inline uint32_t mq_get_u32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline int32_t mq_get_i32(const uint8_t *p) { return (int32_t)mq_get_u32(p); }
static inline int64_t mq_get_i64(const uint8_t *p) {
    return (int64_t)(((uint64_t)mq_get_u32(p) << 32) | (uint64_t)mq_get_u32(p + 4));
}
static inline uint16_t mq_get_u16(const uint8_t *p) { return (uint16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline void mq_put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void mq_put_i64(uint8_t *p, int64_t v) {
    mq_put_u32(p, (uint32_t)((uint64_t)v >> 32)); mq_put_u32(p + 4, (uint32_t)v);
}

/* --- CRC-32 (zlib's polynomial; the same values as zlib.crc32): crc32.c ---------------------------------- */
/* The paths mq_crc32 can take, slowest first; mq_crc32 takes the fastest the CPU has unless told otherwise. */
enum { MQ_CRC_PATH_ZLIB = 0, MQ_CRC_PATH_PCLMUL = 1, MQ_CRC_PATH_VPCLMUL = 2, MQ_CRC_PATHS = 3 };
uint32_t mq_crc32(uint32_t crc, const uint8_t *data, size_t length);
/* The function mq_crc32 calls now, for loops that take many CRCs (no choice made per call). */
typedef uint32_t (*mq_crc32_fn)(uint32_t crc, const uint8_t *data, size_t length);
mq_crc32_fn mq_crc32_function(void);
/* The CRC by one path, which the caller checked the CPU has (mq_crc32_path_supported). */
uint32_t mq_crc32_with(int path, uint32_t crc, const uint8_t *data, size_t length);
int mq_crc32_path(void);                   /* the path mq_crc32 takes */
int mq_crc32_path_supported(int path);     /* 1 when this CPU can run `path` */
const char *mq_crc32_path_name(int path);  /* "zlib", "pclmul", "vpclmul"; NULL for no path */
int mq_crc32_use(int path);                /* make mq_crc32 take `path` (-1: the best); -1 when not supported */
/* zlib's CRC alone (what mq_crc32 uses for inputs under 16 bytes): for the measurements that chose mq_crc32. */
uint32_t mq_crc32_zlib(uint32_t crc, const uint8_t *data, size_t length);

/* --- one record: record.c ---------------------------------------------------------------------------- */
#define MQ_RECORD_CRC_PREFIX "__CRC32#\x01"
#define MQ_RECORD_CRC_PREFIX_LENGTH 9
#define MQ_RECORD_CRC_DIGITS 10

/* Where the parts of one accepted record lie (offsets from the record's first byte), in 64 bits like every
 * position computed from lengths read from disk. */
typedef struct {
    int64_t size, body_length;
    int32_t queue_id;
    int64_t queue_offset;
    int64_t topic_at, topic_length, properties_at, properties_end;
} mq_layout;

/* The fields of one record to write that vary; the hosts are the store's. */
typedef struct {
    int64_t size, body_crc, queue_id, flag, queue_offset, physical_offset, born_timestamp, store_timestamp;
    const uint8_t *body;
    int64_t body_length;
    const uint8_t *tail;  /* TOPICLENGTH, TOPIC, PROPERTIESLENGTH, PROPERTIES (with the record-CRC placeholder) */
    int64_t tail_length;
} mq_record;

/* format.py's rules for the record at `record`, with `limit` readable bytes from there: 1 when it is a valid v1
 * record with IPv4 hosts at `commitlog_offset` (see record.c for exactly what is checked), else 0. */
int mq_locate_record(const uint8_t *record, int64_t limit, int64_t commitlog_offset, int64_t expected_size,
                     int check_crc, int64_t required_from, mq_layout *out);

/* 0 when the record's fields are in range and add up to its size (and leave room for the record-CRC pair when
 * `record_crc`), else a message saying which does not. */
const char *mq_check_record(const mq_record *r, int record_crc);

/* Write a checked record at `at`; the caller checked that its `size` bytes are writable there. */
void mq_write_record(uint8_t *at, const mq_record *r, const uint8_t *born_host, const uint8_t *store_host,
                     int record_crc);

#endif
