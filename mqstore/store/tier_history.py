"""Recovery's view of a store's tier: the history below the local log, read back to check and rebuild what points
into it (mqstore/store/recovery.py, rows QUEUE_REBUILT, TIER_REPLAYED and TIER_UNREADABLE).

With a tier, retention removes a segment from local disk once the tier's manifest lists it, and keeps the
ConsumeQueue and index files that point into it (mqstore/store/retention.py). Recovery then meets entries that
name records below the local log's first segment. It reads them here, through the store's TierReader
(mqstore/tier/reader.py: only what the manifest lists, every record checked by the same decoders as local ones):

  - `entry_matches`: a queue's last entry below the local log, checked against the tier's record (one range read,
    two when the record is longer than the reader's first window);
  - `message_at`: the message where the index ends, when that is below the local log (one range read);
  - `redispatch(start, end, dispatchers)`: the records of [start, end) from the tier's segment objects, fed to the
    dispatchers through the same decoder and batches as the local log's (commitlog/dispatch_batch.py
    `parse_records`, CRCs checked: the bytes come from an object store). Each segment object is read front to
    back in range reads of TIER_REDISPATCH_WINDOW_BYTES_FIRST growing to TIER_REDISPATCH_WINDOW_BYTES_MAX, into an
    anonymous mapping of the segment's size whose pages below the walk are let go (MADV_DONTNEED), so a
    re-dispatch holds at most about two windows of a segment whatever its size. The reader's block cache is
    bypassed: a stream would only evict what reads use.

Before any of these, the tier must continue this store's log, as the uploader checks once it runs: its end within
the local log's, and the last segment both hold the same bytes (one local segment's CRC-32 against the manifest's,
once an open). A tier that cannot be read (down, another store's, its manifest damaged) is not the history's
absence: `start()` then answers None and `problem` says why; `require(what)` raises StoreIOError for a decision that
would otherwise destroy what only the tier can rebuild (recovery.py, TIER_UNREADABLE).
"""

from __future__ import annotations

import logging
import mmap

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch import DISPATCH_BATCH_RECORDS_MAX, parse_records
from mqstore.commitlog.errors import ConfigMismatchError, CorruptionError, InvalidMessageError, StoreIOError
from mqstore.commitlog.message import StoredMessage
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import crc32
from mqstore.tier.manifest import Manifest, TierSegment
from mqstore.tier.reader import TierReader

log = logging.getLogger(__name__)

TIER_REDISPATCH_WINDOW_BYTES_FIRST = 1 << 20  # the first range read of a segment object (a tail may be short)
TIER_REDISPATCH_WINDOW_BYTES_MAX = 16 << 20  # later ones grow by 4x up to this (the reader's window bound)
TIER_REDISPATCH_WINDOW_GROWTH = 4
TIER_READ_ERRORS = (StoreIOError, ConfigMismatchError, CorruptionError)  # a tier that cannot be read


class _MappedArray(np.ndarray):
    """A segment image's bytes as parse_records reads a mapped segment's `array`: `_mmap` is the buffer."""

    _mmap = None


class _SegmentImage:
    """A tier segment object as parse_records reads a local segment (base_offset, size_bytes, view, array, path),
    filled by range reads as the walk goes: an anonymous mapping of the segment's size (zeros until filled)."""

    def __init__(self, location, segment: TierSegment, size_bytes: int):
        self.key = manifest_module.segment_key(segment.base_offset)
        self.path = location.display(self.key)
        self.base_offset = segment.base_offset
        self.size_bytes = size_bytes
        self.filled_end: int | None = None  # the object's bytes are read from a page below the walk's start to here
        self._location = location
        self._handle = None
        self._released = 0  # pages below this were let go
        self._mapping = mmap.mmap(-1, size_bytes)
        self.array = np.frombuffer(self._mapping, dtype=np.uint8).view(_MappedArray)
        self.array._mmap = self._mapping
        self.view = memoryview(self._mapping)

    def fill(self, position: int, stop: int) -> None:
        """Read the object's bytes up to `stop` (at most its size), from `position` on the first call, from where the
        last read ended on the next ones: one range read."""
        stop = min(stop, self.size_bytes)
        if self.filled_end is None:
            self.filled_end = self._released = position - position % mmap.PAGESIZE
        if stop <= self.filled_end:
            return
        if self._handle is None:
            self._handle = self._location.open_input(self.key, self.size_bytes)  # a HEAD on S3, once per segment
        data = self._location.read_range(self.key, self.size_bytes, self.filled_end, stop - self.filled_end,
                                         handle=self._handle)
        self._mapping[self.filled_end : stop] = data
        self.filled_end = stop

    def release_below(self, position: int) -> None:
        """Let the pages below `position` go (they read as zeros again; the walk is past them)."""
        low, high = self._released, position - position % mmap.PAGESIZE
        if high > low:
            self._mapping.madvise(mmap.MADV_DONTNEED, low, high - low)
            self._released = high

    def close(self) -> None:
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass
        try:
            self.view.release()
        except BufferError:
            pass  # a batch still holds a slice of it: the mapping goes with the last view of it
        self.array = None


class _ImageLog:
    """A LogReader (commitlog/dispatch_batch.py) over one segment image: what parse_records asks of a log."""

    def __init__(self, image: _SegmentImage, record_crc_from: int | None):
        self.image = image
        self.record_crc_from = record_crc_from

    def readable_end(self) -> int:
        return self.image.base_offset + self.image.filled_end

    def segment_at(self, commitlog_offset: int):
        assert self.image.base_offset <= commitlog_offset < self.image.base_offset + self.image.size_bytes
        return self.image


class TierHistory:
    """The tier's history below the local log, for recovery (module docstring). One per writable open."""

    def __init__(self, reader: TierReader, commitlog: CommitLog):
        self.reader = reader
        self.commitlog = commitlog
        self.problem: str | None = None  # why the tier could not be read, from the first failure on
        self.position: int | None = None  # redispatch: the start of the batch being dispatched
        self.records_dispatched = 0  # by redispatch, over this open
        self.range_reads = 0  # by redispatch
        self._log_checked = False  # the tier was found to continue this store's log (`_another_log`)

    def _failed(self, exc: BaseException) -> None:
        if self.problem is None:
            self.problem = f"{type(exc).__name__}: {exc}"
            log.warning("recovery cannot read the tier %s: %s", self.reader.location.uri, exc)

    def start(self) -> int | None:
        """Where the history below the local log starts: the tier's start when the tier holds the log below the
        local log's first segment, else None (the local log starts at 0, the tier holds nothing below it, or the
        tier cannot be read or is not this store's: then `problem` says why)."""
        local_min = self.commitlog.min_offset()
        if local_min == 0 or self.problem is not None:
            return None
        try:
            start = self.reader.history_start(local_min)
            if not self._log_checked:
                other = _another_log(self.reader.manifest(), self.commitlog)
                if other is not None:
                    raise ConfigMismatchError(f"the tier is not this store's: {other}")
                self._log_checked = True
        except TIER_READ_ERRORS as exc:
            self._failed(exc)
            return None
        return start if start is not None and start < local_min else None

    def require(self, what: str) -> int | None:
        """`start()`, for a decision that only the tier's history can undo (`what`): StoreIOError, with nothing
        changed, when the tier cannot be read."""
        start = self.start()
        if self.problem is not None:
            raise StoreIOError(f"recovery must {what} from the history in the tier {self.reader.location.uri}, "
                               f"which cannot be read ({self.problem}); nothing was changed: open the store again "
                               "once the tier answers (read_only opens read it meanwhile)")
        return start

    def entry_matches(self, commitlog_offset: int, size: int, topic: str, queue_id: int,
                      queue_offset: int) -> tuple[bool | None, str | None]:
        """(whether the tier's record at `commitlog_offset` is that queue entry: its size, topic, queue id and queue
        offset, why not when it cannot tell). False also below the tier's start (the record is gone for good) and
        where no record starts; None where the tier cannot tell: it cannot be read, it does not reach the offset
        (a store's history the tier should hold and does not), or its record there is damaged (the tier's fault,
        not the entry's)."""
        self.start()  # the tier is read, and checked to be this store's, once
        if self.problem is not None:
            return None, f"the tier cannot be read: {self.problem}"
        manifest = self.reader.manifest()
        if manifest is not None and manifest.start is not None and commitlog_offset < manifest.start:
            return False, None
        if manifest is None or manifest.segment_at(commitlog_offset) is None:
            return None, "the tier does not hold it"
        try:
            message = self.reader.read(commitlog_offset)
        except CorruptionError as exc:
            if exc.not_a_record:
                return False, None
            self._failed(exc)
            return None, f"the tier's record there is damaged: {exc}"
        except TIER_READ_ERRORS as exc:
            self._failed(exc)
            return None, f"the tier cannot be read: {exc}"
        except InvalidMessageError as exc:
            return None, str(exc)
        return (message.size_bytes == size and message.topic == topic and message.queue_id == queue_id
                and message.queue_offset == queue_offset), None

    def message_at(self, commitlog_offset: int) -> StoredMessage | None:
        """The tier's message at `commitlog_offset`, or None (none there, or the tier cannot be read)."""
        if self.start() is None:
            return None
        try:
            return self.reader.read(commitlog_offset)
        except InvalidMessageError:
            return None
        except TIER_READ_ERRORS as exc:
            self._failed(exc)
            return None

    def redispatch(self, start: int, end: int, dispatchers: list) -> int:
        """Feed `dispatchers` the records of [start, end) from the tier's segment objects (module docstring); the
        records dispatched. `start` is a record's start inside the tier. Errors of the tier raise (StoreIOError,
        CorruptionError naming the object and the position in it); `position` then says where the batch that
        failed starts, for a QueueGapError of a dispatcher too."""
        manifest = self.reader.manifest()
        properties = tuple(dict.fromkeys(name for dispatcher in dispatchers
                                         for name in getattr(dispatcher, "properties", ())))
        done = 0
        offset = start
        self.position = start
        while offset < end:  # bounded by the manifest's segments
            segment = manifest.segment_at(offset) if manifest is not None else None
            if segment is None:
                raise InvalidMessageError(f"commitlog offset {offset} is not in the tier {self.reader.location.uri}")
            done += self._segment(manifest, segment, offset, end, dispatchers, properties)
            offset = segment.base_offset + manifest.segment_size_bytes
        return done

    def _segment(self, manifest: Manifest, segment: TierSegment, offset: int, end: int, dispatchers: list,
                 properties: tuple) -> int:
        """`redispatch` of one segment object from `offset` to its blank (or `end`)."""
        image = _SegmentImage(self.reader.location, segment, manifest.segment_size_bytes)
        log_ = _ImageLog(image, manifest.store.get("record_crc_from_offset"))
        base = segment.base_offset
        stop = min(end, base + image.size_bytes)
        window = TIER_REDISPATCH_WINDOW_BYTES_FIRST
        done = 0
        try:
            image.fill(offset - base, offset - base + window)
            self.range_reads += 1
            while offset < stop:  # each pass dispatches a batch, or reads more of the object
                batch = parse_records(log_, offset, min(stop, log_.readable_end()), check_crc=True,
                                      records_max=DISPATCH_BATCH_RECORDS_MAX, zeros_end=True, properties=properties)
                if len(batch):
                    self.position = offset
                    for dispatcher in dispatchers:
                        dispatcher.dispatch(batch)
                    done += len(batch)
                    self.records_dispatched += len(batch)
                if batch.error is not None:
                    raise batch.error
                if batch.end_offset > offset:
                    offset = batch.end_offset
                    self.position = offset
                    image.release_below(offset - base)
                    continue
                if log_.readable_end() >= stop:
                    break  # nothing more below `end`
                _check_more_to_read(image, offset - base)
                window = min(window * TIER_REDISPATCH_WINDOW_GROWTH, TIER_REDISPATCH_WINDOW_BYTES_MAX)
                image.fill(offset - base, image.filled_end + window)
                self.range_reads += 1
        finally:
            image.close()
        return done


def _another_log(manifest: Manifest | None, commitlog: CommitLog) -> str | None:
    """Why the tier of `manifest` cannot be this store's history, or None: its end lies past the local log's, or
    below the local log's start, or the last segment both hold differs (one local segment's CRC-32, compared with
    the manifest's), as the uploader checks (mqstore/tier/uploader.py) once it runs: recovery may not rebuild queues
    from another store's log. A tier that ends where the local log starts cannot be told from this store's."""
    if manifest is None or not manifest.segments:
        return None
    end = commitlog.readable_end()
    if end < manifest.end:
        return f"it holds the log up to commitlog offset {manifest.end}, past this store's end {end}"
    common = [segment for segment in commitlog.segments.segments
              if manifest.segment_at(segment.base_offset) is not None]
    local_min = commitlog.min_offset()
    if not common:
        if local_min > manifest.end:
            return (f"it ends at commitlog offset {manifest.end}, below the local log's start {local_min}: the "
                    "segments between are in neither")
        return None
    segment = common[-1]
    if crc32(segment.view[: segment.size_bytes]) != manifest.segment_at(segment.base_offset).crc32:
        return f"its segment {fmt.segment_name(segment.base_offset)} differs from the local one"
    return None


def _check_more_to_read(image: _SegmentImage, position: int) -> None:
    """The walk of a segment image stopped at `position` with no record complete: a record runs past the bytes read
    so far (read more), unless the object is read to its end or eight zero bytes stand there (a sealed segment
    ends with a blank, never zeros: CorruptionError)."""
    head = fmt.BLANK.size
    if image.filled_end >= image.size_bytes or (
            image.filled_end - position >= head and not any(image.view[position : position + head])):
        raise CorruptionError(f"the walk of the tier's segment stops at {position}, where zeros stand or a record "
                              "runs past the object's end: a sealed segment ends with a blank", path=image.path,
                              offset=position, rule="commitlog.end")
