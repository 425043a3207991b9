"""MessageStore: the facade that wires the CommitLog, the dispatchers and the ConsumeQueues together.

Lifecycle of a writable store: open takes the lock, checks the saved format settings, maps the CommitLog and
finds its end, loads the ConsumeQueues, dispatches whatever the queues have not seen yet, restores the queue
offset table from the queues and starts the dispatch thread. close() stops accepting puts, lets dispatch
reach the end of the log, flushes everything and releases the lock.

With a tier (`tier_uri`, or the one saved in the store) a writer also starts the tier uploader
(mqstore/tier/uploader.py), and every store gets a TierReader (mqstore/tier/reader.py) through which reads of what
retention removed from local disk go to the tier (mqstore/store/reads.py).
"""

from __future__ import annotations

import collections
import errno
import fcntl
import itertools
import logging
import os
import struct
import threading
import time
from typing import Iterable

import numpy as np

from mqstore.commitlog import commitlog as commitlog_module
from mqstore.commitlog import format as fmt
from mqstore.commitlog import mapped_file
from mqstore.commitlog.commitlog import SPACE_RESERVE_STEP_BYTES, CommitLog
from mqstore.commitlog.dispatch import (
    DISPATCH_TAIL_BATCH_RECORDS,
    DISPATCH_TAIL_BATCH_RECORDS_LOW_LATENCY,
    WRITTEN_RECORDS_KEPT,
    DispatchService,
)
from mqstore.commitlog.errors import (
    CorruptionError,
    FlushFailedError,
    InvalidMessageError,
    QueueGapError,
    ReadOnlyStoreError,
    SegmentWriteError,
    StoreClosedError,
    StoreError,
    StoreIOError,
    StoreLockedError,
)
from mqstore.commitlog.handoff import HandOff
from mqstore.commitlog.message import Message, PutResult, PutStatus
from mqstore.commitlog.reput import ReputHeader, append_reput_holding_lock, header_of, prepare_reput
from mqstore.commitlog.unique_key import UniqueKeyGenerator
from mqstore.commitlog.write_batch import RECORD_SIZE
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher
from mqstore.consumequeue.mark import DispatchedMark, mark_path
from mqstore.flush.allocator import SegmentAllocator
from mqstore.flush.checkpoint import CHECKPOINT_FILE_NAME, Checkpoint
from mqstore.flush.services import GroupCommitService, IntervalFlusher
from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_service import IndexService
from mqstore.schedule.service import ScheduleService
from mqstore.store.clock import SYSTEM_CLOCK
from mqstore.store.config import (
    CONFIG_FILE_NAME,
    RECORD_CRC_FROM_KEY,
    FlushMode,
    StoreConfig,
    save_or_check_format,
    save_record_crc_from,
)
from mqstore.store.dispatch_process import ProcessDispatch, stop_leftover
from mqstore.store.index_queries import IndexFlushable, IndexLookups, checkpoint_logical_flush
from mqstore.store.markers import ABORT_FILE_NAME, remove_marker, write_marker
from mqstore.store.reads import Reads
from mqstore.store.recovery import (
    RecoveryCase,
    RecoveryReport,
    checkpoint_damage_noted,
    dispatch_start,
    note_checkpoint_damage,
    note_queue_rebuilt,
    note_tier_replayed,
    recover,
)
from mqstore.store.repair import Salvage
from mqstore.store.retention import Retention
from mqstore.store.settings import resolve_config, saved_settings_damage
from mqstore.store.tier_history import TierHistory
from mqstore.store.tiering import adopt_saved_tier, open_tier_reader, save_tier
from mqstore.tier.location import TierLocation
from mqstore.tier.reader import TierReader
from mqstore.tier.upload_process import ProcessUploader
from mqstore.tier.upload_process import stop_leftover as stop_leftover_uploader
from mqstore.tier.uploader import TierUploader
from mqstore.timer.service import TimerService

log = logging.getLogger(__name__)

CLOSE_DISPATCH_TIMEOUT_S = 300.0
DISPATCH_LAG_POLL_S = 0.1  # a put waiting for dispatch (max_dispatch_lag_bytes) looks at the store's state this often
TIER_WAIT_POLL_S = 0.01  # wait_tiered looks at the tier's end this often
COMMAND_LINE_SHOWN_BYTES_MAX = 200  # of a lock holder's command line, in StoreLockedError
REBUILDS_PER_OPEN_MAX = 64  # queues one open may rebuild after finding holes in them
CONSUME_QUEUE_FLUSH_LEAST_PAGES = 2  # RocketMQ's flushConsumeQueueLeastPages
CONSUME_QUEUE_FLUSH_THOROUGH_INTERVAL_MS = 60_000  # RocketMQ's flushConsumeQueueThoroughInterval
_new_tuple = tuple.__new__  # builds a PutResult without the NamedTuple constructor's Python frame
_PUT_OK = PutStatus.PUT_OK


def _has_segments(directory: str) -> bool:
    """Whether a CommitLog directory holds any segment file."""
    try:
        return any(fmt.parse_segment_name(name) is not None for name in os.listdir(directory))
    except FileNotFoundError:
        return False


class MessageStore(Reads, IndexLookups):
    """An embedded RocketMQ-format message store. Use `MessageStore.open(...)`; it is a context manager."""

    def __init__(self, root_dir: str, config: StoreConfig, read_only: bool):
        self.root_dir = root_dir
        self.config = config
        self.read_only = read_only
        self._closed = True
        self._lock_handle = None
        self._close_lock = threading.Lock()
        self._dispatch: DispatchService | None = None
        self.recovery_report: RecoveryReport | None = None
        self._sync_flush = config.flush_mode is FlushMode.SYNC
        self._sync_timeout_s = config.sync_flush_timeout_ms / 1000.0
        self._lag_limit = config.max_dispatch_lag_bytes  # 0: puts never wait for dispatch
        # Whether the ConsumeQueues and the index are written by another process (read_only stores, and writers
        # with dispatch_process): reads then look for what it added since.
        self._follows_queues = read_only or config.dispatch_process
        self._index_files_trimmed = False  # dispatch_process: retention deleted index files since the last lookup
        self._disk_full = False  # set by retention while disk usage is over disk_full_ratio
        # The first failed flush of any of the store's files (FlushFailedError): from then on puts are refused and
        # flush() and close() raise, until the store is reopened (docs/recovery.md, "When a flush fails").
        self._io_failure: FlushFailedError | None = None
        self._group_commit: GroupCommitService | None = None
        self._services: list = []  # flush services and the allocator, stopped in reverse order at close
        self._checkpoint: Checkpoint | None = None
        self._checkpoint_lock = threading.Lock()  # raises of the checkpoint's queue and index fields
        self._index_missing = False  # index_enabled and the store had no index directory at open
        self._writer = threading.Lock()  # one put or put_batch appends at a time (the CommitLog's lock once open)
        self._put_common = None  # the compiled put, once open (CommitLog.compiled_put)
        self._tier_uploader: TierUploader | ProcessUploader | None = None  # a writer with a tier_uri
        self._tier_reader: TierReader | None = None  # a store with a tier: reads of what left local disk
        self._tier_history: TierHistory | None = None  # a writer with a tier: recovery's reads of the tier
        self._tier_pass_start: int | None = None  # where the last re-dispatch from the tier began
        self.timer: TimerService | None = None  # a writer's timer (mqstore/timer/): delivers timer messages
        self.schedule: ScheduleService | None = None  # a writer's delay levels (mqstore/schedule/)

    # --- lifecycle -----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, root_dir, config: StoreConfig | None = None, read_only: bool = False, *,
             repair: bool = False, clock=None) -> "MessageStore":
        """Open (creating it unless read_only) the store under `root_dir`.

        A writable open recovers the store first (mqstore/store/recovery.py): after a crash it cuts a torn tail and
        re-dispatches; damaged flushed data raises CorruptionError unless `repair=True`, which cuts the log at
        the first bad record. What it found and did is in `store.recovery_report`. `clock` (mqstore/store/clock.py,
        default the system clock) is the time the timed services read: tests pass a ManualClock.
        """
        if config is None:
            config = StoreConfig()
        if not isinstance(config, StoreConfig):
            raise InvalidMessageError(f"config must be a StoreConfig, got {type(config).__name__}")
        root_dir = os.fspath(root_dir)
        store = cls(root_dir, config, read_only)
        store._repair = repair
        store.clock = SYSTEM_CLOCK if clock is None else clock
        try:
            store._open()
        except BaseException:
            store._stop_threads()
            store._release()
            marker = getattr(store, "_abort_marker_created", None)
            if marker is not None:
                remove_marker(marker)
            raise
        return store

    def _open(self) -> None:
        """Open the store's files; a writer then recovers them, dispatches what the queues miss and starts its
        threads. Each step is a method of its own, in this order."""
        self._open_files()
        self._closed = False
        if self.read_only:
            return
        report = self._recover()
        written = self._start_dispatch(report)
        self._start_services(written)
        self._install_put_entry()

    def _install_put_entry(self) -> None:
        """With the compiled put: `put` becomes the compiled entry (commitlog/csrc/put_entry.c), an attribute of
        this store that runs the common case of `MessageStore.put` without a Python frame and calls that method
        for every other case (docs/decisions/0028-put-entry-in-c.md). Not for a subclass that overrides `put`."""
        codec = self._commitlog.codec
        entry_type = getattr(codec, "PutEntry", None)
        if (entry_type is None or self._put_common is None or type(self).put is not MessageStore.put
                or not isinstance(self._writer, codec.WriterLock)):
            return
        appender = self._put_common.__self__  # CommitLog.compiled_put gives its Appender's bound put
        gate = self._group_commit.gate if self._group_commit is not None else None
        self.put = entry_type(self, appender, self._writer, self._handoff, MessageStore.put, StoreIOError, gate).put

    def _open_files(self) -> None:
        """The config resolved against the store (its format settings, its saved tier), the lock, the CommitLog,
        ConsumeQueues and index, and the reader of the tier (mqstore/store/tiering.py), opened."""
        root, passed = self.root_dir, self.config
        self._salvage = Salvage(root) if self._repair and not self.read_only else None  # keeps what repair cuts
        # The format settings not passed explicitly are the store's (mqstore/store/settings.py).
        self.config = config = resolve_config(root, passed, read_only=self.read_only)
        if self.read_only:
            if not os.path.isdir(os.path.join(root, "commitlog")):
                raise StoreIOError(f"{root} is not a store: it has no commitlog directory")
        else:
            try:
                os.makedirs(os.path.join(root, "commitlog"), exist_ok=True)
                os.makedirs(os.path.join(root, "consumequeue"), exist_ok=True)
            except OSError as exc:
                raise StoreIOError(f"cannot create the store at {root}: {exc.strerror}") from exc
            self._take_lock()
            stop_leftover(root)  # a killed writer's dispatch process must not write the queues recovery works on
            stop_leftover_uploader(root)  # nor its tier uploader process write the tier's manifest
            if self._salvage is not None and (damage := saved_settings_damage(root)) is not None:
                self._salvage.settings_damaged(os.path.join(root, "config", CONFIG_FILE_NAME), damage)
                self.config = config = resolve_config(root, passed, read_only=False)  # now from the files
        self._settings = save_or_check_format(os.path.join(root, "config"), config, writable=not self.read_only,
                                              new_log=not _has_segments(os.path.join(root, "commitlog")))
        self.config = config = adopt_saved_tier(root, config)  # the tier_uri saved in the store, when none passed
        born_raw = fmt.encode_host(config.born_host or config.store_host, config.born_port)
        self._commitlog = CommitLog(
            os.path.join(root, "commitlog"), config.segment_size_bytes, writable=not self.read_only,
            max_message_size_bytes=config.max_message_size_bytes, max_queues_per_topic=config.max_queues_per_topic,
            born_host_raw=born_raw,
            store_host_raw=fmt.encode_host(config.store_host, config.store_port),
            preallocate=config.preallocate_segments, salvage=self._salvage,
            record_crc=config.record_crc, record_crc_from=self._settings.get(RECORD_CRC_FROM_KEY))
        self._msg_id_prefix = self._commitlog.store_host_raw.hex().upper()
        self._writer = self._commitlog.lock
        self._handoff = HandOff(self._writer)  # a put that finds the writer lock taken hands its append to the holder
        self._parked = self._handoff.pending
        self._prepare = self._commitlog.prepare
        self._append_holding_lock = self._commitlog.append_holding_lock
        self._queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), config.consume_queue_entries_per_file,
                                         writable=not self.read_only)
        self._index = None
        self.index_rebuilt_because: str | None = None
        if config.index_enabled:
            # An index directory gone (deleted, lost) holds no key: recovery must not trust index_flushed_end for it.
            self._index_missing = not os.path.isdir(os.path.join(root, "index"))
            self._index = self._open_index()
            self._commitlog.unique_keys = None if self.read_only else UniqueKeyGenerator(born_raw[:4])
        if config.tier_uri is not None:
            location = TierLocation.open(config.tier_uri)
            self._tier_reader = open_tier_reader(config, location, self._commitlog.codec)
            if not self.read_only and passed.tier_uri is not None:
                save_tier(root, location, passed.tier_uri)  # where read_only opens and the command line find it
        # The compiled prepare of the common message shape (None without the compiled core, or with UNIQ_KEYs)
        self._prepare_common = None if self.read_only else self._commitlog.compiled_prepare()
        # The compiled single-message put under the writer lock (None: every put takes _put_prepared)
        self._put_common = None if self.read_only else self._commitlog.compiled_put()
        # --- timer (mqstore/timer/): prepare rewrites timer messages onto rmq_sys_wheel_timer; a thread delivers them
        if not self.read_only:
            self.timer = TimerService(self, root, self.clock, config=config, flush_log=self._commitlog.flush)
            self._commitlog.rewrite = self.timer.rewrite
            # --- delay levels (mqstore/schedule/): DELAY messages onto SCHEDULE_TOPIC_XXXX, then the timer's rewrite
            self.schedule = ScheduleService(self, root, self.clock, config=config, flush_log=self._commitlog.flush)
            schedule_rewrite, timer_rewrite = self.schedule.rewrite, self.timer.rewrite
            self._commitlog.rewrite = lambda message: timer_rewrite(schedule_rewrite(message))
            self._commitlog.rewrite_in_compiled_put(self.timer, self.schedule, SYSTEM_CLOCK, self.timer.max_delay_ms,
                                                    len(self.schedule.delays))

    def _recover(self) -> RecoveryReport:
        """The abort marker, the checkpoint, then recovery's decisions applied (mqstore/store/recovery.py)."""
        config, root = self.config, self.root_dir
        abort_path = os.path.join(root, ABORT_FILE_NAME)
        crashed = os.path.exists(abort_path)
        write_marker(abort_path)
        self._abort_marker_created = None if crashed else abort_path  # removed again if this open fails
        self._checkpoint = self._open_checkpoint()
        # Readers in other processes trust the queues below the mark; recovery may cut them, so: nothing known.
        self._mark = DispatchedMark(mark_path(root))
        self._mark.publish(0)
        if self.index_rebuilt_because is not None or self._index_missing:
            self._checkpoint.lower_index_flushed_end(0)  # the new index holds nothing: no key of any message is on disk
            self._checkpoint.flush()
        history = self._tier_history = None if self._tier_reader is None else \
            TierHistory(self._tier_reader, self._commitlog)
        report = recover(self._commitlog, self._queues, self._index, self._checkpoint, crashed=crashed,
                         repair=self._repair, check_crc=config.check_crc_on_recover, salvage=self._salvage,
                         checkpoint_damage=self._checkpoint_damage, tier=history)
        self._note_engine_cases(report)
        salvage = self._salvage
        if salvage is not None and salvage.directory is not None:  # also when only the settings file was set aside
            report.repair_dir = salvage.directory
            report.dropped_files = list(dict.fromkeys(report.dropped_files + salvage.files))
        end = report.log_end
        if config.record_crc and self._commitlog.record_crc_from is None:  # a log written without record CRCs
            self._settings = save_record_crc_from(os.path.join(root, "config"), self._settings, end)
            self._commitlog.record_crc_from = end
        self._commitlog.set_end(end)
        self._commitlog.flushed_position = end
        self._commitlog.write_through = self._sync_flush  # see CommitLog.write_through
        return report

    def _start_dispatch(self, report: RecoveryReport):
        """Dispatch from where recovery says the queues and index stop; returns the deque of records described to
        the dispatch thread as they are written (SYNC), or None."""
        config, root, crashed = self.config, self.root_dir, report.crashed
        dispatchers = [ConsumeQueueDispatcher(self._queues, self._mark, self.schedule.retag)]
        if self._index is not None:
            dispatchers.append(IndexDispatcher(self._index))
        start = dispatch_start(report, self._commitlog, self._queues, self._index, crashed=crashed,
                               checkpoint=self._checkpoint, tier=self._tier_history)
        local_min = self._commitlog.min_offset()
        tail_batch = DISPATCH_TAIL_BATCH_RECORDS_LOW_LATENCY if self._sync_flush else DISPATCH_TAIL_BATCH_RECORDS
        # SYNC: records put one by one are described to the dispatch thread as they are written, so it need not
        # read them back (unless it must check their CRCs): a deque that keeps the newest WRITTEN_RECORDS_KEPT.
        # Its batches are small (at most 16 records), where that saves 12-18% of dispatch's instructions (8% for
        # one record). Not ASYNC: there the producers would pay 3-4% more a put for dispatch batches that are
        # large exactly when producers are busy, where parsing with numpy is as cheap (docs/architecture.md).
        written = collections.deque(maxlen=WRITTEN_RECORDS_KEPT) \
            if self._sync_flush and not config.check_crc_on_dispatch else None
        self._dispatch = DispatchService(self._commitlog, dispatchers, max(start, local_min),
                                         check_crc=config.check_crc_on_dispatch, tail_batch_records=tail_batch,
                                         written=written)
        started = time.perf_counter()
        report.messages_redispatched = self._redispatch(report, start if start < local_min else None)
        self._mark.publish(self._dispatch.dispatched_offset)  # the queues are whole below it now
        report.seconds += time.perf_counter() - started
        self._commitlog.queue_offsets.update(
            {key: queue.max_offset for key, queue in self._queues.queues.items()})
        self.recovery_report = report
        (log.warning if report.cases() not in ([RecoveryCase.CLEAN], [RecoveryCase.NEW_STORE]) else log.info)(
            "opened %s: recovery %s", root, report.as_dict())
        read_min = self._read_log_min()  # with a tier holding the log's history, the tier's start
        for queue in self._queues.queues.values():
            queue.correct_min_offset(read_min)
        return written

    def _start_services(self, written) -> None:
        """The dispatch thread or process, the flush services, retention and the tier uploader."""
        config = self.config
        if config.dispatch_process:
            self._start_dispatch_process()
        else:
            self._commitlog.written_records = written  # from the first put on
            self._dispatch.start()
        self._start_flush_services()
        if self._tier_reader is not None:  # before retention: it removes only what the tier holds
            if config.tier_upload_process:
                uploader = ProcessUploader(self, self._tier_reader.location, config.tier_uri)
            else:
                uploader = TierUploader(self, self._tier_reader.location)
            self._tier_uploader = uploader
            self._tier_reader.manifest_source = lambda: uploader.manifest  # current: reads follow the uploads
            self._tier_reader.refusal_source = lambda: uploader.refused  # another store's tier: not read
        self._retention = Retention(self)
        self._retention.run_once(manual=False)  # learn the disk's state before the first put
        self._retention.start()
        self._services.append(self._retention)
        self.timer.start_if_used()  # timer (mqstore/timer/): on a store with timers, else at the first timer put
        self.schedule.start()  # delay levels (mqstore/schedule/)
        if self._tier_uploader is not None:
            self._tier_uploader.start()
            self._services.append(self._tier_uploader)

    def _start_dispatch_process(self) -> None:
        """Hand the queues and the index to a child process that dispatches from here on; this process follows
        them read-only, as a read_only store does (mqstore/store/dispatch_process.py)."""
        config = self.config
        root = self.root_dir
        start = self._dispatch.dispatched_offset
        # Each part is unset before its replacement opens: if that fails, the open's cleanup closes nothing twice.
        self._dispatch = None
        self._queues.close()
        self._queues = None
        self._queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), config.consume_queue_entries_per_file,
                                         writable=False)
        if self._index is not None:
            self._index.close()
            self._index = None
            self._index = IndexService(os.path.join(root, "index"), config.index_slot_count,
                                       config.index_entry_count_max, read_only=True)
        settings = {name: getattr(config, name) for name in (
            "segment_size_bytes", "max_message_size_bytes", "max_queues_per_topic", "record_crc",
            "consume_queue_entries_per_file", "index_enabled", "index_slot_count", "index_entry_count_max",
            "flush_consume_queue_interval_ms", "check_crc_on_dispatch")}
        settings.update(record_crc_from=self._commitlog.record_crc_from, sync_flush=self._sync_flush,
                        delay_levels=self.schedule.levels_text,
                        consume_queue_flush_least_pages=CONSUME_QUEUE_FLUSH_LEAST_PAGES,
                        consume_queue_flush_thorough_interval_ms=CONSUME_QUEUE_FLUSH_THOROUGH_INTERVAL_MS)
        self._dispatch = ProcessDispatch(root, settings, start, self._commitlog.readable_end())
        self._commitlog.end_word = self._dispatch.end_word
        self._dispatch.start()
        self._dispatch.watch(self._flush_failed)  # a failed flush of the queues or index refuses writes here too

    def _note_engine_cases(self, report: RecoveryReport) -> None:
        """The recovery table's rows decided here rather than in recovery.py: INDEX_REBUILT, CHECKPOINT_REPLACED."""
        if self.index_rebuilt_because is not None:
            report.index_case = RecoveryCase.INDEX_REBUILT
        if self._checkpoint_replaced:
            report.checkpoint_case = RecoveryCase.CHECKPOINT_REPLACED

    def _redispatch(self, report: RecoveryReport, tier_from: int | None) -> int:
        """Dispatch what the queues and index miss: from the tier's segments from `tier_from` up to the local log
        when recovery reaches below it (TIER_REPLAYED), then from the local log. A queue that lost entries the log
        still has (the log goes on past a hole in it) is deleted and rebuilt from the start of the log (or of the
        tier's history), queue by queue (`_after_queue_gap`). Returns the messages dispatched."""
        history = self._tier_history
        tier_before = history.records_dispatched if history is not None else 0
        done = 0
        for _ in range(REBUILDS_PER_OPEN_MAX):
            try:
                if tier_from is not None:
                    self._redispatch_from_tier(report, tier_from)
                    tier_from = None
                done = self._dispatch.dispatch_available()
                break
            except QueueGapError as exc:
                tier_from = self._after_queue_gap(exc, report, tier_from)
        else:
            raise CorruptionError(f"more than {REBUILDS_PER_OPEN_MAX} consume queues needed rebuilding",
                                  path=os.path.join(self.root_dir, "consumequeue"), rule="consumequeue.dense")
        return done + (history.records_dispatched - tier_before if history is not None else 0)

    def _redispatch_from_tier(self, report: RecoveryReport, start: int) -> None:
        """Re-dispatch [start, the local log's start) from the tier's segment objects (mqstore/store/tier_history.py)
        into the queues and the index, as the local log's records are."""
        history = self._tier_history
        end = self._commitlog.min_offset()
        dispatchers = [ConsumeQueueDispatcher(self._queues, retag=self.schedule.retag)]
        if self._index is not None:
            dispatchers.append(IndexDispatcher(self._index))
        log.warning("re-dispatching the history in the tier %s from commitlog offset %d to the local log's start %d",
                    history.reader.location.uri, start, end)
        self._tier_pass_start = start
        before = history.records_dispatched
        try:
            history.redispatch(start, end, dispatchers)
        finally:
            note_tier_replayed(report, start, history.records_dispatched - before)

    def _after_queue_gap(self, exc: QueueGapError, report: RecoveryReport, tier_from: int | None) -> int | None:
        """A dispatch pass (the tier's when `tier_from` is set) found a queue lacking entries: start an empty queue at
        the entry the log goes on with when the pass began where the readable log does (its first messages are gone
        for good: fillers), else delete it for a rebuild from the start of the log or of the tier's history. Returns
        where the tier's pass goes on (None: the local log's pass goes on)."""
        key = self._queues.key_of(exc.path)
        if key is None:
            raise exc
        history = self._tier_history
        history_start = history.start() if history is not None else None
        floor = self._commitlog.min_offset() if history_start is None else history_start
        at_floor = history_start is None if tier_from is None else self._tier_pass_start == history_start
        queue = self._queues.get(*key)
        name = f"{key[0]}/{key[1]}"
        if (queue is None or not queue.files) and exc.continues_at and floor > 0 and at_floor:
            # Its first messages were in segments deleted since: it starts where the readable log does (fillers).
            log.warning("consume queue %s starts at entry %d, the first the log still holds", name, exc.continues_at)
            self._queues.get_or_create(*key).start_at(exc.continues_at)
            if name not in report.queues_rebuilt:
                note_queue_rebuilt(report, *key)
            return history.position if tier_from is not None else None
        if name in report.queues_rebuilt:  # rebuilt from the log's start, gap again
            raise QueueGapError(f"the CommitLog itself lacks entries of queue {name}: {exc}", path=exc.path,
                                rule="consumequeue.dense") from exc
        if history is not None:
            history.require(f"rebuild consume queue {name} ({exc})")
        log.warning("rebuilding consume queue %s: %s", name, exc)
        self._queues.remove(*key)
        note_queue_rebuilt(report, *key)
        self._checkpoint.reset_logical_times()
        self._checkpoint.flush()
        self._dispatch.dispatched_offset = self._commitlog.min_offset()
        return history_start

    def _open_checkpoint(self) -> Checkpoint:
        """The checkpoint; a corrupt one is replaced by zeros, which makes recovery scan the whole log. A corrupt
        one, a missing one while the log has segments (it is made before the first), or one an earlier open
        found so (the marker of recovery.note_checkpoint_damage) is named in `_checkpoint_damage`: recovery
        cannot tell how far the log was flushed (recovery.py, CRASH_CORRUPT)."""
        root = self.root_dir
        path = os.path.join(root, CHECKPOINT_FILE_NAME)
        damage = "an earlier open found it damaged" if checkpoint_damage_noted(root) else None
        if damage is None and not os.path.exists(path) and _has_segments(self._commitlog.directory):
            damage = "the checkpoint file is missing"
        try:
            checkpoint = Checkpoint.open(root, writable=True)
        except CorruptionError as exc:
            log.warning("replacing the corrupt checkpoint of %s: %s", root, exc)
            damage = f"the checkpoint was corrupt: {exc}"
            note_checkpoint_damage(root)  # before the evidence goes: an open that then fails leaves the marker
            os.unlink(path)
            checkpoint = Checkpoint.open(root, writable=True)
        if damage is not None:
            note_checkpoint_damage(root)
        self._checkpoint_replaced = damage is not None
        self._checkpoint_damage = damage
        return checkpoint

    def _start_flush_services(self) -> None:
        config = self.config
        log_ = self._commitlog
        # With ASYNC flushing the allocator also pre-faults the segment being written, ahead of the writer. Not
        # with SYNC: each put's fdatasync would write those zero pages back too, and the next put waits for it.
        allocator = SegmentAllocator(log_.directory, config.segment_size_bytes,
                                     preallocate=config.preallocate_segments, warm=config.warm_segments,
                                     writer_position=None if self._sync_flush else log_.writer_position,
                                     advise_random=not config.write_fault_readahead,
                                     reserve_bytes=SPACE_RESERVE_STEP_BYTES)
        log_.segment_source = allocator.take
        log_.segment_retirer = allocator.retire
        log_.advise_random_appends = not config.write_fault_readahead
        # pwrite, unless the pages ahead of the writer are pre-faulted (decision 0024)
        log_.batch_write_through = self._sync_flush or not config.warm_segments
        # The next segment is made ahead of need once the writer nears the end of its segment (not at open, nor at
        # a roll: a store takes the disk its data needs).
        log_.near_end_listeners.append(lambda segment: allocator.request(segment.base_offset + segment.size_bytes))
        self._allocator = allocator
        if self._sync_flush:
            self._group_commit = GroupCommitService(log_, log_.flushed_position, on_flushed=self._checkpoint_log,
                                                    on_failed=self._flush_failed)
            if isinstance(log_.flush_lock, getattr(log_.codec, "WriterLock", ())):
                # the leader flushes in C, and writes there what `_checkpoint_log` writes (decision 0030)
                self._group_commit.flush_in_c(log_, log_.flush_lock, commitlog_module.DEFINED_FLUSH,
                                              mapped_file.MappedFile, mapped_file.DEFINED_FLUSH,
                                              self._checkpoint.mapped)
            self._group_commit.start()
            self._services.append(self._group_commit)
        else:
            flusher = IntervalFlusher([log_], interval_ms=config.flush_interval_ms,
                                      least_pages=config.flush_least_pages,
                                      thorough_interval_ms=config.flush_thorough_interval_ms,
                                      name="mqstore-flush-commitlog", on_flushed=self._checkpoint_log,
                                      on_failed=self._flush_failed)
            flusher.start()
            self._services.append(flusher)
        self._log_flusher = self._services[-1]
        if self._follows_queues:  # the dispatch process flushes them, and writes their checkpoint times
            self._index_flushable = self._queues_flusher = None
            return
        self._index_flushable = IndexFlushable(self._index) if self._index is not None else None
        logical = [self._queues] + ([self._index_flushable] if self._index is not None else [])
        queues_flusher = IntervalFlusher(logical, interval_ms=config.flush_consume_queue_interval_ms,
                                         least_pages=CONSUME_QUEUE_FLUSH_LEAST_PAGES,
                                         thorough_interval_ms=CONSUME_QUEUE_FLUSH_THOROUGH_INTERVAL_MS,
                                         name="mqstore-flush-consumequeue", on_flushed=self._checkpoint_queues,
                                         on_failed=self._flush_failed)
        queues_flusher.start()
        self._services.append(queues_flusher)
        self._queues_flusher = queues_flusher

    def _flush_failed(self, error: BaseException) -> None:
        """A flush of one of the store's files failed (any thread: a flush service, or `flush()` and `close()`): keep
        the first failure and refuse every put from now on. Puts that run in C see `_put_common` change and hand
        over to `put`, which refuses them (commitlog/csrc/put_entry.c)."""
        if not isinstance(error, FlushFailedError):
            return  # not an I/O failure (a bug, an interrupt): the flush service keeps it in its stats
        if self._io_failure is None:
            self._io_failure = error
            log.error("the store at %s refuses writes until it is reopened: %s", self.root_dir, error)
        self._put_common = None

    def _refuse_writes(self) -> None:
        """Raise FlushFailedError when a flush of the store failed (`_flush_failed`)."""
        failure = self._io_failure
        if failure is not None:
            raise FlushFailedError(f"the store at {self.root_dir} refuses writes since a flush failed ({failure}); "
                                   "reopen it: recovery then checks the log from what was durable",
                                   path=failure.path) from failure

    def _checkpoint_log(self) -> None:
        log_ = self._commitlog
        self._checkpoint.raise_log(log_.flushed_timestamp_ms, log_.flushed_position)

    def _checkpoint_queues(self) -> None:
        """After the queues are flushed: record both times and write the checkpoint (RocketMQ does it here)."""
        with self._checkpoint_lock:  # the flusher's and _flush_entries' raises of index_flushed_end, one at a time
            checkpoint_logical_flush(self._checkpoint, self._queues, self._index_flushable,
                                     physic_ms=self._commitlog.flushed_timestamp_ms)

    def _take_lock(self) -> None:
        path = os.path.join(self.root_dir, "lock")
        try:
            handle = open(path, "a+b")
        except OSError as exc:
            raise StoreIOError(f"cannot open {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a Java broker's tryLock sees
        except OSError as exc:
            holder = lock_holder(handle.fileno())
            handle.close()
            raise StoreLockedError(
                f"{self.root_dir} is open for writing elsewhere ({holder}, lock file {path}); to read it meanwhile, "
                "open it with read_only=True") from exc
        self._lock_handle = handle

    def close(self) -> None:
        """Stop accepting puts, dispatch to the end of the log, flush everything, release the lock."""
        with self._close_lock:
            if self._closed:
                return
            if self.schedule is not None:  # delay levels (mqstore/schedule/): stopped while the store takes puts
                self.schedule.stop()
            if self.timer is not None:  # timer (mqstore/timer/): its last deliveries and checkpoint need the store
                self.timer.stop()
            self._closed = True
            try:
                if isinstance(self._dispatch, ProcessDispatch):
                    self._dispatch.stop(CLOSE_DISPATCH_TIMEOUT_S)  # it dispatches to the end and flushes first
                elif self._dispatch is not None:
                    self._dispatch.wait_dispatched(CLOSE_DISPATCH_TIMEOUT_S)
                if self._dispatch is not None and self._dispatch.error is not None:
                    log.error("closing with dispatch stopped by: %s", self._dispatch.error)
                self._stop_threads()
                if not self.read_only:
                    self._flush_all(closing=True)
                    dispatch = self._dispatch
                    if dispatch.error is None and dispatch.dispatched_offset >= self._commitlog.readable_end():
                        self._mark.remove()  # the queues are complete: readers may trust their furthest unit
                    remove_marker(os.path.join(self.root_dir, ABORT_FILE_NAME))
            finally:
                self._release()

    def _stop_threads(self) -> None:
        """Stop every thread this store started: dispatch, flushers, retention, the segment allocator (a failed
        open stops the ones it had started too). Nothing is flushed here."""
        if self.schedule is not None:
            self.schedule.stop()
        if self.timer is not None:
            self.timer.stop(checkpoint=False)  # after close's own stop: nothing left to do
        if self._dispatch is not None:
            self._dispatch.stop()
        for service in reversed(self._services):
            service.stop()
        if getattr(self, "_allocator", None) is not None:
            self._allocator.close()

    def _release(self) -> None:
        self.__dict__.pop("put", None)  # the compiled entry (it refers to this store): put is the method again
        if isinstance(self._dispatch, ProcessDispatch):
            if getattr(self, "_commitlog", None) is not None:
                self._commitlog.end_word = None  # a view of the control file's mapping
            self._dispatch.close()
        if self._tier_reader is not None:
            self._tier_reader.close()
        if self.timer is not None:
            self.timer.close()
        failed = None  # a file whose last flush fails as it closes (after a failed flush): the rest close all the same
        for part in ("_index", "_queues", "_commitlog", "_checkpoint", "_mark"):
            component = getattr(self, part, None)
            if component is not None:
                try:
                    component.close()
                except FlushFailedError as exc:
                    failed = failed or exc
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None
        if failed is not None:
            self._flush_failed(failed)
            raise failed

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.root_dir} is closed")

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.root_dir} is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"the store at {self.root_dir} was opened read_only")
        self._refuse_writes()

    # --- writing -------------------------------------------------------------------------------------------
    def put(self, message: Message) -> PutResult:
        """Store one message; it becomes visible to get() once dispatched."""
        result = self._put_written(message)
        if self._lag_limit or self._sync_flush:  # a refused result (offset -1) passes _after_append unchanged
            return self._after_append(result)
        return result

    def _put_refused(self, exc: StoreIOError) -> PutResult:
        """The PutResult of a put whose append raised `exc` (`put` and its compiled entry); a FlushFailedError (the
        store refuses writes) is raised again."""
        if isinstance(exc, FlushFailedError):
            raise exc
        log.error("put refused: %s", exc)
        return _refused(_refusal_status(exc))

    def _put_holding_lock(self, message: Message) -> PutResult:
        """For a caller holding the writer lock: the compiled put, else prepare and append (an invalid message
        raises InvalidMessageError with nothing written). A put handed in before a flush failed and run after it
        finds `_put_common` None (`_flush_failed`) and is refused."""
        put_common = self._put_common
        if put_common is None:
            self._refuse_writes()
            return self._append_message_holding_lock(message)
        result = put_common(message)
        return result if result is not None else self._append_message_holding_lock(message)

    def _append_message_holding_lock(self, message: Message) -> PutResult:
        """The Python path of `_put_holding_lock`: prepare, then append."""
        rewrite = self._commitlog.rewrite
        if rewrite is not None:  # timer and delay levels: a message rewritten goes back to the compiled put
            rewritten = rewrite(message)
            if rewritten is not message and self._put_common is not None:
                result = self._put_common(rewritten)
                if result is not None:
                    return result
        prepare = self._prepare_common
        record = prepare(message) if prepare is not None else None
        if record is None:
            record = self._prepare(message)
        offset, queue_offset, store_ts = self._append_holding_lock(record)
        return _new_tuple(PutResult, (_PUT_OK, offset, queue_offset, record[RECORD_SIZE], store_ts,
                                      self._msg_id_prefix + offset.to_bytes(8, "big").hex().upper()))

    def _after_append(self, result: PutResult) -> PutResult:
        """max_dispatch_lag_bytes and the SYNC wait, after a put's append (`put`)."""
        end = result[1] + result[3]
        if self._lag_limit and end - self._dispatch.dispatched_offset > self._lag_limit:
            self._wait_for_lag_under_bound(end)
        if self._sync_flush and not self._group_commit.wait_durable(end, self._sync_timeout_s):
            return _new_tuple(PutResult, (self._not_durable_status(), *result[1:]))
        return result

    def _not_durable_status(self) -> PutStatus:
        """The status of a SYNC put whose bytes are not durable after its wait: FLUSH_DISK_FAILED when a flush
        failed (the bytes may never reach the disk), else FLUSH_DISK_TIMEOUT (they are still being flushed)."""
        if self._io_failure is not None or self._group_commit.stats.error is not None:
            return PutStatus.FLUSH_DISK_FAILED
        return PutStatus.FLUSH_DISK_TIMEOUT

    def _sync_wait(self, result: PutResult, timeout_s: float) -> PutResult:
        """The SYNC wait of an appended put, for the compiled put entry's cases it leaves to Python (`timeout_s`: the
        time left of the store's timeout)."""
        if not self._group_commit.wait_durable(result[1] + result[3], timeout_s):
            return _new_tuple(PutResult, (self._not_durable_status(), *result[1:]))
        return result

    def _put_written(self, message: Message) -> PutResult:
        """`put` without its waits (`put` itself, and mqstore.aio): the PutResult (PUT_OK) once the message is written,
        before it is durable (SYNC) or within the dispatch lag bound; the caller waits for those itself. A refused
        put's result and the errors are `put`'s."""
        if self._closed or self.read_only:
            self._check_writable()
        put_common = self._put_common
        if put_common is None or self._disk_full:
            return self._put_prepared(message)
        # The compiled put (commitlog/csrc/put.c) checks, encodes and appends a message of a known topic (tags, keys,
        # properties, UNIQ_KEY) in one call under the writer lock; what it leaves (another type, a bad value, a new
        # topic, a roll, ...) `_put_holding_lock` prepares and appends there through the Python path. A busy lock's
        # holder runs it for this put (HandOff), in order.
        writer = self._writer
        try:
            if writer.acquire(False):
                try:
                    result = put_common(message)
                    if result is None:
                        result = self._append_message_holding_lock(message)
                finally:
                    writer.release()  # HandOff.release, inlined: the put path
                    if self._parked:
                        self._handoff.drain()
            else:
                result = self._handoff.hand_in(self._put_holding_lock, message)
        except StoreIOError as exc:  # as in _put_prepared: nothing of this message is published
            return self._put_refused(exc)
        return result

    def _put_prepared(self, message: Message) -> PutResult:
        """`_put_written` through the Python path: prepared before the writer lock (without the compiled put, and
        while the disk is full); it returns once written, `put` waits after it (`_after_append`)."""
        prepare = self._prepare_common
        record = prepare(message) if prepare is not None else None
        if record is None:
            record = self._prepare(message)
        self._refuse_writes()
        if self._disk_full:
            return _refused(PutStatus.DISK_FULL)
        writer = self._writer
        try:
            if writer.acquire(False):
                try:
                    offset, queue_offset, store_ts = self._append_holding_lock(record)
                finally:
                    writer.release()  # HandOff.release, inlined: the put path
                    if self._parked:
                        self._handoff.drain()
            else:
                offset, queue_offset, store_ts = self._handoff.hand_in(self._append_holding_lock, record)
        except StoreIOError as exc:  # the next segment, or disk for the record, could not be had, or the record
            log.error("put refused: %s", exc)  # not written: nothing of this message is published
            return _refused(_refusal_status(exc))
        # No wake-up of the dispatch thread here: it looks for new records every DISPATCH_IDLE_WAIT_S (1 ms), so
        # it takes puts in batches instead of stealing the interpreter after each one (a message is visible to
        # get() within about a millisecond once producers pause, far later while one puts flat out unless
        # max_dispatch_lag_bytes bounds the lag; wait_dispatched() wakes it at once).
        return _new_tuple(PutResult, (_PUT_OK, offset, queue_offset, record[RECORD_SIZE], store_ts,
                                      self._msg_id_prefix + offset.to_bytes(8, "big").hex().upper()))

    def reput_header(self, stored, reconsume_times: int | None = None) -> ReputHeader:
        """The header fields a re-put of `stored` carries (commitlog/reput.py: header_of)."""
        return header_of(stored, self._commitlog.born_host_raw, reconsume_times=reconsume_times)

    def reput(self, message: Message, header: ReputHeader) -> PutResult:
        """Write `message` again with the header fields of `header` (commitlog/reput.py): the schedule's and the
        timer's deliveries and a consumer's send-back. Not the producer's put: no rewrite hook, Python encoding."""
        self._check_writable()
        record, header = prepare_reput(self._commitlog, message, header)
        self._refuse_writes()
        if self._disk_full:
            return _refused(PutStatus.DISK_FULL)
        commitlog = self._commitlog
        try:
            offset, queue_offset, store_ts = self._handoff.hand_in(
                lambda prepared: append_reput_holding_lock(commitlog, prepared, header), record)
        except StoreIOError as exc:
            return self._put_refused(exc)
        result = _new_tuple(PutResult, (_PUT_OK, offset, queue_offset, record[RECORD_SIZE], store_ts,
                                        self._msg_id_prefix + offset.to_bytes(8, "big").hex().upper()))
        return self._after_append(result) if self._lag_limit or self._sync_flush else result

    def put_batch(self, messages: Iterable[Message]) -> list[PutResult]:
        """Store many messages under one lock hold. Every message is checked first: one bad one writes none."""
        results, placed = self._put_batch_written(messages)
        if placed:
            end = results[placed - 1][1] + results[placed - 1][3]
            if self._lag_limit and end - self._dispatch.dispatched_offset > self._lag_limit:
                self._wait_for_lag_under_bound(end)
            if self._sync_flush and not self._group_commit.wait_durable(end, self._sync_timeout_s):
                status = self._not_durable_status()
                results[:placed] = [_new_tuple(PutResult, (status, *result[1:])) for result in results[:placed]]
        return results

    def _put_batch_written(self, messages: Iterable[Message]) -> tuple[list[PutResult], int]:
        """`put_batch` without its waits (mqstore.aio): the results (PUT_OK for the messages written) and how many
        messages were written, the first ones of the batch."""
        self._check_writable()
        messages = list(messages)
        if not messages:
            return [], 0
        columns = self._commitlog.prepare_batch(messages)  # checked and encoded before taking the writer lock
        if self._disk_full:  # bad input was reported above even so
            return [_refused(PutStatus.DISK_FULL) for _ in messages], 0
        handoff = self._handoff
        if handoff.lock.acquire(False):
            try:
                offsets, queue_offsets, placed, store_ts, error = self._commitlog.append_columns_holding_lock(columns)
            finally:
                handoff.release()
        else:
            offsets, queue_offsets, placed, store_ts, error = handoff.hand_in(
                self._commitlog.append_columns_holding_lock, columns)
        results = self._batch_results(PutStatus.PUT_OK, offsets, queue_offsets, columns.sizes, placed, store_ts)
        if error is not None:
            log.error("put_batch stored %d of %d messages: %s", placed, len(messages), error)
            results.extend(_refused(_refusal_status(error)) for _ in messages[placed:])
        return results, placed

    def _batch_results(self, status: PutStatus, offsets: np.ndarray, queue_offsets: np.ndarray, sizes: np.ndarray,
                       placed: int, store_ts: int) -> list[PutResult]:
        """The PutResults of a batch's first `placed` messages: by the compiled codec in one call (about 0.05 us a
        message, the results untracked by the cyclic GC), else without a Python-level loop: the msg_ids' offset
        digits of every message at once, then one C iteration making the PutResults (about 0.25 us a message)."""
        codec = self._commitlog.codec
        if codec is not None:
            return codec.put_results(PutResult, status, offsets, queue_offsets, sizes, placed, store_ts,
                                     self._msg_id_prefix)
        digits = np.frombuffer(offsets[:placed].astype(">u8").tobytes().hex().upper().encode("ascii"), dtype="S16")
        msg_ids = map(self._msg_id_prefix.__add__, digits.astype("U16").tolist())
        return list(map(_new_tuple, itertools.repeat(PutResult, placed), zip(
            itertools.repeat(status), offsets[:placed].tolist(), queue_offsets[:placed].tolist(),
            sizes[:placed].tolist(), itertools.repeat(store_ts), msg_ids)))

    def _wait_for_lag_under_bound(self, end: int) -> None:
        """max_dispatch_lag_bytes: wait until dispatch is within three quarters of the limit of `end`. Returns
        early when dispatch has stopped on an error (the put is stored; the error is in stats() and the log) or
        the store is closing."""
        dispatch = self._dispatch
        target = end - self._lag_limit * 3 // 4
        while not dispatch.wait_dispatched(DISPATCH_LAG_POLL_S, target):
            if dispatch.error is not None or self._closed:
                return

    def flush(self) -> None:
        """Write everything stored so far to disk: the CommitLog, then the ConsumeQueues (no-op when read_only)."""
        self._check_open()
        if not self.read_only:
            self._flush_all()

    def _flush_all(self, *, closing: bool = False) -> None:
        """Flush the log, then the queues and the index, and write the checkpoint; FlushFailedError, with nothing
        flushed, once a flush of the store failed (then and every time after, until the store is reopened)."""
        self._refuse_writes()
        try:
            self._flush_files(closing)
        except FlushFailedError as exc:
            self._flush_failed(exc)
            raise

    def _flush_files(self, closing: bool) -> None:
        self._commitlog.flush()
        self._checkpoint_log()
        if self._follows_queues:  # the dispatch process's: it flushed them as it stopped, when closing
            flushed = closing or self._dispatch.flush(CLOSE_DISPATCH_TIMEOUT_S)
            if self._dispatch.flush_failure is not None:
                raise self._dispatch.flush_failure
            if not flushed:
                raise StoreError(f"the queues of {self.root_dir} were not flushed: "
                                 f"{self._dispatch.error or 'the dispatch process did not answer'}")
            self._checkpoint.flush()  # the log's fields too (the process wrote the queues' and flushed before)
            return
        self._queues.flush()
        if self._index is not None:
            self._index_flushable.flush()
        self._checkpoint_queues()

    def _flush_entries(self) -> int:
        """Flush the ConsumeQueues and the index now and write the checkpoint; returns the dispatched offset read
        before: every queue and index entry of the records below it is on disk, and the checkpoint's
        index_flushed_end says so. Retention with a tier calls it before a segment leaves local disk, so that no
        crash recovery has to add entries below the local log (mqstore/store/retention.py)."""
        self._refuse_writes()
        dispatched = self._dispatch.dispatched_offset
        try:
            if self._follows_queues:
                flushed = self._dispatch.flush(CLOSE_DISPATCH_TIMEOUT_S)
                if self._dispatch.flush_failure is not None:
                    raise self._dispatch.flush_failure
                if not flushed:
                    raise StoreError(f"the queues of {self.root_dir} were not flushed: "
                                     f"{self._dispatch.error or 'the dispatch process did not answer'}")
            else:
                self._queues.flush()
                if self._index is not None:
                    self._index_flushable.flush()
                self._checkpoint_queues()
            if self._index is not None:
                with self._checkpoint_lock:
                    self._checkpoint.update(index_flushed_end=dispatched)
                    self._checkpoint.flush()
        except FlushFailedError as exc:
            self._flush_failed(exc)
            raise
        return dispatched

    # --- reading -------------------------------------------------------------------------------------------
    def wait_dispatched(self, timeout_s: float | None = None) -> bool:
        """Block until everything put so far is visible to get(); False on timeout or dispatch failure."""
        self._check_open()
        if self._dispatch is None:
            return True
        return self._dispatch.wait_dispatched(timeout_s)

    def seal_segment(self) -> int:
        """End the segment being written as RocketMQ ends a full one (its end-of-segment blank) and start the next:
        every message stored so far is then in a sealed segment, which a tier uploads (docs/tier.md). The rest of
        the ended segment stays blank (on disk sparse; in a tier, objects are whole segments). The log's flusher is
        asked to flush it now, in either flush mode (this call does not wait for that). Returns the log's end, where
        the next message goes."""
        self._check_writable()
        with self._writer:
            if self._commitlog.seal_holding_lock():
                self._dispatch.wake()
        end = self._commitlog.readable_end()
        self._log_flusher.request(end)  # a tier takes only a flushed segment; no put may come to flush its blank
        if self._tier_uploader is not None:
            self._tier_uploader.nudge()
        return end

    def wait_tiered(self, commitlog_offset: int, timeout_s: float) -> bool:
        """Wait until the tier lists every record below `commitlog_offset` (seal_segment() returns the offset that
        covers everything stored); whether it does by `timeout_s`."""
        self._check_open()
        uploader = self._tier_uploader
        if uploader is None:
            raise ReadOnlyStoreError(f"the store at {self.root_dir} has no tier (tier_uri)")
        deadline = time.monotonic() + timeout_s
        while (uploader.verified_end() or 0) < commitlog_offset:
            if time.monotonic() >= deadline:
                return False
            uploader.nudge()
            time.sleep(TIER_WAIT_POLL_S)
        return True

    def clean_expired(self) -> dict:
        """Run retention now: remove (or archive) expired segments and what points into them; a report."""
        self._check_writable()
        return self._retention.run_once(manual=True).as_dict()

    def wait_dispatched_past(self, after_offset: int, timeout_s: float) -> int | None:
        """Block until dispatch passes commitlog offset `after_offset` or `timeout_s` ends; returns the dispatched
        offset. None for a read_only store (its writer dispatches in another process). Raises StoreError when
        dispatch stopped on an error."""
        self._check_open()
        if self._dispatch is None:
            return None
        return self._dispatch.wait_past(after_offset, timeout_s)

    wait_for_dispatch = wait_dispatched_past  # its earlier name, kept so that callers keep working

    def watch_dispatch(self, event: threading.Event) -> bool:
        """Have dispatch set `event` whenever it makes entries visible (or stops on an error): for a waiter on
        several things at once. False when dispatch runs in another process (read_only stores, dispatch_process):
        nothing signals it here, the waiter looks again in slices."""
        self._check_open()
        watch = getattr(self._dispatch, "watch", None)
        if watch is None:
            return False
        watch(event)
        return True

    def unwatch_dispatch(self, event: threading.Event) -> None:
        unwatch = getattr(self._dispatch, "unwatch", None)
        if unwatch is not None:
            unwatch(event)

    @property
    def dispatched_offset(self) -> int | None:
        """Everything below this commitlog offset is visible to get() (None for a read_only store)."""
        return None if self._dispatch is None else self._dispatch.dispatched_offset

    def consumer(self, group: str | None, topic: str, queue_ids=None, *, tags=None, consume_from: str = "first",
                 **retry_options):
        """A consumer of `topic` for consumer group `group`, from the group's committed offsets (mqstore.consumer);
        `max_reconsume_times=` as open_consumer takes it."""
        from mqstore.consumer.group import open_consumer  # consumer imports this module

        return open_consumer(self, group, topic, queue_ids, tags=tags, consume_from=consume_from, **retry_options)

    def scan(self, *, topic=None, queue_ids=None, start_offset: int | None = None, end_offset: int | None = None,
             start_time=None, end_time=None, columns=None):
        """The store's records as a pyarrow.RecordBatchReader, with the Spark source's columns and filters (topic
        name(s), queue id(s), commitlog offsets [start_offset, end_offset), store times [start_time, end_time) as
        datetimes or ms since the epoch; `columns` picks columns). Up to the log's written end now; see
        mqstore/store/scan.py and docs/arrow.md."""
        from mqstore.store.scan import scan_store  # pyarrow work, imported when used

        self._check_open()
        return scan_store(self.root_dir, tier=self._tier_reader, topic=topic, queue_ids=queue_ids,
                          start_offset=start_offset, end_offset=end_offset, start_time=start_time, end_time=end_time,
                          columns=columns)

    def stats(self) -> dict:
        """Positions, counts and lags of the store, as plain data."""
        self._check_open()
        log_ = self._commitlog
        if self.read_only:
            log_.segments.load()
        end = log_.readable_end() if not self.read_only else log_.find_end(tolerant=True)
        dispatched = self._dispatch.dispatched_offset if self._dispatch is not None else None
        if self._follows_queues:  # what the other process added since
            self._queues.load()
            for queue in list(self._queues.queues.values()):
                queue.refresh()
        queues = {}
        for (topic, queue_id), queue in sorted(self._queues.queues.items()):
            queues.setdefault(topic, {})[queue_id] = {"min_offset": queue.min_offset, "max_offset": queue.max_offset}
        return {
            "root_dir": self.root_dir,
            "read_only": self.read_only,
            "commitlog": {"min_offset": log_.min_offset(), "max_offset": end,
                          "segments": len(log_.segments.segments)},
            "flush": self._flush_stats(end),
            "disk": None if self.read_only else {
                "full": self._disk_full,
                "unexpired_segments_removed": self._retention.unexpired_segments_removed,
                "unexpired_bytes_removed": self._retention.unexpired_bytes_removed,
                "last_clean": (self._retention.last_report.as_dict()
                               if self._retention.last_report is not None else None)},
            "dispatch": {"dispatched_offset": dispatched,
                         "lag_bytes": None if dispatched is None else max(0, end - dispatched),
                         "records": self._dispatch.dispatched_records if self._dispatch else 0,
                         "error": repr(self._dispatch.error) if self._dispatch and self._dispatch.error else None,
                         "process_id": self._dispatch.pid if isinstance(self._dispatch, ProcessDispatch) else None},
            "queues": queues,
            "tier": self._tier_stats(),
            "schedule": self.schedule.stats() if self.schedule is not None else None,  # mqstore/schedule/
            "retry": _group_topic_counts(queues),  # mqstore/consumer/retry.py
        }

    def _tier_stats(self) -> dict | None:
        """The uploader's figures (a writer) or the tier's extent (a reader), and the reads' (`reads`)."""
        reader = self._tier_reader
        if reader is None:
            return None
        if self._tier_uploader is not None:
            figures = self._tier_uploader.stats()
        else:
            try:
                manifest = reader.manifest()
            except StoreError as exc:
                manifest, figures = None, {"uri": reader.location.uri, "last_error": str(exc)}
            else:
                figures = {"uri": reader.location.uri}
            figures.update(start_offset=manifest.start if manifest is not None else None,
                           uploaded_end=manifest.end if manifest is not None else None)
        try:
            read_min = self._read_log_min()
        except StoreError:
            read_min = None
        figures.update(read_min_offset=read_min, reads=reader.stats())
        return figures


    def _flush_stats(self, end: int) -> dict | None:
        """Flushed and committed positions, lags and recent flush durations (None for a read-only store).

        Writes go straight into the mapped segments, so everything written is committed (in the page cache)
        at once: committed_offset is the log's end.
        """
        if self.read_only:
            return None
        log_ = self._commitlog
        checkpoint = self._checkpoint
        return {
            "mode": self.config.flush_mode.value,
            "committed_offset": end,
            "flushed_offset": log_.flushed_position,
            "flush_lag_bytes": max(0, end - log_.flushed_position),
            "failed": None if self._io_failure is None else str(self._io_failure),  # writes are refused while set
            "consume_queue_dirty_bytes": None if self._follows_queues else self._queues.dirty_bytes(),
            "commitlog_flusher": self._log_flusher.stats.as_dict(),
            "consume_queue_flusher": self._dispatch.flush_stats() if self._follows_queues
            else self._queues_flusher.stats.as_dict(),
            "checkpoint": {"physic_msg_timestamp_ms": checkpoint.physic_msg_timestamp_ms,
                           "logics_msg_timestamp_ms": checkpoint.logics_msg_timestamp_ms,
                           "index_msg_timestamp_ms": checkpoint.index_msg_timestamp_ms},
            "segments_created_ahead": self._allocator.created_in_background,
        }


F_OFD_GETLK = 36  # linux/fcntl.h: asks about record locks as an open file description, which sees this process's
_FLOCK = struct.Struct("@hhqqi4x")  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (32 bytes)


def lock_holder(fd: int) -> str:
    """Which process holds the write lock on the store's lock file `fd` ("process 1234 (python -m mqstore put)"),
    as the kernel tells it (fcntl F_OFD_GETLK, else F_GETLK); "another process" where it does not."""
    request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    for command in (F_OFD_GETLK, fcntl.F_GETLK):
        try:
            lock_type, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, command, request))
        except OSError:
            continue  # F_OFD_GETLK: Linux before 3.15
        if lock_type != fcntl.F_UNLCK and pid > 0:
            break
    else:
        return "another process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command_line = handle.read(COMMAND_LINE_SHOWN_BYTES_MAX).replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        command_line = ""
    shown = "this process" if pid == os.getpid() else f"process {pid}"
    return f"{shown} ({command_line.strip()})" if command_line.strip() and pid != os.getpid() else shown


def _refusal_status(exc: StoreIOError) -> PutStatus:
    """The status of a put refused by `exc`: DISK_FULL when the disk had no room (for a new segment, or for
    the blocks reserved ahead of the writer), UNKNOWN_ERROR when the record's write failed, otherwise
    CREATE_MAPPED_FILE_FAILED."""
    if isinstance(exc, SegmentWriteError):
        return PutStatus.UNKNOWN_ERROR
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        return PutStatus.DISK_FULL
    return PutStatus.CREATE_MAPPED_FILE_FAILED


def _refused(status: PutStatus) -> PutResult:
    """The result of a put that wrote nothing."""
    return PutResult(status, -1, -1, 0, 0, "")


def _group_topic_counts(queues: dict) -> dict:
    """Messages in the groups' retry and dead-letter topics, from stats()'s queue table: {"retry": {group: n},
    "dead_letters": {group: n}} (a retry counts once it is back from the schedule topic)."""
    counts: dict = {"retry": {}, "dead_letters": {}}
    for topic, by_queue in queues.items():
        for prefix, kind in (("%RETRY%", "retry"), ("%DLQ%", "dead_letters")):
            if topic.startswith(prefix):
                counts[kind][topic[len(prefix):]] = sum(q["max_offset"] - q["min_offset"] for q in by_queue.values())
    return counts
