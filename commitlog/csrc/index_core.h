/* Index placement as plain C (no Python API): hash the index keys of a batch of messages and place them into
 * one IndexFile's mapping. scan.c binds it to Python (`index_place`); commitlog/csrc/fuzz/fuzz_index.c calls it
 * directly.
 *
 * The layout is indexfile/format.py's: a 40-byte header, S slots of 4 bytes, N entries of 20 bytes, integers
 * big-endian; keyHash = abs(String.hashCode("topic#key")) (0 for Integer.MIN_VALUE), slot = keyHash % S. The
 * policy (when to roll to a new file, flush, checkpoint, which messages a replay skips) stays in Python:
 * mq_index_place fills one file as far as it has room and says where it stopped.
 */
#ifndef MQ_INDEX_CORE_H
#define MQ_INDEX_CORE_H

#include <stdint.h>

/* Sizes and header offsets of indexfile/format.py (HEADER_SIZE_BYTES, SLOT_SIZE_BYTES, ENTRY_SIZE_BYTES, OFFSET_*). */
#define MQ_INDEX_HEADER_SIZE 40
#define MQ_INDEX_SLOT_SIZE 4
#define MQ_INDEX_ENTRY_SIZE 20
#define MQ_INDEX_OFF_BEGIN_TIMESTAMP 0
#define MQ_INDEX_OFF_END_TIMESTAMP 8
#define MQ_INDEX_OFF_BEGIN_PHY 16
#define MQ_INDEX_OFF_END_PHY 24
#define MQ_INDEX_OFF_HASH_SLOT_COUNT 32
#define MQ_INDEX_OFF_INDEX_COUNT 36
#define MQ_INDEX_TIME_DIFF_MAX INT32_MAX

/* Why mq_index_place stopped. */
enum {
    MQ_INDEX_DONE = 0,         /* every key of every row is placed */
    MQ_INDEX_FULL = 1,         /* the file is full (indexCount = N): roll and call again from the cursor */
    MQ_INDEX_PYTHON_KEY = 2,   /* the key at the cursor is not valid UTF-8: the Python path hashes it */
    MQ_INDEX_BAD_SLOT = 3,     /* a slot on disk names no written entry (rule 4): detail = slot, detail2 = value */
    MQ_INDEX_BAD_HEADER = 4,   /* indexCount outside 0..N (rule 2: detail = it) or a negative offset (rule 3) */
    MQ_INDEX_BAD_INPUT = 5,    /* a mapping smaller than the layout, S or N out of range, or no memory */
};

typedef struct {
    const uint8_t *ptr;        /* NULL: absent */
    int64_t len;
} mq_span;

typedef struct {
    int64_t rows;              /* messages */
    const mq_span *prefixes;   /* UTF-8 "topic#" per topic id */
    int64_t prefix_count;
    const int64_t *topic_ids;  /* per row, into prefixes (checked) */
    const mq_span *uniq_keys;  /* per row: the UNIQ_KEY value, or ptr NULL */
    const mq_span *keys;       /* per row: the KEYS value (space-separated words), or ptr NULL */
    const int64_t *offsets;    /* per row: commitlog offset, >= 0 and non-decreasing (checked by the caller) */
    const int64_t *timestamps; /* per row: store time (ms) */
    const int64_t *sys_flags;  /* per row; rows with sys_flag & skip_mask == skip_value have no keys */
    int64_t skip_mask, skip_value;
} mq_index_rows;

typedef struct {
    int64_t row, key;          /* cursor in: the first key to place (key-th index key of message `row`); out: where it stopped */
    int64_t placed;            /* out: entries written */
    int status;                /* out: MQ_INDEX_* */
    int64_t detail, detail2;   /* out: see the status */
} mq_index_cursor;

/* Java's String.hashCode of UTF-8 bytes decoded strictly (UTF-16 code units), continuing from `h`; returns 0
 * and sets *ok = 0 when the bytes are not valid UTF-8 as Python's strict decoder sees it. */
uint32_t mq_java_hash_utf8(uint32_t h, const uint8_t *data, int64_t len, int *ok);

/* Place the index keys of rows[cursor.row:] (for each message: UNIQ_KEY, then each non-empty KEYS word, each
 * under prefix + key), starting at the cursor's key, into the index file mapped at map[0:map_len] with S slots
 * and room for N entries, writing (as IndexFile.put_hashes) the entries, then the header, then the slots. The
 * header is read from the mapping and checked (rules 2 and 3); every slot read is checked (rule 4) before
 * anything is written; every write is inside 40 + 4S + 20N <= map_len. */
void mq_index_place(uint8_t *map, int64_t map_len, int64_t slot_count, int64_t entry_max, const mq_index_rows *rows,
                    mq_index_cursor *cursor);

#endif
