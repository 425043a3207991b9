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
from dataclasses import dataclass, field
from typing import Protocol

from commitlog import format as fmt
from commitlog.errors import CorruptionError

log = logging.getLogger(__name__)

DISPATCH_BATCH_RECORDS_MAX = 8192  # records handed to the dispatchers at once
DISPATCH_IDLE_WAIT_S = 0.001  # how long the loop sleeps when it has caught up and nobody wakes it
DISPATCH_ERROR_BACKOFF_S = 0.5

_TAGS_NEEDLE = b"TAGS\x01"
_KEYS_NEEDLE = b"KEYS\x01"
_UNIQ_NEEDLE = b"UNIQ_KEY\x01"


@dataclass(slots=True)
class DispatchBatch:
    """Consecutive message records of the log, as parallel columns (RocketMQ's DispatchRequest, batched).

    Transaction-prepared and rolled-back records are in the batch too (with their sys_flag); dispatchers
    that must skip them look at `sys_flags`. `end_offset` is the log offset right after the batch, blanks
    included: once the batch is dispatched, everything below it is.
    """

    commitlog_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    tags_codes: list[int] = field(default_factory=list)
    store_timestamps_ms: list[int] = field(default_factory=list)
    sys_flags: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)  # raw KEYS property (space-separated), or None
    uniq_keys: list[bytes | None] = field(default_factory=list)  # raw UNIQ_KEY property, or None
    start_offset: int = 0
    end_offset: int = 0

    def __len__(self) -> int:
        return len(self.commitlog_offsets)


class Dispatcher(Protocol):
    """Something built from the log. Called from the dispatch thread only, in log order."""

    def dispatch(self, batch: DispatchBatch) -> None:
        """Take in every record of `batch`; records already taken in before (a replay) must be ignored."""


class LogReader(Protocol):
    """What the dispatch loop needs of a CommitLog."""

    def readable_end(self) -> int: ...

    def segment_at(self, commitlog_offset: int): ...


def parse_records(log: LogReader, start: int, end: int, *, check_crc: bool = False,
                  records_max: int = DISPATCH_BATCH_RECORDS_MAX) -> DispatchBatch:
    """Decode the records of [start, end) into a batch, stopping after `records_max` records.

    `start` must be a record boundary. Crosses segment ends at blanks. Raises CorruptionError at the first
    invalid record: the log is written by one writer and read only up to its published end, so anything
    invalid below that end is real corruption.
    """
    batch = DispatchBatch(start_offset=start, end_offset=start)
    offsets, sizes, topics = batch.commitlog_offsets, batch.sizes, batch.topics
    queue_ids, queue_offsets, tags_codes = batch.queue_ids, batch.queue_offsets, batch.tags_codes
    timestamps, sys_flags, keys, uniq_keys = batch.store_timestamps_ms, batch.sys_flags, batch.keys, batch.uniq_keys
    header = _DISPATCH_HEADER.unpack_from
    i16 = fmt.I16.unpack_from
    topic_cache: dict[bytes, str] = {}
    tags_cache: dict[bytes, int] = {}
    offset = start
    count = 0
    while offset < end and count < records_max:
        segment = log.segment_at(offset)
        mv = segment.view
        base = segment.base_offset
        segment_end = min(end, base + segment.size_bytes)
        path = segment.path
        pos = offset - base
        limit = segment_end - base
        while pos < limit and count < records_max:
            remaining = segment.size_bytes - pos
            if remaining < fmt.HEADER_SIZE + 4:
                size, magic = fmt.peek(mv, pos, remaining)
                if magic == fmt.BLANK_MAGIC_CODE and size == remaining:
                    pos += remaining
                    break
                _raise_invalid(mv, pos, remaining, base + pos, path)
            size, magic, queue_id, queue_offset, physical, sys_flag, store_ts, body_length = header(mv, pos)
            if magic != _MAGIC_V1 or sys_flag & _V6_FLAGS:
                if magic == fmt.BLANK_MAGIC_CODE and size == remaining:
                    pos += remaining
                    break
                if magic == fmt.MESSAGE_MAGIC_CODE_V2 or (magic == _MAGIC_V1 and sys_flag & _V6_FLAGS):
                    size, fields = _parse_general(mv, pos, remaining, base + pos, path, check_crc)
                    (topic, queue_id, queue_offset, sys_flag, store_ts, properties) = fields
                    pos = _append(batch, base + pos, size, topic, queue_id, queue_offset, sys_flag, store_ts,
                                  properties, tags_cache) - base
                    count += 1
                    continue
                _raise_invalid(mv, pos, remaining, base + pos, path)
            body_end = pos + 88 + body_length
            record_end = pos + size
            if not (_RECORD_SIZE_MIN <= size <= remaining and 0 <= body_length and body_end + 3 <= record_end
                    and physical == base + pos):
                _raise_invalid(mv, pos, remaining, base + pos, path)
            topic_length = mv[body_end]
            properties_at = body_end + 1 + topic_length
            properties_length = i16(mv, properties_at)[0] if properties_at + 2 <= record_end else -1
            if topic_length == 0 or properties_at + 2 + properties_length != record_end or properties_length < 0:
                _raise_invalid(mv, pos, remaining, base + pos, path)
            if check_crc:
                fmt.check_body_crc(mv, fmt.locate(mv, pos, remaining, base + pos, path=path), pos, base + pos,
                                   path=path)
            topic_raw = bytes(mv[body_end + 1 : properties_at])
            topic = topic_cache.get(topic_raw)
            if topic is None:
                topic = _decode_topic(topic_raw, path, base + pos)
                topic_cache[topic_raw] = topic
            offsets.append(base + pos)
            sizes.append(size)
            topics.append(topic)
            queue_ids.append(queue_id)
            queue_offsets.append(queue_offset)
            timestamps.append(store_ts)
            sys_flags.append(sys_flag)
            if properties_length:
                properties = bytes(mv[properties_at + 2 : record_end])
                tag = fmt.property_value(properties, b"TAGS") if _TAGS_NEEDLE in properties else None
                if tag:
                    code = tags_cache.get(tag)
                    if code is None:
                        code = tags_cache[tag] = fmt.tags_code(tag.decode("utf-8", "replace"))
                    tags_codes.append(code)
                else:
                    tags_codes.append(0)
                keys.append(fmt.property_value(properties, b"KEYS") if _KEYS_NEEDLE in properties else None)
                uniq_keys.append(fmt.property_value(properties, b"UNIQ_KEY") if _UNIQ_NEEDLE in properties
                                 else None)
            else:
                tags_codes.append(0)
                keys.append(None)
                uniq_keys.append(None)
            pos = record_end
            count += 1
        offset = base + pos
    batch.end_offset = offset
    return batch


_DISPATCH_HEADER = fmt.struct.Struct(">iI4xi4xqqi16xq20xi")
assert _DISPATCH_HEADER.size == fmt.HEADER_SIZE
_MAGIC_V1 = fmt.MESSAGE_MAGIC_CODE
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_RECORD_SIZE_MIN = fmt.RECORD_SIZE_MIN


def _decode_topic(raw: bytes, path, offset) -> str:
    if not raw.isascii():
        raise CorruptionError(f"topic is not ASCII: {raw!r}", path=path, offset=offset, rule="3")
    return raw.decode("ascii")


def _raise_invalid(mv, pos, remaining, commitlog_offset, path):
    """Raise the precise CorruptionError for a record the fast path refused."""
    size, magic = fmt.peek(mv, pos, remaining)
    if size == 0 and magic == 0:
        raise CorruptionError("zero bytes inside the written part of the log", path=path, offset=commitlog_offset,
                              rule="1")
    if magic == fmt.BLANK_MAGIC_CODE:
        raise CorruptionError(f"end-of-segment blank of {size} bytes with {remaining} left", path=path,
                              offset=commitlog_offset, rule="blank")
    fmt.locate(mv, pos, remaining, commitlog_offset, path=path)
    raise AssertionError("locate() accepted a record the fast path refused")


def _parse_general(mv, pos, remaining, commitlog_offset, path, check_crc):
    layout = fmt.locate(mv, pos, remaining, commitlog_offset, path=path)
    if check_crc:
        fmt.check_body_crc(mv, layout, pos, commitlog_offset, path=path)
    queue_id = fmt.I32.unpack_from(mv, pos + fmt.OFFSET_QUEUE_ID)[0]
    queue_offset = fmt.struct.unpack_from(">q", mv, pos + fmt.OFFSET_QUEUE_OFFSET)[0]
    store_at = layout.store_host[0]
    store_ts = fmt.struct.unpack_from(">q", mv, store_at - 8)[0]
    topic = _decode_topic(bytes(mv[layout.topic_start : layout.topic_start + layout.topic_length]), path,
                          commitlog_offset)
    properties = bytes(mv[layout.properties_start : layout.properties_start + layout.properties_length])
    return layout.size, (topic, queue_id, queue_offset, layout.sys_flag, store_ts, properties)


def _append(batch, offset, size, topic, queue_id, queue_offset, sys_flag, store_ts, properties, tags_cache):
    batch.commitlog_offsets.append(offset)
    batch.sizes.append(size)
    batch.topics.append(topic)
    batch.queue_ids.append(queue_id)
    batch.queue_offsets.append(queue_offset)
    batch.store_timestamps_ms.append(store_ts)
    batch.sys_flags.append(sys_flag)
    tag = fmt.property_value(properties, b"TAGS")
    batch.tags_codes.append(fmt.tags_code(tag.decode("utf-8", "replace")) if tag else 0)
    batch.keys.append(fmt.property_value(properties, b"KEYS"))
    batch.uniq_keys.append(fmt.property_value(properties, b"UNIQ_KEY"))
    return offset + size


class DispatchService:
    """The dispatch thread: tails the log from `dispatched_offset` and feeds every dispatcher.

    `wake()` is called by the writer after an append; `wait_dispatched()` blocks until the log's end at the
    time of the call has been dispatched. An error stops dispatching (it is kept in `error` and logged);
    nothing past the bad record is ever dispatched.
    """

    def __init__(self, log: LogReader, dispatchers: list[Dispatcher], start_offset: int, *,
                 check_crc: bool = False, name: str = "mqstore-dispatch"):
        self._log = log
        self._dispatchers = list(dispatchers)
        self._check_crc = check_crc
        self.dispatched_offset = start_offset
        self.error: BaseException | None = None
        self.idle = False
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.dispatched_records = 0

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        if self.idle:
            self._wake.set()

    def dispatch_available(self) -> int:
        """Dispatch everything up to the log's current end in the calling thread; returns records done."""
        done = 0
        end = self._log.readable_end()
        while self.dispatched_offset < end:
            batch = parse_records(self._log, self.dispatched_offset, end, check_crc=self._check_crc)
            if batch.end_offset == self.dispatched_offset:
                break
            for dispatcher in self._dispatchers:
                dispatcher.dispatch(batch)
            done += len(batch)
            with self._progress:
                self.dispatched_offset = batch.end_offset
                self.dispatched_records += len(batch)
                self._progress.notify_all()
        return done

    def _run(self) -> None:
        while not self._stopping:
            try:
                done = self.dispatch_available()
            except BaseException as exc:  # noqa: BLE001 - kept and reported; the thread must not die silently
                log.exception("dispatch stopped at offset %d", self.dispatched_offset)
                with self._progress:
                    self.error = exc
                    self._progress.notify_all()
                return
            if not done:
                self.idle = True
                self._wake.wait(DISPATCH_IDLE_WAIT_S)
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

    def stop(self) -> None:
        """Stop the thread after its current batch (what is not yet dispatched stays for the next start)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
