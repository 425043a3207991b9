"""The read side of MessageStore (a mixin): get, read_at, queue offsets and times, topics, with RocketMQ's
GetStatus values. It needs the store's `_commitlog`, `_queues`, `read_only`, `_follows_queues`, `_tier_reader`
and `_check_open`.

With a tier (mqstore/tier/reader.py) the log as reads see it starts at the tier's start, when the tier holds the
history below the local log (`_read_log_min`): records below the local log's first segment and at or above that
start are read from the tier, the rest from local disk (`_read_records`, `_read_record`), and the queues' minimum
offsets follow that start, not the local log's. Below it the statuses are RocketMQ's (OFFSET_TOO_SMALL,
MESSAGE_WAS_REMOVING), as below the local log's start without a tier. The common get of local records takes the
same path as without a tier (one comparison with the local log's start).
"""

from __future__ import annotations

import enum
import time
from typing import NamedTuple

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import validate_topic
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError, StoreIOError
from mqstore.commitlog.message import StoredMessage
from mqstore.consumequeue import format as cqf

GET_MAX_COUNT_LIMIT = 65_536  # messages one get() may return
GET_FILTER_SCAN_ENTRIES_MIN = 800  # queue entries a filtered get() examines at least (RocketMQ: 16000 bytes)
# A read_only store's get() looks at the log's directory (a stat, a listing when it changed) at most this often to
# see the segments the writer's retention deleted: a deletion shows in a get within this bound, and at once in
# min_offset(), max_offset() and the other reads. Until then the deleted segment's mapping stays valid (a mapping
# outlives the unlink), so such a get returns the records as they were, never unmapped bytes; RocketMQ's own
# readers do the same while they hold a MappedFile that retention destroys. New segments need no look: a read past
# the last mapped one lists the directory. Decision 0048.
GET_LOG_FOLLOW_INTERVAL_NS = 1_000_000


class GetStatus(enum.Enum):
    """The outcome of a get, with RocketMQ's names and meanings."""

    FOUND = "FOUND"  # messages returned
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries examined, none matched the tag filter
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"  # entries point below the log's minimum (retention)
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # the queue has no entry file for that offset
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max_offset
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max_offset: caught up, nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min_offset: those entries were deleted
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # no such (topic, queue_id) in this store
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue exists and is empty


class GetResult(NamedTuple):
    """Messages read from one queue. `next_offset` is where the next get should start."""

    status: GetStatus
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


_new_tuple = tuple.__new__  # a GetResult made without NamedTuple's Python-level __new__ (the common get)
_FOUND = GetStatus.FOUND


class Reads:
    """get() and the other reads of a MessageStore."""

    _log_followed_ns = None  # when a read_only store's get() last looked at the log's directory (monotonic)
    _tier_reader = None  # the store's TierReader, or None without a tier

    def _queue(self, topic, queue_id, *, from_get: bool = False):
        """The ConsumeQueue of (topic, queue_id) or None; bad names and ids raise InvalidMessageError. A get
        (`from_get`) of a read_only store follows the log's directory at most every GET_LOG_FOLLOW_INTERVAL_NS."""
        if type(queue_id) is not int or queue_id < 0:
            raise InvalidMessageError(f"queue_id must be a non-negative int, got {queue_id!r}")
        queue = self._queues.get(topic, queue_id) if topic.__class__ is str else None
        if queue is None:
            validate_topic(topic)  # known queues have valid names: only unknown ones need the check
        if self._follows_queues:  # written by another process (the writer, or this store's dispatch process)
            if queue is None:
                self._queues.load()
                queue = self._queues.get(topic, queue_id)
            if queue is not None:
                queue.refresh()
                log_ = self._commitlog
                if self.read_only and self._log_follow_due(from_get):
                    log_.segments.load_if_changed()  # follow the writer's retention: its minimum, as its queues do
                queue.follow_log_min(self._read_log_min())
        return queue

    # --- the log as reads see it: local disk, and the tier below it ----------------------------------------
    def _read_log_min(self) -> int:
        """The first commitlog offset reads reach: the tier's start when the tier holds the log's history below the
        local log, else the local log's first offset. 0 while a tier whose manifest this store could never read is
        down (nothing is taken for removed then: reads of it raise StoreIOError until it answers)."""
        local_min = self._commitlog.min_offset()
        tier = self._tier_reader
        if tier is None:
            return local_min
        try:
            start = tier.history_start(local_min)
        except StoreIOError:  # logged by the reader
            return 0
        return local_min if start is None else min(start, local_min)

    def _read_records(self, commitlog_offsets: list[int], sizes: list[int], queue=None, span=None
                      ) -> list[StoredMessage]:
        """CommitLog.read_many over local disk and the tier: the records below the local log's start come from
        the tier (in order, each run of them in one TierReader.read_many)."""
        log_ = self._commitlog
        tier = self._tier_reader
        if tier is None or not commitlog_offsets:
            return log_.read_many(commitlog_offsets, sizes, queue, span)
        local_min = log_.min_offset()
        if (span[0] if span is not None else min(commitlog_offsets)) >= local_min:
            try:
                return log_.read_many(commitlog_offsets, sizes, queue, span)
            except InvalidMessageError:
                if log_.min_offset() == local_min:
                    raise
                local_min = log_.min_offset()  # retention removed segments meanwhile: they are in the tier
        found: list[StoredMessage] = []
        start = 0
        while start < len(commitlog_offsets):
            below = commitlog_offsets[start] < local_min
            stop = start + 1
            while stop < len(commitlog_offsets) and (commitlog_offsets[stop] < local_min) == below:
                stop += 1
            part = None if queue is None else (queue[0], queue[1], queue[2][start:stop])
            if below:
                found.extend(tier.read_many(commitlog_offsets[start:stop], sizes[start:stop], part))
            else:
                try:
                    found.extend(log_.read_many(commitlog_offsets[start:stop], sizes[start:stop], part))
                except InvalidMessageError:
                    if log_.min_offset() == local_min:
                        raise
                    local_min = log_.min_offset()  # retention removed segments meanwhile: split the rest again
                    continue  # bounded: the local log's start only moves up, a segment at a time
            start = stop
        return found

    def _read_record(self, commitlog_offset: int) -> StoredMessage:
        """CommitLog.read over local disk and the tier (the offset below the local log's start: the tier)."""
        log_ = self._commitlog
        tier = self._tier_reader
        if tier is not None and commitlog_offset < log_.min_offset():
            return tier.read(commitlog_offset)
        try:
            return log_.read(commitlog_offset)
        except InvalidMessageError:
            if tier is None or commitlog_offset >= log_.min_offset():
                raise
            return tier.read(commitlog_offset)  # retention removed its segment meanwhile: it is in the tier

    def _log_follow_due(self, from_get: bool) -> bool:
        now = time.monotonic_ns()
        last = self._log_followed_ns
        if from_get and last is not None and now - last < GET_LOG_FOLLOW_INTERVAL_NS:
            return False
        self._log_followed_ns = now
        return True

    def get(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None) -> GetResult:
        """Up to `max_count` messages of one queue from entry `offset`, optionally only those with given tags.

        `tags` is None or "*" for all, a tag, "A || B", or a collection of tags.
        """
        self._check_open()
        if type(offset) is not int:
            raise InvalidMessageError(f"offset must be an int, got {offset!r}")
        if type(max_count) is not int or not 1 <= max_count <= GET_MAX_COUNT_LIMIT:
            raise InvalidMessageError(f"max_count must be an int in 1..{GET_MAX_COUNT_LIMIT}, got {max_count!r}")
        wanted = None if tags is None else _parse_tags(tags)
        queue = self._queue(topic, queue_id, from_get=True)
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        low, high = queue.min_offset, queue.max_offset
        if high == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, low, high)
        if offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, high)
        if offset == high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, low, high)
        if offset > high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], low if low == 0 else high, low, high)
        if not wanted:  # the common case, in fewest steps: every entry's record is still in the log
            offsets, sizes, offset_min, offset_max = queue.read_lists(offset, max_count)
            if offsets and offset_min >= self._commitlog.min_offset():
                entries = range(offset, offset + len(offsets))
                try:
                    found = self._commitlog.read_many(offsets, sizes, (queue.topic, queue.queue_id, entries),
                                                      (offset_min, offset_max))
                    return _new_tuple(GetResult, (_FOUND, found, offset + len(found), low, high))  # GetResult(...)
                except InvalidMessageError:
                    if self._tier_reader is None:
                        raise
                    # retention removed their segment meanwhile: the tier has it (the path below reads it there)
        scan = max(max_count, GET_FILTER_SCAN_ENTRIES_MIN) if wanted else max_count
        units = queue.read(offset, scan)
        if not len(units):
            return GetResult(GetStatus.OFFSET_FOUND_NULL, [], offset + 1, low, high)
        return self._collect(queue, offset, units, max_count, wanted, low, high)

    def _collect(self, queue, offset, units, max_count, wanted, low, high) -> GetResult:
        log_min = self._read_log_min()
        if wanted:
            codes = np.array([fmt.tags_code(tag) for tag in wanted], dtype=np.int64)
            rows = np.flatnonzero(np.isin(units["tags_code"], codes) & (units["commitlog_offset"] >= log_min))
        else:
            rows = np.flatnonzero(units["commitlog_offset"] >= log_min)
        removed = len(units) - len(rows) if not wanted else int(np.count_nonzero(units["commitlog_offset"] < log_min))
        examined = len(units)
        messages: list[StoredMessage] = []
        topic, queue_id = queue.topic, queue.queue_id
        while len(rows):
            take = rows[: max_count - len(messages)] if not wanted else rows[: max(max_count - len(messages), 32)]
            rows = rows[len(take):]
            take_rows = take.tolist()
            found = self._read_records(units["commitlog_offset"][take].tolist(), units["size"][take].tolist(),
                                       (topic, queue_id, [offset + row for row in take_rows]))
            if not wanted and len(found) == max_count - len(messages):
                messages.extend(found)  # every record checked against its entry by read_many
                examined = take_rows[-1] + 1
                break
            for row, message in zip(take_rows, found):
                if wanted and message.tags not in wanted:
                    continue
                messages.append(message)
                if len(messages) == max_count:
                    examined = row + 1
                    break
            if len(messages) == max_count:
                break
        if messages:
            status = GetStatus.FOUND
        elif removed:
            status = GetStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, messages, offset + examined, low, high)

    def read_at(self, commitlog_offset: int) -> StoredMessage:
        """The message whose record starts at `commitlog_offset`."""
        self._check_open()
        if type(commitlog_offset) is not int:
            raise InvalidMessageError(f"commitlog_offset must be an int, got {commitlog_offset!r}")
        try:
            return self._read_record(commitlog_offset)
        except CorruptionError as exc:
            if exc.not_a_record:
                raise InvalidMessageError(f"no message record starts at commitlog offset {commitlog_offset}") \
                    from exc
            raise

    def queue_units(self, topic: str, queue_id: int, offset: int, count: int) -> np.ndarray:
        """A copy of the ConsumeQueue units [offset, offset + count) that exist (consumequeue/format.py's dtype):
        for services that read tag codes (mqstore/schedule: due times)."""
        self._check_open()
        queue = self._queue(topic, queue_id)
        return queue.read(offset, count) if queue is not None else cqf.make_units([], [], [])

    def queue_values(self, topic: str, queue_id: int, offset: int, max_count: int, number_name: bytes,
                     text_name: bytes, out: tuple | None = None):
        """For a service that reads one queue in bulk (mqstore/timer: TIMER_OUT_MS and REAL_TOPIC): (commitlog
        offsets, sizes, rows) of up to `max_count` entries from `offset`, rows as commitlog/record_values.py gives
        them, every record checked as get() checks it. None when `offset` is not an entry, or the records are not
        all in the local log (the tier's, or removed meanwhile): get() then gives the status or the messages.
        With `out` = (offsets, sizes, rows), int64 arrays of at least max_count entries (rows: max_count x
        COLUMNS), the values are written to their first entries and views of those returned: with the compiled
        core nothing is allocated per batch and the interpreter lock is kept throughout (timer_link.c says why)."""
        self._check_open()
        queue = self._queue(topic, queue_id)
        if queue is None or not queue.min_offset <= offset < queue.max_offset:
            return None
        if out is None:
            units = queue.read(offset, max_count)
            if not len(units):
                return None
            offsets, sizes = units["commitlog_offset"], units["size"]
            span = (int(offsets.min()), int(offsets.max()))
            rows = None
        else:
            count, low, high = queue.read_arrays(offset, out[0][:max_count], out[1][:max_count])
            if not count:
                return None
            offsets, sizes, rows, span = out[0][:count], out[1][:count], out[2][:count], (low, high)
        log_ = self._commitlog
        if span[0] < log_.min_offset():
            return None
        try:
            rows = log_.read_values(offsets, sizes, number_name, text_name, (queue.topic, queue.queue_id, offset),
                                    span, out=rows)
        except InvalidMessageError:
            if span[0] >= log_.min_offset():
                raise
            return None  # retention removed their segment meanwhile
        return offsets, sizes, rows

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        queue = self._queue(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of this queue will get (= the count of entries ever written)."""
        self._check_open()
        queue = self._queue(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after `timestamp_ms` (max_offset if none)."""
        self._check_open()
        queue = self._queue(topic, queue_id)
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = queue.read(middle, 1)
            if self._read_record(int(unit["commitlog_offset"][0])).store_timestamp_ms < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def topics(self) -> dict[str, list[int]]:
        """Every topic with the queue ids it has (dispatched queues only)."""
        self._check_open()
        if self._follows_queues:
            self._queues.load()
        return self._queues.topics()


def _parse_tags(tags) -> frozenset[str] | None:
    if tags is None:
        return None
    if isinstance(tags, str):
        parts = [part.strip() for part in tags.split("||")]
    else:
        try:
            parts = list(tags)
        except TypeError as exc:
            raise InvalidMessageError(f"tags must be None, a str or a collection of str, got {tags!r}") from exc
        if not all(isinstance(part, str) for part in parts):
            raise InvalidMessageError(f"tags must be str, got {tags!r}")
    parts = [part for part in parts if part]
    if not parts or "*" in parts:
        return None
    return frozenset(parts)
