"""The lease journal: `<root>/lease/<topic>@<group>.journal`, what a group's lease consumers share.

Every lease consumer of one (topic, group), in any thread or process, appends what it does (a lease handed
out, a lease acknowledged) to one journal and, before each operation, reads what the others appended since
it last looked; all of it under an exclusive flock of `<topic>@<group>.lock`. Replaying the journal gives the
lease state: per queue the acknowledged prefix (`base`), the next entry never handed out (`next`), the live
leases and the acknowledged entries above the prefix. The CommitLog is not used: consumers in a read_only
process cannot put to it (docs/decisions/0056-leases-in-a-journal-beside-the-log.md).

A journal is a 16-byte header, then frames. Big-endian, as RocketMQ.

    header                                  frame
    OFFSET SIZE TYPE FIELD                  OFFSET SIZE TYPE FIELD
    0      4    u32  magic 0x4D514C4A       0      4    u32  magic 0x4C454153 ('LEAS')
    4      4    u32  version (1)            4      4    u32  record_count (1..FRAME_RECORDS_MAX)
    8      8    u64  reserved (0)           8      4    u32  body_crc: CRC-32 (zlib) of the records
    = 16 bytes                              12     4    u32  reserved (0)
                                            16     32*n      records
                                            = 16 + 32 * record_count bytes

    record
    OFFSET SIZE TYPE FIELD
    0      1    u8   kind: 1 BASE, 2 LEASE, 3 ACK, 4 DEAD, 5 SEQUENCE, 6 MOVED
    1      1    u8   reserved (0)
    2      2    u16  delivery_count (LEASE: 1 for the first delivery; others 0)
    4      4    u32  queue_id
    8      8    i64  queue_offset (BASE: the acknowledged prefix; SEQUENCE: 0)
    16     8    i64  value_a: LEASE, ACK: lease_id (0: ACK of a snapshot, or of an entry a tag filter
                         passed over); BASE: next; SEQUENCE: last lease_id
    24     8    i64  value_b: LEASE: deadline_ms (the lease clock's ms since the epoch); others 0
    = 32 bytes

Meaning, applied in journal order: BASE sets a queue's prefix and raises its `next`; LEASE makes (queue, offset)
leased until deadline_ms with that lease_id and delivery count, and raises `next` past it; ACK and DEAD end it
(DEAD: it was moved to %DLQ%<group>) and the prefix advances over acknowledged entries; SEQUENCE raises the
last lease id handed out; MOVED (queue 0, offset 0, values 0) changes no state: a compaction is about to
rename a snapshot over this file (below). A lease id is unique in the journal: each new lease takes the last
one plus one.

Validity rule. The header is valid iff (0) the file has at least 16 bytes, magic and version match and the
reserved field is 0 (a file shorter than 16 bytes is a torn creation and is written again). A frame at
position p is whole iff (1) p + 16 <= file size; (2) its magic matches; (3) 1 <= record_count <=
FRAME_RECORDS_MAX; (4) p + 16 + 32 * record_count <= file size; (5) body_crc matches and reserved is 0.
The journal ends at the first frame that is not whole: a writer killed inside its write() or a power loss
without `sync` leaves such a tail; the next writer truncates it (what it held is lost: those leases are handed
out again, those acks redelivered, at-least-once). A whole frame's records must satisfy (6) kind is 1..5 and
the reserved byte is 0; (7) queue_id <= QUEUE_ID_MAX, queue_offset >= 0 and value_a >= 0; (8) LEASE has
delivery_count >= 1 and lease_id >= 1, BASE has next >= prefix. A whole frame that breaks 6-8 is damage, not a
torn write: CorruptionError(path, offset of the record, rule "lease.N").

Compaction replaces the journal by a snapshot (header, one frame: SEQUENCE, a BASE per queue, a LEASE per live
lease, an ACK per acknowledged entry above a prefix) written to `.journal.tmp`, fsynced and renamed over it;
before the rename, the compactor appends a MOVED frame to the journal it replaces, so that a consumer holding
it open sees the file grow (its cheap check before each call is `lseek(SEEK_END)` against the position it has
read to), reads the MOVED record, finds a different inode at the path and reads the new file from its start.
A MOVED record with the same inode at the path is a compaction that died before its rename: it is skipped. A
consumer that reads the file for another reason also opens the path again when its open file has no name left
(fstat's st_nlink is 0).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from mqstore.commitlog.errors import CorruptionError

HEADER_MAGIC = 0x4D514C4A  # 'MQLJ'
JOURNAL_VERSION = 1
FRAME_MAGIC = 0x4C454153  # 'LEAS'

KIND_BASE = 0x01
KIND_LEASE = 0x02
KIND_ACK = 0x03
KIND_DEAD = 0x04
KIND_SEQUENCE = 0x05
KIND_MOVED = 0x06
KINDS = frozenset((KIND_BASE, KIND_LEASE, KIND_ACK, KIND_DEAD, KIND_SEQUENCE, KIND_MOVED))

QUEUE_ID_MAX = 2**31 - 1  # RocketMQ queue ids are Java ints
FRAME_RECORDS_MAX = 1 << 20  # a frame holding more records is not whole (rule 3)

HEADER = struct.Struct(">IIQ")
HEADER_BYTES = HEADER.size
FRAME = struct.Struct(">IIII")
FRAME_BYTES = FRAME.size
RECORD = struct.Struct(">BBHIqqq")
RECORD_BYTES = RECORD.size

# field offsets of a record, each built from the previous one
RECORD_KIND = 0
RECORD_RESERVED = RECORD_KIND + 1
RECORD_DELIVERY_COUNT = RECORD_RESERVED + 1
RECORD_QUEUE_ID = RECORD_DELIVERY_COUNT + 2
RECORD_QUEUE_OFFSET = RECORD_QUEUE_ID + 4
RECORD_VALUE_A = RECORD_QUEUE_OFFSET + 8
RECORD_VALUE_B = RECORD_VALUE_A + 8
RECORD_END = RECORD_VALUE_B + 8

LEASE_RECORD = np.dtype([("kind", "u1"), ("reserved", "u1"), ("delivery_count", ">u2"), ("queue_id", ">u4"),
                         ("queue_offset", ">i8"), ("value_a", ">i8"), ("value_b", ">i8")])
assert HEADER_BYTES == 16 and FRAME_BYTES == 16
assert RECORD_BYTES == RECORD_END == LEASE_RECORD.itemsize == 32
assert LEASE_RECORD.fields["value_b"][1] == RECORD_VALUE_B

_pack_record = RECORD.pack
_crc32 = crc32 = zlib.crc32


def encode_header() -> bytes:
    return HEADER.pack(HEADER_MAGIC, JOURNAL_VERSION, 0)


def check_header(raw: bytes, path: str) -> None:
    """CorruptionError unless `raw` (>= 16 bytes) is a valid header (rule 0)."""
    magic, version, reserved = HEADER.unpack_from(raw, 0)
    if magic != HEADER_MAGIC or version != JOURNAL_VERSION or reserved != 0:
        raise CorruptionError(f"lease journal header has magic {magic:#x}, version {version}, reserved "
                              f"{reserved}; expected {HEADER_MAGIC:#x}, {JOURNAL_VERSION}, 0",
                              path=path, offset=0, rule="lease.0")


def record(kind: int, queue_id: int, queue_offset: int, value_a: int = 0, value_b: int = 0,
           delivery_count: int = 0) -> bytes:
    """One 32-byte record."""
    return _pack_record(kind, 0, delivery_count, queue_id, queue_offset, value_a, value_b)


def encode_frame(records: list[bytes]) -> bytes:
    """A frame holding `records` (each from `record`)."""
    assert 1 <= len(records) <= FRAME_RECORDS_MAX, len(records)
    body = b"".join(records)
    return FRAME.pack(FRAME_MAGIC, len(records), _crc32(body), 0) + body


def decode_frames(raw: bytes, start: int, path: str) -> tuple[list[tuple], int]:
    """The records of the whole frames of `raw` from `start`, and where the whole frames end (rules 1-8).

    Each record is (kind, reserved, delivery_count, queue_id, queue_offset, value_a, value_b) and `raw` is the
    journal from file position `start` on (positions in errors are file positions).
    """
    records: list[tuple] = []
    position = 0
    size = len(raw)
    while position + FRAME_BYTES <= size:
        magic, count, body_crc, reserved = FRAME.unpack_from(raw, position)
        body_start = position + FRAME_BYTES
        body_end = body_start + RECORD_BYTES * count
        if magic != FRAME_MAGIC or not 1 <= count <= FRAME_RECORDS_MAX or body_end > size:
            break
        body = raw[body_start:body_end]
        if reserved != 0 or _crc32(body) != body_crc:
            break
        frame_records = list(RECORD.iter_unpack(body))
        for index, fields in enumerate(frame_records):
            check_record(fields, path, start + body_start + index * RECORD_BYTES)
        records.extend(frame_records)
        position = body_end
    return records, start + position


def check_record(fields: tuple, path: str, offset: int) -> None:
    """CorruptionError unless a record of a whole frame keeps rules 6-8."""
    kind, reserved, delivery_count, queue_id, queue_offset, value_a, _ = fields
    if kind not in KINDS or reserved != 0:
        raise CorruptionError(f"lease record has kind {kind} and reserved byte {reserved}", path=path,
                              offset=offset, rule="lease.6")
    if queue_id > QUEUE_ID_MAX or queue_offset < 0 or value_a < 0:
        raise CorruptionError(f"lease record has queue {queue_id}, offset {queue_offset}, value {value_a}",
                              path=path, offset=offset, rule="lease.7")
    if kind == KIND_LEASE and (delivery_count < 1 or value_a < 1):
        raise CorruptionError(f"lease record has delivery count {delivery_count} and lease id {value_a}",
                              path=path, offset=offset, rule="lease.8")
    if kind == KIND_BASE and value_a < queue_offset:
        raise CorruptionError(f"base record has next {value_a} below its prefix {queue_offset}", path=path,
                              offset=offset, rule="lease.8")
