"""Walking a store's log: reading partitions into RecordBatches, finding the written end, admitting records.

Partitions carry byte ranges fixed at planning: a `LogPartition` holds pieces of segments read by walking their
records, READ_CHUNK_BYTES at a time (each piece must end exactly where planned; a longer record is taken whole,
once `check_unread_record` has found nothing wrong in its header and tail); a `QueuePartition` holds
ConsumeQueue slices whose records are decoded where they lie, and each record must be the size and topic its
unit says. Both read through a read-only mapping of the segment (`map_segment`: no copy, the pages mapped in one
call by `populate`); only the records within BUFFER_PAD_BYTES of a file's end are read with pread into padded
buffers. `admit` finds where a streaming micro-batch within its limits ends; where the last written segment's
records end (the snapshot planning takes) is mqstore/store/scan_end.py's. Decoding is
commitlog.arrow_decode's; files are read through mqstore.store.store_files.

A `TierPartition` holds pieces of a tier's segment objects: the same walk (`_walk_piece`) reads them through a
tier's SegmentObject (mqstore/tier/scan_source.py: range reads into padded buffers, or a mapping for a file://
tier) instead of a LocalSegment, so every check applies and errors name the object. A LogPartition planned by
store.scan() for a store with a tier reads a piece whose segment retention removed since planning from the
tier's copy.
"""

from __future__ import annotations

import bisect
import mmap
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

try:  # the Spark source's partition type; store.scan() plans the same partitions without pyspark
    from pyspark.sql.datasource import InputPartition
except ImportError:  # pragma: no cover - exercised by a test in a subprocess without pyspark
    InputPartition = object

from mqstore.commitlog import format as fmt
from mqstore.commitlog.arrow_decode import (
    BUFFER_PAD_BYTES,
    NEXT_BLANK,
    NEXT_DONE,
    NEXT_MORE,
    Decoder,
    FastLayout,
    big_endian_ints,
    in_file,
    locate_records,
)
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.mapped_file import MADV_POPULATE_READ, PAGE_SIZE_BYTES, madvise
from mqstore.consumequeue import format as cqfmt
from mqstore.store.config import RECORD_CRC_FROM_KEY
from mqstore.store.scan_options import RowFilter, StoreRef
from mqstore.store.settings import read_saved_settings
from mqstore.store.store_files import QueueIndex, list_segments, open_segment, pread_segment
from mqstore.tier.location import redacted
from mqstore.tier.scan_source import SegmentObject, open_location

MIB = 1 << 20
READ_CHUNK_BYTES = 16 * MIB  # a reader holds at most this much of a segment at once (or one larger record)
QUEUE_GAP_BYTES = 16 * 1024  # ConsumeQueue path: records closer than this are read with one pread
POPULATE_DENSITY_MIN = 8  # a topic scan maps a window's pages at once when its records fill 1/8 of it or more
MAPPED_CHUNK_MIN_BYTES = 1 * MIB  # a log walk's chunk shortened to stay BUFFER_PAD_BYTES inside the mapped file
# What a record's validity rules (1) to (4) and (6)'s shape read of it (commitlog/format.py): the header (hosts of
# up to 20 bytes each), from TOPICLENGTH on (2 bytes in v2, the longest topic, PROPERTIESLENGTH), the last bytes.
HEADER_BYTES_MAX = fmt.OFFSET_BODY + 2 * (fmt.HOST_V6_LENGTH - fmt.HOST_V4_LENGTH)
TAIL_BYTES_MAX = 2 + 0xFFFF + 2
LAST_BYTES = fmt.RECORD_CRC_LENGTH + 1  # the record-CRC pair and the separator before it


# --- partitions -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """Records of one segment from `start` (a record start) to `end`: exactly, or up to the segment's blank."""

    base: int
    start: int
    end: int


class LogPartition(InputPartition):
    """Pieces of one store's log, read by walking their records. `tier`, in the process that planned it only
    (store.scan()), is the store's tier (its TierReader): a piece whose segment retention removed since planning
    is read from the tier's copy when the tier lists it."""

    def __init__(self, root: str, label: str | None, segment_size: int, pieces: tuple, tier=None):
        self.root, self.label, self.segment_size, self.pieces = root, label, segment_size, pieces
        self.tier = tier


class TierPartition(InputPartition):
    """Pieces of a tier's segments, read with range reads of its objects (mqstore/tier/scan_source.py). The
    partition carries the tier's URI, which the process reading it opens (a Spark executor: never an open handle);
    a scan read in the process that planned it may carry the open `location` instead (a TierReader's, whose URI
    the store does not keep). The URI may hold credentials: repr() shows it redacted."""

    def __init__(self, uri: str | None, label: str | None, segment_size: int, record_crc_from: int | None,
                 pieces: tuple, location=None):
        assert uri is not None or location is not None
        self.uri, self.label, self.segment_size, self.pieces = uri, label, segment_size, pieces
        self.record_crc_from = record_crc_from
        self.location = location

    def tier_location(self):
        return self.location if self.location is not None else open_location(self.uri)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.uri is not None:
            state["location"] = None  # opened again where the partition is read
        return state

    def __repr__(self) -> str:
        shown = redacted(self.uri) if self.uri is not None else self.location.uri
        return f"TierPartition(tier={shown!r}, label={self.label!r}, pieces={self.pieces!r})"


class QueuePartition(InputPartition):
    """Records of one store found through ConsumeQueues: (topic, queue directory, first entry, count) slices."""

    def __init__(self, root: str, label: str | None, segment_size: int, first_base: int, slices: tuple):
        self.root, self.label, self.segment_size, self.slices = root, label, segment_size, slices
        self.first_base = first_base


def read_partition(partition, arrow_schema: pa.Schema, row_filter: RowFilter) -> Iterator[pa.RecordBatch]:
    """The RecordBatches of one partition (shared by the batch and the stream reader); none for a partition of
    another kind (an empty plan's placeholder)."""
    if isinstance(partition, TierPartition):
        decoder = Decoder(arrow_schema, row_filter, partition.label, partition.record_crc_from)
        yield from _read_tier_pieces(decoder, partition.tier_location(), partition.segment_size, partition.pieces)
        return
    if not isinstance(partition, (LogPartition, QueuePartition)):
        return
    crc_from = record_crc_from(partition.root)
    if isinstance(partition, LogPartition):
        decoder = Decoder(arrow_schema, row_filter, partition.label, crc_from)
        directory = os.path.join(partition.root, "commitlog")
        for piece in partition.pieces:
            yield from _read_local_piece(decoder, directory, partition, piece)
    elif isinstance(partition, QueuePartition):
        decoder = Decoder(arrow_schema, row_filter, partition.label, crc_from)
        yield from _read_queue_slices(decoder, partition)


def record_crc_from(root: str) -> int | None:
    """The commitlog offset from which the store's records must carry a record CRC (format rule 6), as its
    settings file says, as read_at requires it; None without one (a RocketMQ store, one written without record
    CRCs, or a settings file that is not mqstore's, which the store's own open reports)."""
    value = read_saved_settings(root).get(RECORD_CRC_FROM_KEY)
    return value if type(value) is int and value >= 0 else None


def map_segment(fd: int, path: str) -> np.ndarray:
    """The whole segment file as a read-only mapping (a uint8 array; empty for an empty file). Scans read records
    where they lie instead of copying them out with pread; the array keeps the mapping, which the decoder's
    Arrow arrays may refer to, and nothing unmaps it while they do. Records within BUFFER_PAD_BYTES of the file's
    end are still read into a padded buffer (the decoder's fixed-width windows may reach that far)."""
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return np.empty(0, dtype=np.uint8)
        return np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ), dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise StoreIOError(f"cannot map segment {path}: {exc}") from exc


def populate(mapped: np.ndarray, start: int, end: int) -> None:
    """Map the pages of mapped[start:end] in one call (MADV_POPULATE_READ, without the interpreter lock) rather
    than one page fault per 16 pages as the decoder first touches them; nothing where the kernel lacks it (the
    faults then do the same work)."""
    start -= start % PAGE_SIZE_BYTES
    end = min(end, len(mapped))
    if madvise is not None and end > start:
        madvise(mapped.ctypes.data + start, end - start, MADV_POPULATE_READ)  # an error leaves it to the faults


def _chunk(mapped: np.ndarray, fd: int, path: str, at: int, want: int, want_min: int) -> tuple[np.ndarray, int]:
    """(buffer, length): `want` bytes from file position `at` as a view of the mapping when BUFFER_PAD_BYTES more
    are in the file; else as many as leave that room (at least MAPPED_CHUNK_MIN_BYTES, never for a record
    longer than a chunk, `want_min`); else read into a padded buffer."""
    room = len(mapped) - BUFFER_PAD_BYTES - at
    if room >= want:
        return mapped[at:at + want + BUFFER_PAD_BYTES], want
    if room >= MAPPED_CHUNK_MIN_BYTES and not want_min:
        return mapped[at:at + room + BUFFER_PAD_BYTES], room
    return pread_segment(fd, path, at, want), want


class LocalSegment:
    """A local segment open for a walk: mapped and read where it lies. A piece's walk reads a segment through
    this or through a tier's SegmentObject (mqstore/tier/scan_source.py): `path` names it in errors, `chunk`
    gives a padded buffer of the next bytes, `read` reads bytes into a padded buffer (pread_segment's
    contract), `prepare` says which bytes the walk will read, `will_read` which chunk it likely reads next."""

    def __init__(self, path: str):
        self.path = path
        self.fd = open_segment(path)
        try:
            self.mapped = map_segment(self.fd, path)
        except StoreIOError:
            os.close(self.fd)
            raise

    def read(self, at: int, length: int, out: np.ndarray | None = None, out_at: int = 0) -> np.ndarray:
        return pread_segment(self.fd, self.path, at, length, out=out, out_at=out_at)

    def chunk(self, at: int, want: int, want_min: int) -> tuple[np.ndarray, int]:
        return _chunk(self.mapped, self.fd, self.path, at, want, want_min)

    def prepare(self, start: int, end: int) -> None:
        populate(self.mapped, start, end)

    def will_read(self, at: int, want: int) -> None:
        """Nothing to start ahead: the mapping is read where it lies."""

    def close(self) -> None:
        os.close(self.fd)


def _read_piece(decoder: Decoder, directory: str, segment_size: int, piece: Piece):
    """Decode the records of one piece of a local segment (_walk_piece)."""
    source = LocalSegment(os.path.join(directory, fmt.segment_name(piece.base)))
    try:
        yield from _walk_piece(decoder, source, segment_size, piece)
    finally:
        source.close()


def _read_local_piece(decoder: Decoder, directory: str, partition: LogPartition, piece: Piece):
    """_read_piece, or the piece read from the tier's copy of its segment when retention removed the local one
    since planning (LogPartition's `tier`)."""
    try:
        source = LocalSegment(os.path.join(directory, fmt.segment_name(piece.base)))
    except StoreIOError as exc:
        gone = isinstance(exc.__cause__, FileNotFoundError)
        source = _tier_copy(partition.tier, piece.base, partition.segment_size) if gone else None
        if source is None:
            raise
    try:
        yield from _walk_piece(decoder, source, partition.segment_size, piece)
    finally:
        source.close()


def _tier_copy(tier, base: int, segment_size: int) -> SegmentObject | None:
    """The tier's object of the segment at `base`, open, when `tier` (a TierReader) lists it; else None."""
    if tier is None:
        return None
    manifest = tier.manifest()
    if manifest is None or manifest.segment_at(base) is None:
        tier.history_start(base + segment_size)  # loads the manifest again when it may have gained the segment
        manifest = tier.manifest()
    if manifest is None or manifest.segment_at(base) is None or manifest.segment_size_bytes != segment_size:
        return None
    return SegmentObject(tier.location, base, segment_size)


def _read_tier_pieces(decoder: Decoder, location, segment_size: int, pieces):
    """Decode the pieces of a TierPartition, each object opened once (_walk_piece through range reads)."""
    opened: dict[int, SegmentObject] = {}
    try:
        for piece in pieces:
            source = opened.get(piece.base)
            if source is None:
                source = opened[piece.base] = SegmentObject(location, piece.base, segment_size)
            yield from _walk_piece(decoder, source, segment_size, piece)
    finally:
        for source in opened.values():
            source.close()


def _walk_piece(decoder: Decoder, source, segment_size: int, piece: Piece):
    """Decode the records of one piece, READ_CHUNK_BYTES at a time; the last must end exactly at piece.end."""
    path = source.path
    segment_end = piece.base + segment_size
    source.prepare(piece.start - piece.base, piece.end - piece.base)
    position = piece.start
    want_min = 0
    while position < piece.end:
        want = min(piece.end - position, max(READ_CHUNK_BYTES, want_min))
        buf, want = source.chunk(position - piece.base, want, want_min)
        positions, following, state = locate_records(buf, want, position, segment_end, lenient=False, path=path)
        if following and state in (NEXT_MORE, NEXT_DONE) and position + following < piece.end:
            following_end = min(piece.end, position + following + READ_CHUNK_BYTES)  # the next chunk's bytes
            source.will_read(position + following - piece.base, following_end - position - following)
        if len(positions):
            offsets = positions + position
            yield from decoder.decode(buf, positions, offsets, np.full(len(positions), segment_end), path)
        if state == NEXT_BLANK:
            if piece.end != segment_end:
                raise CorruptionError(f"a blank ends the segment at commitlog offset {position + following}, "
                                      f"before the end {piece.end} planned for this read", path=path,
                                      offset=position + following - piece.base, rule="commitlog.blank")
            return
        want_min = 0
        if state == NEXT_MORE:
            size = record_size(buf, want, following)
            if position + following + max(size, fmt.END_FILE_MIN_BLANK_LENGTH) > piece.end:
                raise CorruptionError(f"the record at commitlog offset {position + following} runs past the "
                                      f"end {piece.end} planned for this read", path=path,
                                      offset=position + following - piece.base, rule="commitlog.2")
            if following == 0:
                assert size > want, (size, want)  # else locate_records would have returned the record
                check_unread_record(source.read, path, piece.base, position, size, segment_end)
                want_min = size
        position += following


def record_size(buf: np.ndarray, length: int, at: int) -> int:
    """TOTALSIZE of the record at `at`, or 0 when its first 4 bytes are not in buf[:length]."""
    return fmt.I32.unpack_from(buf, at)[0] if at + 4 <= length else 0


def check_unread_record(read, path: str, base: int, offset: int, size: int, segment_end: int, *,
                        expect_size: int | None = None) -> None:
    """Before a record longer than a read chunk is read whole: the CorruptionError reading it would raise when
    that error depends only on its header and tail, so a hostile TOTALSIZE costs a few small reads, not gigabytes.

    `read(file_offset, length, out=None, out_at=0)` reads the segment's bytes (pread_segment's contract: a local
    segment's or a tier object's `read`). `size` (at most what the segment has left from `offset`) is the
    TOTALSIZE the read would fetch, or, with `expect_size`, the size a ConsumeQueue unit gives. The bytes
    validity rules (1) to (4) and the shape of (6) look at are read into a zero image of the record at their own
    places (pages not written take no memory), and the image gets the decoder's own checks: a ConsumeQueue unit's
    size against TOTALSIZE, then arrow_decode.FastLayout; a record it does not take is checked as decode_message
    checks it (format.locate, then the record-CRC pair). A record that passes is read whole as before; so is one
    of a valid shape, whose remaining checks (topic, body) need the bytes.
    """
    file_offset = offset - base
    head_length = min(size, HEADER_BYTES_MAX)
    head = read(file_offset, head_length)
    total = fmt.I32.unpack_from(head, 0)[0]
    if expect_size is not None and total != expect_size:  # what Decoder.decode checks first on this path
        raise CorruptionError(f"a ConsumeQueue unit says {expect_size} bytes, the record there has TOTALSIZE "
                              f"{total}", path=path, offset=file_offset, rule="consumequeue.matches-log")
    image = np.zeros(size + BUFFER_PAD_BYTES, dtype=np.uint8)
    image[:head_length] = head[:head_length]
    tail_at = _topic_length_at(head)
    for start, stop in ((tail_at, tail_at + TAIL_BYTES_MAX), (size - LAST_BYTES, size)):
        start, stop = max(start, head_length), min(stop, size)
        if start < stop:
            read(file_offset + start, stop - start, out=image, out_at=start)
    if FastLayout(image, np.zeros(1, dtype=np.int64), np.array([offset], dtype=np.int64)).fast[0]:
        return
    try:
        layout = fmt.locate(image, 0, segment_end - offset, offset, path=path)
        fmt.check_crcs(image, layout, 0, offset, required=False, check_crc=False, path=path)
    except CorruptionError as exc:
        raise in_file(exc, path, offset) from None


def _topic_length_at(head: np.ndarray) -> int:
    """Where a record's TOPICLENGTH lies by its header: after the body, whose length follows the two hosts
    (8 or 20 bytes each by SYSFLAG; format.py's table)."""
    sys_flag = fmt.I32.unpack_from(head, fmt.OFFSET_SYS_FLAG)[0]
    wide_hosts = bool(sys_flag & fmt.SYS_FLAG_BORNHOST_V6) + bool(sys_flag & fmt.SYS_FLAG_STOREHOST_V6)
    body_length_at = fmt.OFFSET_BODY_LENGTH + wide_hosts * (fmt.HOST_V6_LENGTH - fmt.HOST_V4_LENGTH)
    return body_length_at + 4 + fmt.I32.unpack_from(head, body_length_at)[0]


def _read_queue_slices(decoder: Decoder, partition: QueuePartition):
    """Gather the records the partition's ConsumeQueue slices point to, topic by topic, segment by segment."""
    by_topic: dict[str, list[np.ndarray]] = {}
    for topic, queue_dir, first, count in partition.slices:
        by_topic.setdefault(topic, []).append(_read_queue_range(queue_dir, first, count))
    directory = os.path.join(partition.root, "commitlog")
    size = partition.segment_size
    for topic, parts in sorted(by_topic.items()):
        units = np.concatenate(parts)
        order = np.argsort(units["commitlog_offset"], kind="stable")
        offsets = units["commitlog_offset"][order].astype(np.int64)
        sizes = units["size"][order].astype(np.int64)
        if not len(offsets):
            continue
        bases = offsets - (offsets - partition.first_base) % size
        cuts = np.flatnonzero(np.diff(bases)) + 1
        for group in np.split(np.arange(len(offsets)), cuts):
            yield from _gather_segment(decoder, directory, int(bases[group[0]]), size, offsets[group], sizes[group],
                                       topic)


def _read_queue_range(queue_dir: str, first: int, count: int) -> np.ndarray:
    """Units [first, first+count) of a queue; CorruptionError when fewer are written than were planned."""
    parts, number, left = [], first, count
    files = QueueIndex.files(queue_dir)
    starts = [f for f, _ in files]
    while left > 0:
        index = bisect.bisect_right(starts, number) - 1
        if index < 0:
            raise StoreIOError(f"ConsumeQueue file of entry {number} in {queue_dir} was deleted while the read was "
                               f"running")
        file_first, path = files[index]
        next_first = starts[index + 1] if index + 1 < len(starts) else None
        take = left if next_first is None else min(left, next_first - number)
        got = QueueIndex.read_units(path, number - file_first, take)
        if len(got) < take:
            raise CorruptionError(f"ConsumeQueue holds {len(got)} of the {take} units planned from entry {number}",
                                  path=path, offset=(number - file_first) * cqfmt.UNIT_SIZE_BYTES,
                                  rule="consumequeue.matches-log")
        parts.append(got)
        number += take
        left -= take
    return np.concatenate(parts) if parts else np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)


def _gather_segment(decoder: Decoder, directory: str, base: int, segment_size: int, offsets: np.ndarray,
                    sizes: np.ndarray, topic: str):
    """Decode the records at `offsets` of one segment where they lie in its mapping, windows of at most
    READ_CHUNK_BYTES of log (or one record) at a time; those too near the file's end for the decoder's padding
    (or past a file shorter than planned) are read into buffers."""
    path = os.path.join(directory, fmt.segment_name(base))
    if np.any(sizes < fmt.RECORD_SIZE_MIN) or np.any(offsets + sizes > base + segment_size):
        bad = int(np.flatnonzero((sizes < fmt.RECORD_SIZE_MIN) | (offsets + sizes > base + segment_size))[0])
        raise CorruptionError(f"a ConsumeQueue unit of topic {topic!r} says {int(sizes[bad])} bytes at "
                              f"{int(offsets[bad])}", path=path, offset=int(offsets[bad]) - base,
                              rule="consumequeue.matches-log")
    source = LocalSegment(path)
    try:
        mapped = source.mapped
        starts = offsets - base
        ends = starts + sizes
        # offsets ascend; the records whose bytes and padding are in the file come first
        inside = int(np.searchsorted(np.maximum.accumulate(ends), len(mapped) - BUFFER_PAD_BYTES, side="right"))
        segment_ends = np.full(len(offsets), base + segment_size)
        at = 0
        while at < inside:
            stop = min(max(int(np.searchsorted(ends[at:inside], starts[at] + READ_CHUNK_BYTES, side="right")), 1)
                       + at, inside)
            if int(sizes[at]) > READ_CHUNK_BYTES:  # a window of one record: its header and tail checked first
                check_unread_record(source.read, path, base, int(offsets[at]), int(sizes[at]), base + segment_size,
                                    expect_size=int(sizes[at]))
            lo, hi = int(starts[at]), int(ends[at:stop].max())
            if int(sizes[at:stop].sum()) * POPULATE_DENSITY_MIN >= hi - lo:  # else fault in the few pages used
                populate(mapped, lo, hi)
            yield from decoder.decode(mapped[lo:hi + BUFFER_PAD_BYTES], starts[at:stop] - lo, offsets[at:stop],
                                      segment_ends[at:stop], path, expect_topic=topic, expect_sizes=sizes[at:stop])
            at = stop
        if inside < len(offsets):
            yield from _gather_read(decoder, source, base, segment_size, offsets[inside:], sizes[inside:], topic)
    finally:
        source.close()


def _gather_read(decoder: Decoder, source, base: int, segment_size: int, offsets: np.ndarray, sizes: np.ndarray,
                 topic: str):
    """Read the records at `offsets` of one segment (a LocalSegment or a tier's SegmentObject) into buffers (runs
    of close records with one read each) and decode them."""
    path = source.path
    ends = offsets + sizes
    gaps = offsets[1:] - ends[:-1]
    # What record i adds to a buffer, at most: its size and the gap before it when that gap is read (a run goes
    # on). Buffers are kept within READ_CHUNK_BYTES by these bytes, not by the records' own: a topic's records
    # between others are read with those others, and buffers of several chunks were fresh pages to clear.
    read_bytes = sizes.copy()
    read_bytes[1:] += np.where((gaps > 0) & (gaps <= QUEUE_GAP_BYTES), gaps, 0)
    read_before = np.concatenate(([0], np.cumsum(read_bytes)))
    at = 0
    while at < len(offsets):
        # one buffer of at most READ_CHUNK_BYTES (or one record), made of runs of close records
        limit = read_before[at] + READ_CHUNK_BYTES
        stop = at + max(int(np.searchsorted(read_before[at + 1:], limit, side="right")), 1)
        if int(sizes[at]) > READ_CHUNK_BYTES:  # a record read alone
            check_unread_record(source.read, path, base, int(offsets[at]), int(sizes[at]), base + segment_size,
                                expect_size=int(sizes[at]))
        run_breaks = np.flatnonzero(gaps[at:stop - 1] > QUEUE_GAP_BYTES) + at + 1
        run_starts = np.concatenate(([at], run_breaks))
        run_stops = np.concatenate((run_breaks, [stop]))
        run_lengths = np.maximum.reduceat(ends[at:stop], run_starts - at) - offsets[run_starts]
        buf = np.zeros(int(run_lengths.sum()) + BUFFER_PAD_BYTES, dtype=np.uint8)
        into = 0
        positions = np.empty(stop - at, dtype=np.int64)
        for a, b, length in zip(run_starts.tolist(), run_stops.tolist(), run_lengths.tolist()):
            source.read(int(offsets[a]) - base, length, out=buf, out_at=into)
            positions[a - at:b - at] = offsets[a:b] - offsets[a] + into
            into += length
        yield from decoder.decode(buf, positions, offsets[at:stop], np.full(stop - at, base + segment_size), path,
                                  expect_topic=topic, expect_sizes=sizes[at:stop])
        at = stop


# --- streaming: how far a micro-batch reads -------------------------------------------------------------------
def admit(ref: StoreRef, start: int, end: int, rows_max: int | None, bytes_max: int | None) -> int:
    """The record start up to which a micro-batch reads from `start`: within the limits, one record at least."""
    segments = list_segments(ref.root)
    size = segments.segment_size
    rows = data = 0
    position = start
    while position < end:
        base = segments.base_of(position)
        path = segments.path(base)
        fd = open_segment(path)
        try:
            piece_end = min(end, base + size)
            want = min(piece_end - position, READ_CHUNK_BYTES)
            buf = pread_segment(fd, path, position - base, want)
        finally:
            os.close(fd)
        positions, following, state = locate_records(buf, want, position, base + size, lenient=False, path=path)
        if len(positions):
            sizes = big_endian_ints(buf, positions, 4, ">i4")
            count = len(positions)
            if rows_max is not None:
                count = min(count, rows_max - rows)
            if bytes_max is not None:
                count = min(count, int(np.searchsorted(np.cumsum(sizes), bytes_max - data, side="right")))
            if rows == 0 and count == 0:
                count = 1  # always make progress, even past a limit smaller than one record
            if count < len(positions):
                return position + int(positions[count])
            rows += count
            data += int(sizes.sum())
        if state == NEXT_BLANK:
            position = base + size
        elif state == NEXT_MORE and following == 0:  # one record larger than a read chunk
            size_needed = record_size(buf, want, 0)
            if rows and (rows_max is not None and rows >= rows_max
                         or bytes_max is not None and data + size_needed > bytes_max):
                return position
            rows += 1
            data += size_needed
            position += size_needed
        else:
            position += following
    return end
