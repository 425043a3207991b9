"""Segment allocation ahead of need (RocketMQ's AllocateMappedFileService), so a roll does not stall put().

When the writer nears the end of segment N, the allocator creates segment N+1 in its own thread: a sparse file of
the full length with its first `reserve_bytes` of disk reserved (posix_fallocate); the writer reserves the rest
as it goes (commitlog.commitlog). `request()` only queues the work: it runs under the writer lock, where
starting a thread cost the rolling put milliseconds (Thread.start waits until the new thread has run, which
needs the GIL).

With `warm=True` the thread also pre-faults the new segment's pages, so the writer's first touches are cheap:
madvise(MADV_POPULATE_WRITE) on the mapping, a chunk at a time, through ctypes (which releases the GIL). It
maps every page writable without writing a byte, so it may go on after `take()` handed the segment over, while
records are written into it: the rolling put does not wait for it (and it stops when the next segment is
requested: making that one comes first). Where the kernel lacks it (before Linux
5.14), the thread writes zeros over the file with pwrite instead, and `take()` stops that at the next chunk
boundary first, so it never writes over a record. Either way the pages are dirty: the zeros are written back.

With `warm=True` and a `writer_position`, the thread also pre-faults the segment being written, up to
AHEAD_WINDOW_BYTES ahead of the writer, whenever it has nothing else to do (a store's first segment, a
reopened store's current one, and any segment the writer reaches before warming got there): the writer's
first touch of a page costs a page fault (about 0.5 GB/s here), which the thread takes on the other core
instead. Only with MADV_POPULATE_WRITE: zeros written ahead of a live writer could overwrite its records.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import queue
import threading
from typing import Callable

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import StoreIOError
from mqstore.commitlog.mapped_file import MADV_POPULATE_WRITE, MappedFile, madvise

log = logging.getLogger(__name__)

WARM_CHUNK_BYTES = 256 * 1024  # zeros written per pwrite; bounds how long take() waits for warming to stop
POPULATE_CHUNK_BYTES = 4 * 1024 * 1024  # bytes pre-faulted per madvise call (each call then waits for the GIL)
AHEAD_WINDOW_BYTES = 32 * 1024 * 1024  # how far ahead of the writer the current segment is pre-faulted
AHEAD_CHUNK_BYTES = 4 * 1024 * 1024  # bytes pre-faulted ahead per madvise call (each then waits for the GIL)
AHEAD_POLL_S = 0.005  # how often the idle thread looks at the writer's position
_ZEROS = bytes(WARM_CHUNK_BYTES)


_madvise = madvise  # module level, so that tests can take it away


class _Allocation:
    """One segment on its way: made by the thread, handed over by take()."""

    __slots__ = ("base_offset", "segment", "error", "stop", "created", "finished", "writes_zeros")

    def __init__(self, base_offset: int):
        self.base_offset = base_offset
        self.segment: MappedFile | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()  # set by close(), and by take() while zeros are being written: stop warming
        self.created = threading.Event()  # set by the thread: `segment` or `error` is final
        self.finished = threading.Event()  # set by the thread: nothing more will touch the file
        self.writes_zeros = False  # warming writes zeros with pwrite (take() must stop it before the hand-over)


class SegmentAllocator:
    """Creates the next segment of a directory in its thread; `take(base)` returns it."""

    def __init__(self, directory: str, segment_size_bytes: int, *, preallocate: bool, warm: bool,
                 writer_position: Callable[[], tuple] | None = None, advise_random: bool = False,
                 reserve_bytes: int | None = None):
        """`writer_position()` -> (mapping array, base offset, log end) of the segment being written (array None
        before the first); with `warm`, the thread pre-faults that segment ahead of the writer. With
        `advise_random` new segments are advised for appending (MappedFile.advise_appending) before anything
        touches them. With `preallocate`, the first `reserve_bytes` of a new segment get their disk reserved
        (all of it when None)."""
        self.directory = directory
        self.reserve_bytes = reserve_bytes
        self.segment_size_bytes = segment_size_bytes
        self.preallocate = preallocate
        self.warm = warm
        self._lock = threading.Lock()
        self._pending: dict[int, _Allocation] = {}
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # allocations, segments to retire; None stops
        self._writer_position = writer_position if warm and _madvise is not None else None
        self.advise_random = advise_random
        self._ahead_base: int | None = None  # the segment pre-faulted ahead of the writer ...
        self._ahead_until = 0  # ... up to this position in it
        self.warmed_ahead_bytes = 0
        self._thread = threading.Thread(target=self._run, name="mqstore-allocate", daemon=True)
        self._thread.start()
        self.created_in_background = 0
        self.warmed_bytes = 0

    def request(self, base_offset: int) -> None:
        """Queue the creation of the segment at `base_offset` unless it is on its way (the thread skips a file
        that exists)."""
        with self._lock:
            if base_offset in self._pending:
                return
            allocation = self._pending[base_offset] = _Allocation(base_offset)
        self._requests.put(allocation)

    def retire(self, segment: MappedFile) -> None:
        """The writer has filled `segment`: the thread advises its mapping for reading again
        (MappedFile.advise_appending), out of the rolling put, which the kernel could make wait for this
        thread's pre-faulting."""
        self._requests.put(segment)

    def _run(self) -> None:
        while True:
            if self._writer_position is None:
                allocation = self._requests.get()
            else:
                try:
                    allocation = self._requests.get(timeout=AHEAD_POLL_S)
                except queue.Empty:
                    self._warm_ahead()
                    continue
            if allocation is None:
                return
            if isinstance(allocation, MappedFile):  # retire(): the writer has left it
                allocation.advise_appending(False)
                continue
            try:
                self._create(allocation)  # even at close: a requested segment is made (stop ends warming)
            finally:
                allocation.created.set()
                allocation.finished.set()

    def _create(self, allocation: _Allocation) -> None:
        path = os.path.join(self.directory, fmt.segment_name(allocation.base_offset))
        try:
            if os.path.exists(path):
                return
            segment = MappedFile.create(path, allocation.base_offset, self.segment_size_bytes,
                                        preallocate=self.preallocate, reserve_bytes=self.reserve_bytes)
            self.created_in_background += 1
            if self.advise_random:
                segment.advise_appending(True)  # before any page of it is touched, here or by the writer
            array = segment.array  # keeps the mapping alive while it is pre-faulted, even once closed
            if self.warm and self._populate(array, allocation.stop, 0, POPULATE_CHUNK_BYTES):
                allocation.segment = segment
                allocation.created.set()  # take() may hand it over now: the rest is pre-faulted meanwhile
                self._populate(array, allocation.stop, POPULATE_CHUNK_BYTES, self.segment_size_bytes)
            elif self.warm:
                allocation.writes_zeros = True
                allocation.segment = segment
                allocation.created.set()  # take() stops the warming, then hands it over
                self._warm(path, allocation.stop)
            else:
                allocation.segment = segment
        except BaseException as exc:  # noqa: BLE001 - handed to take(), which raises it in the writer
            allocation.error = exc

    def _populate(self, array, stop: threading.Event, start: int, end: int) -> bool:
        """Pre-fault [start, end) of a mapping with MADV_POPULATE_WRITE; False where the kernel lacks it."""
        if _madvise is None:
            return False
        address = array.ctypes.data
        for position in range(start, min(end, self.segment_size_bytes), POPULATE_CHUNK_BYTES):
            if stop.is_set() or (start > 0 and not self._requests.empty()):
                return True  # closing, or the next segment is wanted: making it comes first
            if start > 0 and self._writer_position is not None:
                self._warm_ahead()  # the pages the writer reaches first come before the next segment's
            length = min(POPULATE_CHUNK_BYTES, self.segment_size_bytes - position)
            if _madvise(address + position, length, MADV_POPULATE_WRITE) != 0:
                error = ctypes.get_errno()
                if position == 0:
                    return False  # EINVAL: an older kernel
                log.warning("pre-faulting a segment stopped at %d: %s", position, os.strerror(error))
                return True  # warming is an optimisation: the segment is good
            self.warmed_bytes += length
        return True

    def _warm_ahead(self) -> None:
        """Pre-fault the writer's segment up to AHEAD_WINDOW_BYTES past its end, a chunk at a time, until a
        request comes (MADV_POPULATE_WRITE writes nothing: records written meanwhile are untouched)."""
        array, base, end = self._writer_position()  # read without the writer lock: at worst one roll stale
        if array is None:
            return
        if base != self._ahead_base:
            self._ahead_base, self._ahead_until = base, 0
        size = len(array)
        position = min(max(end - base, 0), size)
        target = min(size, -(-(position + AHEAD_WINDOW_BYTES) // mmap.PAGESIZE) * mmap.PAGESIZE)  # whole pages
        start = max(self._ahead_until, position - position % mmap.PAGESIZE)
        address = array.ctypes.data  # `array` keeps the mapping alive while it is pre-faulted, even once closed
        while start < target and self._requests.empty():
            length = min(AHEAD_CHUNK_BYTES, target - start)
            if _madvise(address + start, length, MADV_POPULATE_WRITE) != 0:
                log.warning("pre-faulting ahead of the writer stopped: %s", os.strerror(ctypes.get_errno()))
                self._writer_position = None  # an optimisation: not tried again
                return
            start += length
            self.warmed_ahead_bytes += length
        self._ahead_until = start

    def _warm(self, path: str, stop: threading.Event) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            for position in range(0, self.segment_size_bytes, WARM_CHUNK_BYTES):
                if stop.is_set():
                    return
                os.pwrite(fd, _ZEROS[: min(WARM_CHUNK_BYTES, self.segment_size_bytes - position)], position)
                self.warmed_bytes += WARM_CHUNK_BYTES
        finally:
            os.close(fd)

    def take(self, base_offset: int) -> MappedFile | None:
        """The segment made for `base_offset` (warming stopped), or None when none was requested (or its file
        existed already)."""
        with self._lock:
            allocation = self._pending.pop(base_offset, None)
        if allocation is None:
            return None
        allocation.created.wait()
        if allocation.writes_zeros:
            allocation.stop.set()
            allocation.finished.wait()
        if allocation.error is not None:
            error = allocation.error
            if isinstance(error, StoreIOError):
                raise error
            raise StoreIOError(f"creating segment {fmt.segment_name(base_offset)} failed: {error}") from error
        return allocation.segment

    def close(self) -> None:
        """Stop the thread; segments made but never taken stay on disk (empty, valid) for the next open."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for allocation in pending:
            allocation.stop.set()
        self._requests.put(None)
        if self._thread.is_alive():
            self._thread.join()
        for allocation in pending:
            if allocation.segment is not None:
                allocation.segment.close()
