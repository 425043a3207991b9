"""Planning a read of the commitlog source: a snapshot of each store, then partitions of about equal size.

How a store is planned (batch), case by case:

    CASE                                              DECISION
    a segment's first 8 bytes are zero                preallocated, not written: not read
    the last written segment                          read up to its written end, found by walking its records
                                                      from the dispatched end (or its start) to the first zero or
                                                      invalid header; the last records' body CRCs are checked, a
                                                      record straddling the end is not included
    ... that header followed by a record start        damage, not the end: its CorruptionError (file, offset,
        (within scan_end.DAMAGE_LOOKAHEAD_BYTES)      rule), as read_at reports it
    ... that header below the offset the checkpoint   damage, whatever follows it: CorruptionError, rule
        says was flushed (read before the walk)       commitlog.end, as a plain open raises it
    a topic filter, region the ConsumeQueues cover    read only the records the topic's queues point to; the
                                                      region ends at the writer's dispatched mark when there
                                                      is one (queues are written one after another), else at
                                                      the queues' furthest unit
    a topic filter, region past the dispatched end    walk the records and keep the topic's
    a time filter                                     skip segments whose records are all outside the range,
                                                      trusting store timestamps to grow along the log (as
                                                      RocketMQ's own time lookups do)
    a segment larger than the partition target        split at record starts taken from the ConsumeQueues; each
                                                      split is checked by the reader before it, which must land
                                                      exactly on it
    small segments                                    grouped, so each core gets about two partitions

How a tier is planned (a tier URI given as the store, or a local store's tier below its log's start):

    CASE                                              DECISION
    the tier's manifest (mqstore/tier/manifest.py)    the only knowledge of the tier: its segments, all sealed,
                                                      are read up to their end-of-file blanks; no walk to an end
    no manifest at a tier URI                         CommitLogSourceError: not a tier
    a local store with a tier                         the tier's segments below the local log's start, when the
                                                      tier reaches it (TierReader.history_start: the store's own
                                                      tier, no gap), then the local segments; a local log
                                                      starting at 0 does not ask the tier
    a topic filter                                    the tier's segments walked, the topic's records kept
    a time filter                                     as for local segments, by each object's first record (one
                                                      small range read each)
    a segment longer than the partition target        split at record starts from the local ConsumeQueues, else
                                                      from the tier's queue images (scan_source.QueueImages)

Every partition carries the byte ranges fixed here, so a read sees each store up to its end at planning time
while a writer appends. A tier's partitions (scan_read.TierPartition) carry the tier's URI, which the process
reading them opens. A streaming micro-batch is planned from the offsets Spark gives (`plan_stream`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

try:  # the Spark source's partition type; store.scan() plans the same partitions without pyspark
    from pyspark.sql.datasource import InputPartition
except ImportError:  # pragma: no cover - exercised by a test in a subprocess without pyspark
    InputPartition = object

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import ConfigMismatchError, InvalidConfigError, StoreIOError
from mqstore.consumequeue.mark import mark_path, read_mark
from mqstore.store.scan_end import checkpoint_flushed_offset, refuse_stop_below_flushed, written_end
from mqstore.store.scan_errors import CommitLogSourceError
from mqstore.store.scan_options import RowFilter, StoreRef, is_tier_uri
from mqstore.store.scan_read import (
    LogPartition,
    Piece,
    QueuePartition,
    TierPartition,
)
from mqstore.store.store_files import QueueIndex, Segments, list_segments
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.manifest import MANIFEST_KEYS, Manifest
from mqstore.tier.scan_source import QueueImages, first_timestamps_us, open_location

MIB = 1 << 20
PARTITION_BYTES_MAX = 256 * MIB  # log bytes per partition, at most (each is one Spark task; 64 MiB: more tasks, slower)
PARTITION_BYTES_MIN = 64 * 1024  # below this a partition costs more to schedule than to read
PARTITIONS_PER_CORE = 2
QUEUE_PARTITION_RECORDS_MAX = 262144  # records per partition on the ConsumeQueue path


# --- the snapshot: where a store's written log ends -----------------------------------------------------------
@dataclass(frozen=True)
class TierSnapshot:
    """A tier as planning found it: where it is, its manifest, and the URI its partitions open it with (None: they
    carry this process's open location)."""

    location: TierLocation
    manifest: Manifest
    uri: str | None


@dataclass
class StorePlan:
    """What planning learned about one store: its segments, written end, dispatched end, known record starts.
    With `tier`, the segments are objects of that tier (all sealed: the written end is the last one's end)."""

    ref: StoreRef
    segments: Segments
    end: int
    dispatched_end: int | None
    queues: QueueIndex
    boundaries: list
    tier: TierSnapshot | None = None


def plan_store(ref: StoreRef, known_start: int | None = None) -> StorePlan:
    """Snapshot one store: its written end now (walking from the best known record start)."""
    flushed = checkpoint_flushed_offset(ref.root)  # first: what it says was on disk before the walk looks
    segments = list_segments(ref.root)
    queues = QueueIndex(ref.root)
    furthest = _verified_dispatched_end(segments, queues)
    starts = [s for s in (furthest, known_start) if s is not None]
    end, boundaries = written_end(segments, starts)
    refuse_stop_below_flushed(segments, end, flushed)
    dispatched = _queues_complete_below(ref.root, segments, furthest)
    if dispatched is not None and dispatched > end:
        dispatched = end
    return StorePlan(ref, segments, end, dispatched, queues, boundaries)


def _verified_dispatched_end(segments: Segments, queues: QueueIndex) -> int | None:
    """The end of the queues' furthest unit, when the record it points to is where it says."""
    found = queues.dispatched_end()
    if found is None or not segments.bases:
        return None
    end, offset, size = found
    head = _header_at(segments, offset)
    if head is None or end > segments.base_of(offset) + segments.segment_size:
        return None
    total, magic, physical = head
    if magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2) or total != size or physical != offset:
        return None
    return end


def _queues_complete_below(root: str, segments: Segments, furthest: int | None) -> int | None:
    """A commitlog offset below which every record is in its ConsumeQueue (None: no such offset is known).

    An mqstore writer that has the store open publishes one (consumequeue/mark.py): its dispatcher writes a
    batch queue by queue, so a queue's furthest unit can be ahead of another queue's last record. Without the
    mark (RocketMQ wrote the store, or mqstore closed it cleanly) the queues are complete up to their furthest
    unit: RocketMQ's dispatcher writes one record's units at a time, in log order.
    """
    mark = read_mark(mark_path(root))
    if mark is None or mark == furthest:
        return furthest
    if mark <= segments.start:
        return None
    base = segments.base_of(mark)
    if mark == base:
        return mark if base in segments.bases else None
    head = _header_at(segments, mark)
    if head is None:
        return None
    total, magic, physical = head
    if magic in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2) and physical == mark:
        return mark
    if magic == fmt.BLANK_MAGIC_CODE and total == base + segments.segment_size - mark:
        return mark
    return None  # not a record start: a mark left by an older run, the log rewritten since


def _header_at(segments: Segments, offset: int) -> tuple[int, int, int | None] | None:
    """(TOTALSIZE, MAGICCODE, PHYSICALOFFSET or None when the segment ends first) of the header at commitlog
    `offset`; None if it cannot be read."""
    base = segments.base_of(offset)
    if offset < segments.start or base not in segments.bases:
        return None
    try:
        fd = os.open(segments.path(base), os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.pread(fd, fmt.OFFSET_PHYSICAL_OFFSET + 8, offset - base)
    finally:
        os.close(fd)
    if len(head) < fmt.BLANK.size:
        return None
    total, magic = fmt.BLANK.unpack_from(head, 0)
    if len(head) < fmt.OFFSET_PHYSICAL_OFFSET + 8:  # the last bytes of a segment: only a blank fits there
        return total, magic, None
    return total, magic, fmt.struct.unpack_from(">q", head, fmt.OFFSET_PHYSICAL_OFFSET)[0]


# --- planning: partitions -------------------------------------------------------------------------------------
def _segment_first_timestamps_us(plan: StorePlan) -> dict[int, int | None]:
    """The store timestamp of each segment's first record (None when it does not start with a record)."""
    if plan.tier is not None:
        return first_timestamps_us(plan.tier.location, plan.tier.manifest,
                                   [base for base in plan.segments.bases if base < plan.end])
    found = {}
    for base in plan.segments.bases:
        if base >= plan.end:
            break
        try:
            fd = os.open(plan.segments.path(base), os.O_RDONLY)
            try:
                head = os.pread(fd, fmt.OFFSET_STORE_TIMESTAMP + 8, 0)
            finally:
                os.close(fd)
        except FileNotFoundError:
            found[base] = None
            continue
        total, magic = fmt.BLANK.unpack_from(head, 0)
        found[base] = (fmt.struct.unpack_from(">q", head, fmt.OFFSET_STORE_TIMESTAMP)[0] * 1000
                       if magic == fmt.MESSAGE_MAGIC_CODE else None)
    return found


def _time_allowed(plan: StorePlan, row_filter: RowFilter):
    """The segment bases that may hold a record in the time range (None: all), by first timestamps."""
    lo, hi = row_filter.time_lo_us, row_filter.time_hi_us
    if lo is None and hi is None:
        return None
    firsts = _segment_first_timestamps_us(plan)
    bases = [b for b in plan.segments.bases if b < plan.end]
    allowed = set()
    for i, base in enumerate(bases):
        first = firsts.get(base)
        following = firsts.get(bases[i + 1]) if i + 1 < len(bases) else None
        if first is not None and hi is not None and first >= hi:
            continue  # every record of the segment is stored at or after `first`
        if following is not None and lo is not None and following < lo:
            continue  # every record of the segment is stored at or before the next segment's first
        allowed.add(base)
    return allowed


def _log_pieces(plan: StorePlan, lo: int, hi: int, allowed, *, lo_is_record_start: bool) -> list[Piece]:
    """Pieces holding the records with offsets in [lo, hi) (and more: the reader's filter drops the rest).

    A piece starts at `lo` when it is a record start, else at its segment's base; it ends at the segment's end
    (through the blank) or at the planned written end.
    """
    size = plan.segments.segment_size
    pieces = []
    for base in plan.segments.bases:
        segment_end = base + size
        if segment_end <= lo or base >= hi or base >= plan.end:
            continue
        if allowed is not None and base not in allowed:
            continue
        start = lo if lo_is_record_start and base <= lo else base
        pieces.append(Piece(base, start, min(segment_end, plan.end)))
    return pieces


def _split_piece(plan: StorePlan, piece: Piece, target: int) -> list[Piece]:
    """Cut a long piece at record starts about `target` bytes apart (known ones, or ConsumeQueue units)."""
    if piece.end - piece.start <= target * 3 // 2:
        return [piece]
    cuts, position = [], piece.start
    while piece.end - position > target * 3 // 2:
        wanted = position + target
        known = [b for b in plan.boundaries if wanted <= b < piece.end]
        found = min(known) if known else plan.queues.boundary_at_or_after(wanted, piece.end)
        if found is None or found <= position:
            break
        cuts.append(found)
        position = found
    edges = [piece.start, *cuts, piece.end]
    return [Piece(piece.base, a, b) for a, b in zip(edges, edges[1:])]


def _queue_units(plan: StorePlan, row_filter: RowFilter, lo: int, hi: int, allowed) -> list[tuple]:
    """(topic, queue dir, first entry number, units, wanted) of each selected queue, units in [lo, hi)."""
    size = plan.segments.segment_size
    found = []
    for topic, queue_id, queue_dir in plan.queues.queues():
        if topic not in row_filter.topics:
            continue
        if row_filter.queue_ids is not None and queue_id not in row_filter.queue_ids:
            continue
        first, units = plan.queues.entries(queue_dir, lo, hi)
        if not len(units):
            continue
        wanted = np.ones(len(units), dtype=bool)
        if allowed is not None:
            offsets = units["commitlog_offset"].astype(np.int64)
            wanted = np.isin(offsets - (offsets - plan.segments.start) % size, np.array(sorted(allowed), np.int64))
        found.append((topic, queue_dir, first, units, wanted))
    return found


def _queue_groups(found: list[tuple], target: int) -> list[list]:
    """Groups of (topic, queue dir, first entry, count) slices, each about `target` bytes of records."""
    slices = []  # (topic, queue_dir, first, count, bytes, commitlog offset of the first)
    for topic, queue_dir, first, units, wanted in found:
        record_bytes = np.where(wanted, units["size"].astype(np.int64), 0)
        cumulative = np.cumsum(record_bytes)
        # where a new stretch of `target` log bytes starts: a slice stays within one
        window_starts = np.flatnonzero(np.diff(units["commitlog_offset"].astype(np.int64) // target)) + 1
        at = 0
        while at < len(units):
            stop = max(int(np.searchsorted(cumulative, cumulative[at] - record_bytes[at] + target, side="right")),
                       at + 1)
            stop = min(stop, at + QUEUE_PARTITION_RECORDS_MAX)
            following = int(np.searchsorted(window_starts, at, side="right"))
            if following < len(window_starts):
                stop = min(stop, int(window_starts[following]))
            chunk = np.flatnonzero(wanted[at:stop])
            if len(chunk):
                a, b = at + int(chunk[0]), at + int(chunk[-1]) + 1
                slices.append((topic, queue_dir, first + a, b - a, int(record_bytes[a:b].sum()),
                               int(units["commitlog_offset"][a])))
            at = stop
    # By where they start in the log: a partition holds the queues' slices of a stretch of log (their records lie
    # close together in the segment's pages, which it maps once), not one queue's records spread over the log.
    slices.sort(key=lambda item: item[5])
    groups, current, current_bytes = [], [], 0
    for item in slices:
        if current and current_bytes + item[4] > target:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(item[:4])
        current_bytes += item[4]
    if current:
        groups.append(current)
    return groups


def _partition_target(total_bytes: int, bytes_max: int = PARTITION_BYTES_MAX) -> int:
    """Bytes per partition: a multiple of PARTITIONS_PER_CORE partitions per core, none above `bytes_max`."""
    slots = PARTITIONS_PER_CORE * (os.cpu_count() or 1)  # the planner's cores stand for the cluster's
    count = slots * max(1, math.ceil(total_bytes / (bytes_max * slots)))
    return min(bytes_max, max(PARTITION_BYTES_MIN, math.ceil(total_bytes / count)))


def _group_pieces(plan: StorePlan, pieces: list[Piece], target: int) -> list[LogPartition]:
    partitions, current, current_bytes = [], [], 0
    for piece in pieces:
        for part in _split_piece(plan, piece, target):
            length = part.end - part.start
            if current and current_bytes + length > target:
                partitions.append(current)
                current, current_bytes = [], 0
            current.append(part)
            current_bytes += length
    if current:
        partitions.append(current)
    ref, size, tier = plan.ref, plan.segments.segment_size, plan.tier
    if tier is not None:
        crc_from = tier.manifest.store.get("record_crc_from_offset")
        location = tier.location if tier.uri is None else None
        return [TierPartition(tier.uri, ref.label, size, crc_from, tuple(p), location) for p in partitions]
    fallback = None if isinstance(ref.tier, str) else ref.tier  # a TierReader: segments removed since are read there
    return [LogPartition(ref.root, ref.label, size, tuple(p), fallback) for p in partitions]


def plan_batch(stores, row_filter: RowFilter, *, partition_bytes_max: int = PARTITION_BYTES_MAX
               ) -> list[InputPartition]:
    """The partitions of a batch read of `stores`, each store up to its written end now, each at most
    `partition_bytes_max` bytes of log where record starts are known to cut at. A store with a tier is read from
    the tier below its local log's start, then from its local segments; a tier URI from the tier alone."""
    if row_filter.is_empty():
        return []
    work = []  # (plan, log pieces, ConsumeQueue units)
    total = 0
    for ref in stores:
        for plan in _plans_of(ref):
            pieces, units = _plan_work(plan, row_filter)
            if not pieces and not units:
                continue
            total += sum(p.end - p.start for p in pieces)
            total += sum(int(np.sum(u["size"].astype(np.int64)[w])) for _, _, _, u, w in units)
            work.append((plan, pieces, units))
    target = _partition_target(total, partition_bytes_max)
    partitions: list[InputPartition] = []
    for plan, pieces, units in work:
        for group in _queue_groups(units, target):
            partitions.append(QueuePartition(plan.ref.root, plan.ref.label, plan.segments.segment_size,
                                             plan.segments.start, tuple(group)))
        partitions.extend(_group_pieces(plan, pieces, target))
    return partitions


def _plan_work(plan: StorePlan, row_filter: RowFilter) -> tuple[list[Piece], list[tuple]]:
    """(log pieces, ConsumeQueue units) of one plan's records that may pass `row_filter`."""
    lo = max(plan.segments.start, row_filter.offset_lo or 0)
    hi = plan.end if row_filter.offset_hi is None else min(plan.end, row_filter.offset_hi)
    if lo >= hi:
        return [], []
    allowed = _time_allowed(plan, row_filter)
    units, log_lo = [], lo
    by_queues = row_filter.topics is not None and plan.dispatched_end is not None and plan.dispatched_end > lo
    if by_queues:
        units = _queue_units(plan, row_filter, lo, min(hi, plan.dispatched_end), allowed)
        log_lo = plan.dispatched_end  # a record start: the queues cover everything before it
    pieces = _log_pieces(plan, log_lo, hi, allowed, lo_is_record_start=by_queues) if log_lo < hi else []
    return pieces, units


# --- a tier's segments ----------------------------------------------------------------------------------------
def _plans_of(ref: StoreRef) -> list[StorePlan]:
    """The plans of one store in log order: a tier URI's; a local store's, after its tier's below it."""
    if is_tier_uri(ref.root):
        return [_tier_plan(ref, open_tier(ref.root), None, None)]
    plan = plan_store(ref)
    if ref.tier is None or not plan.segments.bases or plan.segments.start == 0:
        return [plan]  # no history below the local log: the tier is not asked
    snapshot = _tier_below(ref.tier, plan.segments)
    if snapshot is None:
        return [plan]
    return [_tier_plan(ref, snapshot, plan.segments.start, plan.queues), plan]


def open_tier(uri: str) -> TierSnapshot:
    """The tier at `uri` with its manifest; CommitLogSourceError when it cannot be opened or has no manifest."""
    try:
        location = open_location(uri)
    except InvalidConfigError as exc:
        raise CommitLogSourceError(str(exc)) from exc
    manifest = manifest_module.load(location)
    if manifest is None:
        raise CommitLogSourceError(f"no tier manifest at {location.display(MANIFEST_KEYS[0])} or {MANIFEST_KEYS[1]}: "
                                   f"{location.uri} is not a tier, or its store has uploaded nothing yet")
    return TierSnapshot(location, manifest, uri)


def _tier_below(tier, segments: Segments) -> TierSnapshot | None:
    """The tier of a local store when it holds the log's history up to the local log's start (its TierReader's
    history_start: not a tier the writer refused, no gap, the store's format settings); else None."""
    if isinstance(tier, str):
        snapshot = open_tier(tier)
        manifest = snapshot.manifest
        if manifest.segment_size_bytes != segments.segment_size:
            raise ConfigMismatchError(f"the tier {snapshot.location.uri} holds segments of "
                                      f"{manifest.segment_size_bytes} bytes, the store's are {segments.segment_size}")
        reaches = manifest.start is not None and manifest.start <= segments.start <= manifest.end
        start = manifest.start if reaches else None
    else:
        start = tier.history_start(segments.start)
        snapshot = TierSnapshot(tier.location, tier.manifest(), None) if start is not None else None
    if start is None or start >= segments.start:
        return None
    return snapshot


def _tier_plan(ref: StoreRef, snapshot: TierSnapshot, local_start: int | None, local_queues) -> StorePlan:
    """The plan of a tier's segments below `local_start` (all of them: None). Long segments are cut at record
    starts from the local ConsumeQueues when there are any, else from the tier's queue images."""
    manifest = snapshot.manifest
    size = manifest.segment_size_bytes
    bases = tuple(s.base_offset for s in manifest.segments if local_start is None or s.base_offset < local_start)
    segments = Segments(snapshot.location.display("commitlog"), size, bases)
    end = bases[-1] + size if bases else 0
    images = QueueImages(snapshot.location, manifest)
    queues = images if local_queues is None else _Boundaries((local_queues, images))
    return StorePlan(ref, segments, end, None, queues, [], tier=snapshot)


class _Boundaries:
    """Record starts from the first of several sources that knows one."""

    def __init__(self, sources):
        self.sources = sources

    def boundary_at_or_after(self, commitlog_offset: int, limit: int) -> int | None:
        for source in self.sources:
            found = source.boundary_at_or_after(commitlog_offset, limit)
            if found is not None:
                return found
        return None


def plan_stream(ref: StoreRef, lo: int, hi: int) -> list[LogPartition]:
    """The partitions of one store's records in [lo, hi) (both record starts): one micro-batch."""
    segments = list_segments(ref.root)
    if lo < segments.start:
        raise StoreIOError(f"store {ref.root}: the records from commitlog offset {lo} were deleted by "
                           f"retention before this query read them (the log now starts at "
                           f"{segments.start})")
    plan = StorePlan(ref, segments, hi, None, QueueIndex(ref.root), [lo])
    pieces = _log_pieces(plan, lo, hi, None, lo_is_record_start=True)
    return _group_pieces(plan, pieces, _partition_target(hi - lo))
