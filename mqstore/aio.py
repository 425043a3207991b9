"""An asyncio API for the store: `await` a put whose acknowledgement follows the flush mode, poll without blocking.

    async with AsyncMessageStore.open(root, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
        result = await store.put(Message("orders", b"...", tags="paid", keys=["o-1"]))  # durable then
        consumer = store.consumer("billing", "orders")
        messages = await consumer.poll(max_count=32, timeout_ms=1000)

The write of a put runs on the event loop's thread, as the sync `put` writes (a few microseconds under the
writer lock; a refused or invalid message fails there, with the sync API's status or error). What the sync put
then blocks on is an awaitable here:
- SYNC: the put waits for a future that the store's flush waiter resolves once the flush that covers the
  message's end offset is done. One thread per store (`FlushWaiter`) waits on the group commit
  (`GroupCommitService.wait_durable`) for the end of the newest put in flight, so one fdatasync covers every put
  written meanwhile (group commit), and it resolves all the futures it made durable with one
  `loop.call_soon_threadsafe`, in the order they were written. The statuses are the sync put's: PUT_OK,
  FLUSH_DISK_TIMEOUT (not durable within `sync_flush_timeout_ms`), FLUSH_DISK_FAILED (a flush failed: from then on
  the store refuses puts with FlushFailedError, as the sync API does).
- ASYNC: a put returns as soon as it is written.
- `max_dispatch_lag_bytes`, and a consumer's `poll` when it is caught up: the wait for dispatch is a future that
  one thread per store (`DispatchWaiter`) resolves when dispatch passes the offset asked for.

A cancelled put is not un-written: its message is in the log and is flushed and dispatched as any other; only
its acknowledgement is lost. `close()` lets the flush waiter resolve every put in flight (each gets the status
its bytes earned), then closes the store in a worker thread; a put started after it began raises
StoreClosedError. docs/asyncio.md has the guide, docs/decisions/0040-asyncio-api.md the reasons.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Iterable

from mqstore.commitlog.errors import InvalidMessageError, StoreClosedError, StoreError
from mqstore.commitlog.message import Message, PutResult, PutStatus
from mqstore.consumer.group import POLL_MAX_COUNT_LIMIT, POLL_TIMEOUT_MS_MAX, READ_ONLY_POLL_INTERVAL_S
from mqstore.lease.aio import AsyncLeaseConsumer
from mqstore.lease.consumer import open_lease_consumer
from mqstore.store.config import StoreConfig
from mqstore.store.engine import MessageStore

__all__ = ["AsyncConsumer", "AsyncLeaseConsumer", "AsyncMessageStore"]

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0  # a waiter thread with nothing to wait for looks at its stop flag this often (it is woken anyway)
DISPATCH_WAIT_SLICE_S = 0.1  # the dispatch waiter's longest single wait, so that new waiters are seen this soon
_new_tuple = tuple.__new__
_Future = asyncio.Future
_running_loop = asyncio.get_running_loop
_FLUSH_DISK_FAILED = PutStatus.FLUSH_DISK_FAILED


def _deliver(resolved: list) -> None:
    """On the loop: settle each (_, future, value, kind) of one flush, in order: `kind is True` sets `value` as the
    future's exception, anything else (a put's `placed`, False) as its result. Futures cancelled meanwhile are
    skipped (their messages stay written)."""
    for _, future, value, is_error in resolved:
        if not future.done():
            if is_error is True:
                future.set_exception(value)
            else:
                future.set_result(value)


def _post(resolved: list) -> None:
    """From a waiter thread: one call_soon_threadsafe per event loop for everything it resolved at once."""
    if not resolved:
        return
    loop = resolved[0][1].get_loop()
    if all(entry[1].get_loop() is loop for entry in resolved):
        groups = {loop: resolved}
    else:  # futures of several loops (a store shared between loops): each loop settles its own
        groups = {}
        for entry in resolved:
            groups.setdefault(entry[1].get_loop(), []).append(entry)
    for loop, entries in groups.items():
        try:
            loop.call_soon_threadsafe(_deliver, entries)
        except RuntimeError:  # that loop is closed: nobody awaits those futures any more
            pass


def _take_all(pending: collections.deque) -> list:
    """Every entry of a waiter's deque, taken off it."""
    taken = []
    while pending:
        taken.append(pending.popleft())
    return taken


def _with_status(status: PutStatus, result, placed: int):
    """A put's result (placed < 0) or a batch's results (its first `placed` written) with `status` instead of
    PUT_OK for what was written."""
    if placed < 0:
        return _new_tuple(PutResult, (status, *result[1:]))
    return [_new_tuple(PutResult, (status, *item[1:])) for item in result[:placed]] + result[placed:]


class FlushWaiter:
    """The thread that waits, for the puts in flight of one SYNC store, until the flush covers them.

    `pending` holds (end offset, future, result, placed) in the order puts were written. The thread waits on the
    group commit for the newest entry's end (leading the flush itself, or parked behind the leader, as a sync
    put does: `GroupCommitService.wait_durable`), so the flush covers every put written before it began; it then
    resolves every entry the flush made durable, in one call to the loop.
    """

    def __init__(self, store: MessageStore):
        self._store = store
        self._group_commit = store._group_commit
        self._timeout_s = store._sync_timeout_s
        self.pending: collections.deque = collections.deque()
        self.idle = False  # the thread waits for work: whoever adds some wakes it (`wake`)
        self._wake = threading.Lock()  # released to wake the thread (cheaper than an Event: no Python frames)
        self._wake.acquire()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqstore-aio-flush", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:
            pass  # already woken

    def stop(self) -> None:
        """Resolve what is in flight, then end the thread (blocks: call it from a worker thread)."""
        self._stopping = True
        self.wake()
        self._thread.join()

    def _run(self) -> None:
        pending = self.pending
        while True:
            if not pending:
                if self._stopping:
                    return
                self.idle = True  # set before looking again: a put added after the look sees it and wakes us
                if not pending and not self._stopping:
                    self._wake.acquire(True, IDLE_WAIT_S)
                self.idle = False
                continue
            waited = len(pending)  # these were written before this wait began
            try:
                durable = self._group_commit.wait_durable(pending[-1][0], self._timeout_s)
                resolved = self._resolve(durable, waited)
            except Exception as exc:  # noqa: BLE001 - a bug must fail the puts in flight, not hang them
                log.exception("the asyncio flush waiter failed")
                error = StoreError(f"waiting for the flush failed: {exc!r}")
                error.__cause__ = exc
                resolved = [(0, entry[1], error, True) for entry in _take_all(pending)]
            _post(resolved)

    def _resolve(self, durable: bool, waited: int) -> list:
        """Take the entries settled by one wait off `pending`: those now durable (PUT_OK); after a failed wait,
        every one when a flush failed or the store closed, else the `waited` that waited a whole timeout."""
        pending = self.pending
        take = pending.popleft
        position = self._group_commit.durable_position
        resolved = []  # entries as `_deliver` takes them; those of `pending` give their result
        keep = resolved.append
        while pending and pending[0][0] <= position:
            keep(take())
        if durable:
            return resolved
        store = self._store
        if store._closed:  # the sync store was closed underneath: its last flush is not known here
            error = StoreClosedError(f"the store at {store.root_dir} was closed with this put in flight")
            while pending:
                keep((0, take()[1], error, True))
            return resolved
        status = store._not_durable_status()
        count = len(pending) if status is _FLUSH_DISK_FAILED else max(0, waited - len(resolved))
        for _ in range(min(count, len(pending))):
            end, future, result, placed = take()
            keep((end, future, _with_status(status, result, placed), placed))
        return resolved


class DispatchWaiter:
    """The thread that waits for dispatch progress for one store's awaiting consumers and lag-bounded puts.

    `add(after_offset)` gives a future resolved with the dispatched offset once dispatch passes `after_offset`
    (or with the StoreError raised when dispatch stopped). The thread waits on the store's dispatch progress
    (`MessageStore.wait_dispatched_past`, woken by dispatch) for the lowest offset asked, in slices of
    DISPATCH_WAIT_SLICE_S, and only while a future waits.
    """

    def __init__(self, store: MessageStore):
        self._store = store
        self._lock = threading.Lock()
        self._waiting: list = []  # [after_offset, future]
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqstore-aio-dispatch", daemon=True)
        self._thread.start()

    def add(self, after_offset: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiting.append((after_offset, future))
        self._wake.set()
        return future

    def stop(self) -> None:
        """End the thread; futures still waiting get StoreClosedError (blocks: call it from a worker thread)."""
        self._stopping = True
        self._wake.set()
        self._thread.join()
        with self._lock:
            waiting, self._waiting = self._waiting, []
        error = StoreClosedError(f"the store at {self._store.root_dir} is closed")
        _post([(0, future, error, True) for _, future in waiting])

    def _run(self) -> None:
        while not self._stopping:
            with self._lock:
                self._waiting = [entry for entry in self._waiting if not entry[1].done()]
                lowest = min((entry[0] for entry in self._waiting), default=None)
            if lowest is None:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            try:
                dispatched = self._store.wait_dispatched_past(lowest, DISPATCH_WAIT_SLICE_S)
            except Exception as exc:  # noqa: BLE001 - dispatch stopped or the store closed: nothing new will come
                if not isinstance(exc, StoreError):
                    log.exception("the asyncio dispatch waiter failed")
                with self._lock:
                    waiting, self._waiting = self._waiting, []
                _post([(0, future, exc, True) for _, future in waiting])
                continue
            if dispatched is None or dispatched <= lowest:
                continue
            with self._lock:
                passed = [entry for entry in self._waiting if entry[0] < dispatched]
                self._waiting = [entry for entry in self._waiting if entry[0] >= dispatched]
            _post([(0, future, dispatched, False) for _, future in passed])


class _Opening:
    """What `AsyncMessageStore.open` returns: `async with` it, or `await` it; the open runs in a worker thread
    (recovery can take a while), never on the loop."""

    def __init__(self, arguments: tuple, keywords: dict):
        self._arguments = arguments
        self._keywords = keywords
        self._store: AsyncMessageStore | None = None

    async def _open(self) -> "AsyncMessageStore":
        loop = asyncio.get_running_loop()
        sync = await loop.run_in_executor(None, lambda: MessageStore.open(*self._arguments, **self._keywords))
        return AsyncMessageStore(sync)

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> "AsyncMessageStore":
        self._store = await self._open()
        return self._store

    async def __aexit__(self, *exc_info) -> None:
        await self._store.close()


class AsyncMessageStore:
    """A MessageStore for asyncio: `AsyncMessageStore.open(root, config)` (an async context manager, or awaited),
    or `AsyncMessageStore(sync_store)` around an open one (closing this closes that)."""

    def __init__(self, sync: MessageStore):
        if not isinstance(sync, MessageStore):
            raise InvalidMessageError(f"AsyncMessageStore wraps a MessageStore, got {type(sync).__name__}")
        self.sync = sync
        self._closing = False
        self._flush_waiter = None
        if sync._sync_flush and not sync.read_only and not sync._closed:
            self._flush_waiter = FlushWaiter(sync)
        self._dispatch_waiter: DispatchWaiter | None = None  # started by the first wait for dispatch
        self._dispatch_lock = threading.Lock()

    @classmethod
    def open(cls, root_dir, config: StoreConfig | None = None, read_only: bool = False, *,
             repair: bool = False) -> _Opening:
        """`async with AsyncMessageStore.open(root, config) as store:` (or `store = await ...open(...)`), with
        MessageStore.open's arguments."""
        return _Opening((root_dir, config, read_only), {"repair": repair})

    @property
    def config(self) -> StoreConfig:
        return self.sync.config

    @property
    def root_dir(self) -> str:
        return self.sync.root_dir

    # --- writing -------------------------------------------------------------------------------------------
    async def put(self, message: Message) -> PutResult:
        """Store one message; the PutResult once acknowledged as the flush mode says (SYNC: durable)."""
        if self._closing:
            self._refuse_closed()
        result = self.sync._put_written(message)
        waiter = self._flush_waiter
        if result[1] < 0:  # refused: nothing written
            return result
        if self.sync._lag_limit:
            await self._dispatch_lag(result[1] + result[3])
        if waiter is None:
            return result
        future = _Future(loop=_running_loop())  # loop.create_future without its Python frame
        waiter.pending.append((result[1] + result[3], future, result, -1))
        if waiter.idle:
            waiter.wake()
        return await future

    async def put_batch(self, messages: Iterable[Message]) -> list[PutResult]:
        """Store many messages under one lock hold (MessageStore.put_batch); acknowledged as `put` is."""
        if self._closing:
            self._refuse_closed()
        results, placed = self.sync._put_batch_written(messages)
        if not placed:
            return results
        end = results[placed - 1][1] + results[placed - 1][3]
        if self.sync._lag_limit:
            await self._dispatch_lag(end)
        waiter = self._flush_waiter
        if waiter is None:
            return results
        future = asyncio.get_running_loop().create_future()
        waiter.pending.append((end, future, results, placed))
        if waiter.idle:
            waiter.wake()
        return await future

    async def _dispatch_lag(self, end: int) -> None:
        """max_dispatch_lag_bytes: wait, without blocking the loop, until dispatch is within three quarters of the
        limit of `end` (as the sync put does; returns early when dispatch stopped on an error)."""
        sync = self.sync
        target = end - sync._lag_limit * 3 // 4
        if end - sync.dispatched_offset <= sync._lag_limit:
            return
        while sync.dispatched_offset < target:
            try:
                await self._dispatched_past(sync.dispatched_offset)
            except StoreError:
                return

    def _refuse_closed(self) -> None:
        raise StoreClosedError(f"the store at {self.sync.root_dir} is closed")

    # --- reading: cheap, delegated -------------------------------------------------------------------------
    async def get(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None):
        """MessageStore.get (a read of mapped files: it does not wait)."""
        return self.sync.get(topic, queue_id, offset, max_count, tags)

    def __getattr__(self, name: str):
        """The sync store's other reads (`max_offset`, `topics`, `stats`, `read_at`, `query_by_key`, ...), called
        directly: they read mapped files and do not wait."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.sync, name)

    async def flush(self) -> None:
        """MessageStore.flush in a worker thread."""
        await asyncio.get_running_loop().run_in_executor(None, self.sync.flush)

    async def wait_dispatched(self, timeout_s: float | None = None) -> bool:
        """Until everything put so far is visible to get(); False on timeout or a dispatch failure."""
        sync = self.sync
        if sync.dispatched_offset is None:
            return True
        target = sync._commitlog.readable_end()
        try:
            async with asyncio.timeout(timeout_s):
                while sync.dispatched_offset < target:
                    await self._dispatched_past(sync.dispatched_offset)
        except (TimeoutError, StoreError):
            return False
        return True

    def _dispatched_past(self, after_offset: int) -> asyncio.Future:
        """A future resolved with the dispatched offset once it passes `after_offset` (DispatchWaiter)."""
        if self._dispatch_waiter is None:
            with self._dispatch_lock:
                if self._dispatch_waiter is None:
                    self._dispatch_waiter = DispatchWaiter(self.sync)
        return self._dispatch_waiter.add(after_offset)

    def consumer(self, group: str | None, topic: str, queue_ids=None, *, tags=None,
                 consume_from: str = "first", **retry_options) -> "AsyncConsumer":
        """An AsyncConsumer of `topic` for `group` (MessageStore.consumer's arguments, max_reconsume_times too)."""
        return AsyncConsumer(self, self.sync.consumer(group, topic, queue_ids, tags=tags, consume_from=consume_from,
                                                      **retry_options))

    def lease_consumer(self, group: str, topic: str, **options) -> AsyncLeaseConsumer:
        """An AsyncLeaseConsumer of `topic` for `group` (open_lease_consumer's options; mqstore/lease/aio.py)."""
        return AsyncLeaseConsumer(self, open_lease_consumer(self.sync, group, topic, **options))

    # --- lifecycle -----------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Resolve the puts in flight, then close the store (in a worker thread; the loop keeps running)."""
        if self._closing:
            return
        self._closing = True
        await asyncio.get_running_loop().run_in_executor(None, self._close_blocking)
        await asyncio.sleep(0)  # let the last resolutions posted to the loop run before returning

    def _close_blocking(self) -> None:
        try:
            if self._flush_waiter is not None:
                self._flush_waiter.stop()
        finally:
            try:
                if self._dispatch_waiter is not None:
                    self._dispatch_waiter.stop()
            finally:
                self.sync.close()

    async def __aenter__(self) -> "AsyncMessageStore":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class Committed(dict):
    """The offsets `AsyncConsumer.commit` stored, by queue id; awaiting it gives itself (the commit is done)."""

    def __await__(self):
        return self
        yield  # noqa: B901 - makes __await__ a generator that returns at once


class AsyncConsumer:
    """A consumer whose `poll` awaits new messages without blocking the loop (mqstore.consumer.group.Consumer's
    positions, filters and commits)."""

    def __init__(self, store: AsyncMessageStore, consumer):
        self.store = store
        self.sync = consumer

    async def poll(self, max_count: int = 32, timeout_ms: int = 0) -> list:
        """Up to `max_count` messages; when none are there, await new ones for up to `timeout_ms` (woken by
        dispatch progress, no polling; a read_only store is looked at every READ_ONLY_POLL_INTERVAL_S)."""
        if type(timeout_ms) is not int or not 0 <= timeout_ms <= POLL_TIMEOUT_MS_MAX:
            raise InvalidMessageError(f"timeout_ms must be an int in 0..{POLL_TIMEOUT_MS_MAX}, got {timeout_ms!r}")
        if type(max_count) is not int or not 1 <= max_count <= POLL_MAX_COUNT_LIMIT:
            raise InvalidMessageError(f"max_count must be an int in 1..{POLL_MAX_COUNT_LIMIT}, got {max_count!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        sync_store = self.store.sync
        while True:
            seen = sync_store.dispatched_offset  # before the look: progress after it wakes us
            messages = self.sync.poll(max_count, 0)
            if messages:
                return messages
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            if seen is None:  # read_only: its writer dispatches in another process
                await asyncio.sleep(min(remaining, READ_ONLY_POLL_INTERVAL_S))
                continue
            future = self.store._dispatched_past(seen)
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                return []

    def commit(self) -> "Committed":
        """Store the positions as the group's committed offsets (Consumer.commit: a small file write, done at once);
        the offsets, which may also be awaited (`await consumer.commit()`)."""
        return Committed(self.sync.commit())

    async def nack(self, message, delay_level: int = 0):
        """Consumer.nack in a worker thread (a SYNC store waits for the copy to be durable); its PutResult."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.sync.nack, message, delay_level)

    def __getattr__(self, name: str):
        """The sync consumer's other methods (positions, committed, seek, lag, dead_letters, close, ...)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.sync, name)

    def __enter__(self) -> "AsyncConsumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.sync.close()

    async def __aenter__(self) -> "AsyncConsumer":
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.sync.close()
