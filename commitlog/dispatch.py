"""Dispatch: the loop that tails the CommitLog and hands what it finds to the dispatchers.

This is RocketMQ's ReputMessageService with its CommitLogDispatcher list. `DispatchService` reads the log
from the last dispatched offset to the log's end, decodes the records in batches into a `DispatchBatch`
(columns, not objects) and calls every registered `Dispatcher` with it. The ConsumeQueue dispatcher lives in
`consumequeue`, the index dispatcher in `indexfile`; this module knows neither.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from mqstore.commitlog import format as fmt
from mqstore.commitlog.dispatch_batch import (
    DISPATCH_BATCH_RECORDS_MAX,
    HEADER_DTYPE,
    DispatchBatch,
    LogReader,
    batch_from_written,
    parse_records,
)
from mqstore.commitlog.errors import StoreError

log = logging.getLogger(__name__)

# Re-exported: dispatchers and recovery take their batches from here.
__all__ = ["DISPATCH_BATCH_RECORDS_MAX", "HEADER_DTYPE", "DispatchBatch", "DispatchService", "Dispatcher",
           "LogReader", "parse_records"]

DISPATCH_IDLE_WAIT_S = 0.001  # how long the loop sleeps when it has caught up and nobody wakes it
DISPATCH_SMALL_BATCH_RECORDS = 32  # a round that found fewer records than this ...
DISPATCH_SMALL_BATCH_WAIT_S = 0.005  # ... is followed by a longer wait: a batch's fixed cost is paid less often
DISPATCH_ERROR_BACKOFF_S = 0.5
# The tailing thread's batches: small, with the interpreter offered to producers between them (bench/put_stalls.py:
# about half the puts over 5 ms of 8192-record batches). Catching up in one call (at open) uses the large ones.
DISPATCH_TAIL_BATCH_RECORDS = 512
# ... and where producers wait for the disk (SYNC puts), smaller still: a producer whose fdatasync returns while
# the thread holds the interpreter waits for the rest of that batch (docs/architecture.md: with ~30-record batches,
# 1-2% of SYNC puts took over 1 ms, p99 1.0 ms; with 16-record batches 0.1%, p99 0.5-0.6 ms, same throughput).
DISPATCH_TAIL_BATCH_RECORDS_LOW_LATENCY = 16
# The deque of records the writer describes (`DispatchService`'s `written`) keeps this many, dropping the oldest.
WRITTEN_RECORDS_KEPT = 1024


class Dispatcher(Protocol):
    """Something built from the log. Called from the dispatch thread only, in log order. A dispatcher that
    reads properties of every record (`DispatchBatch.property_values`) names them in a `properties` attribute:
    the batch decoder then reads them in its one pass over each record's properties."""

    def dispatch(self, batch: DispatchBatch) -> None:
        """Take in every record of `batch`; records already taken in before (a replay) must be ignored."""


class DispatchService:
    """The dispatch thread: tails the log from `dispatched_offset` and feeds every dispatcher.

    The thread looks for new records every DISPATCH_IDLE_WAIT_S when idle (writers do not wake it per append,
    so it dispatches in batches); `wake()` makes it look at once; `wait_dispatched()` blocks until the log's end at the
    time of the call has been dispatched. An error stops dispatching (it is kept in `error` and logged);
    nothing past the bad record is ever dispatched.

    With `written`, the deque a CommitLog fills with a description of each record it appends (its
    `written_records`), records found there are dispatched without reading them back from the log: the batch
    has the columns and properties `parse_records` would decode (`batch_from_written`). What the deque does not
    describe (records it dropped when full, records written before it was set, batches, blanks) is parsed from
    the log as before. Records read back this way are not checked against their bytes: do not pass `written`
    when dispatch must check CRCs.
    """

    def __init__(self, log: LogReader, dispatchers: list[Dispatcher], start_offset: int, *,
                 check_crc: bool = False, name: str = "mqstore-dispatch",
                 tail_batch_records: int = DISPATCH_TAIL_BATCH_RECORDS, written=None):
        assert tail_batch_records >= 1
        assert written is None or not check_crc
        self._log = log
        self._written = written
        self._written_crc_length = fmt.RECORD_CRC_LENGTH if getattr(log, "record_crc", False) else 0
        self.written_records_dispatched = 0  # records dispatched from `written` (the rest were parsed)
        self._tail_batch_records = tail_batch_records
        self._dispatchers = list(dispatchers)
        self._check_crc = check_crc
        self._properties = tuple(dict.fromkeys(
            name for dispatcher in self._dispatchers for name in getattr(dispatcher, "properties", ())))
        self.dispatched_offset = start_offset
        self.error: BaseException | None = None
        self.idle = False
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._watchers: tuple[threading.Event, ...] = ()  # set at each progress (see watch)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.dispatched_records = 0

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        if self.idle:
            self._wake.set()

    def dispatch_available(self, records_max: int = DISPATCH_BATCH_RECORDS_MAX, *, yield_between: bool = False
                           ) -> int:
        """Dispatch everything up to the log's current end in the calling thread, `records_max` records a batch;
        returns records done. With `yield_between` the interpreter is offered to other threads between batches
        (the tailing thread: a producer waiting for it gets it at once, not after the 5 ms switch interval)."""
        done = 0
        end = self._log.readable_end()
        written = self._written
        while self.dispatched_offset < end:
            if yield_between and done:
                time.sleep(0)
            batch = self._written_batch(records_max) if written else None
            if batch is None:  # parse up to the next record described (a gap), or to the end
                stop = min(end, written[0][0]) if written else end
                batch = parse_records(self._log, self.dispatched_offset, stop, check_crc=self._check_crc,
                                      records_max=records_max, properties=self._properties)
            if len(batch):
                for dispatcher in self._dispatchers:
                    dispatcher.dispatch(batch)
                done += len(batch)
            with self._progress:
                self.dispatched_offset = batch.end_offset
                self.dispatched_records += len(batch)
                self._progress.notify_all()
                for event in self._watchers:
                    event.set()
            if batch.error is not None:
                raise batch.error
            if batch.end_offset == batch.start_offset:
                break
        return done

    def _written_batch(self, records_max: int) -> DispatchBatch | None:
        """The records the writer described from `dispatched_offset` on (at most `records_max`), or None when the
        next one described is further on (the records between are parsed) or none is.

        This thread alone takes from the deque; writers append to it (and drop its oldest entry when full),
        so an entry is examined only once taken; one that lies past a gap is put back.
        """
        written = self._written
        expected = self.dispatched_offset
        taken = []
        while written and len(taken) < records_max:
            record = written.popleft()
            if record[0] < expected:
                continue  # dispatched already, from the log
            if record[0] != expected:
                written.appendleft(record)  # past a gap (when full, this drops the newest entry: parsed later)
                break
            taken.append(record)
            expected = record[0] + record[1]
        if not taken:
            return None
        self.written_records_dispatched += len(taken)
        return batch_from_written(taken, self._written_crc_length, self._properties)

    def _run(self) -> None:
        while not self._stopping:
            try:
                done = self.dispatch_available(self._tail_batch_records, yield_between=True)
            except BaseException as exc:  # noqa: BLE001 - kept and reported; the thread must not die silently
                log.exception("dispatch stopped at offset %d", self.dispatched_offset)
                with self._progress:
                    self.error = exc
                    self._progress.notify_all()
                    for event in self._watchers:
                        event.set()
                return
            if done < DISPATCH_SMALL_BATCH_RECORDS:
                # Caught up, or nearly: wait, longer after a trickle, so a slow stream of puts (SYNC mode, one
                # producer) does not pay the batch decoder's fixed cost once per message.
                self.idle = True
                self._wake.wait(DISPATCH_IDLE_WAIT_S if not done else DISPATCH_SMALL_BATCH_WAIT_S)
                self._wake.clear()
                self.idle = False

    def wait_dispatched(self, timeout_s: float | None = None, target: int | None = None) -> bool:
        """Block until everything up to `target` (default: the log's end now) is dispatched."""
        if target is None:
            target = self._log.readable_end()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._progress:
            while self.dispatched_offset < target:
                if self.error is not None:
                    return False
                self._wake.set()
                wait_s = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if wait_s <= 0:
                    return False
                self._progress.wait(wait_s)
            return True

    def watch(self, event: threading.Event) -> None:
        """Set `event` whenever dispatch progresses or stops on an error (a waiter on several things at once)."""
        with self._progress:
            self._watchers = (*self._watchers, event)

    def unwatch(self, event: threading.Event) -> None:
        with self._progress:
            self._watchers = tuple(watched for watched in self._watchers if watched is not event)

    def wait_past(self, after_offset: int, timeout_s: float) -> int:
        """Block until dispatch passes `after_offset` (woken by dispatch, no polling); returns the dispatched
        offset then, or at the timeout. Raises the dispatch error instead of waiting when dispatch stopped."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while self.dispatched_offset <= after_offset:
                if self.error is not None:
                    raise StoreError(f"dispatch stopped, no new messages will arrive: {self.error}") from self.error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._progress.wait(remaining)
            return self.dispatched_offset

    def stop(self) -> None:
        """Stop the thread after its current batch (what is not yet dispatched stays for the next start)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
