"""A store's files as the commitlog source reads them: CommitLog segments and ConsumeQueue files.

Reads only, with plain file descriptors (no mapping, no lock), so a writer may be appending in another
process: `list_segments` lists the segments and checks the layout rule (same size, contiguous),
`open_segment` / `pread_segment` read bytes of a segment and report a segment deleted or shortened under a
read as StoreIOError, and `QueueIndex` reads ConsumeQueue units on demand while planning (the dispatched end,
record starts to split a segment at, the units of one queue in a range of the log).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.arrow_decode import BUFFER_PAD_BYTES
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.segments import first_gap, gap_error
from mqstore.consumequeue import format as cqfmt
from mqstore.store.scan_errors import CommitLogSourceError

BOUNDARY_QUEUES_MAX = 16  # queues searched for a record start to split a segment at


# --- reading files --------------------------------------------------------------------------------------------
def open_segment(path: str) -> int:
    """A read-only descriptor of a segment; StoreIOError naming it when it is gone."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise StoreIOError(f"segment {path} was deleted while the read was running (retention?); the rows "
                           f"planned from it can no longer be read") from exc
    except OSError as exc:
        raise StoreIOError(f"cannot open segment {path}: {exc.strerror}") from exc


def pread_segment(fd: int, path: str, file_offset: int, length: int, out: np.ndarray | None = None,
                  out_at: int = 0) -> np.ndarray:
    """`length` bytes at `file_offset`, into a zero-padded array (or into `out` at `out_at`)."""
    if out is None:
        out = np.zeros(length + BUFFER_PAD_BYTES, dtype=np.uint8)
        out_at = 0
    view = memoryview(out)[out_at:out_at + length]
    done = 0
    while done < length:
        try:
            got = os.preadv(fd, [view[done:]], file_offset + done)
        except OSError as exc:
            raise StoreIOError(f"cannot read segment {path} at {file_offset + done}: {exc.strerror}") from exc
        if got == 0:
            raise StoreIOError(f"segment {path} is shorter than planned ({file_offset + done} bytes; {length - done} "
                               f"more were expected): it was truncated or replaced while the read was running")
        done += got
    return out


# --- store layout ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segments:
    """The segment files of one store at planning time: `bases` ascending, all `segment_size` long."""

    directory: str
    segment_size: int
    bases: tuple

    def path(self, base: int) -> str:
        return os.path.join(self.directory, fmt.segment_name(base))

    @property
    def start(self) -> int:
        return self.bases[0] if self.bases else 0

    def base_of(self, commitlog_offset: int) -> int:
        """The base of the segment holding `commitlog_offset` (which may be one past the last byte)."""
        return commitlog_offset - (commitlog_offset - self.start) % self.segment_size


def list_segments(root: str) -> Segments:
    """The store's segments; CorruptionError when their sizes or names break the layout rule."""
    directory = os.path.join(root, "commitlog")
    try:
        names = os.listdir(directory)
    except FileNotFoundError as exc:
        raise CommitLogSourceError(f"not a RocketMQ store (no commitlog/ directory): {root}") from exc
    bases = sorted(b for b in (fmt.parse_segment_name(n) for n in names) if b is not None)
    if not bases:
        return Segments(directory, 0, ())
    sizes = {}
    for base in bases:
        try:
            sizes[base] = os.stat(os.path.join(directory, fmt.segment_name(base))).st_size
        except FileNotFoundError:
            sizes[base] = None  # deleted by retention while listing
    bases = [b for b in bases if sizes[b] is not None]
    if not bases:
        return Segments(directory, 0, ())
    size = sizes[bases[-1]]
    for base in bases:
        if sizes[base] != size or size <= 0:
            raise CorruptionError(f"segment is {sizes[base]} bytes, the store's segments are {size}",
                                  path=os.path.join(directory, fmt.segment_name(base)), rule="commitlog.segment-size")
    gap = first_gap(bases, size)
    if gap is not None:
        raise gap_error(directory, bases, gap)
    return Segments(directory, size, tuple(bases))


# --- ConsumeQueues --------------------------------------------------------------------------------------------
class QueueIndex:
    """The ConsumeQueue files of one store, read on demand (planning only: never pickled into partitions)."""

    def __init__(self, root: str):
        self.directory = os.path.join(root, "consumequeue")
        self._queues = None
        self._first_offsets: dict[str, list[int]] = {}

    def queues(self) -> list[tuple[str, int, str]]:
        """(topic, queue_id, directory) of every queue."""
        if self._queues is None:
            found = []
            try:
                topics = sorted(os.listdir(self.directory))
            except OSError:
                topics = []
            for topic in topics:
                topic_dir = os.path.join(self.directory, topic)
                try:
                    ids = os.listdir(topic_dir)
                except OSError:
                    continue
                for name in ids:
                    if name.isdigit():
                        found.append((topic, int(name), os.path.join(topic_dir, name)))
            self._queues = sorted(found)
        return self._queues

    @staticmethod
    def files(queue_dir: str) -> list[tuple[int, str]]:
        """(first entry number, path) of the queue's files, ascending."""
        try:
            names = os.listdir(queue_dir)
        except OSError:
            return []
        files = []
        for name in names:
            start = cqfmt.parse_file_name(name)
            if start is not None and start % cqfmt.UNIT_SIZE_BYTES == 0:
                files.append((start // cqfmt.UNIT_SIZE_BYTES, os.path.join(queue_dir, name)))
        return sorted(files)

    @staticmethod
    def read_units(path: str, first: int = 0, count: int | None = None) -> np.ndarray:
        """Units [first, first+count) of one file, cut at the first unit with size 0 (the queue's end); a negative
        size is damage (ConsumeQueue format rule 1), not an end that would hide the units after it."""
        try:
            with open(path, "rb") as handle:
                handle.seek(first * cqfmt.UNIT_SIZE_BYTES)
                raw = handle.read(-1 if count is None else count * cqfmt.UNIT_SIZE_BYTES)
        except FileNotFoundError:
            return np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        except OSError as exc:
            raise StoreIOError(f"cannot read ConsumeQueue file {path}: {exc.strerror}") from exc
        units = np.frombuffer(raw[:len(raw) - len(raw) % cqfmt.UNIT_SIZE_BYTES], dtype=cqfmt.CONSUME_QUEUE_UNIT)
        return units[:cqfmt.written_count(units, path, first)]

    def first_offsets(self, queue_dir: str, files) -> list[int]:
        """The commitlog offset of each file's first unit (cached)."""
        cached = self._first_offsets.get(queue_dir)
        if cached is None or len(cached) != len(files):
            cached = []
            for _, path in files:
                units = self.read_units(path, 0, 1)
                cached.append(int(units["commitlog_offset"][0]) if len(units) else 1 << 62)
            self._first_offsets[queue_dir] = cached
        return cached

    def dispatched_end(self) -> tuple[int, int, int] | None:
        """(end, offset, size) of the last unit written to any queue: the log is dispatched up to `end`."""
        best = None
        for _, _, queue_dir in self.queues():
            for _first, path in reversed(self.files(queue_dir)):
                last = _last_unit(path)
                if last is not None:
                    offset, size = last
                    if best is None or offset + size > best[0]:
                        best = (offset + size, offset, size)
                    break
        return best

    def boundary_at_or_after(self, commitlog_offset: int, limit: int) -> int | None:
        """A record start in [commitlog_offset, limit) taken from the biggest queues, or None."""
        ranked = sorted(((len(self.files(d)), d) for _, _, d in self.queues()), reverse=True)
        best = None
        for _, queue_dir in ranked[:BOUNDARY_QUEUES_MAX]:
            files = self.files(queue_dir)
            firsts = self.first_offsets(queue_dir, files)
            index = max(bisect.bisect_right(firsts, commitlog_offset) - 1, 0)
            for _, path in files[index:index + 2]:
                found = _first_unit_at_or_after(path, commitlog_offset)
                if found is not None:
                    if found < limit and (best is None or found < best):
                        best = found
                    break
        return best

    def entries(self, queue_dir: str, lo: int, hi: int) -> tuple[int, np.ndarray]:
        """(number of the first returned entry, units) of one queue with commitlog offset in [lo, hi)."""
        files = self.files(queue_dir)
        if not files:
            return 0, np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        firsts = self.first_offsets(queue_dir, files)
        start = max(bisect.bisect_right(firsts, lo) - 1, 0)
        stop = bisect.bisect_left(firsts, hi)
        parts, first_number = [], None
        chosen = files[start:max(stop, start + 1)]
        for index, (number, path) in enumerate(chosen):
            units = self.read_units(path)
            following = chosen[index + 1][0] if index + 1 < len(chosen) else None
            if following is not None and number + len(units) < following:
                _refuse_short_file(path, len(units))
            offsets = units["commitlog_offset"]
            a, b = np.searchsorted(offsets, lo), np.searchsorted(offsets, hi)
            if len(units) and int(units["size"][0]) == cqfmt.FILLER_SIZE:  # a queue that starts late: not entries
                a = max(int(a), cqfmt.leading_fillers(units))
            if a < b:
                if first_number is None:
                    first_number = number + int(a)
                parts.append(units[a:b])
        if not parts:
            return 0, np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        return first_number, np.concatenate(parts)


def _refuse_short_file(path: str, written: int) -> None:
    """A ConsumeQueue file whose written part (up to its first free unit) ends before the next file starts: the
    queue's written part ends there (ConsumeQueue format), so the next file's units are not entries of it. The
    store's open refuses it (consumequeue/consume_queue.py); a scan does the same rather than number the next
    file's units as if they followed."""
    raise CorruptionError(f"queue file ends after {written} entries but is not the last", path=path,
                          offset=written * cqfmt.UNIT_SIZE_BYTES, rule="consumequeue.1")


def _unit_at(fd: int, index: int) -> tuple[int, int] | None:
    """(commitlog offset, size) of unit `index` of an open ConsumeQueue file, None past its written end."""
    raw = os.pread(fd, cqfmt.UNIT_SIZE_BYTES, index * cqfmt.UNIT_SIZE_BYTES)
    if len(raw) < cqfmt.UNIT_SIZE_BYTES:
        return None
    unit = np.frombuffer(raw, dtype=cqfmt.CONSUME_QUEUE_UNIT)
    size = int(unit["size"][0])
    return (int(unit["commitlog_offset"][0]), size) if size > 0 else None


def _first_unit_at_or_after(path: str, commitlog_offset: int) -> int | None:
    """The smallest commitlog offset >= `commitlog_offset` among a file's written units (binary search)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        lo, hi = 0, os.fstat(fd).st_size // cqfmt.UNIT_SIZE_BYTES  # the answer is unit lo once lo == hi
        while lo < hi:
            mid = (lo + hi) // 2
            unit = _unit_at(fd, mid)
            if unit is not None and unit[0] < commitlog_offset:
                lo = mid + 1
            else:
                hi = mid
        unit = _unit_at(fd, lo)
        return unit[0] if unit is not None else None
    finally:
        os.close(fd)


def _last_unit(path: str) -> tuple[int, int] | None:
    """(commitlog offset, size) of the last written unit of one ConsumeQueue file, by binary search."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        lo, hi = 0, os.fstat(fd).st_size // cqfmt.UNIT_SIZE_BYTES  # units [0, lo) are written, [hi, ...) not
        while lo < hi:
            mid = (lo + hi) // 2
            if _unit_at(fd, mid) is not None:
                lo = mid + 1
            else:
                hi = mid
        return _unit_at(fd, lo - 1) if lo else None
    finally:
        os.close(fd)
