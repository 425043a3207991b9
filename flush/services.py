"""Flush services: threads that write dirty bytes of anything flushable to disk.

They know nothing of messages. A `Flushable` reports how many bytes are dirty and flushes everything written
so far, returning the position that is now durable (a byte offset for the CommitLog; any number that only grows
for others). The store wires one `GroupCommitService` (SYNC mode) or one `IntervalFlusher` for the CommitLog,
and one `IntervalFlusher` for the ConsumeQueues and the index.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol

log = logging.getLogger(__name__)

PAGE_SIZE_BYTES = 4096
FLUSH_DURATIONS_KEPT = 64  # recent flush durations kept for stats()


class Flushable(Protocol):
    def dirty_bytes(self) -> int:
        """Bytes written but not yet flushed."""

    def flush(self) -> int:
        """Flush everything written so far; return the position now durable."""


class FlushStats:
    """Counts and recent durations of one service's flushes."""

    def __init__(self):
        self.flush_count = 0
        self.last_duration_ms = 0.0
        self.max_duration_ms = 0.0
        self.recent_durations_ms: list[float] = []
        self.error: BaseException | None = None

    def record(self, seconds: float) -> None:
        milliseconds = seconds * 1000.0
        self.flush_count += 1
        self.last_duration_ms = milliseconds
        self.max_duration_ms = max(self.max_duration_ms, milliseconds)
        self.recent_durations_ms.append(milliseconds)
        if len(self.recent_durations_ms) > FLUSH_DURATIONS_KEPT:
            del self.recent_durations_ms[: -FLUSH_DURATIONS_KEPT]

    def as_dict(self) -> dict:
        return {"flushes": self.flush_count, "last_ms": round(self.last_duration_ms, 3),
                "max_ms": round(self.max_duration_ms, 3),
                "error": None if self.error is None else repr(self.error)}


class GroupCommitService:
    """SYNC flushing (RocketMQ's GroupCommitService): callers wait until their position is durable.

    One thread flushes; every caller that asked while a flush was running is served by the next one, so
    concurrent producers share flushes. `wait_durable` returns False when its position did not become durable
    within the timeout (the data stays written; the caller reports FLUSH_DISK_TIMEOUT).
    """

    def __init__(self, flushable: Flushable, durable_position: int, *, name: str = "mqstore-group-commit",
                 on_flushed: Callable[[], None] | None = None):
        self._flushable = flushable
        self._on_flushed = on_flushed
        self._condition = threading.Condition()
        self.durable_position = durable_position
        self._requested = durable_position
        self._stopping = False
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_durable(self, position: int, timeout_s: float) -> bool:
        """Block until everything below `position` is on disk; False on timeout or a failed flush."""
        condition = self._condition
        with condition:
            if self.durable_position >= position:
                return True
            if position > self._requested:
                self._requested = position
                condition.notify_all()
            deadline = time.monotonic() + timeout_s
            while self.durable_position < position:
                if self.stats.error is not None or self._stopping:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                condition.wait(remaining)
            return True

    def _run(self) -> None:
        condition = self._condition
        while True:
            with condition:
                while self._requested <= self.durable_position and not self._stopping:
                    condition.wait()
                if self._stopping and self._requested <= self.durable_position:
                    return
            started = time.perf_counter()
            try:
                durable = self._flushable.flush()
                if self._on_flushed is not None:
                    self._on_flushed()
            except BaseException as exc:  # noqa: BLE001 - reported to every waiter, then the thread ends
                log.exception("group commit flush failed")
                with condition:
                    self.stats.error = exc
                    condition.notify_all()
                return
            with condition:
                self.stats.record(time.perf_counter() - started)
                self.durable_position = max(self.durable_position, durable)
                condition.notify_all()

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join()


class IntervalFlusher:
    """ASYNC flushing (RocketMQ's FlushRealTimeService / FlushConsumeQueueService).

    Every `interval_ms` it flushes each flushable that has at least `least_pages` dirty pages, and every
    flushable with anything dirty once `thorough_interval_ms` has passed since the last thorough round.
    """

    def __init__(self, flushables: list[Flushable], *, interval_ms: int, least_pages: int, thorough_interval_ms: int,
                 name: str = "mqstore-flush", on_flushed: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        assert interval_ms > 0 and least_pages >= 0 and thorough_interval_ms >= 0
        self._flushables = list(flushables)
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._on_flushed = on_flushed
        self._clock = clock
        self._last_thorough = clock()
        self._wake = threading.Event()
        self._stopping = False
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run_once(self) -> int:
        """One round: flush what is due; returns how many flushables were flushed."""
        now = self._clock()
        thorough = (now - self._last_thorough) * 1000.0 >= self.thorough_interval_ms
        if thorough:
            self._last_thorough = now
        least_bytes = self.least_pages * PAGE_SIZE_BYTES
        flushed = 0
        for flushable in self._flushables:
            dirty = flushable.dirty_bytes()
            if dirty <= 0 or (not thorough and dirty < least_bytes):
                continue
            started = time.perf_counter()
            flushable.flush()
            self.stats.record(time.perf_counter() - started)
            flushed += 1
        if flushed and self._on_flushed is not None:
            self._on_flushed()
        return flushed

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval_ms / 1000.0)
            if self._stopping:
                break
            try:
                self.run_once()
            except BaseException as exc:  # noqa: BLE001 - kept for stats(); retried next round
                log.exception("interval flush failed")
                self.stats.error = exc

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
