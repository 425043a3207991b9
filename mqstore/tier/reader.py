"""The tier's reader: records a store no longer holds on local disk, read from the tier with range reads.

A store with a tier reads every commitlog offset below its local log's first segment and at or above the tier's
start from the tier's segment objects (`commitlog/<20 digits>`, mqstore/tier/manifest.py): the object is the
segment holding the offset (the manifest lists it), the position in it is the offset minus the segment's base.
Only what the manifest lists is read; the manifest is the reader's whole knowledge of the tier.

Reads:
  - `read_many(offsets, sizes, queue)`: records whose size a ConsumeQueue unit (or an index's lookup) gives. The
    records of one segment, up to TIER_READ_WINDOW_BYTES_MAX apart, are fetched as one window, in ONE range read
    when none of its blocks is cached (a get of 32 messages costs one GET of the bytes they span).
  - `read(offset)`: a record whose size is not known (read_at, offset_for_time): a window of TIER_READ_AT_FIRST_BYTES
    first, read again to TOTALSIZE when the record is longer (a TOTALSIZE that does not fit the segment is left to
    the decoder, which reports it).
Both decode through the same functions as local records (commitlog/message.py: decode_message, decode_records and
the compiled codec's decode_record / decode_run) with the tier's record_crc_from_offset, so every check on
untrusted bytes applies: a record that fails one raises CorruptionError naming the object
(`TierLocation.display(key)`) and the position of the record in it, and keeping the rule and the flags
(`not_a_record`, `length_sound`) the decoder set.

The cache: fixed-size blocks (TIER_CACHE_BLOCK_BYTES of an object each, the last one of an object shorter) in one
LRU of at most `cache_bytes` bytes (the store's `tier_cache_bytes`), shared by the threads of the store under one
lock; a range read is done outside the lock (two threads missing the same block may both fetch it; the cache keeps
one). A read asks the object store only for the runs of blocks it misses, each run in one range read. The input
handles of recently read objects are kept, at most `TierLocation.open_inputs_max` (the least recently used goes):
opening an S3 object costs a HEAD, a read with an open handle is one GET, so on an object store a reader keeps a
handle for every object of all but the largest tiers and a cold get is one request; on a filesystem each handle
holds a file descriptor, and a few are kept.

The manifest: a writer's reader follows its uploader's manifest (`manifest_source`), always current, and reads
nothing from a tier the uploader refused as another store's (`refusal_source`: reads stop at the local log).
Without one (a read_only store, or before the uploader read it) the reader loads the newest whole manifest slot, at
first use, and again when asked about offsets past the tier's end that it may have gained since (a writer in
another process uploads and then removes its local copies): at once when the local log's start moved past the
tier's end since the last load (the writer removed segments, so the manifest lists them), else at most every
TIER_MANIFEST_FOLLOW_INTERVAL_MS. A manifest written for other format settings than the store's is refused
(ConfigMismatchError): its objects would be read with the wrong segment size.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import ConfigMismatchError, CorruptionError, InvalidMessageError, StoreIOError
from mqstore.commitlog.message import StoredMessage, decode_message, decode_records, decode_records_native
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.manifest import Manifest, TierSegment

log = logging.getLogger(__name__)

# A block is what one cache entry holds and what a miss fetches at least. S3 answers a range GET in ~20-50 ms
# whatever its length up to a few hundred KiB, so a block far larger than a message costs little more than one
# message and serves its neighbours (a consumer reads on, a get of 32 messages spans a few blocks).
TIER_CACHE_BLOCK_BYTES = 256 * 1024
TIER_READ_AT_FIRST_BYTES = 4096  # of a record read without a known size, before its TOTALSIZE says more
TIER_READ_WINDOW_BYTES_MAX = 16 * 1024 * 1024  # records further apart than this are fetched in separate windows
TIER_MANIFEST_FOLLOW_INTERVAL_MS = 1000  # a reader without a writer's manifest loads it again at most this often


class _Window:
    """Bytes of a tier segment object, as the record decoders see a segment: `view` over the bytes, the commitlog
    offset of its first byte, its length and its name (the object's display name)."""

    __slots__ = ("view", "base_offset", "size_bytes", "path")

    def __init__(self, data: bytes, base_offset: int, path: str):
        self.view = memoryview(data)
        self.base_offset = base_offset
        self.size_bytes = len(data)
        self.path = path


class TierReader:
    """Reads records from a tier (module docstring). Thread-safe."""

    def __init__(self, location: TierLocation, store_fields: dict, *, cache_bytes: int,
                 block_bytes: int = TIER_CACHE_BLOCK_BYTES, codec=None, manifest_source=None,
                 follow_interval_ms: int = TIER_MANIFEST_FOLLOW_INTERVAL_MS):
        assert cache_bytes >= 0 and block_bytes > 0
        self.location = location
        self.store_fields = dict(store_fields)  # manifest_module.STORE_FIELDS of the store that reads
        self.cache_bytes = cache_bytes
        self.block_bytes = block_bytes
        self.codec = codec  # the compiled codec (commitlog.native.NATIVE) or None: the pure-Python reference
        self.handles_max = location.open_inputs_max  # input handles kept open (module docstring)
        self.manifest_source = manifest_source  # callable -> Manifest | None: a writer's uploader's manifest
        self.refusal_source = None  # callable -> str | None: why the writer's uploader refused the tier
        self._follow_interval_ns = follow_interval_ms * 1_000_000
        self._lock = threading.Lock()  # the cache, the handles and the figures
        self._blocks: collections.OrderedDict = collections.OrderedDict()  # (key, block number) -> bytes, LRU
        self._handles: collections.OrderedDict = collections.OrderedDict()  # key -> open input file, LRU
        self._manifest_lock = threading.Lock()
        self._manifest: Manifest | None = None  # as last loaded by this reader
        self._loaded_ns: int | None = None  # when it was loaded (monotonic), None before the first load
        self._loaded_for_local_min = -1  # the local log's start the last load was made for
        self._failure: Exception | None = None  # why the last load failed, until one succeeds
        self._checked: int | None = None  # id() of the last manifest whose format settings were checked
        self.held_bytes = 0
        self.held_bytes_peak = 0
        self.hits = self.misses = 0  # blocks
        self.range_reads = 0
        self.bytes_fetched = 0
        self.objects_opened = 0
        self.manifest_loads = 0

    # --- the manifest --------------------------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        """The tier's manifest as this reader knows it (loaded at first use); None for a tier without one."""
        source = self.manifest_source() if self.manifest_source is not None else None
        if source is not None:
            return self._check(source)
        with self._manifest_lock:
            if self._loaded_ns is None or (self._failure is not None and self._due()):
                self._load()
            elif self._failure is not None and not self.manifest_loads:
                raise StoreIOError(f"the tier {self.location.uri} could not be read: {self._failure}")
            return self._manifest

    def _due(self) -> bool:
        return time.monotonic_ns() - self._loaded_ns >= self._follow_interval_ns

    def _load(self) -> None:
        """Load the manifest from the tier (under _manifest_lock). When the tier does not answer, the manifest
        loaded before stays (and the next try waits for the interval); StoreIOError when there is none."""
        self._loaded_ns = time.monotonic_ns()
        try:
            found = manifest_module.load(self.location)
        except StoreIOError as exc:
            self._failure = exc
            log.warning("cannot read the manifest of the tier %s%s: %s", self.location.uri,
                        " (reads go on with the one read before)" if self.manifest_loads else "", exc)
            if self.manifest_loads:
                return
            raise
        self._manifest = None if found is None else self._check(found)
        self._failure = None
        with self._lock:
            self.manifest_loads += 1

    def _check(self, manifest: Manifest) -> Manifest:
        if self._checked != id(manifest):
            theirs = {name: manifest.store.get(name) for name in manifest_module.STORE_FIELDS}
            ours = {name: self.store_fields.get(name) for name in manifest_module.STORE_FIELDS}
            if theirs != ours:
                raise ConfigMismatchError(f"the tier {self.location.uri} holds a store of other format settings "
                                          f"({theirs}) than this store's ({ours})")
            self._checked = id(manifest)
        return manifest

    def _reload_if_due(self, local_min: int | None) -> Manifest | None:
        """Load the manifest again when due (module docstring); the manifest known after."""
        if self.manifest_source is not None and self.manifest_source() is not None:
            return self.manifest()  # the writer's own: current
        with self._manifest_lock:
            moved = local_min is not None and local_min > self._loaded_for_local_min
            if self._loaded_ns is None or moved or self._due():
                self._load()
                if local_min is not None:
                    self._loaded_for_local_min = max(self._loaded_for_local_min, local_min)
            return self._manifest

    def history_start(self, local_min: int) -> int | None:
        """The tier's start when the tier holds the log's history below `local_min` (the local log's first
        offset): its segments reach from at or below `local_min` up to it. None otherwise (an empty tier, one
        starting past the local log's start, or one ending below it, a gap: reads then stop at `local_min`).
        Raises StoreIOError when the tier cannot be read and the reader has no manifest yet."""
        if self._refused() is not None:
            return None
        manifest = self.manifest()
        if manifest is None or manifest.end is None or manifest.end < local_min:
            manifest = self._reload_if_due(local_min)
        if manifest is None or not manifest.segments:
            return None
        return manifest.start if manifest.start <= local_min <= manifest.end else None

    def _refused(self) -> str | None:
        return self.refusal_source() if self.refusal_source is not None else None

    def _segment_for(self, commitlog_offset: int) -> tuple[Manifest, TierSegment]:
        """The manifest and its segment holding `commitlog_offset`; InvalidMessageError when the tier has none."""
        refused = self._refused()
        if refused is not None:
            raise InvalidMessageError(f"commitlog offset {commitlog_offset} is not in the local log, and the tier "
                                      f"{self.location.uri} is not this store's ({refused})")
        manifest = self.manifest()
        segment = manifest.segment_at(commitlog_offset) if manifest is not None else None
        if segment is None and (manifest is None or manifest.end is None or commitlog_offset >= manifest.end):
            manifest = self._reload_if_due(None)
            segment = manifest.segment_at(commitlog_offset) if manifest is not None else None
        if segment is None:
            shown = "it is empty" if manifest is None or manifest.start is None else \
                f"it holds [{manifest.start}, {manifest.end})"
            raise InvalidMessageError(f"commitlog offset {commitlog_offset} is not in the tier {self.location.uri} "
                                      f"({shown})")
        return manifest, segment

    # --- records -------------------------------------------------------------------------------------------
    def read(self, commitlog_offset: int, *, check_crc: bool = True) -> StoredMessage:
        """Decode and check the record at `commitlog_offset` (its size unknown: module docstring)."""
        manifest, segment = self._segment_for(commitlog_offset)
        key = manifest_module.segment_key(segment.base_offset)
        object_size = manifest.segment_size_bytes
        position = commitlog_offset - segment.base_offset
        left = object_size - position
        data = self.read_bytes(key, object_size, position, min(TIER_READ_AT_FIRST_BYTES, left))
        if len(data) >= 4:
            total = int.from_bytes(data[:4], "big", signed=True)
            if len(data) < total <= left:  # longer than the first window and inside the object: read it all
                data = self.read_bytes(key, object_size, position, total)
        crc_from = manifest.store.get("record_crc_from_offset")
        where = self.location.display(key)
        try:
            if self.codec is not None:
                message = self.codec.decode_record(data, 0, len(data), commitlog_offset, check_crc,
                                                   -1 if crc_from is None else crc_from, StoredMessage)
                if message is not None:
                    return message
            return decode_message(data, 0, len(data), commitlog_offset, path=where, check_crc=check_crc,
                                  record_crc_from=crc_from)
        except CorruptionError as exc:
            raise _in_object(exc, where, position, commitlog_offset) from exc

    def read_many(self, commitlog_offsets: list[int], sizes: list[int],
                  queue: tuple[str, int, list[int]] | None = None) -> list[StoredMessage]:
        """Decode the records at `commitlog_offsets` whose TOTALSIZE an index gives in `sizes`, checked as
        CommitLog.read_many checks them (with `queue` = (topic, queue_id, queue offsets), each must be that
        queue's entry). Records of one segment close together are fetched as one window."""
        messages: list[StoredMessage] = []
        count = len(commitlog_offsets)
        done = 0
        while done < count:
            manifest, segment = self._segment_for(commitlog_offsets[done])
            stop, low, high = self._window_of(manifest, segment, commitlog_offsets, sizes, done)
            key = manifest_module.segment_key(segment.base_offset)
            data = self.read_bytes(key, manifest.segment_size_bytes, low - segment.base_offset, high - low)
            window = _Window(data, low, self.location.display(key))
            part = None if queue is None else (queue[0], queue[1], queue[2][done:stop])
            messages.extend(self._decode_window(window, segment, manifest, commitlog_offsets[done:stop],
                                                sizes[done:stop], part))
            done = stop
        return messages

    def _window_of(self, manifest: Manifest, segment: TierSegment, offsets: list[int], sizes: list[int],
                   first: int) -> tuple[int, int, int]:
        """(stop, low, high): the records offsets[first:stop], all in `segment` and spanning [low, high) of the
        log, at most TIER_READ_WINDOW_BYTES_MAX (or one record). A size that does not fit the segment raises
        CorruptionError (the index's unit is wrong), before anything is read."""
        segment_end = segment.base_offset + manifest.segment_size_bytes
        low, high = offsets[first], offsets[first]
        stop = first
        while stop < len(offsets):
            offset, size = offsets[stop], sizes[stop]
            if not segment.base_offset <= offset < segment_end:
                break
            if size < fmt.RECORD_SIZE_MIN or offset + size > segment_end:
                key = manifest_module.segment_key(segment.base_offset)
                raise CorruptionError(f"an index gives size {size} for the record at commitlog offset {offset}, "
                                      f"which does not fit the tier's segment", path=self.location.display(key),
                                      offset=offset - segment.base_offset, rule="consumequeue.matches-log")
            new_low, new_high = min(low, offset), max(high, offset + size)
            if stop > first and new_high - new_low > TIER_READ_WINDOW_BYTES_MAX:
                break
            low, high = new_low, new_high
            stop += 1
        return stop, low, high

    def _decode_window(self, window: _Window, segment: TierSegment, manifest: Manifest, offsets: list[int],
                       sizes: list[int], queue) -> list[StoredMessage]:
        crc_from = manifest.store.get("record_crc_from_offset")

        def segments(_offset):
            return window

        try:
            if self.codec is not None:
                return decode_records_native(self.codec, segments, offsets, sizes, record_crc_from=crc_from,
                                             queue=queue)
            return decode_records(segments, offsets, sizes, record_crc_from=crc_from, queue=queue)
        except CorruptionError as exc:
            failing = self._first_failing(window, offsets, sizes, queue, crc_from)
            at = failing if failing is not None else offsets[0]
            raise _in_object(exc, window.path, at - segment.base_offset, at) from exc

    @staticmethod
    def _first_failing(window: _Window, offsets: list[int], sizes: list[int], queue, crc_from) -> int | None:
        """The commitlog offset of the first record of the window that fails alone (to name it in the error)."""
        for number, (offset, size) in enumerate(zip(offsets, sizes)):
            single = None if queue is None else (queue[0], queue[1], [queue[2][number]])
            try:
                decode_records(lambda _offset: window, [offset], [size], record_crc_from=crc_from, queue=single)
            except CorruptionError:
                return offset
        return None

    # --- bytes ---------------------------------------------------------------------------------------------
    def read_bytes(self, key: str, object_size: int, position: int, length: int) -> bytes:
        """`length` bytes at `position` of the object `key` (of `object_size` bytes), through the block cache: the
        runs of blocks it misses are fetched with one range read each."""
        assert 0 <= position and 0 < length and position + length <= object_size, (key, position, length)
        block = self.block_bytes
        first, last = position // block, (position + length - 1) // block
        found: dict[int, bytes] = {}
        missing: list[int] = []
        with self._lock:
            for number in range(first, last + 1):
                data = self._blocks.get((key, number))
                if data is None:
                    missing.append(number)
                else:
                    self._blocks.move_to_end((key, number))
                    found[number] = data
            self.hits += len(found)
            self.misses += len(missing)
        skip = position - first * block
        for run_first, run_stop in _runs(missing):
            start, end = run_first * block, min(run_stop * block, object_size)
            data = self._fetch(key, object_size, start, end - start)
            fetched = {number: data[(number - run_first) * block : (number - run_first + 1) * block]
                       for number in range(run_first, run_stop)}
            self._keep(key, fetched)
            if (run_first, run_stop) == (first, last + 1):  # one read fetched it all (a cold read): no join
                return data[skip : skip + length]
            found.update(fetched)
        if first == last:
            return found[first][skip : skip + length]
        return b"".join(found[number] for number in range(first, last + 1))[skip : skip + length]

    def _fetch(self, key: str, object_size: int, start: int, length: int) -> bytes:
        data = self.location.read_range(key, object_size, start, length, handle=self._handle(key, object_size))
        with self._lock:
            self.range_reads += 1
            self.bytes_fetched += length
        return data

    def _handle(self, key: str, object_size: int):
        """An open input file of the object (kept for the next reads; the least recently used ones are let go)."""
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
        handle = self.location.open_input(key, object_size)  # a HEAD on S3: outside the lock
        with self._lock:
            self.objects_opened += 1
            self._handles[key] = handle
            self._handles.move_to_end(key)
            while len(self._handles) > self.handles_max:
                self._handles.popitem(last=False)  # closed when the last reader using it lets go of it
        return handle

    def _keep(self, key: str, blocks: dict[int, bytes]) -> None:
        """Put fetched blocks in the cache, then drop the least recently used ones down to cache_bytes."""
        with self._lock:
            for number, data in blocks.items():
                if len(data) > self.cache_bytes or (key, number) in self._blocks:
                    continue
                self._blocks[(key, number)] = data
                self.held_bytes += len(data)
                while self.held_bytes > self.cache_bytes:
                    _, dropped = self._blocks.popitem(last=False)
                    self.held_bytes -= len(dropped)
                self.held_bytes_peak = max(self.held_bytes_peak, self.held_bytes)

    # --- figures and lifecycle -----------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            return {"cache_bytes": self.held_bytes, "cache_bytes_peak": self.held_bytes_peak,
                    "cache_bytes_max": self.cache_bytes, "cache_blocks": len(self._blocks),
                    "block_hits": self.hits, "block_misses": self.misses, "range_reads": self.range_reads,
                    "bytes_fetched": self.bytes_fetched, "objects_opened": self.objects_opened,
                    "manifest_loads": self.manifest_loads}

    def close(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            self._blocks.clear()
            self.held_bytes = 0
        for handle in handles:
            try:
                handle.close()
            except OSError:
                pass


def _runs(numbers: list[int]):
    """(first, stop) of each run of consecutive numbers in a sorted list."""
    run_first = previous = None
    for number in numbers:
        if run_first is None:
            run_first = previous = number
        elif number == previous + 1:
            previous = number
        else:
            yield run_first, previous + 1
            run_first = previous = number
    if run_first is not None:
        yield run_first, previous + 1


def _in_object(exc: CorruptionError, where: str, position: int, commitlog_offset: int) -> CorruptionError:
    """`exc` (raised decoding tier bytes) as an error naming the tier object and the record's position in it."""
    text = str(exc)
    suffix = f" (file {exc.path}, offset {exc.offset})" if exc.path is not None else \
        (f" (offset {exc.offset})" if exc.offset is not None else "")
    if suffix and text.endswith(suffix):
        text = text[: -len(suffix)]
    return CorruptionError(f"{text} [the record at commitlog offset {commitlog_offset}, in the tier object]",
                           path=where, offset=position, rule=exc.rule, length_sound=exc.length_sound,
                           not_a_record=exc.not_a_record)
