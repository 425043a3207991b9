"""The CommitLog: one append-only log of every message, in segments (RocketMQ's CommitLog).

Passive: it checks and encodes messages (`prepare`), appends them under one writer lock (`append`,
`append_records`), reads them back (`read`), and knows its written end. Dispatching, flushing on a schedule
and recovery policy live elsewhere; they call in here.

Queue offsets are assigned here, under the writer lock, from `queue_offsets` (RocketMQ's topicQueueTable):
dense per (topic, queue_id), starting at 0. The owner restores that table on open.

Disk use follows the data: segments are made at their full length but sparse, and with `preallocate` the writer
reserves disk blocks (posix_fallocate) just ahead of what it writes, a step of SPACE_RESERVE_STEP_BYTES and further
ahead as it goes on in a segment (`_reserve_ahead`), so a full disk fails an append (StoreIOError, ENOSPC) instead
of a later store into the mapping (SIGBUS). When the writer comes within `next_segment_lead_bytes` of its segment's
end, `near_end_listeners` are told (the owner has the next segment made then, not at open). Both happen on the
append's slow path, behind the one comparison with `_append_limit` that every append makes anyway
(docs/decisions/0014-disk-use-follows-the-data.md).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time

import numpy as np
from mqstore.commitlog import format as fmt
from mqstore.commitlog import native
from mqstore.commitlog.dispatch_batch import parse_records
from mqstore.commitlog.errors import (
    FlushFailedError,
    InvalidMessageError,
    SegmentWriteError,
    StoreClosedError,
    StoreIOError,
)
from mqstore.commitlog.mapped_file import PAGE_SIZE_BYTES, MappedFile, fsync_directory
from mqstore.commitlog.message import (
    Message,
    PutResult,
    PutStatus,
    StoredMessage,
    decode_message,
    decode_records,
    decode_records_native,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record_values import read_values
from mqstore.commitlog.segments import SegmentList
from mqstore.commitlog.unique_key import UNIQUE_KEY_HEX_DIGITS, UniqueKeyGenerator
from mqstore.commitlog.write_batch import Columns, PreparedRecord, append_columns, columns_from_records, prepare_columns

TOPIC_PATTERN = re.compile("[A-Za-z0-9_%|-]{1," + str(fmt.TOPIC_LENGTH_MAX) + "}")
FIND_END_BATCH_RECORDS = 65_536  # records decoded at once while looking for the end of the log
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MAX = 2**63 - 1  # BORNTIMESTAMP is a signed 64-bit field
DESCRIBED_TAIL_BYTES_MAX = 4096  # bytes of topic and properties above which a record is not described
# With `write_through`, records up to this size are encoded in a buffer and written with pwrite; larger ones are
# encoded in the mapping as always (their copy costs more than the page faults pwrite saves).
WRITE_THROUGH_RECORD_BYTES_MAX = 64 * 1024
# Disk blocks the writer reserves ahead of itself at a time (preallocate): a fresh store takes this much of the
# CommitLog's disk, and the put that crosses a step pays one posix_fallocate of it (bench/disk_reservation.py).
SPACE_RESERVE_STEP_BYTES = 4 * 1024 * 1024
# A writer that goes on into a segment reserves further ahead each time: as much again as it has reserved there
# beyond the first step, at most this much (docs/decisions/0045-batch-write-budget.md: each posix_fallocate can
# wait tens of milliseconds on the file system's journal, under the writer lock).
SPACE_RESERVE_AHEAD_MAX_BYTES = 64 * 1024 * 1024
# How near its segment's end the writer asks for the next segment (near_end_listeners); a quarter of the segment
# when that is less, so that small segments are not asked for at once.
NEXT_SEGMENT_LEAD_BYTES = 64 * 1024 * 1024
# The compiled pwrite of a whole buffer (commitlog/csrc/flushwait.c), for the write-through append; None: os.pwrite
_write_at = None if NATIVE is None else NATIVE.write_at

_RESERVED_PROPERTIES = frozenset((fmt.PROPERTY_TAGS, fmt.PROPERTY_KEYS, fmt.PROPERTY_RECORD_CRC))
_FORBIDDEN = ("\x01", "\x02")

_crc32 = fmt.crc32_small  # for inputs up to fmt.CRC_SMALL_BYTES_MAX (else fmt.crc32)
_CRC_SMALL = fmt.CRC_SMALL_BYTES_MAX
_time_ns = time.time_ns
_pack_header = fmt.HEADER_V1.pack_into
_MAGIC = fmt.MESSAGE_MAGIC_CODE


def validate_topic(topic) -> bytes:
    """The topic's ASCII bytes; InvalidMessageError unless it is 1-127 characters of [A-Za-z0-9_%|-]."""
    if not isinstance(topic, str):
        raise InvalidMessageError(f"topic must be a str, got {type(topic).__name__}")
    if not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidMessageError(
            f"topic {topic!r} must be 1 to {fmt.TOPIC_LENGTH_MAX} characters of A-Z a-z 0-9 _ % | -")
    return topic.encode("ascii")


def _check_text(what: str, value) -> str:
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be a str, got {type(value).__name__}")
    if "\x01" in value or "\x02" in value:
        raise InvalidMessageError(f"{what} must not contain the separator characters \\x01 or \\x02: {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 bytes stand for it
            raise InvalidMessageError(f"{what} is not encodable as UTF-8 (a lone surrogate at index {exc.start}): "
                                      f"{value!r}") from exc
    return value


def _properties_text(message: Message) -> str:
    """The PROPERTIES string of a message with tags, keys or user properties (the slow path of prepare)."""
    parts = []
    tags = message.tags
    if tags is not None:
        if not _check_text("tags", tags):
            raise InvalidMessageError("tags must be None or a non-empty str")
        parts.append(f"TAGS\x01{tags}\x02")
    keys = message.keys
    if keys:
        if isinstance(keys, (str, bytes)):
            raise InvalidMessageError("keys must be a sequence of str, not a single str")
        for key in keys:
            if not _check_text("a key", key) or " " in key:
                raise InvalidMessageError(f"a key must be a non-empty str without spaces: {key!r}")
        parts.append(f"KEYS\x01{' '.join(keys)}\x02")
    properties = message.properties
    if properties:
        if not isinstance(properties, dict):
            raise InvalidMessageError(f"properties must be a dict, got {type(properties).__name__}")
        for name, value in properties.items():
            if not _check_text("a property name", name):
                raise InvalidMessageError("a property name must not be empty")
            if name in _RESERVED_PROPERTIES:
                if name == fmt.PROPERTY_RECORD_CRC:
                    raise InvalidMessageError(f"property {name!r} is the store's record CRC")
                raise InvalidMessageError(f"property {name!r} is set through Message.{name.lower()}")
            _check_text(f"property {name!r}", value)
            parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)



def _reserve_ahead(segment, wanted: int) -> None:
    """Reserve `segment`'s disk up to at least `wanted` bytes, in whole SPACE_RESERVE_STEP_BYTES, and ahead of it as
    much again as the segment had reserved beyond its first step (at most SPACE_RESERVE_AHEAD_MAX_BYTES): 4, 8,
    16, 32, 64, 128, 196, 260 MiB ..., about 20 calls a GiB instead of 256, while a store with little data still
    takes one step. When the reservation ahead cannot be had (a nearly full disk) only `wanted` is reserved, so
    DISK_FULL comes when the bytes an append needs are missing, not earlier (StoreIOError then)."""
    step = SPACE_RESERVE_STEP_BYTES
    needed = -(-wanted // step) * step
    ahead = min(max(segment.reserved_bytes - step, 0) // step * step, SPACE_RESERVE_AHEAD_MAX_BYTES)
    if ahead:
        try:
            segment.reserve(needed + ahead)
            return
        except StoreIOError:
            pass  # the blocks ahead are an optimisation: try for what this append needs
    segment.reserve(needed)


class CommitLog:
    """Segments plus the writer's state: the written end and the queue offset table."""

    # A writer's rewrite of a message before it is prepared (mqstore/timer, mqstore/schedule: delayed messages onto
    # their topics), or None: the reference, run by `prepare`. The compiled put does the same rewrites itself once
    # rewrite_in_compiled_put is called, and leaves to `prepare` what it hands back (commitlog/csrc/put_rewrite.c).
    rewrite = None

    def __init__(self, directory: str, segment_size_bytes: int, *, writable: bool,
                 max_message_size_bytes: int, max_queues_per_topic: int,
                 born_host_raw: bytes, store_host_raw: bytes, preallocate: bool = True, salvage=None,
                 record_crc: bool = False, record_crc_from: int | None = None):
        assert len(born_host_raw) == len(store_host_raw) == fmt.HOST_V4_LENGTH
        self._appender = None  # the compiled put's copy of the writer's segment state (compiled_put), or None
        assert max_message_size_bytes + fmt.RECORD_SIZE_FIXED + fmt.TOPIC_LENGTH_MAX + fmt.PROPERTIES_LENGTH_MAX \
            + fmt.END_FILE_MIN_BLANK_LENGTH <= segment_size_bytes
        self.directory = directory
        self.segment_size_bytes = segment_size_bytes
        self.writable = writable
        self.max_message_size_bytes = max_message_size_bytes
        self.max_queues_per_topic = max_queues_per_topic
        self.born_host_raw = born_host_raw
        self.store_host_raw = store_host_raw
        self.record_crc = record_crc  # append writes the record-CRC property (format rule 6)
        self.record_crc_from = record_crc_from  # records from here on must carry one (None: none must)
        self._crc_suffix = fmt.RECORD_CRC_PLACEHOLDER if record_crc else b""
        self.reserve_space = preallocate and writable  # reserve disk blocks ahead of the writer (see the module doc)
        self.next_segment_lead_bytes = min(NEXT_SEGMENT_LEAD_BYTES, segment_size_bytes // 4)
        self._segment: MappedFile | None = None
        self._next_announced = False  # near_end_listeners were told about the current segment
        # The codec of the per-record byte work: the compiled core (commitlog.native) or None for the pure-Python
        # reference; chosen when the log is opened, so that tests can open one log with each.
        self.codec = native.NATIVE
        if writable:
            os.makedirs(directory, exist_ok=True)
        self.segments = SegmentList(directory, segment_size_bytes, writable=writable, preallocate=preallocate,
                                    salvage=salvage)
        self.queue_offsets: dict[tuple[str, int], int] = {}
        # The writer lock: with the compiled core, its WriterLock (threading.Lock's interface, and a try-acquire
        # that the store's compiled put entry calls from C; commitlog/csrc/put_entry.c).
        self.lock = threading.Lock() if getattr(self.codec, "WriterLock", None) is None else self.codec.WriterLock()
        self._topic_tails: dict[str, bytes] = {}
        self._end = self.segments.first_base_offset
        self._closed = False
        self._scratch = None  # with write_through: where single appends are encoded before their pwrite
        self._use_segment(None)
        # Called with the segment being written when the writer comes within next_segment_lead_bytes of its end
        # (once a segment), under the writer lock: the owner has the next segment made ahead of need then.
        self.near_end_listeners: list = []
        # When the owner sets a deque here, append() describes each record it writes to the dispatch thread
        # (commitlog.dispatch): a bounded deque that drops its oldest entries. A record whose topic and properties
        # take over DESCRIBED_TAIL_BYTES_MAX is not described (dispatch parses it): the deque keeps what it holds
        # alive.
        self._written_records = None
        self.segment_source = None  # optional callable(base_offset) -> MappedFile | None made ahead of need
        # Optional callable(MappedFile) given each segment the writer leaves at a roll, which must advise it for
        # reading again (MappedFile.advise_appending) in a thread of its own; without one the roll does it.
        self.segment_retirer = None
        # When True, the segment appends go to is advised for random access (MappedFile.advise_appending): a
        # put's page fault then fills that page only, not the kernel's read-around of several MiB.
        self.advise_random_appends = False
        # When True (the owner sets it where segments are not pre-faulted), batches (write_batch.append_columns)
        # are encoded into `batch_scratch` and written with pwrite, not copied into the mapping: a fresh page's
        # first write through a mapping is a page fault. See docs/decisions/0024-batches-written-with-pwrite.md.
        self.batch_write_through = False
        self.batch_scratch: bytearray | None = None
        self._unique_keys: UniqueKeyGenerator | None = None  # see the unique_keys property
        self.last_store_timestamp_ms = 0  # store time of the newest appended record
        self.flushed_position = 0  # everything below is on disk
        # When set (an int64 array shared with another process): the writer stores the readable end in its
        # element 0 each time the end moves, after the bytes below it are written (one aligned 8-byte store).
        self._end_word = None
        self.flushed_timestamp_ms = 0  # store time of the newest record below flushed_position
        # The first failed flush, kept under the flush lock by flush() and the compiled SYNC leader: see flush()
        self.flush_error: FlushFailedError | None = None
        # Held while flush() runs; a WriterLock with the compiled core, which its SYNC leader takes (flushwait.c).
        writer_lock = getattr(self.codec, "WriterLock", None)
        self._flush_lock = threading.Lock() if writer_lock is None else writer_lock()

    # --- positions -----------------------------------------------------------------------------------------
    def readable_end(self) -> int:
        """The offset just past the last complete record (readers never look beyond it)."""
        return self._end

    def min_offset(self) -> int:
        return self.segments.first_base_offset

    def reader_end(self) -> int:
        """For a read-only log another process writes: the end of the last segment now on disk.

        Readers below it decode records only where a ConsumeQueue entry (or the caller) says one starts, and
        every decoded record is checked, so an unfinished record is an error, never a message.
        """
        self.segments.load_if_changed()
        last = self.segments.last()
        return last.base_offset + last.size_bytes if last is not None else 0

    def set_end(self, commitlog_offset: int) -> None:
        """Set the written end (after the owner found it by recovery or by walking the log, and as appends move
        it: `append_holding_lock` does the same inline), and publish it in `end_word` when set."""
        assert commitlog_offset >= self.segments.first_base_offset
        self._end = commitlog_offset
        if self.end_word is not None:
            self.end_word[0] = commitlog_offset

    def segment_at(self, commitlog_offset: int) -> MappedFile:
        segment = self.segments.segment_at(commitlog_offset)
        if segment is None and not self.writable:
            self.segments.load()
            segment = self.segments.segment_at(commitlog_offset)
        if segment is None:
            raise InvalidMessageError(f"commitlog offset {commitlog_offset} is outside the log "
                                      f"[{self.min_offset()}, {self._end})")
        return segment

    def find_end(self, start: int | None = None, *, tolerant: bool = False) -> int:
        """Walk valid records from `start` (default: the last segment with data) to the end of written data.

        Stops at eight zero bytes or at the end of the last segment. A record that breaks the format rule
        raises CorruptionError (clean opens only: crash recovery decides differently); with `tolerant` the
        walk stops there instead (a reader racing a writer in another process sees a half-written record).
        """
        last = self.segments.last()
        if last is None:
            return 0
        if start is None:
            start = last.base_offset
            # Segments made ahead of need are empty: the data ends in the last segment that has any.
            while start > self.segments.first_base_offset and not any(
                    fmt.peek(self.segments.segment_at(start).view, 0, self.segment_size_bytes)):
                start -= self.segment_size_bytes
        offset = start
        limit = last.base_offset + last.size_bytes
        while offset < limit:
            batch = parse_records(self, offset, limit, records_max=FIND_END_BATCH_RECORDS, zeros_end=True)
            if batch.error is not None:
                if tolerant:
                    return batch.end_offset
                raise batch.error
            if batch.end_offset == offset:
                break
            offset = batch.end_offset
        return offset

    # --- writing -------------------------------------------------------------------------------------------
    def prepare(self, message: Message, hooked: bool = True) -> PreparedRecord:
        """Check a message and encode everything but the store-assigned fields. Nothing is written.

        A hot path: the common case (known topic, bytes body, no properties) takes the fewest steps.
        `hooked=False` (a re-put, commitlog/reput.py) skips the `rewrite` hook.
        """
        if message.__class__ is not Message and not isinstance(message, Message):
            raise InvalidMessageError(f"expected a Message, got {type(message).__name__}")
        if hooked and self.rewrite is not None:
            message = self.rewrite(message)
        topic = message.topic
        tails = self._topic_tails.get(topic) if topic.__class__ is str else None
        if tails is None:
            tails = self._topic_tail(topic)
        queue_id = message.queue_id
        if queue_id.__class__ is not int or not 0 <= queue_id < self.max_queues_per_topic:
            raise InvalidMessageError(
                f"queue_id must be an int in 0..{self.max_queues_per_topic - 1}, got {queue_id!r}")
        body = message.body
        if body.__class__ is not bytes:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise InvalidMessageError(f"body must be bytes, got {type(body).__name__}")
            body = bytes(body)
        if len(body) > self.max_message_size_bytes:
            raise InvalidMessageError(
                f"body of {len(body)} bytes is over max_message_size_bytes={self.max_message_size_bytes}")
        flag = message.flag
        if flag.__class__ is not int or not INT32_MIN <= flag <= INT32_MAX:
            raise InvalidMessageError(f"flag must be a 32-bit int, got {flag!r}")
        born = message.born_timestamp_ms
        if born is not None and (born.__class__ is not int or not 0 <= born <= INT64_MAX):
            raise InvalidMessageError(f"born_timestamp_ms must be an int in [0, 2**63) or None, got {born!r}")
        unique_keys = self._unique_keys
        if message.tags is None and not message.keys and not message.properties:
            tail = tails[1] if unique_keys is None else tails[2] + unique_keys.next() + tails[3]
        else:
            properties = _properties_text(message).encode("utf-8")
            if unique_keys is not None and fmt.PROPERTY_UNIQ_KEY not in message.properties:
                properties += b"UNIQ_KEY\x01" + unique_keys.next() + b"\x02"
            properties += self._crc_suffix
            if len(properties) > fmt.PROPERTIES_LENGTH_MAX:
                raise InvalidMessageError(
                    f"properties take {len(properties)} bytes, over the limit of {fmt.PROPERTIES_LENGTH_MAX}")
            tail = tails[0] + fmt.I16.pack(len(properties)) + properties
        crc = _crc32(body) if len(body) <= _CRC_SMALL else fmt.crc32(body)
        return ((topic, queue_id), flag, body, crc & 0x7FFFFFFF, born, tail, 88 + len(body) + len(tail))

    def compiled_prepare(self):
        """`prepare` of the common message shape (a compiled Message without tags, keys or properties, of a topic
        seen before) in compiled code, as a callable returning the prepared record, or None for any other message
        (then `prepare` handles it); None when there is no compiled codec or the log adds UNIQ_KEYs."""
        if self.codec is None or self.unique_keys is not None or not hasattr(self.codec, "prepare_message"):
            return None
        return functools.partial(self.codec.prepare_message, self._topic_tails, self.max_queues_per_topic,
                                 self.max_message_size_bytes)

    def compiled_put(self):
        """The single-message put in compiled code (commitlog/csrc/put.c): a callable that, for a caller holding
        `self.lock`, does `prepare` + `append_holding_lock` for a compiled Message of a topic seen before, with
        or without tags, keys, user properties and UNIQ_KEYs, and returns its PutResult (PUT_OK); None, with
        nothing written, for anything else (then the caller runs those two). None when there is no compiled
        codec. The writer's state stays here: the callable reads and writes this object's attributes (`_end`,
        `queue_offsets`, ...) on every call, and takes UNIQ_KEYs from `unique_keys`' compiled state."""
        if self.codec is None or not hasattr(self.codec, "Appender") or not self.writable or _write_at is None:
            return None
        self._appender = self.codec.Appender(self, globals(), time.time_ns, _write_at, PutResult, PutStatus.PUT_OK)
        self._appender.refresh()
        return self._appender.put

    def rewrite_in_compiled_put(self, timer, schedule, system_clock, max_delay_ms: int, level_count: int) -> None:
        """Let the compiled put rewrite delayed messages as `rewrite` does (commitlog/csrc/put_rewrite.c): the
        writer's TimerService and ScheduleService, the clock whose time it may read itself, their limits. Nothing
        without a compiled put (then `rewrite` does it all)."""
        if self._appender is not None:
            self._appender.set_rewrite(timer, schedule, system_clock, max_delay_ms, level_count,
                                       self.max_queues_per_topic)

    def _refresh_appender(self) -> None:
        """Tell the compiled put (compiled_put) that the state it copies changed: the segment written, its
        `_append_limit`, `write_through`, `written_records`, `end_word`. Called after every change of them."""
        if self._appender is not None:
            self._appender.refresh()

    @property
    def unique_keys(self) -> UniqueKeyGenerator | None:
        """When set, every message without a UNIQ_KEY property gets one from this generator (the index is on)."""
        return self._unique_keys

    @unique_keys.setter
    def unique_keys(self, generator: UniqueKeyGenerator | None) -> None:
        self._unique_keys = generator
        self._refresh_appender()

    @property
    def written_records(self):
        """When the owner sets a deque here, appends describe each record they write to the dispatch thread
        (see __init__); None: they do not."""
        return self._written_records

    @written_records.setter
    def written_records(self, deque) -> None:
        self._written_records = deque
        self._refresh_appender()

    @property
    def end_word(self):
        """An int64 array shared with another process, or None: see __init__."""
        return self._end_word

    @end_word.setter
    def end_word(self, words) -> None:
        self._end_word = words
        self._refresh_appender()

    def _topic_tail(self, topic) -> tuple[bytes, bytes, bytes, bytes]:
        """For a topic, checked and cached: TOPICLENGTH + TOPIC; the same followed by PROPERTIES without user
        properties (only the record-CRC placeholder, when written); the same followed by the start of PROPERTIES
        holding only a UNIQ_KEY (and the placeholder); and what follows the UNIQ_KEY's value there."""
        encoded = validate_topic(topic)
        prefix = bytes((len(encoded),)) + encoded
        suffix = self._crc_suffix
        unique_only = b"UNIQ_KEY\x01"
        unique_length = len(unique_only) + UNIQUE_KEY_HEX_DIGITS + 1 + len(suffix)
        tails = (prefix, prefix + fmt.I16.pack(len(suffix)) + suffix,
                 prefix + fmt.I16.pack(unique_length) + unique_only, b"\x02" + suffix)
        self._topic_tails[topic] = tails
        return tails

    def append(self, record: PreparedRecord) -> tuple[int, int, int]:
        """Append one prepared record; returns (commitlog_offset, queue_offset, store_timestamp_ms)."""
        with self.lock:
            return self.append_holding_lock(record)

    def append_holding_lock(self, record: PreparedRecord) -> tuple[int, int, int]:
        """`append` for a caller that holds `self.lock` (the store's put path: one lock per put, not two)."""
        queue_key, flag, body, crc, born, tail, size = record
        offset = self._end
        if offset + size + 8 > self._append_limit:
            offset = self._roll(offset, size)
        pos = offset - self._segment_base
        scratch = self._scratch
        if scratch is not None and size <= WRITE_THROUGH_RECORD_BYTES_MAX and not self._flush_lock.locked():
            view, at = scratch, 0  # encoded here, then written with pwrite (see `write_through`)
        else:
            view, at, scratch = self._view, pos, None
        queue_offsets = self.queue_offsets
        queue_offset = queue_offsets.get(queue_key, 0)
        store_ts = _time_ns() // 1_000_000
        codec = self.codec
        if codec is not None:
            codec.encode_record(view, at, size, crc, queue_key[1], flag, queue_offset, offset,
                                store_ts if born is None else born, self.born_host_raw, store_ts, self.store_host_raw,
                                body, tail, self.record_crc)
        else:
            body_end = at + 88 + len(body)
            _pack_header(view, at, size, _MAGIC, crc, queue_key[1], flag, queue_offset, offset, 0,
                         store_ts if born is None else born, self.born_host_raw, store_ts, self.store_host_raw,
                         0, 0, len(body))
            view[at + 88 : body_end] = body
            end = at + size
            view[body_end:end] = tail
            if self.record_crc:  # fmt.record_crc_digits, inlined: the put path
                covered = view[at : end - 20]
                crc = _crc32(covered) if size <= _CRC_SMALL else fmt.crc32(covered)
                view[end - 11 : end - 1] = (b"%010d" % (crc & 0x7FFFFFFF))[::-1]
        if scratch is not None:
            self._write_through(scratch[:size], pos)
        queue_offsets[queue_key] = queue_offset + 1
        self.last_store_timestamp_ms = store_ts
        written = self.written_records
        if written is not None and len(tail) <= DESCRIBED_TAIL_BYTES_MAX:  # before the end moves: dispatch finds
            written.append((offset, size, queue_key, queue_offset, store_ts, tail))  # it described once it sees it
        self._end = end = offset + size
        end_word = self.end_word
        if end_word is not None:
            end_word[0] = end
        return offset, queue_offset, store_ts

    def _write_through(self, record: memoryview, pos: int) -> None:
        """pwrite an encoded record at `pos` of the current segment (nothing is published before it is all there)."""
        fd = self._segment_fd
        try:
            if _write_at is not None:  # the whole record in one call, the GIL let go around pwrite
                _write_at(fd, record, pos)
                return
            while record:
                written = os.pwrite(fd, record, pos)
                record, pos = record[written:], pos + written
        except OSError as exc:
            raise SegmentWriteError(f"cannot write to segment {self._segment_base}: {exc.strerror}") from exc

    @property
    def write_through(self) -> bool:
        """Whether single appends are written with pwrite instead of being encoded in the mapping.

        For SYNC stores: after each fdatasync the kernel write-protects the pages it cleaned, and the next
        append's first store into the mapping takes a page fault; a pwrite of the same bytes takes none (the
        page cache is shared, so readers of the mapping see them all the same). A loop of 100 B appends and
        fdatasyncs made 8.6% more a second with pwrite than with the mapping here (6 alternating runs).
        With ASYNC the mapping is cheaper: a page is cleaned once per flush interval, not once per put.

        Only while no flush runs, which with SYNC is when other producers are waiting: the pwrite lets go of
        the GIL (a stalled disk must not stop every thread), here while this thread holds the writer lock, and
        with many producers each such put handed the GIL away mid-append (64 SYNC producers, every append
        written through: 2.8k puts/s against 21k through the mapping, before the HandOff parked busy puts). So
        appends made while `flush()` holds its lock are encoded in the mapping as always.
        """
        return self._scratch is not None

    @write_through.setter
    def write_through(self, on: bool) -> None:
        self._scratch = memoryview(bytearray(WRITE_THROUGH_RECORD_BYTES_MAX)) if on else None
        self._refresh_appender()

    def append_records(self, records: list[PreparedRecord]
                     ) -> tuple[list[tuple[int, int]], int, StoreIOError | None]:
        """Append records prepared one by one (`prepare`) under one lock hold, through the batch writer.

        Returns ([(commitlog_offset, queue_offset)] of the records written, store ts, error): when a segment
        cannot be created part way, the ones before it stay stored and the StoreIOError is returned with them
        (the rest are not written).
        """
        columns = columns_from_records(records)
        with self.lock:
            offsets, queue_offsets, placed, store_ts, error = append_columns(self, columns)
        return list(zip(offsets[:placed].tolist(), queue_offsets[:placed].tolist())), store_ts, error

    def now_ms(self) -> int:
        """The store clock (ms since the epoch) that stamps STORETIMESTAMP; tests replace `_time_ns`."""
        return _time_ns() // 1_000_000

    def prepare_batch(self, messages: list[Message]) -> Columns:
        """Check and encode a batch as columns (commitlog/write_batch.py); InvalidMessageError for the first bad
        message, as `prepare` gives it. Nothing is written."""
        return prepare_columns(self, messages)

    def append_columns_holding_lock(self, columns: Columns) -> tuple:
        """Append a prepared batch, for a caller that holds `self.lock`: (commitlog offsets, queue offsets, records
        placed, store ts, StoreIOError or None); records before a failed segment creation stay stored."""
        return append_columns(self, columns)

    def _use_segment(self, segment: MappedFile | None) -> None:
        """Make `segment` the one appends go to (None: no segment yet, or closed). Appends past `_append_limit`
        take the slow path (`_roll`), which calls `_make_room` first thing in a segment."""
        if segment is None:
            self._view, self._array, self._segment_base, self._segment_end = None, None, 0, -1
            self._segment_fd = None
            self._append_limit = -1
            self._segment = None
        else:
            if self.advise_random_appends and not segment.appending:  # the first after open, or made by a roll
                segment.advise_appending(True)
            if segment is not self._segment:
                self._next_announced = False
                # Below the log's end the blocks hold records already: only what lies beyond needs reserving.
                written = max(0, self._end - segment.base_offset)
                segment.reserved_bytes = max(segment.reserved_bytes, written - written % PAGE_SIZE_BYTES)
            self._segment = segment
            self._segment_fd = segment.fileno()
            self._view = segment.view
            self._array = segment.array
            self._segment_base = segment.base_offset
            self._segment_end = segment.base_offset + segment.size_bytes
            self._append_limit = -1  # the next append takes the slow path, which sets it
        self._refresh_appender()

    def _make_room(self, needed_end: int) -> None:
        """The slow path of an append that ends (with room for a blank after it) at `needed_end`, inside the
        current segment: reserve disk up to it in whole steps (StoreIOError when the disk has no room), tell
        `near_end_listeners` once the writer nears the segment's end, and set the next `_append_limit` to the
        first point where either must happen again."""
        segment = self._segment
        base = self._segment_base
        limit = self._segment_end
        assert needed_end <= limit
        if self.reserve_space:
            wanted = needed_end - base
            if wanted > segment.reserved_bytes:
                _reserve_ahead(segment, wanted)
            limit = min(limit, base + segment.reserved_bytes)
        if not self._next_announced:
            lead_start = self._segment_end - self.next_segment_lead_bytes
            if needed_end > lead_start:
                self._next_announced = True
                for listener in self.near_end_listeners:
                    listener(segment)
            else:
                limit = min(limit, lead_start)
        assert needed_end <= limit
        self._append_limit = limit
        self._refresh_appender()

    def _roll(self, offset: int, size: int) -> int:
        """Called under the lock when a record of `size` bytes may not fit the current segment.

        Writes the end-of-segment blank and moves to the next segment (created if needed) when it does not
        fit; returns the offset the record goes to. Also where a closed log refuses appends.
        """
        if self._closed:
            raise StoreClosedError("the commitlog is closed")
        if not self.writable:
            raise StoreClosedError("the commitlog is read-only")
        segment = self.segments.segment_at(offset)
        if segment is not None:
            self._use_segment(segment)
            if offset + size + fmt.END_FILE_MIN_BLANK_LENGTH <= self._segment_end:
                self._make_room(offset + size + fmt.END_FILE_MIN_BLANK_LENGTH)  # a step, or the first after open
                return offset
            next_base = self._end_segment(segment, offset)
        else:
            assert offset % self.segment_size_bytes == 0, offset
            next_base = offset
        self._begin_segment(next_base, size)
        return next_base

    def _end_segment(self, segment, offset: int) -> int:
        """Write the end-of-segment blank at `offset` in `segment` (the one in use), publish the log's end past it
        and retire the segment from appending; the next segment's base offset."""
        pos = offset - segment.base_offset
        left = segment.size_bytes - pos
        assert left >= fmt.END_FILE_MIN_BLANK_LENGTH, left  # every append leaves room for a blank after it
        if self.reserve_space:  # within what was reserved but after a reopen, which reserved from a page start
            segment.reserve(pos + fmt.END_FILE_MIN_BLANK_LENGTH)
        if self.codec is not None:
            self.codec.encode_blank(segment.view, pos, left)
        else:
            fmt.BLANK.pack_into(segment.view, pos, left, fmt.BLANK_MAGIC_CODE)
        next_base = self._segment_end
        self.set_end(next_base)  # the blank is written: readers may pass it
        if segment.appending:
            if self.segment_retirer is not None:
                self.segment_retirer(segment)
            else:
                segment.advise_appending(False)
        return next_base

    def _begin_segment(self, base_offset: int, size: int) -> None:
        """Use the segment at `base_offset` (made or created when missing) with room for `size` bytes and a blank."""
        following = self.segments.segment_at(base_offset)
        if following is None:
            made = self.segment_source(base_offset) if self.segment_source is not None else None
            following = self.segments.adopt(made) if made is not None else self.segments.create(base_offset)
        self._use_segment(following)
        self._make_room(base_offset + size + fmt.END_FILE_MIN_BLANK_LENGTH)

    def seal_holding_lock(self) -> bool:
        """End the segment holding the log's end with the end-of-segment blank, as a roll does when a record does
        not fit, and move to the next segment: every record written so far then lies in sealed segments. For a
        caller that holds `self.lock`. False (nothing done) when the end is at a segment's start."""
        if self._closed or not self.writable:
            raise StoreClosedError("the commitlog is closed" if self._closed else "the commitlog is read-only")
        end = self._end
        if end % self.segment_size_bytes == 0:
            return False
        segment = self.segments.segment_at(end)
        assert segment is not None, end
        self._use_segment(segment)
        self._begin_segment(self._end_segment(segment, end), 0)
        return True

    # --- reading -------------------------------------------------------------------------------------------
    def read(self, commitlog_offset: int, *, check_crc: bool = True) -> StoredMessage:
        """Decode and check (body CRC included unless told otherwise) the message record at `commitlog_offset`."""
        if self._closed:
            raise StoreClosedError("the commitlog is closed")
        if commitlog_offset >= self._end and not self.writable:
            self._end = max(self._end, self.reader_end())
        if not self.segments.first_base_offset <= commitlog_offset < self._end:
            raise InvalidMessageError(f"commitlog offset {commitlog_offset} is outside the log "
                                      f"[{self.min_offset()}, {self._end})")
        segment = self.segment_at(commitlog_offset)
        view = segment.view
        if view is None:
            raise StoreClosedError("the commitlog is closed")
        pos = commitlog_offset - segment.base_offset
        if self.codec is not None:  # None: a record the compiled fast path leaves to the reference (or damage)
            message = self.codec.decode_record(view, pos, segment.size_bytes - pos, commitlog_offset, check_crc,
                                               -1 if self.record_crc_from is None else self.record_crc_from,
                                               StoredMessage)
            if message is not None:
                return message
        return decode_message(view, pos, segment.size_bytes - pos, commitlog_offset, path=segment.path,
                              check_crc=check_crc, record_crc_from=self.record_crc_from)

    def read_many(self, commitlog_offsets: list[int], sizes: list[int],
                  queue: tuple[str, int, list[int]] | None = None, span: tuple[int, int] | None = None
                  ) -> list[StoredMessage]:
        """Decode many records, as an index (ConsumeQueue) locates them; all must lie in the log. With `queue`
        = (topic, queue_id, queue offsets) each record must be that queue's entry (else CorruptionError).
        `span` is (min, max) of `commitlog_offsets` when the caller has them (ConsumeQueue.read_lists)."""
        if self._closed:
            raise StoreClosedError("the commitlog is closed")
        if commitlog_offsets:
            low, high = (min(commitlog_offsets), max(commitlog_offsets)) if span is None else span
            if high >= self._end and not self.writable:
                self._end = max(self._end, self.reader_end())
            if low < self.segments.first_base_offset or high >= self._end:
                raise InvalidMessageError(f"commitlog offsets {low}..{high} are not all inside the log "
                                          f"[{self.min_offset()}, {self._end})")
        if self.codec is not None:
            return decode_records_native(self.codec, self.segment_at, commitlog_offsets, sizes,
                                         record_crc_from=self.record_crc_from, queue=queue)
        return decode_records(self.segment_at, commitlog_offsets, sizes, record_crc_from=self.record_crc_from,
                              queue=queue)

    def read_values(self, commitlog_offsets, sizes, number_name: bytes, text_name: bytes,
                    queue: tuple[str, int, int] | None = None, span: tuple[int, int] | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
        """Two property values of many records, checked as read_many checks them, without decoding messages
        (commitlog/record_values.py: its rows and columns, and `out`). `queue` = (topic, queue_id, first entry)."""
        if self._closed:
            raise StoreClosedError("the commitlog is closed")
        if len(commitlog_offsets):
            low, high = (int(min(commitlog_offsets)), int(max(commitlog_offsets))) if span is None else span
            if high >= self._end and not self.writable:
                self._end = max(self._end, self.reader_end())
            if low < self.segments.first_base_offset or high >= self._end:
                raise InvalidMessageError(f"commitlog offsets {low}..{high} are not all inside the log "
                                          f"[{self.min_offset()}, {self._end})")
        return read_values(self.codec, self.segment_at, commitlog_offsets, sizes, number_name, text_name,
                           record_crc_from=self.record_crc_from, queue=queue, out=out)

    # --- durability and lifecycle --------------------------------------------------------------------------
    def truncate(self, commitlog_offset: int, salvage=None) -> int:
        """Cut the log at `commitlog_offset` (a record boundary found by recovery): zero the rest of its segment,
        delete every later segment. With a `salvage` (mqstore.store.repair.Salvage) nothing is destroyed: the segment is
        copied to it before its tail is zeroed and the later segments are moved to it. Returns how many written
        bytes were dropped. Only before appends start."""
        assert self.writable and not self._closed
        with self.lock:
            dropped = max(0, self._end - commitlog_offset)
            segment = self.segments.segment_at(commitlog_offset)
            if segment is not None:
                position = commitlog_offset - segment.base_offset
                if salvage is not None and segment.array[position:].any():
                    salvage.copy_segment(segment.path, f"the log was cut at its position {position} (commitlog "
                                                       f"offset {commitlog_offset}): the segment before the cut")
                segment.array[position:] = 0
                segment.flush(position, segment.size_bytes)
            deleted = self.segments.remove_after(commitlog_offset)
            for later in deleted:
                if salvage is None:
                    later.delete()
                    continue
                later.close()
                salvage.move_segment(later.path, f"a whole segment after the cut at commitlog offset "
                                                 f"{commitlog_offset}")
            if deleted:  # a deletion lost in a crash would bring the cut records back under new ones
                fsync_directory(self.directory)
            self._end = commitlog_offset
            self.flushed_position = min(self.flushed_position, commitlog_offset)
            self._use_segment(None)
            return dropped

    def writer_position(self) -> tuple:
        """(mapping array, base offset, log end) of the segment appends go to (array None before the first), for
        threads that work ahead of the writer: read without the lock, so at worst one roll stale."""
        return self._array, self._segment_base, self._end

    def dirty_bytes(self) -> int:
        """Bytes appended but not yet flushed (the Flushable protocol of the flush services)."""
        return self._end - self.flushed_position

    @property
    def flush_lock(self):
        """The lock `flush` holds (the compiled SYNC leader's flush takes it too)."""
        return self._flush_lock

    def flush(self) -> int:
        """Flush everything appended so far; returns the position now durable (the Flushable protocol).

        The first failure (FlushFailedError) is kept in `flush_error`, and every flush after it raises it again:
        flushed_position never moves past the bytes it failed on (MappedFile.flush says why)."""
        with self._flush_lock:
            if self.flush_error is not None:
                raise FlushFailedError(f"the CommitLog is not flushed past offset {self.flushed_position}: an earlier "
                                       f"flush failed ({self.flush_error})", path=self.flush_error.path) \
                    from self.flush_error
            timestamp = self.last_store_timestamp_ms  # read before the end: never newer than what is flushed
            end = self._end
            flushed = self.flushed_position
            if end > flushed:
                segment = self._segment  # SYNC's common case, one flush a put: the range is in the segment written
                base = -1 if segment is None else segment.base_offset
                try:
                    if 0 <= base <= flushed and end <= base + segment.size_bytes:
                        segment.flush(flushed - base, end - base)
                    else:
                        self.flush_range(flushed, end)
                except FlushFailedError as exc:
                    self.flush_error = exc
                    raise
                self.flushed_position = end
                self.flushed_timestamp_ms = max(self.flushed_timestamp_ms, timestamp)
            return self.flushed_position

    def flush_range(self, start: int, end: int) -> None:
        """Write the bytes [start, end) of the log to disk, across segments (fdatasync of each segment touched)."""
        offset = start
        while offset < end:
            segment = self.segments.segment_at(offset)
            if segment is None:
                break
            stop = min(end, segment.base_offset + segment.size_bytes)
            segment.flush(offset - segment.base_offset, stop - segment.base_offset)
            offset = stop

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self._use_segment(None)
            self.segments.close()

    @property
    def closed(self) -> bool:
        return self._closed


# CommitLog.flush as defined here: the compiled SYNC leader (flushwait.c) flushes in C only while the class still has
# this one.
DEFINED_FLUSH = CommitLog.flush
