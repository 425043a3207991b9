"""Flush services: threads that write dirty bytes of anything flushable to disk.

They know nothing of messages. A `Flushable` reports how many bytes are dirty and flushes everything written
so far, returning the position that is now durable (a byte offset for the CommitLog; any number that only grows
for others). The store wires one `GroupCommitService` (SYNC mode) or one `IntervalFlusher` for the CommitLog,
and one `IntervalFlusher` for the ConsumeQueues and the index.

A failed flush is kept, never retried into a success: the flushables raise FlushFailedError from then on
(MappedFile.flush says why), a service hands the first failure to its `on_failed` (the store then refuses writes)
and SYNC waiters are released with their positions not durable.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Callable, Protocol

from mqstore.commitlog.errors import FlushFailedError
from mqstore.commitlog.native import NATIVE

log = logging.getLogger(__name__)

PAGE_SIZE_BYTES = 4096
FLUSH_DURATIONS_KEPT = 64  # recent flush durations kept for stats()
LEADER_FLUSH_ROUNDS_MAX = 4  # flushes one leader runs back to back for callers that parked meanwhile
FLUSH_INLINE_TIMEOUT_SHARE = 0.1  # a SYNC caller flushes itself while the last flush took under this share of
#                                   its timeout (else the thread flushes, and the caller can time out on time)
# FlushGate.wait's outcomes (commitlog/csrc/flushwait.c)
GATE_DURABLE, GATE_LEAD, GATE_TIMEOUT, GATE_CLOSED, GATE_IDLE = 0, 1, 2, 3, 4


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
        self.recent_durations_ms: collections.deque[float] = collections.deque(maxlen=FLUSH_DURATIONS_KEPT)
        self.error: BaseException | None = None

    def record(self, seconds: float) -> None:
        milliseconds = seconds * 1000.0
        self.flush_count += 1
        self.last_duration_ms = milliseconds
        if milliseconds > self.max_duration_ms:
            self.max_duration_ms = milliseconds
        self.recent_durations_ms.append(milliseconds)

    def as_dict(self) -> dict:
        return {"flushes": self.flush_count, "last_ms": round(self.last_duration_ms, 3),
                "max_ms": round(self.max_duration_ms, 3),
                "error": None if self.error is None else repr(self.error)}


class GateFlushStats(FlushStats):
    """FlushStats kept in a FlushGate: the flushes the gate's C flush runs are counted there, and `record` counts
    the Python path's in the same place."""

    def __init__(self, gate):
        assert gate.durations_kept == FLUSH_DURATIONS_KEPT
        self._gate = gate
        self.error = None

    def record(self, seconds: float) -> None:
        self._gate.record(seconds)

    @property
    def flush_count(self) -> int:
        return self._gate.flushes

    @property
    def last_duration_ms(self) -> float:
        last = self._gate.last_flush_s
        return 0.0 if last == math.inf else last * 1000.0

    @property
    def max_duration_ms(self) -> float:
        return self._gate.max_flush_s * 1000.0

    @property
    def recent_durations_ms(self) -> list[float]:
        return [seconds * 1000.0 for seconds in self._gate.recent_flush_s]


class GroupCommitService:
    """SYNC flushing (RocketMQ's GroupCommitService): callers wait until their position is durable.

    Leader and followers, as LevelDB's and MySQL's group commit: a caller whose position is not durable and who
    finds no flush running becomes the leader and flushes in its own thread (one producer pays no thread
    switch); callers arriving while a flush runs park, and when it ends the leader wakes those it made durable
    and one of the others, who leads the next flush for all of them. So concurrent producers share flushes.

    A caller only flushes itself while the last flush took under FLUSH_INLINE_TIMEOUT_SHARE of its timeout
    (and never before a first flush has been timed): a caller stuck in a flush cannot time out. Otherwise it
    parks and the service's own thread flushes, so every caller gets `False` when its position did not become
    durable within `timeout_s` (the data stays written; the store reports FLUSH_DISK_TIMEOUT). A leader
    returns when its flush does: a disk that turns slow after fast flushes delays that one leader past its
    timeout (its result then says whether its bytes are durable); the callers parked behind it time out on time,
    and the slow flush sends the following ones to the thread.

    With the compiled core (`native`, the default when it is built) callers wait in a FlushGate
    (commitlog/csrc/flushwait.c): a condition variable waited on without the GIL, woken by the leader's
    `advance` after each flush; a woken caller checks its position or takes the lead there, and comes back to
    the interpreter only with a result. The same decisions as the Python version, without a lock per caller,
    the parked list the leader walked under the GIL, or a return to the interpreter for callers not yet durable
    (docs/decisions/0020-sync-path.md).
    """

    def __init__(self, flushable: Flushable, durable_position: int, *, name: str = "mqstore-group-commit",
                 on_flushed: Callable[[], None] | None = None,
                 on_failed: Callable[[BaseException], None] | None = None, native: bool | None = None):
        self._flushable = flushable
        self._on_flushed = on_flushed
        self._on_failed = on_failed  # told of the flush that failed (once: every waiter fails from then on)
        self._durable_position = durable_position
        self._flush_lock = threading.Lock()  # held by whoever flushes: a leading caller or the thread
        self._parked_lock = threading.Lock()
        self._parked: list[list] = []  # [position, lock held until its owner is woken] of parked callers
        self._requested = durable_position  # the highest position asked of the thread
        self._wake = threading.Lock()  # released to wake the thread
        self._wake.acquire()
        self._last_flush_s = math.inf  # duration of the last flush; no caller leads before one was timed
        self._stopping = False
        self._leads = 0  # flushes led by callers in Python (the gate counts those led in C)
        if native is None:
            native = NATIVE is not None
        self._gate = NATIVE.flush_gate(durable_position) if native else None
        self.stats = GateFlushStats(self._gate) if native else FlushStats()
        if native:
            self.wait_durable = self._wait_gate  # the instance's own: one lookup on the put path
        self._thread = threading.Thread(target=self._run_gate if native else self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def durable_position(self) -> int:
        """Everything below is on disk."""
        return self._gate.durable if self._gate is not None else self._durable_position

    @property
    def leader_flush_count(self) -> int:
        """Flushes led by callers (the rest ran in the thread)."""
        return self._leads + (self._gate.leads if self._gate is not None else 0)

    @property
    def gate(self):
        """The FlushGate callers wait in (None: the Python version)."""
        return self._gate

    def flush_in_c(self, log, flush_lock, log_flush, segment_type, segment_flush, checkpoint) -> bool:
        """Let the leader's flush run in the compiled core (flushwait.c's `lead`) when the flushable is the CommitLog
        `log` and `on_flushed` writes `checkpoint` (a MappedFile) as the store's `_checkpoint_log` does; False
        without the gate. Every case it does not take comes back to `_lead_gate_python`."""
        if self._gate is None or self._flushable is not log:
            return False
        self._gate.bind(self, log, flush_lock, log_flush, segment_type, segment_flush, checkpoint, self._on_flushed,
                        LEADER_FLUSH_ROUNDS_MAX, FLUSH_INLINE_TIMEOUT_SHARE)
        return True

    def wait_durable(self, position: int, timeout_s: float) -> bool:
        """Block until everything below `position` is on disk; False on timeout or a failed flush."""
        entry = None
        deadline = None
        while True:
            if self.durable_position >= position:
                return True
            if self.stats.error is not None or self._stopping:
                return False
            leads = self._last_flush_s < timeout_s * FLUSH_INLINE_TIMEOUT_SHARE
            if leads and self._flush_lock.acquire(False):
                self._leads += 1
                self._lead(position)
                continue
            if deadline is None:
                deadline = time.monotonic() + timeout_s
            if entry is None:
                entry = [position, threading.Lock()]
                entry[1].acquire()
            with self._parked_lock:
                self._parked.append(entry)
            # Parked first, then one more try: a flush that ended before we parked did not see us, and one
            # running now will wake us when it ends.
            if leads:
                if self._flush_lock.acquire(False):
                    self._leads += 1
                    self._lead(position)  # it wakes us too (releasing our lock): a fresh one if we park again
                    entry = None
                    continue
            else:
                self._request(position)
            remaining = deadline - time.monotonic()
            if remaining > 0 and entry[1].acquire(True, remaining):
                continue  # woken: durable now, or chosen to lead the next flush
            if not self._unpark(entry):
                # A flush woke us as we timed out, maybe choosing us to lead the next one: the thread takes it on.
                self._request(position)
            return self.durable_position >= position

    def parked_count(self) -> int:
        """Callers waiting for a flush now (parked, or blocked in the gate)."""
        return self._gate.waiting if self._gate is not None else len(self._parked)

    def _wait_gate(self, position: int, timeout_s: float) -> bool:
        """wait_durable through the FlushGate (the compiled core's wait, without the GIL)."""
        gate = self._gate
        if self.stats.error is not None or self._stopping:
            return gate.durable >= position
        started = time.monotonic()
        remaining = timeout_s
        while True:
            leads = gate.last_flush_s < timeout_s * FLUSH_INLINE_TIMEOUT_SHARE
            if not leads:
                self._request(position)
            outcome = gate.wait(position, remaining, leads)
            if outcome == GATE_DURABLE:
                return True
            if outcome == GATE_TIMEOUT or outcome == GATE_CLOSED:
                return gate.durable >= position  # timed out, or stopped or failed meanwhile
            if outcome == GATE_LEAD:
                self._leads += 1
                self._lead_gate()
                if gate.durable >= position:
                    return True
            # else GATE_IDLE: the lead was let go with this position not durable; ask again (or lead)
            remaining = timeout_s - (time.monotonic() - started)
            if remaining <= 0:
                return gate.durable >= position

    def _flush_once(self) -> int | None:
        """One flush by the leader, timed and recorded: the position now durable, or None when the flush failed
        (the error is kept in stats and reported to every waiter from now on)."""
        started = time.perf_counter()
        try:
            durable = self._flushable.flush()
            if self._on_flushed is not None:
                self._on_flushed()
        except Exception as exc:  # noqa: BLE001 - reported to every waiter from now on
            log.exception("group commit flush failed")
            self._failed(exc)
            return None
        elapsed = time.perf_counter() - started
        self.stats.record(elapsed)
        if self._gate is None:
            self._last_flush_s = elapsed
            if durable > self._durable_position:
                self._durable_position = durable
        return durable

    def _flush_failed(self, exc: Exception) -> Exception:
        """The gate's C flush failed (`exc`: the fdatasync's OSError, or what the checkpoint's callback raised): kept
        and reported to every waiter from now on, as `_flush_once` does (the gate closes itself). Returns what is
        kept: a FlushFailedError for a failed fdatasync, which the C leader stores as the log's `flush_error`
        under its flush lock, so that no flush after it claims those bytes durable."""
        if isinstance(exc, OSError):  # its filename is the segment's path
            error = FlushFailedError(f"fdatasync of {exc.filename} failed: {exc.strerror}", path=exc.filename)
            error.__cause__ = exc
            exc = error
        log.error("group commit flush failed: %s", exc, exc_info=exc)
        self._failed(exc)
        return exc

    def _failed(self, exc: BaseException) -> None:
        """Keep the first failure (every waiter gets False from now on) and tell the owner."""
        if self.stats.error is None:
            self.stats.error = exc
        if self._on_failed is not None:
            self._on_failed(exc)

    def _lead_gate(self) -> None:
        """Holding the gate's lead: flush, wake the callers it made durable, and flush again while callers wait
        (at most LEADER_FLUSH_ROUNDS_MAX flushes, as `_lead`); then let go of the lead. In C once `flush_in_c`
        bound the gate."""
        if self._gate.bound:
            self._gate.lead()
        else:
            self._lead_gate_python()

    def _lead_gate_python(self) -> None:
        """`_lead_gate` in Python: the flush through the flushable and `on_flushed`."""
        gate = self._gate
        holding = True
        try:
            for round_ in range(1, LEADER_FLUSH_ROUNDS_MAX + 1):
                durable = self._flush_once()
                if durable is None:
                    holding = False
                    gate.close()
                    return
                if not gate.advance(durable, round_ < LEADER_FLUSH_ROUNDS_MAX):
                    holding = False
                    return
        finally:
            if holding:  # stopped by a BaseException mid-flush: let another thread lead
                gate.advance(gate.durable, False)

    def _run_gate(self) -> None:
        gate = self._gate
        while True:
            self._wake.acquire()
            if gate.wait(self._requested, None, True) == GATE_LEAD:
                self._lead_gate()
            if self._stopping:
                return

    def _lead(self, position: int) -> None:
        """Holding the flush lock: flush unless `position` is durable already; while callers parked during that
        flush wait, flush again for them (at most LEADER_FLUSH_ROUNDS_MAX flushes); release it, wake the parked.

        Flushing again at once keeps the disk busy: handing the next flush to a parked caller would first wait
        for that thread to be woken and to get the GIL, with the disk idle meanwhile.
        """
        try:
            for round_ in range(LEADER_FLUSH_ROUNDS_MAX):
                if self.durable_position >= position or self.stats.error is not None:
                    break
                if self._flush_once() is None:
                    break
                if self._parked and round_ + 1 < LEADER_FLUSH_ROUNDS_MAX:
                    position = self._wake_parked(choose_leader=False)
        finally:
            self._flush_lock.release()
            if self._parked:
                self._wake_parked(choose_leader=True)

    def _wake_parked(self, *, choose_leader: bool) -> int:
        """Wake every parked caller whose position is durable (all of them after a failed flush or at stop), and
        with `choose_leader` one of the others to lead the next flush. Returns the highest position still
        waiting (0 when none is)."""
        with self._parked_lock:
            durable = self.durable_position
            everyone = self.stats.error is not None or self._stopping
            kept = []
            for entry in self._parked:
                if everyone or entry[0] <= durable:
                    entry[1].release()
                elif choose_leader:
                    entry[1].release()
                    choose_leader = False
                else:
                    kept.append(entry)
            self._parked = kept
            return max((entry[0] for entry in kept), default=0)

    def _unpark(self, entry: list) -> bool:
        """Take a caller that timed out off the parked list; False when a flush already woke it."""
        with self._parked_lock:
            for index, parked in enumerate(self._parked):
                if parked is entry:
                    del self._parked[index]
                    return True
            return False

    def request(self, position: int) -> None:
        """Have the service's thread flush what is written, at least up to `position`, without waiting for it (a
        failure is kept and reported as any other)."""
        self._request(position)

    def _request(self, position: int) -> None:
        """Ask the thread to flush up to `position`."""
        if position > self._requested:
            self._requested = position
        try:
            self._wake.release()
        except RuntimeError:
            pass  # already woken: it flushes everything written when it runs

    def _run(self) -> None:
        while True:
            self._wake.acquire()
            self._flush_lock.acquire()
            self._lead(self._requested)
            if self._stopping:
                return

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.unbind()  # the last flushes go through Python, which knows about stopping
        self._stopping = True
        self._request(self._requested)
        if self._thread.is_alive():
            self._thread.join()
        if self._gate is not None:
            self._gate.close()
        if self._parked:
            self._wake_parked(choose_leader=True)


class IntervalFlusher:
    """ASYNC flushing (RocketMQ's FlushRealTimeService / FlushConsumeQueueService).

    Every `interval_ms` it flushes each flushable that has at least `least_pages` dirty pages, and every
    flushable with anything dirty once `thorough_interval_ms` has passed since the last thorough round.
    """

    def __init__(self, flushables: list[Flushable], *, interval_ms: int, least_pages: int, thorough_interval_ms: int,
                 name: str = "mqstore-flush", on_flushed: Callable[[], None] | None = None,
                 on_failed: Callable[[BaseException], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        assert interval_ms > 0 and least_pages >= 0 and thorough_interval_ms >= 0
        self._flushables = list(flushables)
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._on_flushed = on_flushed
        self._on_failed = on_failed  # told of each round's FlushFailedError (its flushable keeps failing after it)
        self._clock = clock
        self._last_thorough = clock()
        self._wake = threading.Event()
        self._requests = self._served = 0  # request() counts; a round that sees more than it served is thorough
        self._stopping = False
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run_once(self) -> int:
        """One round: flush what is due; returns how many flushables were flushed."""
        now = self._clock()
        requests = self._requests  # read once: a request after this read wakes the next round, which serves it
        asked, self._served = requests != self._served, requests
        thorough = asked or (now - self._last_thorough) * 1000.0 >= self.thorough_interval_ms
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

    def request(self, position: int) -> None:
        """Run a thorough round now (everything dirty, `position` included), without waiting for it."""
        self._requests += 1
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval_ms / 1000.0)
            self._wake.clear()
            if self._stopping:
                break
            try:
                self.run_once()
            except BaseException as exc:  # noqa: BLE001 - kept for stats(); retried next round
                if self.stats.error is None or not isinstance(exc, FlushFailedError):
                    log.exception("interval flush failed")
                self.stats.error = exc
                if isinstance(exc, FlushFailedError) and self._on_failed is not None:
                    self._on_failed(exc)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
