"""Segment allocation ahead of need (RocketMQ's AllocateMappedFileService), so a roll does not stall put().

After the CommitLog moves to segment N, the allocator creates segment N+1 in a background thread (its space
reserved with posix_fallocate) and, with `warm=True`, writes zeros over it with pwrite in small chunks, so
the page cache already holds its pages and the writer's first touches are cheap (the thread spends its time
in system calls, which release the GIL). `take()` hands the segment over: warming stops at the next chunk
boundary first, so it never writes over a record.
"""

from __future__ import annotations

import logging
import os
import threading

from commitlog import format as fmt
from commitlog.errors import StoreIOError
from commitlog.mapped_file import MappedFile

log = logging.getLogger(__name__)

WARM_CHUNK_BYTES = 256 * 1024  # zeros written per pwrite; bounds how long take() waits for warming to stop
_ZEROS = bytes(WARM_CHUNK_BYTES)


class SegmentAllocator:
    """Creates the next segment of a directory in the background; `take(base)` returns it."""

    def __init__(self, directory: str, segment_size_bytes: int, *, preallocate: bool, warm: bool):
        self.directory = directory
        self.segment_size_bytes = segment_size_bytes
        self.preallocate = preallocate
        self.warm = warm
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Thread, dict]] = {}
        self.created_in_background = 0
        self.warmed_bytes = 0

    def request(self, base_offset: int) -> None:
        """Start creating the segment at `base_offset` unless it exists or is on its way."""
        with self._lock:
            if base_offset in self._pending:
                return
            path = os.path.join(self.directory, fmt.segment_name(base_offset))
            if os.path.exists(path):
                return
            state = {"segment": None, "error": None, "stop": threading.Event()}
            thread = threading.Thread(target=self._create, args=(base_offset, path, state),
                                      name=f"mqstore-allocate-{base_offset}", daemon=True)
            self._pending[base_offset] = (thread, state)
            thread.start()

    def _create(self, base_offset: int, path: str, state: dict) -> None:
        try:
            segment = MappedFile.create(path, base_offset, self.segment_size_bytes, preallocate=self.preallocate)
            state["segment"] = segment
            self.created_in_background += 1
            if self.warm:
                self._warm(path, state["stop"])
        except BaseException as exc:  # noqa: BLE001 - handed to take(), which raises it in the writer
            state["error"] = exc

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
        """The segment made for `base_offset` (warming stopped), or None when none was requested."""
        with self._lock:
            pending = self._pending.pop(base_offset, None)
        if pending is None:
            return None
        thread, state = pending
        state["stop"].set()
        thread.join()
        if state["error"] is not None:
            error = state["error"]
            if isinstance(error, StoreIOError):
                raise error
            raise StoreIOError(f"creating segment {fmt.segment_name(base_offset)} failed: {error}") from error
        return state["segment"]

    def close(self) -> None:
        """Stop background work; segments made but never taken stay on disk (empty, valid) for the next open."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for thread, state in pending:
            state["stop"].set()
            thread.join()
            if state["segment"] is not None:
                state["segment"].close()
