"""Lease consumers: work queues with per-message acknowledgement and a visibility timeout (RocketMQ 5's POP).

    consumer = open_lease_consumer(store, "workers", "jobs")
    for leased in consumer.receive(max_count=32, visibility_ms=30_000, timeout_ms=1000):
        handle(leased.message)
        consumer.ack(leased.lease)            # not acknowledged in time: handed out again

`receive` hands out messages with a lease each: first those whose lease expired (their delivery count raised),
then entries of the topic's queues never handed out. A message is leased to one consumer at a time: every lease
consumer of the (topic, group), in this process or another, shares the group's lease journal under a flock
(mqstore/lease/format.py), so a message is handed out again only after its lease's deadline. `ack` ends a lease,
`extend` moves its deadline, `nack` lets it expire now. A message delivered `max_delivery_count` times whose
lease expires again is put on `%DLQ%<group>` (dead_letter.py) and acknowledged; a consumer of a read_only store
cannot put and leaves it to a writable one. Deadlines are read from the consumer's clock (the store's, a
ManualClock in tests); `timeout_ms`, how long receive waits for something to hand out, is wall time. A waiting
receive is woken by dispatch, by the clock's jumps, by nacks and extends of the group's consumers in this process
and at the earliest lease deadline it saw; it looks again every RECEIVE_WAIT_SLICE_S for other processes' doings.

Every entry below a queue's acknowledged prefix is done: the prefix is committed to the group's offsets
(`config/consumerOffset.json`) by `commit()`, on `close()`, every `commit_interval_ms` of acks and when the
journal is compacted, so plain consumers and tools see the group's progress.

Durability: once `receive` or `ack` returns, its lease or acknowledgement survives a kill -9 of any process
(the journal is written with write(2)). `sync=True` also fdatasyncs each write, so that they survive a power
loss. After a crash a lease handed out but not acknowledged is delivered again when it expires: at-least-once.
With `tags`, only messages with one of those tags are handed out; the others are acknowledged in the journal
as the receive passes over them (so the prefix advances), as RocketMQ's broker filters a subscription. Every
consumer of a group should use the same tags: what one passes over, the group will not be handed.
"""

from __future__ import annotations

import heapq
import threading
import time
import weakref
from typing import Iterable, NamedTuple

from mqstore.commitlog.errors import InvalidMessageError, StoreClosedError
from mqstore.commitlog.message import StoredMessage
from mqstore.consumer.offsets import ConsumerOffsets, offset_key, validate_group
from mqstore.lease import format as fmt
from mqstore.lease.dead_letter import put_dead_letter
from mqstore.lease.errors import ForeignLeaseError, LeaseExpiredError, UnknownLeaseError
from mqstore.lease.journal import COMPACT_BYTES, LeaseJournal
from mqstore.store.reads import GET_MAX_COUNT_LIMIT, GetStatus

RECEIVE_MAX_COUNT_LIMIT = GET_MAX_COUNT_LIMIT  # messages one receive may hand out
VISIBILITY_MS_MAX = 12 * 3600 * 1000  # longest lease (RocketMQ 5 caps a POP's invisible time near this)
RECEIVE_TIMEOUT_MS_MAX = 24 * 3600 * 1000  # longest a receive may wait
RECEIVE_WAIT_SLICE_S = 0.05  # a waiting receive looks again at least this often (other processes do not signal)
MAX_DELIVERY_COUNT = 16  # RocketMQ's default max reconsume times
QUEUE_LIST_REFRESH_S = 1.0  # a receive lists the topic's queues at least this often (and when it finds too little)
COMMIT_INTERVAL_MS = 5000  # acks commit the prefix to consumerOffset.json at most this often (RocketMQ: 5 s)

_LEASE = fmt.KIND_LEASE
_ACK = fmt.KIND_ACK
_DEAD = fmt.KIND_DEAD
_BASE = fmt.KIND_BASE
_FOUND = GetStatus.FOUND
_FILTERED = (_FOUND, GetStatus.NO_MATCHED_MESSAGE)  # get outcomes after which entries were passed over by tag
_new_tuple = tuple.__new__  # builds the named tuples below without their Python-level __new__


class Lease(NamedTuple):
    """A handle on one leased message: pass it to ack, ack_many, extend or nack."""

    owner: str  # "topic@group" of the consumer that handed it out
    queue_id: int
    queue_offset: int
    lease_id: int
    deadline_ms: int
    delivery_count: int


class LeasedMessage(NamedTuple):
    message: StoredMessage
    lease: Lease


def check_int(name: str, value, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidMessageError(f"{name} must be an int in {low}..{high}, got {value!r}")


def open_lease_consumer(store, group: str, topic: str, *, tags=None, max_delivery_count: int = MAX_DELIVERY_COUNT,
                        sync: bool = False, clock=None, commit_interval_ms: int = COMMIT_INTERVAL_MS,
                        compact_bytes: int = COMPACT_BYTES) -> "LeaseConsumer":
    """A lease consumer of every queue of `topic` for `group` (see the module docstring).

    `tags` filters as `MessageStore.get` does: None or "*" for all, a tag, "A || B" or a collection of tags.
    """
    validate_group(group)
    tags = _check_tags(tags)
    store.max_offset(topic, 0)  # checks the topic name and that the store is open
    check_int("max_delivery_count", max_delivery_count, 1, 0xFFFF - 1)
    check_int("commit_interval_ms", commit_interval_ms, 0, RECEIVE_TIMEOUT_MS_MAX)
    journal = LeaseJournal(store.root_dir, topic, group, sync=bool(sync), compact_bytes=compact_bytes)
    return LeaseConsumer(store, group, topic, journal, max_delivery_count=max_delivery_count,
                         clock=store.clock if clock is None else clock, commit_interval_ms=commit_interval_ms,
                         tags=tags)


def _check_tags(tags):
    """`tags` as get takes them, None when they select everything; InvalidMessageError unless well formed."""
    if tags is None:
        return None
    parts = tags.split("||") if isinstance(tags, str) else tags
    if not isinstance(parts, (list, tuple, set, frozenset)) or not all(isinstance(part, str) for part in parts):
        raise InvalidMessageError(f"tags must be None, a str or a collection of str, got {tags!r}")
    wanted = [part.strip() for part in parts if part.strip()]
    return None if not wanted or "*" in wanted else frozenset(wanted)


class LeaseConsumer:
    """Leases messages of one topic for one group. Thread-safe. Build it with `open_lease_consumer`."""

    def __init__(self, store, group: str, topic: str, journal: LeaseJournal, *, max_delivery_count: int, clock,
                 commit_interval_ms: int, tags: frozenset[str] | None = None):
        self.store = store
        self.tags = tags  # None: every message; else only these tags are handed out, the rest acknowledged
        self.group = group
        self.topic = topic
        self.owner = offset_key(topic, group)
        self.max_delivery_count = max_delivery_count
        self.clock = clock
        self.commit_interval_ms = commit_interval_ms
        self._journal = journal
        self._offsets = ConsumerOffsets.of_store(store.root_dir)
        self._mutex = threading.Lock()
        self._committed_at_ms = clock.now_ms()
        self._closed = False
        # Set when something may have become receivable: dispatch made entries visible (a writable store), the
        # clock jumped (a ManualClock), a consumer of the group in this process nacked or extended a lease.
        self._wake = threading.Event()
        _watch(self)
        self._passed_over = False  # the last look acknowledged entries whose tag did not match
        self._queue_ids: list[int] | None = None  # the topic's queues when last listed (see _known_queues)
        self._queue_ids_at_s = 0.0

    # --- receiving -----------------------------------------------------------------------------------------
    def receive(self, max_count: int = 32, visibility_ms: int = 30_000, timeout_ms: int = 0) -> list[LeasedMessage]:
        """Up to `max_count` messages, each leased for `visibility_ms`; waits up to `timeout_ms` for one."""
        check_int("max_count", max_count, 1, RECEIVE_MAX_COUNT_LIMIT)
        check_int("visibility_ms", visibility_ms, 1, VISIBILITY_MS_MAX)
        check_int("timeout_ms", timeout_ms, 0, RECEIVE_TIMEOUT_MS_MAX)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._wake.clear()  # before the look: what happens during it wakes the wait below
            received = self.receive_now(max_count, visibility_ms)
            remaining = deadline - time.monotonic()
            if received or remaining <= 0:
                return received
            if not self._passed_over:  # else entries were passed over by tag: look on at once
                self._wake.wait(self.wait_s(remaining))

    def wait_s(self, remaining_s: float) -> float:
        """How long a receive that found nothing may wait before it looks again (it is also woken, see _wake).

        Until the earliest lease deadline the last look saw (on a wall clock; a ManualClock's moves wake it),
        at most `remaining_s` and RECEIVE_WAIT_SLICE_S: what other processes do is not signalled.
        """
        wait_s = min(remaining_s, RECEIVE_WAIT_SLICE_S)
        expiry = self._journal.state.expiry
        if expiry:
            wait_s = min(wait_s, max(0.0, (expiry[0][0] - self.clock.now_ms()) / 1000))
        return wait_s

    def receive_now(self, max_count: int, visibility_ms: int) -> list[LeasedMessage]:
        """One look (receive without waiting); the arguments are checked by the caller."""
        with self._mutex:
            self._check_open()
            self._passed_over = False
            with self._journal.locked() as state:
                now = self.clock.now_ms()
                records: list[tuple] = []
                received: list[LeasedMessage] = []
                self._redeliver(state, now, now + visibility_ms, max_count, records, received)
                if len(received) < max_count:
                    self._deliver_new(state, now + visibility_ms, max_count, records, received)
                if records:
                    self._journal.append(records)
                    self._maybe_compact()
        return received

    def _redeliver(self, state, now: int, deadline: int, max_count: int, records: list, received: list) -> None:
        """Lease again messages whose lease expired (or put them on the DLQ past max_delivery_count)."""
        expiry = state.expiry
        lease_id = state.last_lease_id + len(records)
        while expiry and expiry[0][0] <= now and len(received) < max_count:
            _, queue_id, queue_offset, expired_id = heapq.heappop(expiry)
            entry = state.queues[queue_id].leases.get(queue_offset)
            if entry is None or entry[0] != expired_id or entry[1] > now:
                continue  # acknowledged, leased again, or extended: a newer heap entry stands for it
            result = self.store.get(self.topic, queue_id, queue_offset, max_count=1)
            if result.status is not _FOUND or result.messages[0].queue_offset != queue_offset:
                records.append((_ACK, 0, 0, queue_id, queue_offset, expired_id, 0))  # deleted by retention
                continue
            message = result.messages[0]
            count = entry[2]
            if count >= self.max_delivery_count:
                if put_dead_letter(self.store, self.group, message, count):
                    records.append((_DEAD, 0, 0, queue_id, queue_offset, expired_id, 0))
                continue
            lease_id += 1
            records.append((_LEASE, 0, count + 1, queue_id, queue_offset, lease_id, deadline))
            received.append(LeasedMessage(message, Lease(self.owner, queue_id, queue_offset, lease_id, deadline,
                                                         count + 1)))

    def _deliver_new(self, state, deadline: int, max_count: int, records: list, received: list) -> None:
        """Lease entries never handed out, round-robin from the queue after the one last started with."""
        queue_ids = self._known_queues(state, refresh=False)
        if not self._deliver_from(state, queue_ids, deadline, max_count, records, received):
            fresh = self._known_queues(state, refresh=True)  # before saying "too little": new queues?
            added = [queue_id for queue_id in fresh if queue_id not in queue_ids]
            if added:
                self._deliver_from(state, added, deadline, max_count, records, received)

    def _deliver_from(self, state, queue_ids: list[int], deadline: int, max_count: int, records: list,
                      received: list) -> bool:
        """`_deliver_new` over `queue_ids`; whether the batch is full."""
        owner = self.owner
        lease_id = state.last_lease_id + len(records)
        for queue_id in queue_ids:
            budget = max_count - len(received)
            if budget <= 0:
                break
            queue = state.queues[queue_id]
            result = self.store.get(self.topic, queue_id, queue.next, max_count=budget, tags=self.tags)
            if result.status is GetStatus.OFFSET_TOO_SMALL:  # deleted by retention: skip what is gone
                self._journal.append([(_BASE, 0, 0, queue_id, result.next_offset, result.next_offset, 0)])
                result = self.store.get(self.topic, queue_id, queue.next, max_count=budget, tags=self.tags)
            if self.tags is not None and result.next_offset > queue.next and result.status in _FILTERED:
                _acknowledge_filtered(queue, queue_id, result, records)
                self._passed_over = True
            if result.status is not _FOUND:
                continue
            append_record = records.append
            append_received = received.append
            for message in result.messages:
                lease_id += 1
                queue_offset = message.queue_offset
                append_record((_LEASE, 0, 1, queue_id, queue_offset, lease_id, deadline))
                append_received(_new_tuple(LeasedMessage, (message, _new_tuple(Lease, (
                    owner, queue_id, queue_offset, lease_id, deadline, 1)))))
        return len(received) >= max_count

    def _known_queues(self, state, refresh: bool) -> list[int]:
        """The topic's queue ids; a queue new to the journal starts at the group's committed offset.

        The store is asked again (a directory listing) when `refresh` or QUEUE_LIST_REFRESH_S after the last
        time; in between the list is the one found then.
        """
        now_s = time.monotonic()
        if refresh or self._queue_ids is None or now_s - self._queue_ids_at_s >= QUEUE_LIST_REFRESH_S:
            self._queue_ids = self.store.topics().get(self.topic, [])
            self._queue_ids_at_s = now_s
        queue_ids = self._queue_ids
        new = [queue_id for queue_id in queue_ids if queue_id not in state.queues]
        if new:
            committed = self._offsets.offsets(self.topic, self.group)
            records = []
            for queue_id in new:
                base = committed.get(queue_id, self.store.min_offset(self.topic, queue_id))
                records.append((_BASE, 0, 0, queue_id, base, base, 0))
            self._journal.append(records)
        if len(queue_ids) > 1:  # start with the queue after the one that started last time
            start = state.last_lease_id % len(queue_ids)
            queue_ids = queue_ids[start:] + queue_ids[:start]
        return queue_ids

    # --- ending leases -------------------------------------------------------------------------------------
    def ack(self, lease: Lease) -> None:
        """End a lease: the message is done. LeaseError (nothing written) unless the lease is live."""
        if type(lease) is not Lease or lease.owner != self.owner:
            self.ack_many((lease,))  # raises the error
            return
        with self._mutex:
            self._check_open()
            now = self._journal.ack_one(lease.queue_id, lease.queue_offset, lease.lease_id, self.clock.now_ms)
        if now is None:
            self.ack_many((lease,))  # not live: raises the error, nothing written
        elif now - self._committed_at_ms >= self.commit_interval_ms or self._journal.needs_compaction():
            with self._mutex:
                if not self._closed:
                    with self._journal.locked() as state:
                        self._after_acks(state, now)

    def ack_many(self, leases: Iterable[Lease]) -> None:
        """End several leases at once (one write); if one is not live, LeaseError and nothing is written."""
        leases = self._own(leases)
        if not leases:
            return
        with self._mutex:
            self._check_open()
            with self._journal.locked() as state:
                now = self.clock.now_ms()
                records = []
                seen = set()
                for lease in leases:
                    self._check_live(state, lease, now, seen)
                    records.append((_ACK, 0, 0, lease.queue_id, lease.queue_offset, lease.lease_id, 0))
                self._journal.append(records)
                self._after_acks(state, now)

    def _after_acks(self, state, now: int) -> None:
        self._maybe_compact()
        if now - self._committed_at_ms >= self.commit_interval_ms:
            self._commit_locked(state, now)

    def extend(self, lease: Lease, visibility_ms: int) -> Lease:
        """Keep a live lease `visibility_ms` from now; the new handle (the old one stays valid too)."""
        check_int("visibility_ms", visibility_ms, 1, VISIBILITY_MS_MAX)
        return self._release(lease, visibility_ms)

    def nack(self, lease: Lease) -> None:
        """Give a lease up now: the message is receivable again at once, its delivery count raised then."""
        self._release(lease, 0)

    def _release(self, lease: Lease, visibility_ms: int) -> Lease:
        (lease,) = self._own((lease,))
        with self._mutex:
            self._check_open()
            with self._journal.locked() as state:
                now = self.clock.now_ms()
                self._check_live(state, lease, now, set())
                renewed = lease._replace(deadline_ms=now + visibility_ms)
                self._journal.append([(_LEASE, 0, lease.delivery_count, lease.queue_id, lease.queue_offset,
                                       lease.lease_id, renewed.deadline_ms)])
        _wake_group(self._journal.path)  # an earlier deadline for the waiting receives of the group
        return renewed

    def _own(self, leases: Iterable[Lease]) -> list[Lease]:
        leases = list(leases)
        for lease in leases:
            if not isinstance(lease, Lease):
                raise InvalidMessageError(f"expected a Lease, got {type(lease).__name__}")
            if lease.owner != self.owner:
                raise ForeignLeaseError(f"lease of {lease.owner} given to the consumer of {self.owner}")
        return leases

    def _check_live(self, state, lease: Lease, now: int, seen: set) -> None:
        where = (lease.queue_id, lease.queue_offset)
        queue = state.queues.get(lease.queue_id)
        entry = None if queue is None else queue.leases.get(lease.queue_offset)
        if where in seen or entry is None:
            done = queue is not None and (lease.queue_offset < queue.base or lease.queue_offset in queue.acked)
            raise UnknownLeaseError(f"lease {lease.lease_id} of {self.owner} queue {lease.queue_id} offset "
                                    f"{lease.queue_offset}: " + ("already acknowledged" if done or where in seen
                                                                 else "never handed out"))
        if entry[0] > lease.lease_id:
            raise LeaseExpiredError(f"lease {lease.lease_id} expired; the message was leased again "
                                    f"(lease {entry[0]})")
        if entry[0] != lease.lease_id:
            raise UnknownLeaseError(f"lease {lease.lease_id} was never handed out")
        if entry[1] <= now:
            raise LeaseExpiredError(f"lease {lease.lease_id} expired at {entry[1]} (now {now})")
        seen.add(where)

    # --- progress ------------------------------------------------------------------------------------------
    def prefixes(self) -> dict[int, int]:
        """Each queue's acknowledged prefix: every entry below it is done (what commit() stores)."""
        with self._mutex, self._journal.locked() as state:
            return {queue_id: queue.base for queue_id, queue in sorted(state.queues.items())}

    def leased_count(self) -> int:
        """Leases handed out and not acknowledged (expired ones included)."""
        with self._mutex, self._journal.locked() as state:
            return state.live_count

    def commit(self) -> dict[int, int]:
        """Store the acknowledged prefixes as the group's committed offsets; returns them."""
        with self._mutex:
            self._check_open()
            with self._journal.locked() as state:
                return self._commit_locked(state, self.clock.now_ms())

    def _commit_locked(self, state, now: int) -> dict[int, int]:
        self._committed_at_ms = now
        prefixes = {queue_id: queue.base for queue_id, queue in state.queues.items()}
        return self._offsets.commit(self.topic, self.group, prefixes) if prefixes else {}

    def _maybe_compact(self) -> None:
        if self._journal.needs_compaction():
            state = self._journal.state
            self._commit_locked(state, self.clock.now_ms())
            self._journal.compact()

    def close(self) -> None:
        """Commit the prefixes and let go of the journal. Live leases stay: they expire as usual."""
        with self._mutex:
            if self._closed:
                return
            try:
                with self._journal.locked() as state:
                    self._commit_locked(state, self.clock.now_ms())
            finally:
                self._closed = True
                _unwatch(self)
                self._journal.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the lease consumer of {self.owner} is closed")

    def __enter__(self) -> "LeaseConsumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LeaseConsumer(group={self.group!r}, topic={self.topic!r})"


_group_lock = threading.Lock()
# journal path -> the wakes of its consumers in this process, held weakly: a consumer dropped without close()
# (a test's stand-in for a kill) leaves nothing behind
_group_wakes: dict[str, weakref.WeakSet] = {}


def _watch(consumer: LeaseConsumer) -> None:
    """Have the store's dispatch, the clock and the group's other consumers in this process wake `consumer`."""
    event = consumer._wake
    if not consumer.store.read_only:
        consumer.store.watch_dispatch(event)
    getattr(consumer.clock, "watch", _ignore)(event)
    with _group_lock:
        _group_wakes.setdefault(consumer._journal.path, weakref.WeakSet()).add(event)


def _unwatch(consumer: LeaseConsumer) -> None:
    event = consumer._wake
    consumer.store.unwatch_dispatch(event)
    getattr(consumer.clock, "unwatch", _ignore)(event)
    with _group_lock:
        path = consumer._journal.path
        events = _group_wakes.get(path)
        if events is not None:
            events.discard(event)
            if not events:
                del _group_wakes[path]


def _wake_group(path: str) -> None:
    with _group_lock:
        events = list(_group_wakes.get(path, ()))
    for event in events:
        event.set()


def _ignore(event) -> None:
    """The watch of a clock that has none."""


def _acknowledge_filtered(queue, queue_id: int, result, records: list) -> None:
    """Records acknowledging the entries `result`'s get passed over (their tag did not match): from the
    queue's `next` to `result.next_offset`, all but the messages it returned. When everything handed out is
    acknowledged (base == next), the run before the first message is one BASE record, not an ACK each."""
    start, end = queue.next, result.next_offset
    taken = {message.queue_offset for message in result.messages}
    if queue.base == start:
        first = min(taken, default=end)
        if first > start:
            records.append((_BASE, 0, 0, queue_id, first, first, 0))
            start = first
    records.extend((_ACK, 0, 0, queue_id, offset, 0, 0) for offset in range(start, end) if offset not in taken)
