"""A tier's objects as a bulk read sees them: segments read in large range reads, queue images searched for record
starts, the first record's store time of each segment. `scan()` and the Spark source read a tier through this
module (mqstore/store/scan_plan.py plans, mqstore/store/scan_read.py walks and decodes); it knows nothing of
Arrow or Spark.

A tier is opened from its URI (`open_location`, one TierLocation per URI and process, so that the partitions a
process reads share one filesystem client) and known by its manifest alone (mqstore/tier/manifest.py): every
segment it lists is sealed and `segment_size_bytes` long, so the tier's written end is its last segment's end, and
there is no checkpoint and no writer to follow.

`SegmentObject` opens one listed segment object once (on S3 a HEAD, which also gives the object's size: a size
that is not the listed one is CorruptionError rule `tier.object-size` before any byte is read) and reads it in
range reads (`read_at`) into numpy buffers that end with BUFFER_PAD_BYTES zeros, as the record walk and the decoder
need (commitlog/arrow_decode.py). `chunk` returns a read of `want` bytes plus the padding's length of the bytes
that follow when the object has them (the buffer pyarrow returns, no copy), else a shorter read that leaves that
room, else a copy into a zero-padded buffer: the same rule as a mapped local segment. A read that returns fewer
bytes than asked (the object shrank) is `tier.object-size` too. Every error names the object
(TierLocation.display(key)) and the byte position in it.

A walk reads ahead: once it has located the records of the chunk in hand it says where the next chunk starts
(`will_read`), and that range read runs on one of PREFETCH_THREADS threads while the chunk in hand is decoded. An
object of a local filesystem (a `file://` tier) is mapped instead and read where it lies, as a local segment is.

`QueueImages` finds record starts to cut a long segment at, for partitions of about equal size: the first unit at
or after a commitlog offset in one of the largest queues, searched in windows of QUEUE_WINDOW_UNITS units of the
queue's images (a range read each, kept for the next search), guessing the window by interpolation. A unit is
untrusted: a cut it gives is checked by the reads on both sides of it (the one before must end exactly there, the
one after must find a record there), so a wrong unit costs a CorruptionError, never a wrong row.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from mqstore.commitlog import format as fmt
from mqstore.commitlog.arrow_decode import BUFFER_PAD_BYTES
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.mapped_file import MADV_POPULATE_READ, PAGE_SIZE_BYTES, madvise
from mqstore.consumequeue import format as queue_fmt
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.manifest import Manifest

MIB = 1 << 20
SHORTENED_READ_MIN_BYTES = 1 * MIB  # a read shortened to keep the padding inside the object is at least this long
QUEUE_WINDOW_UNITS = 4096  # ConsumeQueue units a record-start search reads at once (80 KiB)
QUEUE_SEARCH_READS_MAX = 24  # range reads one search makes at most (a damaged, unsorted queue ends it early)
BOUNDARY_QUEUES_MAX = 4  # queues searched for a record start to cut a segment at
LOCATIONS_KEPT_MAX = 16  # tiers a process keeps open (the least recently used goes)

PREFETCH_THREADS = 4  # range reads started ahead of the walks of a process, at once, at most

_locations: dict[str, TierLocation] = {}
_locations_lock = threading.Lock()
_prefetch: list[ThreadPoolExecutor] = []  # the process's pool of read-ahead threads, made at first use
_owner = [os.getpid()]  # the process the pool and the open tiers belong to (a forked child makes its own)


def _forked() -> None:
    """Under _locations_lock: forget what a parent process opened (its threads and its S3 clients' connections
    did not survive the fork)."""
    if _owner[0] != os.getpid():
        _owner[0] = os.getpid()
        _locations.clear()
        _prefetch.clear()


def _prefetch_pool() -> ThreadPoolExecutor:
    with _locations_lock:
        _forked()
        if not _prefetch:
            _prefetch.append(ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="mqstore-tier-read"))
        return _prefetch[0]


def open_location(uri: str) -> TierLocation:
    """The tier at `uri`, opened once per process (TierLocation.open's errors otherwise)."""
    with _locations_lock:
        _forked()
        location = _locations.pop(uri, None)
        if location is not None:
            _locations[uri] = location  # the most recently used last
            return location
    location = TierLocation.open(uri)
    with _locations_lock:
        _locations[uri] = location
        while len(_locations) > LOCATIONS_KEPT_MAX:
            _locations.pop(next(iter(_locations)))
    return location


def segment_name_of(location: TierLocation, base_offset: int) -> str:
    """How the segment object of `base_offset` is named in errors (its last part is the segment's file name, so
    arrow_decode.file_offset finds the position inside it)."""
    return location.display(manifest_module.segment_key(base_offset))


class SegmentObject:
    """One segment object of a tier, open for range reads into padded buffers (module docstring). An object of a
    local filesystem (a `file://` tier) is read through a read-only mapping instead, as a local segment is
    (decision 0042): no copy, its pages mapped in one call per piece (`prepare`); like a local segment's, a
    file shrunk under the mapping would stop the process with SIGBUS (a tier's writer replaces objects by
    renaming over them, which leaves the mapped file whole)."""

    def __init__(self, location: TierLocation, base_offset: int, size: int):
        self.location = location
        self.key = manifest_module.segment_key(base_offset)
        self.path = location.display(self.key)
        self.size = size  # as the manifest lists it
        self._handle = self._mapped = None
        self._ahead = None  # ((position, length), future of _view): the read will_read started
        if location.filesystem.type_name == "local":
            self._mapped = self._map(location.path(self.key))
            return
        self._handle = location.open_input(self.key, size)
        try:
            found = self._handle.size()
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise StoreIOError(f"cannot read the size of {self.path}: {exc}") from exc
        if found != size:
            self.close()
            raise self._size_error(found)

    def _size_error(self, found: int) -> CorruptionError:
        return CorruptionError(f"the tier object is {found} bytes, its manifest lists {self.size}", path=self.path,
                               offset=min(found, self.size), rule="tier.object-size")

    def _map(self, local_path: str) -> np.ndarray:
        try:
            fd = os.open(local_path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptionError(f"the tier object {self.path} listed in the manifest is missing", path=self.path,
                                  offset=0, rule="tier.object-missing") from exc
        except OSError as exc:
            raise StoreIOError(f"cannot open {self.path}: {exc.strerror}") from exc
        try:
            found = os.fstat(fd).st_size
            if found != self.size:
                raise self._size_error(found)
            return np.frombuffer(mmap.mmap(fd, self.size, access=mmap.ACCESS_READ), dtype=np.uint8)
        except (OSError, ValueError) as exc:
            raise StoreIOError(f"cannot map {self.path}: {exc}") from exc
        finally:
            os.close(fd)

    def _view(self, position: int, length: int) -> np.ndarray:
        """Bytes [position, position + length) of the object (within it), as read or as mapped."""
        if self._mapped is not None:
            return self._mapped[position:position + length]
        try:
            data = self._handle.read_at(length, position)
        except (OSError, pa.ArrowException) as exc:
            raise StoreIOError(f"cannot read {self.path} at {position}: {exc}") from exc
        if len(data) != length:
            raise CorruptionError(f"the tier object ends at {position + len(data)}, before {position + length}: it "
                                  f"is shorter than the {self.size} bytes its manifest lists", path=self.path,
                                  offset=position + len(data), rule="tier.object-size")
        return np.frombuffer(data, dtype=np.uint8)

    def read(self, position: int, length: int, out: np.ndarray | None = None, out_at: int = 0) -> np.ndarray:
        """`length` bytes at `position` in one range read, into a new zero-padded array (or into `out` at
        `out_at`); store_files.pread_segment's contract."""
        if position < 0 or length < 0 or position + length > self.size:
            raise CorruptionError(f"a read of {length} bytes at {position} runs past the object's {self.size} "
                                  f"bytes", path=self.path, offset=max(position, 0), rule="tier.object-size")
        if out is None:
            out = np.zeros(length + BUFFER_PAD_BYTES, dtype=np.uint8)
            out_at = 0
        if length:
            out[out_at:out_at + length] = self._view(position, length)
        return out

    def chunk(self, position: int, want: int, want_min: int) -> tuple[np.ndarray, int]:
        """(buffer, length): `want` bytes at `position` followed by BUFFER_PAD_BYTES of the object's next bytes,
        as read (no copy); else, near the object's end, as many as leave that room (at least
        SHORTENED_READ_MIN_BYTES, never for a record that must be read whole, `want_min`); else a copy into a
        zero-padded buffer. The read will_read started for the same bytes is taken when there is one."""
        length = self._view_length(position, want, want_min)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] == (position, length):
                return ahead[1].result(), length  # raises what the read raised
            ahead[1].cancel()
        if length:
            return self._view(position, length + BUFFER_PAD_BYTES), length
        return self.read(position, want), want

    def _view_length(self, position: int, want: int, want_min: int) -> int:
        """How many bytes chunk() gives as a view of the object (0: it copies `want` bytes instead)."""
        room = self.size - BUFFER_PAD_BYTES - position
        if room >= want or (room >= SHORTENED_READ_MIN_BYTES and not want_min):
            return min(want, room)
        return 0

    def will_read(self, position: int, want: int) -> None:
        """The walk's next chunk() will likely be (position, want): start that range read on a thread of
        PREFETCH_THREADS, so that it runs while the walk decodes the chunk it has (one read ahead at most). A
        mapped object needs none."""
        length = self._view_length(position, want, 0)
        if self._mapped is not None or not length or self._ahead is not None:
            return
        self._ahead = ((position, length), _prefetch_pool().submit(self._view, position, length + BUFFER_PAD_BYTES))

    def prepare(self, start: int, end: int) -> None:
        """The walk will read [start, end) of the object: a mapped object's pages are mapped in one call
        (MADV_POPULATE_READ, without the interpreter lock); nothing to do ahead of range reads."""
        if self._mapped is None or madvise is None:
            return
        start -= start % PAGE_SIZE_BYTES
        end = min(end, len(self._mapped))
        if end > start:
            madvise(self._mapped.ctypes.data + start, end - start, MADV_POPULATE_READ)  # an error: page faults

    def close(self) -> None:
        if self._ahead is not None:
            future = self._ahead[1]
            self._ahead = None
            if not future.cancel():  # a read under way: the handle is closed after it (its bytes, or error, dropped)
                futures.wait([future])
        if self._handle is None:
            return
        try:
            self._handle.close()
        except (OSError, pa.ArrowException):
            pass


def first_timestamps_us(location: TierLocation, manifest: Manifest, bases) -> dict[int, int | None]:
    """The store timestamp (microseconds) of the first record of each listed segment in `bases`: one small range
    read each, PREFETCH_THREADS at once (None when the segment does not start with a version-1 message record)."""
    length = fmt.OFFSET_STORE_TIMESTAMP + 8

    def first(base: int) -> int | None:
        head = location.read_range(manifest_module.segment_key(base), manifest.segment_size_bytes, 0, length)
        _, magic = fmt.BLANK.unpack_from(head, 0)
        if magic != fmt.MESSAGE_MAGIC_CODE:
            return None
        return fmt.struct.unpack_from(">q", head, fmt.OFFSET_STORE_TIMESTAMP)[0] * 1000

    bases = list(bases)
    return dict(zip(bases, _prefetch_pool().map(first, bases)))


class QueueImages:
    """Record starts from the tier's ConsumeQueue images (module docstring); planning only, never pickled."""

    def __init__(self, location: TierLocation, manifest: Manifest):
        self.location = location
        self.manifest = manifest
        self.file_size = manifest.store["consume_queue_entries_per_file"] * queue_fmt.UNIT_SIZE_BYTES
        totals = [(sum(f.entries for f in files), topic, queue_id) for (topic, queue_id), files
                  in manifest.queues.items()]
        self.ranked = [(topic, queue_id) for _, topic, queue_id in sorted(totals, reverse=True)
                       if _][:BOUNDARY_QUEUES_MAX]
        self._windows: dict[tuple[str, int], np.ndarray] = {}  # (object key, window number) -> units
        self.range_reads = 0

    def boundary_at_or_after(self, commitlog_offset: int, limit: int) -> int | None:
        """A record start in [commitlog_offset, limit) by the largest queues' units, or None."""
        best = None
        for topic, queue_id in self.ranked:
            found = self._queue_at_or_after(topic, queue_id, commitlog_offset)
            if found is not None and found < limit and (best is None or found < best):
                best = found
        return best

    def _window(self, key: str, entries: int, number: int) -> np.ndarray:
        """Units [number * W, (number + 1) * W) of a queue image, cut at its listed entries and at its first free
        unit; fillers and units of other sizes than a record's are left out by the caller."""
        units = self._windows.get((key, number))
        if units is None:
            first = number * QUEUE_WINDOW_UNITS
            count = min(QUEUE_WINDOW_UNITS, entries - first)
            raw = self.location.read_range(key, self.file_size, first * queue_fmt.UNIT_SIZE_BYTES,
                                           count * queue_fmt.UNIT_SIZE_BYTES)
            self.range_reads += 1
            units = np.frombuffer(raw, dtype=queue_fmt.CONSUME_QUEUE_UNIT)
            self._windows[(key, number)] = units
        return units

    def _queue_at_or_after(self, topic: str, queue_id: int, commitlog_offset: int) -> int | None:
        """The smallest unit offset >= `commitlog_offset` of one queue: the first of its images whose last window
        reaches it, searched."""
        for queue_file in self.manifest.queues.get((topic, queue_id), ()):
            if queue_file.entries <= 0:
                continue
            key = manifest_module.queue_key(topic, queue_id, queue_file.name)
            last_window = (queue_file.entries - 1) // QUEUE_WINDOW_UNITS
            last = _record_offsets(self._window(key, queue_file.entries, last_window))
            if len(last) and int(last[-1]) < commitlog_offset:
                continue  # every unit of this image is below the offset
            return self._file_at_or_after(key, queue_file.entries, commitlog_offset)
        return None

    def _file_at_or_after(self, key: str, entries: int, commitlog_offset: int) -> int | None:
        """The search within one image. The answer is in windows [lo, hi) or is `found` (the first unit of window
        hi); the window read next is guessed from the offsets known on either side (interpolation), else halved."""
        lo, hi = 0, (entries + QUEUE_WINDOW_UNITS - 1) // QUEUE_WINDOW_UNITS
        found = None
        below = above = None  # (window number, offset) known on each side
        for _ in range(QUEUE_SEARCH_READS_MAX):
            if lo >= hi:
                break
            number = (lo + hi) // 2
            if below is not None and above is not None and above[1] > below[1]:
                guess = below[0] + (commitlog_offset - below[1]) * (above[0] - below[0]) // (above[1] - below[1])
                number = min(max(guess, lo), hi - 1)
            units = self._window(key, entries, number)
            offsets = _record_offsets(units)
            if not len(offsets):  # fillers lie before a queue's records, free units after them
                if np.any(units["size"] == queue_fmt.FILLER_SIZE):
                    lo = number + 1
                else:
                    hi = number
            elif int(offsets[-1]) < commitlog_offset:
                lo, below = number + 1, (number, int(offsets[-1]))
            elif int(offsets[0]) >= commitlog_offset:
                hi, above, found = number, (number, int(offsets[0])), int(offsets[0])
            else:
                return int(offsets[offsets >= commitlog_offset].min())
        return found


def _record_offsets(units: np.ndarray) -> np.ndarray:
    """The commitlog offsets of the units that point to records (not fillers, not free units), as int64."""
    sizes = units["size"]
    keep = (sizes >= fmt.RECORD_SIZE_MIN) & (sizes != queue_fmt.FILLER_SIZE) & (units["commitlog_offset"] >= 0)
    return units["commitlog_offset"][keep].astype(np.int64)
