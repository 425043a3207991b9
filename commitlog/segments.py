"""The ordered list of a CommitLog's segment files (RocketMQ's MappedFileQueue).

Segments all have `segment_size_bytes`, are named by their base offset (commitlog.format.segment_name)
and are contiguous: segment k+1 starts where segment k ends. Retention deletes from the front only.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from mqstore.commitlog import format as fmt
from mqstore.commitlog import native
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.mapped_file import MappedFile, remove_leftovers

log = logging.getLogger(__name__)

# A directory changed this recently is listed by load_if_changed() whatever its mtime says: a second change
# within the same tick of the file system's clock can leave the mtime as the first one set it.
RECENT_CHANGE_NS = 2_000_000_000



def first_gap(bases: list[int], segment_size_bytes: int) -> int | None:
    """The index in `bases` (sorted segment base offsets) of the first segment that does not start where the one
    before it ends, or None when they are contiguous."""
    for number in range(1, len(bases)):
        if bases[number] - bases[number - 1] != segment_size_bytes:
            return number
    return None


def gap_error(directory: str, bases: list[int], gap: int) -> CorruptionError:
    """The error for segments that are not contiguous at `bases[gap]` (first_gap's answer)."""
    return CorruptionError(f"segments are not contiguous: {fmt.segment_name(bases[gap - 1])} is followed by "
                           f"{fmt.segment_name(bases[gap])}", path=directory, rule="commitlog.contiguous")

def _stat_stamp(path: bytes) -> tuple[int, int]:
    """os.stat's (st_mtime_ns, st_ino) of `path`: the compiled directory_stamp's reference."""
    status = os.stat(path)
    return status.st_mtime_ns, status.st_ino


# a get of a read-only store stats the log's directory each time: the compiled form skips os.stat's result object
_directory_stamp = native.NATIVE.directory_stamp if native.NATIVE is not None else _stat_stamp


class SegmentList:
    """The segments of one directory, mapped; lookup by absolute offset is O(1)."""

    def __init__(self, directory: str, segment_size_bytes: int, *, writable: bool, preallocate: bool = True,
                 salvage=None):
        self.directory = directory
        self.segment_size_bytes = segment_size_bytes
        self.writable = writable
        self.preallocate = preallocate
        # A writer told to repair gets a salvage (mqstore.store.repair.Salvage): it keeps what the repair changes and
        # fixes segment files of the wrong size (cut the bytes past the size, extend a short one with zeros:
        # recovery then cuts the log there) and the segments after a missing one (moved away: the log ends at
        # the gap), instead of refusing them.
        self.salvage = salvage
        self.segments: list[MappedFile] = []
        self._lock = threading.Lock()
        self._listed_stamp: tuple | None = None  # the directory's (mtime, inode) when load() last listed it all
        self._directory_bytes = os.fsencode(directory)
        try:
            self.load()
        except BaseException:
            self.close()  # the segments mapped before the bad one
            raise

    def load_if_changed(self) -> None:
        """load(), unless the directory is as it was at the last complete listing: a reader calls it on every
        read to follow the writer's new segments and its retention, and a stat costs far less than a listing.

        Adding or removing a file moves a directory's mtime; a directory that changed in the last
        RECENT_CHANGE_NS is listed every time (a change in the same clock tick may leave the mtime unmoved).
        """
        try:
            stamp = _directory_stamp(self._directory_bytes)
        except OSError:
            self.load()  # reports what is wrong (or finds no directory yet)
            return
        if stamp == self._listed_stamp and abs(time.time_ns() - stamp[0]) > RECENT_CHANGE_NS:
            return
        self._listed_stamp = None
        if self.load():
            self._listed_stamp = stamp  # taken before the listing: a change during it shows next time

    def load(self) -> bool:
        """Map every segment file of the directory that is not mapped yet (a reader calls it to see new ones).
        Returns False when a reader stopped at an empty last file (a writer still making it)."""
        with self._lock:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                names = []
            except OSError as exc:
                raise StoreIOError(f"cannot list {self.directory}: {exc.strerror}") from exc
            if self.writable:
                names = remove_leftovers(self.directory, names)
            bases = []
            for name in names:
                base = fmt.parse_segment_name(name)
                if base is None:
                    continue  # temporary or foreign files are not segments
                if base % self.segment_size_bytes:
                    raise CorruptionError(
                        f"segment base offset {base} is not a multiple of the segment size {self.segment_size_bytes}",
                        path=os.path.join(self.directory, name), rule="commitlog.segment-name")
                bases.append(base)
            bases.sort()
            if not self.writable and bases:  # a reader: drop the segments the writer's retention deleted
                gone = [segment for segment in self.segments if segment.base_offset < bases[0]]
                if gone:
                    self.segments = self.segments[len(gone):]  # a new list: segment_at() reads it unlocked
                    for segment in gone:
                        segment.close()
            known = {s.base_offset for s in self.segments}
            gap = first_gap(bases, self.segment_size_bytes)
            if gap is not None:
                if not (self.writable and self.salvage is not None):
                    raise gap_error(self.directory, bases, gap)
                self.salvage.segments_after_gap([os.path.join(self.directory, fmt.segment_name(later))
                                                 for later in bases[gap:]], bases[gap - 1])
                bases = bases[:gap]
            for base in bases:
                if base in known:
                    continue
                if self.segments and base != self.segments[-1].base_offset + self.segment_size_bytes:
                    continue  # below our first segment: already deleted by retention
                path = os.path.join(self.directory, fmt.segment_name(base))
                if base == bases[-1] and os.path.getsize(path) == 0:
                    if not self.writable:
                        return False  # an empty last file: a reader racing a writer creating it
                    # RocketMQ's writer creates a segment file, then sizes it by mapping it: killed in between,
                    # it leaves an empty last file, which RocketMQ's load ignores and its writer makes again
                    # when it needs it. It holds no byte of the log: a writer removes it and does the same.
                    log.warning("removing %s: an empty last segment file (a writer died creating it)", path)
                    _remove(path)
                    break
                if self.writable and self.salvage is not None and os.path.getsize(path) != self.segment_size_bytes:
                    self.salvage.segment_of_wrong_size(path, self.segment_size_bytes)
                self.segments.append(MappedFile.open(path, base, self.segment_size_bytes, writable=self.writable))
            return True

    @property
    def first_base_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else 0

    def segment_at(self, commitlog_offset: int) -> MappedFile | None:
        """The segment holding `commitlog_offset`, or None when no mapped segment does."""
        segments = self.segments
        if not segments:
            return None
        index = (commitlog_offset - segments[0].base_offset) // self.segment_size_bytes
        if 0 <= index < len(segments):
            return segments[index]
        return None

    def last(self) -> MappedFile | None:
        return self.segments[-1] if self.segments else None

    def create(self, base_offset: int) -> MappedFile:
        """Create and map the segment starting at `base_offset` (the next one after the last)."""
        assert self.writable
        assert base_offset % self.segment_size_bytes == 0
        with self._lock:
            if self.segments:
                assert base_offset == self.segments[-1].base_offset + self.segment_size_bytes, base_offset
            path = os.path.join(self.directory, fmt.segment_name(base_offset))
            # Sparse: the writer reserves disk ahead of itself as it goes (CommitLog._make_room).
            segment = MappedFile.create(path, base_offset, self.segment_size_bytes, preallocate=self.preallocate,
                                        reserve_bytes=0)
            self.segments.append(segment)
            return segment

    def adopt(self, segment: MappedFile) -> MappedFile:
        """Append a segment made elsewhere (ahead of need) for the next base offset."""
        assert self.writable and segment.size_bytes == self.segment_size_bytes
        with self._lock:
            if self.segments:
                assert segment.base_offset == self.segments[-1].base_offset + self.segment_size_bytes
            self.segments.append(segment)
            return segment

    def remove_first(self, segment: MappedFile) -> None:
        """Take the oldest segment out of the list (retention); the caller deletes or archives its file."""
        with self._lock:
            assert self.segments and self.segments[0] is segment and len(self.segments) > 1
            self.segments.pop(0)

    def remove_after(self, commitlog_offset: int) -> list[MappedFile]:
        """Take every segment starting after the one holding `commitlog_offset` out of the list (recovery's
        truncation); the caller deletes them."""
        holding_base = commitlog_offset - commitlog_offset % self.segment_size_bytes
        with self._lock:
            removed = [segment for segment in self.segments if segment.base_offset > holding_base]
            self.segments = [segment for segment in self.segments if segment.base_offset <= holding_base]
            return removed

    def close(self) -> None:
        with self._lock:
            for segment in self.segments:
                segment.close()
            self.segments = []


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        raise StoreIOError(f"cannot remove {path}: {exc.strerror}") from exc
