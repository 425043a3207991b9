"""Retention: deleting (or archiving) old CommitLog segments and what points into them (RocketMQ's
CleanCommitLogService and CleanConsumeQueueService).

When does a segment go? A segment is expired when its file was last modified more than `file_reserved_hours`
ago. Expired segments are removed
  - at `delete_when_hour` (local time, the hour RocketMQ's deleteWhen names), or
  - at once while disk usage is over `disk_max_used_space_ratio` (0.75), or
  - whenever `MessageStore.clean_expired()` is called.
Unexpired messages stay, however full the disk: an embedded store shares its disk with other programs, and one
of them filling it is no reason to lose data; put() returns DISK_FULL instead (below). Only with
`delete_unexpired_on_disk_pressure` (RocketMQ's broker policy, for a store that owns its disk), while usage is over
`disk_clean_forcibly_ratio` (0.85), do the oldest segments go even if not expired: each round that does so logs
a WARNING naming the segments, their offsets and the disk usage, and `stats()["disk"]` counts them.
Never removed: the segment holding the log's end and any segment not fully dispatched and flushed.

With `archive_dir` set, segments are moved to `<archive_dir>/commitlog/` instead of deleted (KahaDB's
archiveDataLogs); `restore_from_archive` puts them back in front of a store's log, which then rebuilds its
ConsumeQueues and index from the whole log.

After segments go, ConsumeQueue files whose every entry points below the log's new minimum are deleted, each
queue's `min_offset` moves to its first entry still in the log, and index files below it are deleted.

With a tier (`tier_uri`), a segment may leave local disk only once the tier's manifest lists it (uploaded and
verified) and the ConsumeQueue and index entries of its records are on disk: the round flushes the queues and the
index first (`MessageStore._flush_entries`, once a round, when a segment is about to go; it raises the checkpoint's
index_flushed_end to the dispatched offset it flushed), and removes only segments below what that flush covered.
So no crash recovery has to add entries for records below the local log, which only the tier then holds
(mqstore/store/recovery.py: with a tier it can, TIER_REPLAYED, but reads every segment object from there). A
removed segment is still readable (mqstore/store/reads.py reads it from the tier), so:
  - the ConsumeQueue and index files stay on local disk (they are what reads of the tier's history look up, and
    the queues' `min_offset` stays at the tier's start); neither this process nor the dispatch process trims them.
    They cost about 20 bytes a message (its ConsumeQueue unit) plus 20 bytes a key with the index on (one entry
    for the UNIQ_KEY and one per KEYS word, and 4 bytes per hash slot of each file), next to the message's record
    in the log (its body plus about 100-200 bytes): for 1 KiB messages with one key, 60 of every ~1,200 bytes;
  - besides expiry, uploaded segments go early, oldest first, unexpired: while the local segments take more than
    `tier_local_retention_bytes` (each counted at its full size), and while disk usage is over
    `disk_max_used_space_ratio` (`delete_unexpired_on_disk_pressure` is not needed: nothing is lost). They are
    listed in the report's `offloaded_segments_removed`, not as unexpired messages removed. Segments not in the
    tier are never removed before they expire, whatever the disk.
Above `disk_full_ratio`, `put()` returns PutStatus.DISK_FULL until space is freed (a WARNING when that begins).

The disk's usage comes from `disk_usage_probe`, looked up at each call: tests replace it to stand for a disk
that another program fills.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import StoreIOError

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
SEGMENTS_REMOVED_PER_ROUND_MAX = 16  # bounds one round's work; the next round goes on
TRIM_TIMEOUT_S = 60.0  # how long retention waits for a dispatch process to delete queue and index files


@dataclass
class CleanReport:
    """What one retention round did."""

    reason: str = ""
    segments_removed: list[str] = field(default_factory=list)
    archived: bool = False
    bytes_freed: int = 0
    log_min_offset: int = 0
    queue_files_removed: int = 0
    index_files_removed: int = 0
    disk_used_ratio: float = 0.0
    unexpired_segments_removed: list[str] = field(default_factory=list)  # of segments_removed, the unexpired
    offloaded_segments_removed: list[str] = field(default_factory=list)  # of those, unexpired but in the tier

    def as_dict(self) -> dict:
        return asdict(self)


def disk_used_ratio(path: str) -> float:
    """The used fraction of the file system holding `path`, as df reports it: used / (used + available to
    unprivileged users). Blocks reserved for root count as neither, so a disk with reserved blocks is not
    mistaken for a fuller one."""
    stats = os.statvfs(path)
    used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    usable = used + stats.f_bavail * stats.f_frsize
    return used / usable if usable > 0 else 0.0


disk_usage_probe = disk_used_ratio  # what retention measures the disk with (a seam: see the module docstring)


def _probe(path: str) -> float:
    return disk_usage_probe(path)


class Retention:
    """Runs retention rounds for one store; `start()` runs them every `clean_interval_ms` on a thread."""

    def __init__(self, store, *, usage=_probe, clock_ms=lambda: time.time_ns() // 1_000_000,
                 local_hour=lambda: time.localtime().tm_hour):
        self._store = store
        self._usage = usage
        self._clock_ms = clock_ms
        self._local_hour = local_hour
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqstore-retention", daemon=True)
        self.last_report: CleanReport | None = None
        self.unexpired_segments_removed = 0  # since open: segments of unexpired messages removed (a forced clean)
        self.unexpired_bytes_removed = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = self._store.config.clean_interval_ms / 1000.0
        while not self._stopping.wait(interval):
            try:
                self.run_once(manual=False)
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("retention round failed")

    def run_once(self, *, manual: bool) -> CleanReport:
        """One round: check the disk, then remove what the rules say (see the module docstring)."""
        with self._lock:
            store = self._store
            config = store.config
            report = CleanReport()
            report.disk_used_ratio = usage = self._usage(store.root_dir)
            self._set_disk_full(usage)
            space_pressure = usage > config.disk_max_used_space_ratio
            forcibly = config.delete_unexpired_on_disk_pressure and usage > config.disk_clean_forcibly_ratio
            time_up = self._local_hour() == config.delete_when_hour
            over_local_bound = self._over_local_bound()
            if not (manual or time_up or space_pressure or over_local_bound):
                self.last_report = report
                return report
            report.reason = "manual" if manual else ("disk" if space_pressure else
                                                     "local-bytes" if over_local_bound else "time")
            self._remove_segments(report, forcibly)
            if report.segments_removed:
                self._trim_queues_and_index(report)
                report.disk_used_ratio = self._usage(store.root_dir)
                self._set_disk_full(report.disk_used_ratio)
            report.log_min_offset = store._commitlog.min_offset()
            self.last_report = report
            if report.unexpired_segments_removed:
                log.warning("retention %s %d segment(s) of UNEXPIRED messages (%s; messages below commitlog offset "
                            "%d are gone) because the disk was %.0f%% used, over disk_clean_forcibly_ratio=%s, and "
                            "delete_unexpired_on_disk_pressure=True", "archived" if report.archived else "deleted",
                            len(report.unexpired_segments_removed), ", ".join(report.unexpired_segments_removed),
                            report.log_min_offset, usage * 100, config.disk_clean_forcibly_ratio)
            if report.segments_removed:
                log.info("retention removed %s", report.as_dict())
            return report

    def _over_local_bound(self) -> bool:
        """With a tier and tier_local_retention_bytes: whether the local segments take more than that."""
        store = self._store
        bound = store.config.tier_local_retention_bytes
        if bound is None or getattr(store, "_tier_uploader", None) is None:
            return False
        return sum(segment.size_bytes for segment in list(store._commitlog.segments.segments)) > bound

    def _unexpired_may_go(self, forcibly: bool) -> bool:
        """Whether the oldest removable segment may go unexpired: with a tier (it is in the tier) while the local
        segments are over tier_local_retention_bytes or the disk over disk_max_used_space_ratio; without one
        only by delete_unexpired_on_disk_pressure's rule."""
        store = self._store
        config = store.config
        if getattr(store, "_tier_uploader", None) is not None:
            return self._over_local_bound() or self._usage(store.root_dir) > config.disk_max_used_space_ratio
        return forcibly and self._usage(store.root_dir) > config.disk_clean_forcibly_ratio

    def _set_disk_full(self, usage: float) -> None:
        """Refuse puts (DISK_FULL) while usage is over disk_full_ratio; a WARNING when that begins."""
        store = self._store
        full = usage > store.config.disk_full_ratio
        if full and not store._disk_full:
            log.warning("the disk of %s is %.0f%% used, over disk_full_ratio=%s: put() returns DISK_FULL until "
                        "space is freed%s", store.root_dir, usage * 100, store.config.disk_full_ratio,
                        "" if store.config.delete_unexpired_on_disk_pressure else
                        " (unexpired messages are kept: delete_unexpired_on_disk_pressure=False)")
        store._disk_full = full

    def _removable(self) -> list:
        """Segments that may go: all but the one holding the end, and only below what is dispatched and flushed."""
        store = self._store
        commitlog = store._commitlog
        safe_end = min(commitlog.readable_end(), commitlog.flushed_position, store._dispatch.dispatched_offset)
        uploader = getattr(store, "_tier_uploader", None)
        if uploader is not None:  # with a tier, only what the tier's manifest lists, verified, may leave the disk
            tier_end = uploader.verified_end()
            safe_end = min(safe_end, tier_end if tier_end is not None else commitlog.min_offset())
        return [s for s in commitlog.segments.segments[:-1] if s.base_offset + s.size_bytes <= safe_end]

    def _remove_segments(self, report: CleanReport, forcibly: bool) -> None:
        store = self._store
        config = store.config
        now = self._clock_ms()
        reserved_ms = config.file_reserved_hours * HOUR_MS
        tiered = getattr(store, "_tier_uploader", None) is not None
        entries_flushed_end = None  # with a tier: the queue and index entries below it are on disk
        for segment in self._removable()[:SEGMENTS_REMOVED_PER_ROUND_MAX]:
            expired = os.path.getmtime(segment.path) * 1000 + reserved_ms <= now
            if not expired and not self._unexpired_may_go(forcibly):
                break  # segments go oldest first: a kept one keeps every later one
            if tiered:
                if entries_flushed_end is None:
                    entries_flushed_end = store._flush_entries()  # once a round, when a segment is to go
                if segment.base_offset + segment.size_bytes > entries_flushed_end:
                    break
            self._remove_segment(segment, report)
            if not expired and tiered:  # in the tier: nothing is lost
                report.offloaded_segments_removed.append(report.segments_removed[-1])
            elif not expired:
                report.unexpired_segments_removed.append(report.segments_removed[-1])
                self.unexpired_segments_removed += 1
                self.unexpired_bytes_removed += segment.size_bytes

    def _remove_segment(self, segment, report: CleanReport) -> None:
        store = self._store
        commitlog = store._commitlog
        archive_dir = store.config.archive_dir
        name = os.path.basename(segment.path)
        commitlog.segments.remove_first(segment)
        try:
            if archive_dir:
                target_dir = os.path.join(archive_dir, "commitlog")
                os.makedirs(target_dir, exist_ok=True)
                segment.close()
                shutil.move(segment.path, os.path.join(target_dir, name))
                report.archived = True
            else:
                segment.delete()
        except OSError as exc:
            raise StoreIOError(f"cannot remove segment {segment.path}: {exc}") from exc
        report.segments_removed.append(name)
        report.bytes_freed += segment.size_bytes

    def _trim_queues_and_index(self, report: CleanReport) -> None:
        store = self._store
        log_min = store._commitlog.min_offset()
        if getattr(store, "_tier_reader", None) is not None:
            return  # the tier holds the history they point into: they stay (module docstring)
        if store._follows_queues:  # the dispatch process writes them: it deletes their files
            queue_files, index_files = store._dispatch.trim(log_min, TRIM_TIMEOUT_S)
            report.queue_files_removed += queue_files
            report.index_files_removed += index_files
            store._index_files_trimmed = store._index_files_trimmed or index_files > 0
            return
        for queue in list(store._queues.queues.values()):
            report.queue_files_removed += queue.delete_files_below(log_min)
        if store._index is not None:
            report.index_files_removed += store._index.delete_files_below(log_min)


def restore_from_archive(archive_dir: str, store_dir: str) -> list[str]:
    """Put archived segments back in front of a closed store's CommitLog (or into an empty store).

    Only segments that end exactly where the store's log starts, back to back, are restored; the store's
    ConsumeQueues and index are deleted so the next open rebuilds them from the whole log. Returns the
    restored file names.
    """
    source = os.path.join(archive_dir, "commitlog")
    target = os.path.join(store_dir, "commitlog")
    os.makedirs(target, exist_ok=True)
    present = sorted(b for b in (fmt.parse_segment_name(n) for n in os.listdir(target)) if b is not None)
    archived = sorted(b for b in (fmt.parse_segment_name(n) for n in os.listdir(source)) if b is not None)
    if not archived:
        return []
    size = os.path.getsize(os.path.join(source, fmt.segment_name(archived[0])))
    start = present[0] if present else archived[-1] + size
    chosen = []
    for base in reversed(archived):
        if base + size != start:
            break
        chosen.append(base)
        start = base
    for base in chosen:
        shutil.copy2(os.path.join(source, fmt.segment_name(base)), os.path.join(target, fmt.segment_name(base)))
    for derived in ("consumequeue", "index"):
        shutil.rmtree(os.path.join(store_dir, derived), ignore_errors=True)
    return [fmt.segment_name(base) for base in sorted(chosen)]
