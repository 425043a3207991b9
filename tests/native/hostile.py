"""Hostile records in a large sparse segment, decoded by one codec: the cases of test_hostile_lengths.py.

Run as a child process (`python -m tests.native.hostile CODEC SEGMENT_FILE`), so that a codec that crashes fails
the test instead of ending pytest: it writes each case's record into the sparse segment file (mapped, 4 GiB and
more), decodes it through every read path of the codec (a read by offset, an indexed read, the two-value read of the
timer's enqueue, the dispatch scan),
zeroes it again, and prints one JSON line of outcomes per case. CODEC is "python" (the pure-Python reference) or
"native" (the compiled core, falling back to the reference where it hands a record back, as the store does).

Lengths sit at each side of 2^31 and 2^32 (TOTALSIZE, BODYLENGTH as i32 fields, TOPICLENGTH as u8,
PROPERTIESLENGTH as i16), and records at positions around 2^31, 2^32 and the segment's end. A record whose
fields add up (a valid shape) is only made small: a giant one would make both codecs copy gigabytes.
"""

from __future__ import annotations

import itertools
import json
import mmap
import struct
import sys
import zlib

SEGMENT_BYTES = (1 << 32) + (1 << 20)  # 4 GiB + 1 MiB: positions past 2^31 and 2^32 inside one segment
SEGMENT_BASE = 3 * SEGMENT_BYTES  # commitlog offsets past 2^33 too
MAGIC_V1 = 0xDAA320A7
HOST = bytes([10, 0, 0, 7, 0, 0, 0x2A, 0x9F])

POSITIONS = (0, (1 << 31) - 88, (1 << 31) + 8, (1 << 32) - 96, SEGMENT_BYTES - 400)
SIZES = (0x7FFFFFFF, 0x7FFFFFFE, 0x80000000, 0xFFFFFFFF, 0x80000000 + 92, 92, 91)
TOPIC_LENGTHS = (0, 1, 127, 255)
PROPERTIES_LENGTHS = (0, 0x7FFF, 0x8000, 0xFFFF)


def body_lengths(size: int) -> tuple[int, ...]:
    """BODYLENGTH values for a TOTALSIZE: the largest that leaves room for the tail, around it, and at i32's ends."""
    return tuple(sorted({(size - 91) & 0xFFFFFFFF, (size - 91 - 2) & 0xFFFFFFFF, (size - 88) & 0xFFFFFFFF,
                         0x7FFFFFFF, 0x80000000, 0xFFFFFFFF}))


def header(size: int, body_length: int, physical: int, body_crc: int = 0) -> bytes:
    """88 bytes of a v1 header with IPv4 hosts; TOTALSIZE and BODYLENGTH as raw 32-bit patterns."""
    return struct.pack(">IIiiiqqiq8sq8siqI", size & 0xFFFFFFFF, MAGIC_V1, body_crc, 0, 0, 0, physical, 0, 0, HOST,
                       0, HOST, 0, 0, body_length & 0xFFFFFFFF)


def tail(topic_length: int, properties_length: int) -> bytes:
    """TOPICLENGTH, up to 255 topic bytes, PROPERTIESLENGTH (a raw 16-bit pattern) and a few property bytes."""
    return bytes([topic_length]) + b"t" * topic_length + struct.pack(">H", properties_length) + b"a\x01b\x02"


def hostile_cases():
    """(position, pieces): each piece (at, bytes) relative to the record; pieces outside the segment are cut."""
    for position, size, topic_length, properties_length in itertools.product(
            POSITIONS, SIZES, TOPIC_LENGTHS, PROPERTIES_LENGTHS):
        for body_length in body_lengths(size):
            physical = SEGMENT_BASE + position
            tail_at = 88 + (body_length - (1 << 32) if body_length >= 1 << 31 else body_length)
            yield position, ((0, header(size, body_length, physical)), (tail_at, tail(topic_length, properties_length)))


def valid_record(physical: int, body: bytes, topic: bytes = b"T") -> bytes:
    properties = b"a\x01b\x02"
    size = 88 + len(body) + 1 + len(topic) + 2 + len(properties)
    return (header(size, len(body), physical, zlib.crc32(body) & 0x7FFFFFFF) + body + bytes([len(topic)]) + topic
            + struct.pack(">h", len(properties)) + properties)


def edge_cases():
    """Small records of a valid shape at the boundaries: across 2^31 and 2^32, ending at the segment's end and one
    byte past it, and a header cut by the end."""
    for position in ((1 << 31) - 50, (1 << 32) - 50, (1 << 32) + 7):
        yield position, ((0, valid_record(SEGMENT_BASE + position, b"x" * 40)),)
    record = valid_record(0, b"y" * 9)
    for position in (SEGMENT_BYTES - len(record), SEGMENT_BYTES - len(record) + 1):
        yield position, ((0, valid_record(SEGMENT_BASE + position, b"y" * 9)),)
    for left in (8, 12, 91, 92):
        position = SEGMENT_BYTES - left
        yield position, ((0, valid_record(SEGMENT_BASE + position, b"z")),)


def outcome(call) -> list:
    """["ok", the message's fields] or [the exception's type, its text]: comparable across codecs."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - every outcome is recorded and compared, none is hidden
        return [type(exc).__name__, str(exc)]
    if isinstance(result, list):
        return ["ok", [repr(tuple(message)) for message in result]]
    if hasattr(result, "tolist"):  # read_values' rows
        return ["ok", result.tolist()]
    if hasattr(result, "error"):  # a DispatchBatch
        error = None if result.error is None else str(result.error)
        return ["batch", result.commitlog_offsets.tolist(), result.sizes.tolist(), result.topic_names,
                result.end_offset, error]
    return ["ok", repr(tuple(result))]


def run(codec_name: str, path: str) -> None:
    import numpy as np
    from mqstore.commitlog import _native, dispatch_batch
    from mqstore.commitlog.mapped_file import MappedFile
    from mqstore.commitlog.message import StoredMessage, decode_message, decode_records, decode_records_native
    from mqstore.commitlog.record_values import read_values

    codec = _native if codec_name == "native" else None
    dispatch_batch.NATIVE = codec
    array = np.memmap(path, dtype=np.uint8, mode="r+", shape=(SEGMENT_BYTES,))
    writer = array._mmap
    segment = MappedFile(path, SEGMENT_BASE, SEGMENT_BYTES, array, writable=False)
    view = segment.view

    class Log:  # dispatch_batch.LogReader over the one segment
        @staticmethod
        def segment_at(offset):
            return segment

        @staticmethod
        def readable_end():
            return SEGMENT_BASE + SEGMENT_BYTES

    def read(position):
        offset = SEGMENT_BASE + position
        if codec is not None:
            message = codec.decode_record(view, position, SEGMENT_BYTES - position, offset, True, -1, StoredMessage)
            if message is not None:
                return message
        return decode_message(view, position, SEGMENT_BYTES - position, offset, path=path, check_crc=True)

    def indexed(position):
        offset = SEGMENT_BASE + position
        size = struct.unpack_from(">i", view, position)[0] if position + 4 <= SEGMENT_BYTES else 0
        if codec is not None:
            return decode_records_native(codec, Log.segment_at, [offset], [size])
        return decode_records(Log.segment_at, [offset], [size])

    def values(position):  # the timer's enqueue path: two property values by an index's size
        offset = SEGMENT_BASE + position
        size = struct.unpack_from(">i", view, position)[0] if position + 4 <= SEGMENT_BYTES else 0
        return read_values(codec, Log.segment_at, [offset], [size], b"a", b"b")

    def scan(position):
        return dispatch_batch.parse_records(Log, SEGMENT_BASE + position, SEGMENT_BASE + SEGMENT_BYTES,
                                            check_crc=True)

    for number, (position, pieces) in enumerate(itertools.chain(hostile_cases(), edge_cases())):
        placed = []
        for at, data in pieces:
            start = position + at
            if 0 <= start < SEGMENT_BYTES:
                data = data[: SEGMENT_BYTES - start]
                writer[start : start + len(data)] = data
                placed.append((start, len(data)))
        result = {"case": number, "position": position,
                  "read": outcome(lambda: read(position)), "indexed": outcome(lambda: indexed(position)),
                  "values": outcome(lambda: values(position)),
                  "scan": outcome(lambda: scan(position))}
        for start, length in placed:
            writer[start : start + length] = bytes(length)
        print(json.dumps(result), flush=True)
    segment.view = None


def make_segment(path: str) -> None:
    """A sparse file of SEGMENT_BYTES zero bytes (a hole: no disk blocks)."""
    with open(path, "wb") as handle:
        handle.truncate(SEGMENT_BYTES)


if __name__ == "__main__":
    assert mmap.PAGESIZE > 0
    run(sys.argv[1], sys.argv[2])
