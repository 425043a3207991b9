"""Differential fuzzing of the compiled codec's read bindings against the pure-Python decoders, on damaged records.

A few real records (every shape the writer makes: record CRC or not, tags, keys, unicode properties, empty and
larger bodies), written once at import through the pure-Python codec, are laid in a buffer; the input then
overwrites bytes, sets length and offset fields to boundary values (near 2^15, 2^31, 2^32), cuts the buffer, and
picks the call:

- `decode_record` at a record start (or any position) against `decode_message`: a message from the compiled
  codec must be exactly the Python one; None hands the record to Python; an exception must be Python's class;
- `decode_run` (through `decode_records_native`, as CommitLog.read_many calls it) against `decode_records`, with
  offsets and sizes from the chain, mutated, and with or without a queue to match;
- `record_values` (through `read_values`, as the timer's enqueue calls it) against `read_values`' Python path,
  with the same offsets, sizes and queue as `decode_run`;
- `walk_chain` against arrow_decode's Python walk.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile

import numpy as np
from mqstore.commitlog import arrow_decode, native
from mqstore.commitlog import format as fmt
from mqstore.commitlog.message import StoredMessage, decode_message, decode_records, decode_records_native
from mqstore.commitlog.record_values import read_values

from fuzz.provider import Input

COMPILED = native.NATIVE
BUFFER_BASE_OFFSET = 1 << 20  # the segment's base offset (PHYSICALOFFSETs are written relative to it)
EDITS_MAX = 6
BOUNDARY_VALUES = (0, 1, -1, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 0x80000000 - 88, 0xFFFFFFFF,
                   fmt.RECORD_SIZE_MIN - 1, fmt.RECORD_SIZE_MIN)
FIELD_OFFSETS = (0, 4, 8, 12, 16, 20, 28, 36, 84)  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET,
#                                                    PHYSICALOFFSET, SYSFLAG, BODYLENGTH (format.py's table)


class Segment:
    """The stand-in MappedFile decode_records reads through (`segments(offset)`)."""

    def __init__(self, data: bytearray):
        self.view = memoryview(data)
        self.base_offset = BUFFER_BASE_OFFSET
        self.size_bytes = len(data)
        self.path = "fuzz-segment"


def _records() -> list[bytes]:
    """Records of every shape, written by a store with the pure-Python codec (at import, once)."""
    from mqstore import Message, MessageStore, StoreConfig

    directory = tempfile.mkdtemp(prefix="mqstore-fuzz-codec-")
    records = []
    try:
        for record_crc in (False, True):
            native.NATIVE = None
            try:
                store = MessageStore.open(os.path.join(directory, str(record_crc)), StoreConfig(
                    segment_size_bytes=64 * 1024, record_crc=record_crc, index_enabled=False, dispatch_process=False,
                    preallocate_segments=False, store_host="10.0.0.7", disk_full_ratio=1.0,
                    disk_max_used_space_ratio=1.0, disk_clean_forcibly_ratio=1.0))
            finally:
                native.NATIVE = COMPILED
            with store:
                for message in (Message("t0", b""), Message("t0", b"x" * 300, queue_id=3, flag=-5),
                                Message("tags", b"body", tags="TagA", keys=["k1", "k2"]),
                                Message("props", "välue ☃".encode(), properties={"naïve": "välue ☃"},
                                        born_timestamp_ms=1_600_000_000_000),
                                Message("props", b"t", properties={"TIMER_OUT_MS": "1700000000123",
                                                                   "REAL_TOPIC": "real"})):
                    result = store.put(message)
                    segment = store._commitlog.segment_at(result.commitlog_offset)
                    at = result.commitlog_offset - segment.base_offset
                    records.append(bytes(segment.view[at : at + result.size_bytes]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return records


RECORDS = _records()


def _buffer(source: Input) -> tuple[bytearray, list[int]]:
    """Some of RECORDS back to back, their PHYSICALOFFSETs set to where they lie, then zeros; and their starts."""
    data = bytearray()
    starts = []
    for _ in range(source.below(4) + 1):
        record = bytearray(source.pick(RECORDS))
        struct.pack_into(">q", record, 28, BUFFER_BASE_OFFSET + len(data))
        starts.append(len(data))
        data += record
    data += bytes(source.below(3) * 64)
    return data, starts


def _damage(source: Input, data: bytearray, starts: list[int]) -> None:
    for _ in range(source.below(EDITS_MAX + 1)):
        kind = source.below(5)
        if not data:
            return
        if kind == 0:  # a byte anywhere
            data[source.below(len(data))] = source.uint(1)
        elif kind in (1, 2):  # a header field of a record set to a boundary value
            at = source.pick(starts) + source.pick(FIELD_OFFSETS)
            width = 8 if at - max(s for s in starts if s <= at) in (20, 28) else 4
            value = source.pick(BOUNDARY_VALUES)
            if at + width <= len(data):
                data[at : at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
        elif kind == 3:  # a one-byte or two-byte length (topic, properties) near the end of a record
            at = source.below(len(data))
            data[at] = source.pick((0, 1, 0x7F, 0x80, 0xFF))
        else:  # cut the buffer
            del data[source.below(len(data)) :]


def _outcome(call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the class is the outcome compared
        return ("raised", type(exc).__name__)
    if isinstance(value, list):
        return ("messages", [tuple(m) for m in value])
    return ("value", value if not isinstance(value, tuple) else tuple(value))


def _check_decode_record(source: Input, data: bytearray, starts: list[int]) -> None:
    view = memoryview(data)
    pos = source.pick(starts) if source.below(4) else source.below(len(data) + 1)
    remaining = len(data) - pos
    offset = BUFFER_BASE_OFFSET + pos
    check_crc = source.flag()
    record_crc_from = source.pick((None, 0, offset, offset + 1))
    expected = _outcome(lambda: decode_message(view, pos, remaining, offset, check_crc=check_crc,
                                               record_crc_from=record_crc_from))
    got = _outcome(lambda: COMPILED.decode_record(view, pos, remaining, offset, check_crc,
                                                  -1 if record_crc_from is None else record_crc_from, StoredMessage))
    if got == ("value", None):
        return
    assert got == expected, f"decode_record at {pos}: python {expected!r}, compiled {got!r}"


def _check_decode_run(source: Input, data: bytearray, starts: list[int]) -> None:
    segment = Segment(data)
    offsets = [BUFFER_BASE_OFFSET + start for start in starts]
    sizes = [int.from_bytes(data[s : s + 4], "big", signed=True) if s + 4 <= len(data) else 0 for s in starts]
    if source.flag() and sizes:
        sizes[source.below(len(sizes))] = source.pick(BOUNDARY_VALUES)
    if source.flag() and offsets:
        offsets[source.below(len(offsets))] += source.pick((-1, 1, 8, -8))
    offsets = [offset for offset in offsets if BUFFER_BASE_OFFSET <= offset < BUFFER_BASE_OFFSET + max(len(data), 1)]
    sizes = sizes[: len(offsets)]
    record_crc_from = source.pick((None, BUFFER_BASE_OFFSET, BUFFER_BASE_OFFSET + 10_000))
    queue = None
    if source.flag():
        entries = range(0, len(offsets)) if source.flag() else [source.below(4) for _ in offsets]
        queue = (source.pick(("t0", "tags", "props")), source.below(4), entries)
    expected = _outcome(lambda: decode_records(lambda offset: segment, offsets, sizes,
                                               record_crc_from=record_crc_from, queue=queue))
    got = _outcome(lambda: decode_records_native(COMPILED, lambda offset: segment, offsets, sizes,
                                                 record_crc_from=record_crc_from, queue=queue))
    assert got == expected, f"decode_run: python {expected!r}, compiled {got!r}"
    first = source.below(4)
    values_queue = None if queue is None else (queue[0], queue[1], first)
    names = source.pick(((b"TIMER_OUT_MS", b"REAL_TOPIC"), (b"TAGS", b"KEYS"), ("naïve".encode(), b"TAGS")))
    expected = _outcome(lambda: read_values(None, lambda offset: segment, offsets, sizes, *names,
                                            record_crc_from=record_crc_from, queue=values_queue).tolist())
    got = _outcome(lambda: read_values(COMPILED, lambda offset: segment, offsets, sizes, *names,
                                       record_crc_from=record_crc_from, queue=values_queue).tolist())
    assert got == expected, f"record_values: python {expected!r}, compiled {got!r}"


def _check_walk_chain(source: Input, data: bytearray) -> None:
    length = len(data) - source.below(min(len(data), 256) + 1)
    positions = np.empty(max(0, length) // fmt.RECORD_SIZE_MIN + 1, dtype=np.int64)
    view = np.frombuffer(bytes(data), dtype=np.uint8)
    count, following = COMPILED.walk_chain(view, length, BUFFER_BASE_OFFSET, positions)
    expected, expected_following, _ = arrow_decode._walk_python(view, length, BUFFER_BASE_OFFSET,
                                                               BUFFER_BASE_OFFSET + len(data), lenient=True, path=None)
    assert (list(positions[:count]), following) == (list(expected), expected_following), \
        f"walk_chain: compiled {list(positions[:count])}, {following}; python {list(expected)}, {expected_following}"


def one_input(data: bytes) -> None:
    source = Input(data)
    buffer, starts = _buffer(source)
    _damage(source, buffer, starts)
    starts = [start for start in starts if start < len(buffer)] or [0]
    for _ in range(source.below(3) + 1):
        kind = source.below(4)
        if kind < 2:
            _check_decode_record(source, buffer, starts)
        elif kind == 2:
            _check_decode_run(source, buffer, starts)
        else:
            _check_walk_chain(source, buffer)
