"""The time the store's timed services read: delivery of delayed messages, retries, lease expiry.

A service asks `now_ms()` and sleeps with `wait(event, timeout_ms)`, never with time.sleep, so that a test can
hand the store a ManualClock and move time on with `advance(ms)`: every waiter wakes at once and looks again, and
no test sleeps for a delay. Store timestamps in records are not taken from this clock (they are the put path's
wall time); a ManualClock started at the wall time keeps the two comparable.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """The wall clock, in milliseconds since the epoch."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        """Wait until `event` is set or `timeout_ms` of this clock has passed; True when the event is set."""
        return event.wait(max(0.0, timeout_ms) / 1000.0)

    def watch(self, event: threading.Event) -> None:
        """Set `event` whenever this clock jumps (a ManualClock moved by a test); the wall clock never does."""

    def unwatch(self, event: threading.Event) -> None:
        """Stop setting `event` (see watch)."""


SYSTEM_CLOCK = Clock()

MANUAL_WAIT_SLICE_S = 0.05  # a waiter on a ManualClock also looks again this often (a missed wake-up costs this)


class ManualClock(Clock):
    """A clock that moves only when told (`advance`, `set`). Waiters wake whenever it moves.

    A wait with a timeout returns when the event is set or when the clock has moved past the wait's deadline; it
    never returns because wall time passed, so a service on a ManualClock does nothing timed until a test moves it.
    """

    def __init__(self, start_ms: int | None = None):
        self._now_ms = int(start_ms if start_ms is not None else SYSTEM_CLOCK.now_ms())
        self._moved = threading.Condition()
        self._watchers: tuple[threading.Event, ...] = ()

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> int:
        """Move the clock on by `delta_ms` (>= 0) and wake every waiter; the new time."""
        if delta_ms < 0:
            raise ValueError(f"a clock does not go back: advance({delta_ms})")
        return self.set(self._now_ms + int(delta_ms))

    def set(self, now_ms: int) -> int:
        """Move the clock to `now_ms` (not earlier than now) and wake every waiter; the new time."""
        with self._moved:
            if now_ms < self._now_ms:
                raise ValueError(f"a clock does not go back: {now_ms} < {self._now_ms}")
            self._now_ms = int(now_ms)
            self._moved.notify_all()
            watchers = self._watchers
        for event in watchers:
            event.set()
        return self._now_ms

    def watch(self, event: threading.Event) -> None:
        with self._moved:
            self._watchers = (*self._watchers, event)

    def unwatch(self, event: threading.Event) -> None:
        with self._moved:
            self._watchers = tuple(watched for watched in self._watchers if watched is not event)

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        deadline_ms = self._now_ms + max(0.0, timeout_ms)
        while not event.is_set():
            with self._moved:
                if self._now_ms >= deadline_ms:
                    return False
                self._moved.wait(MANUAL_WAIT_SLICE_S)
        return True
