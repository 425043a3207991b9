"""The written end of a store's log, as a read plans it: a walk of the last written segment's records.

`written_end` walks the last written segment from the latest known record start to the first zero or invalid
header, and checks the body CRC of the last records, so a record still being written is not taken. A stop that
has record starts after it is damage, not the end (decision 0016): `_refuse_damage_before_records` reads the
record at the stop again and raises its CorruptionError. A stop below the offset the checkpoint says was flushed
is damage whatever follows it (`checkpoint_flushed_offset`, `refuse_stop_below_flushed`; decision 0047).
Reads go through mqstore/store/scan_read.py's segment helpers.
"""

from __future__ import annotations

import bisect
import functools
import os

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.arrow_decode import (
    NEXT_BLANK,
    NEXT_END,
    NEXT_MORE,
    FastLayout,
    big_endian_ints,
    decode_record,
    locate_records,
)
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.message import decode_message
from mqstore.flush.checkpoint import CHECKPOINT_DAMAGED_FILE_NAME, CHECKPOINT_DTYPE, CHECKPOINT_FILE_NAME
from mqstore.store import scan_read  # pread_segment, check_unread_record: looked up per call (tests count them)
from mqstore.store.store_files import Segments, open_segment

MIB = 1 << 20
TAIL_CRC_RECORDS = 64  # records before a written end whose body CRC is checked when planning
# Where the planning walk stops before a segment's end, it looks this far on for a record start (the default
# max_message_size_bytes and a record's fixed part): one there means damage, not the end of the log.
DAMAGE_LOOKAHEAD_BYTES = 4 * MIB + 64 * 1024
DAMAGE_ZEROS_END_BYTES = 64 * 1024  # ... unless the first this many bytes from the stop are all zero: the end


# --- the written end of a store's log -------------------------------------------------------------------------
def written_end(segments: Segments, known_starts=()) -> tuple[int, list]:
    """(written end of the log, record starts met on the way), walking the last written segment.

    The last written segment is the last one whose first header is not zero (the writer may have created the
    next one already). Its records are walked from the latest known record start in it up to the first zero
    or invalid header; the body CRC of the last TAIL_CRC_RECORDS records is checked, so a record still being
    written is not counted.
    """
    if not segments.bases:
        return 0, []
    size = segments.segment_size
    for base in reversed(segments.bases):
        fd = open_segment(segments.path(base))
        try:
            head = os.pread(fd, fmt.END_FILE_MIN_BLANK_LENGTH, 0)
        finally:
            os.close(fd)
        if head.strip(b"\0"):
            break
    else:
        return segments.start, []
    start = base
    for known in known_starts:
        if base < known <= base + size:
            start = max(start, known)
    if start == base + size:
        return start, [start]
    return _walk_to_end(segments.path(base), base, size, start)


def _walk_to_end(path: str, base: int, size: int, start: int) -> tuple[int, list]:
    segment_end = base + size
    boundaries = [start]
    recent: list[tuple[int, int]] = []
    position, want_min, end = start, 0, None
    fd = open_segment(path)
    try:
        while position < segment_end and end is None:
            want = min(segment_end - position, max(scan_read.READ_CHUNK_BYTES, want_min))
            buf = scan_read.pread_segment(fd, path, position - base, want)
            positions, following, state = locate_records(buf, want, position, segment_end, lenient=True, path=path)
            if len(positions):
                valid = _structure_valid(buf, positions, position, segment_end, path)
                if not valid.all():
                    first_bad = int(np.flatnonzero(~valid)[0])
                    following, state = int(positions[first_bad]), NEXT_END
                    positions = positions[:first_bad]
                sizes = big_endian_ints(buf, positions, 4, ">i4") if len(positions) else positions
                recent = (recent + list(zip((positions + position).tolist(), sizes.tolist())))[-TAIL_CRC_RECORDS:]
            if state == NEXT_BLANK:
                end = segment_end
            elif state == NEXT_END:
                end = position + following
            elif state == NEXT_MORE and following == 0:  # one record larger than a read chunk
                want_min = scan_read.record_size(buf, want, 0)
                assert want_min > want, (want_min, want)  # else locate_records would have returned it
                try:
                    read = functools.partial(scan_read.pread_segment, fd, path)
                    scan_read.check_unread_record(read, path, base, position, want_min, segment_end)
                except CorruptionError as exc:
                    if not exc.length_sound:  # rules 1 to 4: what _structure_valid would find once it is read
                        end = position  # (a rule-6 shape error is raised by the CRC pass below, as for any record)
            else:
                want_min = 0
                position += following
                boundaries.append(position)
        if end is None:
            end = position
        if end < segment_end:
            _refuse_damage_before_records(fd, path, base, end, segment_end)
        for offset, record_size in recent:
            if offset >= end:
                break
            record = scan_read.pread_segment(fd, path, offset - base, record_size)
            message = decode_record(record.data, 0, segment_end - offset, offset, path)
            if fmt.body_crc(message.body) != message.body_crc:
                end = offset  # a record still being written: not part of the snapshot
                break
    finally:
        os.close(fd)
    return end, [b for b in boundaries if b < end]


def _refuse_damage_before_records(fd: int, path: str, base: int, end: int, segment_end: int) -> None:
    """The walk stopped at `end`, where no record could be taken: the end of the log, or damage when records
    follow (decision 0016: damage is not the end of the log). A record start (a message magic code whose
    PHYSICALOFFSET names its own place) within DAMAGE_LOOKAHEAD_BYTES after `end` says the log goes on: then the
    record at `end` is read again (a writer may have finished it since) and, when it still breaks the format, its
    CorruptionError is raised with the file and offset, as read_at reports it. DAMAGE_ZEROS_END_BYTES of zeros
    from `end` (a writer's tail, a closed store's end) are the end without a longer read."""
    want = min(segment_end - end, DAMAGE_LOOKAHEAD_BYTES)
    try:  # bytes to search (what is there, if the file is shorter); zeros first, the common end, cost one window
        raw = os.pread(fd, min(want, DAMAGE_ZEROS_END_BYTES), end - base)
        if raw.count(0) == len(raw):
            return
        if len(raw) < want:
            raw = os.pread(fd, want, end - base)
    except OSError as exc:
        raise StoreIOError(f"cannot read segment {path} at {end - base}: {exc.strerror}") from exc
    if not _record_start_after(raw, end):
        return
    decode_record(raw, 0, len(raw), end, path)  # raises for damage; a record written since ends the snapshot here


def checkpoint_flushed_offset(root: str) -> int | None:
    """The commitlog offset below which the store's checkpoint says the log is on disk, or None when it cannot
    say: no checkpoint, one too short, the marker of a checkpoint found damaged, or no offset (RocketMQ 4.4.0's
    checkpoints keep none). Read it before the log's files: a writer raises it only over bytes it wrote before."""
    if os.path.exists(os.path.join(root, CHECKPOINT_DAMAGED_FILE_NAME)):
        return None
    try:
        with open(os.path.join(root, CHECKPOINT_FILE_NAME), "rb") as handle:
            head = handle.read(CHECKPOINT_DTYPE.itemsize)
    except OSError:
        return None
    if len(head) < CHECKPOINT_DTYPE.itemsize:
        return None
    at = CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1]
    flushed = int.from_bytes(head[at : at + 8], "big", signed=True)
    return flushed if flushed > 0 else None


def refuse_stop_below_flushed(segments: Segments, end: int, flushed: int | None) -> None:
    """The walk to the written end stopped at `end`, below the offset the checkpoint says was flushed and inside
    the log's files: those bytes were on disk, so the stop is damage, not the end (recovery's rule,
    docs/recovery.md), whatever follows it (zeros included). A flushed offset past the log's files is the
    checkpoint's damage, which recovery reports; it is no evidence here."""
    if flushed is None or flushed <= end or not segments.bases:
        return
    if flushed > segments.bases[-1] + segments.segment_size:
        return
    base = segments.bases[max(bisect.bisect_right(segments.bases, end) - 1, 0)]
    raise CorruptionError(f"the log's walk stops at commitlog offset {end}, inside the written part of the log: "
                          f"the checkpoint says the log was flushed to {flushed}", path=segments.path(base),
                          offset=end - base, rule="commitlog.end")


def _record_start_after(raw: bytes, raw_abs: int) -> bool:
    """Whether `raw` (log bytes from commitlog offset raw_abs) holds a record start after its first byte."""
    for magic in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2):
        pattern = magic.to_bytes(4, "big")
        at = raw.find(pattern, fmt.OFFSET_MAGIC_CODE + 1)
        while at >= 0:
            start = at - fmt.OFFSET_MAGIC_CODE
            physical = raw[start + fmt.OFFSET_PHYSICAL_OFFSET : start + fmt.OFFSET_PHYSICAL_OFFSET + 8]
            if len(physical) == 8 and int.from_bytes(physical, "big", signed=True) == raw_abs + start:
                return True
            at = raw.find(pattern, at + 1)
    return False


def _structure_valid(buf, positions, buf_abs, segment_end, path) -> np.ndarray:
    """Rules (1) to (4) for each located record (vectorized; decode_message for the rare kinds)."""
    layout = FastLayout(buf, positions, positions + buf_abs)
    valid = layout.structure.copy()
    for i in np.flatnonzero(~valid).tolist():
        offset = int(positions[i]) + buf_abs
        try:
            decode_message(buf.data, int(positions[i]), segment_end - offset, offset, path=path)
            valid[i] = True
        except CorruptionError:
            break
    return valid
