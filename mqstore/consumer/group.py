"""Consumers: read a topic's queues from a group's committed offsets, long-poll for new messages, commit.

    consumer = open_consumer(store, "billing", "orders")      # all queues of the topic
    while running:
        for message in consumer.poll(max_count=32, timeout_ms=1000):
            handle(message)
        consumer.commit()                                      # at-least-once: commit after handling

A consumer keeps a position per queue: the queue offset of the next message it will return. It starts at the
group's committed offset (`config/consumerOffset.json`, see `mqstore.consumer.offsets`), or, for a queue the group
never committed, at the queue's first kept entry (`consume_from="first"`) or its end (`"last"`). Positions
advance as messages are returned; `commit()` stores them, so after a crash consumption resumes from the last
commit and messages returned after it are delivered again (at-least-once).

`poll` reads each queue from its position in batches (`MessageStore.get`, which filters by tag hash in the
ConsumeQueue, then by the exact tag), round-robin over the queues so that no queue starves. When every queue is
caught up it blocks until the dispatch thread has dispatched something new (it is notified, it does not spin),
then looks again, until `timeout_ms` has passed. A consumer of a store opened read_only (written by another
process) has no dispatch thread to listen to: it looks again every READ_ONLY_POLL_INTERVAL_S.

Positions whose entries are gone are corrected as RocketMQ corrects them: below the queue's first entry
(OFFSET_TOO_SMALL: deleted by retention) to the first entry; past its end (OFFSET_OVERFLOW_BADLY: the queue was
rebuilt shorter) to where `get` says. A consumer is not thread-safe: use one per thread.

Retries (mqstore/consumer/retry.py, docs/retry.md): a group consumer also reads its group's retry topic
`%RETRY%<group>` (alternating with its topic's queues) and presents the retries of its topic with their original
topic; `nack(message)` sends a message back to it, or to `%DLQ%<group>` after `max_reconsume_times`, and the
consumer's position moves on as after any message (commit() then keeps it: the send-back holds the message).
"""

from __future__ import annotations

import time
from typing import Iterator

from mqstore.commitlog.errors import InvalidMessageError, StoreClosedError, StoreIOError
from mqstore.commitlog.message import StoredMessage
from mqstore.consumer import retry
from mqstore.consumer.offsets import ConsumerOffsets, validate_group
from mqstore.store.reads import GET_MAX_COUNT_LIMIT, GetStatus

CONSUME_FROM = ("first", "last")
POLL_MAX_COUNT_LIMIT = GET_MAX_COUNT_LIMIT  # messages one poll may return
POLL_TIMEOUT_MS_MAX = 24 * 3600 * 1000  # longest a poll may block
ITER_BATCH_MESSAGES = 256  # messages iteration reads at once
READ_ONLY_POLL_INTERVAL_S = 0.05  # how often a consumer of a read_only store looks for new entries

_CAUGHT_UP = frozenset((GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE,
                        GetStatus.NO_MATCHED_LOGIC_QUEUE))


def _wait_dispatched_past(store, after_offset: int, timeout_s: float) -> int | None:
    """Block until the store has dispatched past commitlog offset `after_offset`, for at most `timeout_s`.

    Returns the dispatched offset then (with `after_offset=-1` and no timeout: the dispatched offset now).
    A store opened read_only has no dispatch thread in this process: sleep up to READ_ONLY_POLL_INTERVAL_S
    and return None. Raises StoreError instead of waiting when dispatching stopped on an error (nothing new
    would come).
    """
    if store.read_only:
        if timeout_s > 0:
            time.sleep(min(timeout_s, READ_ONLY_POLL_INTERVAL_S))
        return None
    return store.wait_dispatched_past(after_offset, timeout_s)


def open_consumer(store, group: str | None, topic: str, queue_ids=None, *, tags=None,
                  consume_from: str = "first",
                  max_reconsume_times: int = retry.MAX_RECONSUME_TIMES_DEFAULT) -> "Consumer":
    """A consumer of `topic` (its `queue_ids`, or every queue it has and will have) for consumer `group`.

    `group=None` makes a consumer that starts from `consume_from` and commits nothing (for browsing).
    `tags` filters as `MessageStore.get` does: None or "*", a tag, "A || B" or a collection of tags.
    A group consumer also reads the group's retry topic; `max_reconsume_times` is how many times `nack` sends a
    message back to it before the dead-letter topic. A group whose retry or DLQ topic would be illegal (a name over
    120 characters) is refused.
    """
    retry.check_max_reconsume_times(max_reconsume_times)
    if group is not None:
        validate_group(group)
        retry.check_group_topics(group)
    if consume_from not in CONSUME_FROM:
        raise InvalidMessageError(f"consume_from must be one of {CONSUME_FROM}, got {consume_from!r}")
    if tags is not None and not isinstance(tags, (str, list, tuple, set, frozenset)):
        raise InvalidMessageError(f"tags must be None, a str or a collection of str, got {tags!r}")
    if queue_ids is not None:
        queue_ids = sorted(set(queue_ids))
        if not queue_ids or not all(type(queue_id) is int and queue_id >= 0 for queue_id in queue_ids):
            raise InvalidMessageError(f"queue_ids must be None or non-negative ints, got {queue_ids!r}")
    store.max_offset(topic, 0)  # checks the topic name and that the store is open
    offsets = None if group is None else ConsumerOffsets.of_store(store.root_dir)
    consumer = Consumer(store, group, topic, queue_ids, offsets=offsets, tags=tags, consume_from=consume_from)
    consumer.max_reconsume_times = max_reconsume_times
    if group is not None and not topic.startswith((retry.RETRY_TOPIC_PREFIX, retry.DLQ_TOPIC_PREFIX)):
        consumer._retry = Consumer(store, group, retry.retry_topic(group), None, offsets=offsets, tags=None,
                                   consume_from="first")
        retry.register_reader(store, group, consumer)
    return consumer


class Consumer:
    """Reads one topic for one group. Build it with `open_consumer` (or `MessageStore.consumer`)."""

    def __init__(self, store, group: str | None, topic: str, queue_ids: list[int] | None, *,
                 offsets: ConsumerOffsets | None, tags, consume_from: str):
        self.store = store
        self.group = group
        self.topic = topic
        self.tags = tags
        self._offsets = offsets
        self._fixed_queues = queue_ids is not None
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = offsets.offsets(topic, group) if offsets is not None else {}
        self._next_queue = 0  # where the next round-robin pass starts
        self._discovered_at: int | None = None  # dispatched offset when the topic's queues were last listed
        self._discovered_time = time.monotonic()  # when they were last listed (read_only stores)
        self._closed = False
        self._retry: Consumer | None = None  # the reader of the group's retry topic (open_consumer sets it)
        self._retry_first = False  # which of the two _fetch_all reads first, alternating
        self.max_reconsume_times = retry.MAX_RECONSUME_TIMES_DEFAULT
        if queue_ids is None:
            self._discovered_at = _wait_dispatched_past(store, -1, 0)
            queue_ids = store.topics().get(topic, [])
        for queue_id in queue_ids:
            self._add_queue(queue_id, consume_from)

    # --- positions -----------------------------------------------------------------------------------------
    @property
    def queue_ids(self) -> list[int]:
        return sorted(self._positions)

    def positions(self) -> dict[int, int]:
        """The next queue offset this consumer will read, by queue id."""
        return dict(self._positions)

    def committed(self) -> dict[int, int]:
        """The group's committed offsets of this topic as last read or written, by queue id."""
        return dict(self._committed)

    def seek(self, queue_id: int, offset: int) -> None:
        """Read `queue_id` from `offset` next (a commit still never moves the stored offset back)."""
        if queue_id not in self._positions:
            raise InvalidMessageError(f"queue {queue_id} is not one of this consumer's {self.queue_ids}")
        if type(offset) is not int or offset < 0:
            raise InvalidMessageError(f"offset must be a non-negative int, got {offset!r}")
        self._positions[queue_id] = offset

    def lag(self) -> dict[int, int]:
        """Entries each queue holds past this consumer's position (tag filtering not considered)."""
        return {queue_id: max(0, self.store.max_offset(self.topic, queue_id) - position)
                for queue_id, position in sorted(self._positions.items())}

    def _add_queue(self, queue_id: int, consume_from: str) -> None:
        position = self._committed.get(queue_id)
        if position is None:
            if consume_from == "last":
                position = self.store.max_offset(self.topic, queue_id)
            else:
                position = self.store.min_offset(self.topic, queue_id)
        self._positions[queue_id] = position

    def _discover_queues(self, seen: int | None, *, force: bool = False) -> bool:
        """Pick up queues of the topic that appeared since (read from their start); True if there were any.

        Only dispatching creates queues, so the topic is looked at again only once the dispatched offset
        `seen` moved; for a read_only store (`seen` None) at most every READ_ONLY_POLL_INTERVAL_S, or `force`.
        """
        if self._fixed_queues:
            return False
        if seen is not None:
            if seen == self._discovered_at and not force:
                return False
            self._discovered_at = seen
        else:
            now = time.monotonic()
            if now - self._discovered_time < READ_ONLY_POLL_INTERVAL_S and not force:
                return False
            self._discovered_time = now
        new = [q for q in self.store.topics().get(self.topic, []) if q not in self._positions]
        for queue_id in new:
            self._add_queue(queue_id, "first")
        return bool(new)

    # --- reading -------------------------------------------------------------------------------------------
    def poll(self, max_count: int = 32, timeout_ms: int = 0) -> list[StoredMessage]:
        """Up to `max_count` messages from the positions; when none are there, wait up to `timeout_ms` for some.

        Returns an empty list when the wait ended with nothing new. Positions advance past what is returned
        (and past entries the tag filter skipped).
        """
        self._check_open()
        if type(max_count) is not int or not 1 <= max_count <= POLL_MAX_COUNT_LIMIT:
            raise InvalidMessageError(f"max_count must be an int in 1..{POLL_MAX_COUNT_LIMIT}, got {max_count!r}")
        if type(timeout_ms) is not int or not 0 <= timeout_ms <= POLL_TIMEOUT_MS_MAX:
            raise InvalidMessageError(f"timeout_ms must be an int in 0..{POLL_TIMEOUT_MS_MAX}, got {timeout_ms!r}")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            seen = _wait_dispatched_past(self.store, -1, 0)  # what was dispatched before this look
            self._discover_all(seen)
            found, updates, more = self._fetch_all(max_count)
            for reader, next_positions in updates:
                reader._positions.update(next_positions)
            if found:
                return [message for message, _ in found]
            if more:
                continue  # entries were skipped by the filter or a position corrected: look again at once
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            _wait_dispatched_past(self.store, -1 if seen is None else seen, remaining)

    def __iter__(self) -> Iterator[StoredMessage]:
        """Every message from the positions up to the queues' ends now (it does not wait for new ones).

        A message's position is advanced before it is yielded: commit() after a `break` keeps what was seen.
        """
        while True:
            self._check_open()
            self._discover_all(_wait_dispatched_past(self.store, -1, 0))
            found, updates, more = self._fetch_all(ITER_BATCH_MESSAGES)
            for message, reader in found:
                reader._positions[message.queue_id] = message.queue_offset + 1
                yield message
            for reader, next_positions in updates:
                reader._positions.update(next_positions)
            if not found and not more and not self._discover_all(None, force=True):
                return

    def _discover_all(self, seen: int | None, *, force: bool = False) -> bool:
        """`_discover_queues` of the topic and of the retry topic."""
        found = self._discover_queues(seen, force=force)
        return (self._retry is not None and self._retry._discover_queues(seen, force=force)) or found

    def _fetch_all(self, max_count: int) -> tuple[list[tuple[StoredMessage, "Consumer"]], list, bool]:
        """`_fetch` of the topic and of the retry topic, which goes first alternating, changing nothing.

        Returns ([(message, the consumer whose position it moves)], [(that consumer, its next positions)], more).
        Retried messages are presented with their original topic; those of other topics of the group are skipped.
        """
        readers = [self] if self._retry is None else [self, self._retry][::-1 if self._retry_first else 1]
        self._retry_first = not self._retry_first
        found: list[tuple[StoredMessage, Consumer]] = []
        updates, more = [], False
        for reader in readers:
            budget = max_count - len(found)
            if budget == 0:
                return found, updates, True
            messages, next_positions, reader_more = reader._fetch(budget)
            if reader is not self:
                messages = [message for message in map(retry.presented, messages) if message.topic == self.topic]
            found.extend((message, reader) for message in messages)
            updates.append((reader, next_positions))
            more = more or reader_more
        return found, updates, more

    def _fetch(self, max_count: int) -> tuple[list[StoredMessage], dict[int, int], bool]:
        """One round-robin pass over the queues, changing nothing.

        Returns (messages, the position of each queue read after it, whether a queue may have more right now).
        """
        queue_ids = sorted(self._positions)
        if not queue_ids:
            return [], {}, False
        start = self._next_queue % len(queue_ids)
        self._next_queue = start + 1
        messages: list[StoredMessage] = []
        next_positions: dict[int, int] = {}
        more = False
        for queue_id in queue_ids[start:] + queue_ids[:start]:
            budget = max_count - len(messages)
            if budget == 0:
                more = True
                break
            position = self._positions[queue_id]
            result = self.store.get(self.topic, queue_id, position, max_count=budget, tags=self.tags)
            if result.status in _CAUGHT_UP:
                continue
            messages.extend(result.messages)
            if result.next_offset != position:
                next_positions[queue_id] = result.next_offset
                more = more or result.next_offset < result.max_offset
        return messages, next_positions, more

    # --- committing ----------------------------------------------------------------------------------------
    def commit(self) -> dict[int, int]:
        """Store the positions as the group's committed offsets (never moving one back); returns them.

        A consumer without a group commits nothing and returns its positions.
        """
        self._check_open()
        if self._offsets is None:
            return self.positions()
        stored = self._offsets.commit(self.topic, self.group, dict(self._positions))
        self._committed = {queue_id: offset for queue_id, offset in stored.items()}
        if self._retry is not None and self._retry._positions:
            positions = retry.lowest_retry_positions(self.store, self.group, self._retry._positions)
            self._retry._committed = self._offsets.commit(self._retry.topic, self.group, positions)
        return self.committed()

    def retry_positions(self) -> dict[int, int]:
        """The next queue offset this consumer will read in its group's retry topic (empty: it reads none)."""
        return {} if self._retry is None else self._retry.positions()

    def retry_committed(self) -> dict[int, int]:
        """The group's committed offsets of its retry topic as this consumer last read or wrote them."""
        return {} if self._retry is None else self._retry.committed()

    # --- retries -------------------------------------------------------------------------------------------
    def nack(self, message: StoredMessage, delay_level: int = 0):
        """Send back a message this consumer failed: to the group's retry topic with delay level `delay_level`
        (0: 3 + its reconsume times), or to its dead-letter topic after `max_reconsume_times` sends or with a
        `delay_level` < 0 (mqstore/consumer/retry.py). Returns the PutResult of the copy; a refused one
        (DISK_FULL, ...) raises StoreIOError: then do not commit past the message.
        """
        self._check_open()
        if self.group is None:
            raise InvalidMessageError("a consumer without a group cannot nack: open it with a group")
        result, _ = retry.send_back(self.store, self.group, message, delay_level, self.max_reconsume_times)
        if result.status not in retry.STORED:
            raise StoreIOError(f"the send-back of the message at {message.commitlog_offset} was refused: "
                               f"{result.status.name}")
        return result

    def dead_letters(self, max_count: int = 32, start: int = 0) -> list[StoredMessage]:
        """Up to `max_count` messages of the group's dead-letter topic from queue offset `start`, each presented
        with its original topic (read only: the DLQ has no committed offsets here)."""
        self._check_open()
        if self.group is None:
            raise InvalidMessageError("a consumer without a group has no dead letters")
        return retry.dead_letters(self.store, self.group, max_count, start)

    def replay(self, message: StoredMessage, queue_id: int = 0):
        """Put a dead letter (from `dead_letters`) back on its original topic, queue `queue_id`, with its header
        fields and reconsume times 0 (retry.replay); its PutResult."""
        self._check_open()
        return retry.replay(self.store, message, queue_id)

    def close(self) -> None:
        """Stop using the consumer. Nothing is committed: call commit() first to keep the positions."""
        self._closed = True
        if self._retry is not None:
            retry.unregister_reader(self.store, self.group, self)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the consumer of {self.topic} for group {self.group} is closed")

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer(group={self.group!r}, topic={self.topic!r}, positions={self._positions})"
