"""Recovery: what a writable open does to make the store consistent after any stop, as a decision table.

Each row's case is a member of `RecoveryCase` (below); `RecoveryReport` names the cases that applied, and
tests/recovery/ has a test for each row (tests/recovery/test_recovery_table.py checks that every member has one).

What is observed                                         | case               | decision
---------------------------------------------------------|--------------------|---------------------------------------
no segment file yet (a store being created)               | NEW_STORE          | nothing to recover
no `abort` marker; the last 3 segments walk cleanly to    | CLEAN              | keep everything
  zeros, and nothing says the log goes on past them       |                    |
no `abort` marker; a record breaks the format rule, or    | CLEAN_CORRUPT      | CorruptionError; repair=True: cut the
  the walk stops (zeros, a file's end) where the log goes |                    | log at that record (see Repair)
  on: later bytes in the segment, later segments with     |                    |
  data, the checkpoint's flushed offset, or a queue entry |                    |
  naming a record there (close flushed everything: this   |                    |
  is damage, not the end of the log)                      |                    |
`abort` marker; the log walks cleanly to zeros at or past | CRASH_CLEAN_TAIL   | keep the log; cut queue and index
  the checkpoint's flushed offset, nothing written after  |                    | entries past its end; re-dispatch
  (the process died, the page cache survived)             |                    |
`abort` marker; the walk stops at a bad record, or at     | CRASH_TORN_TAIL    | cut the log there (zero the rest of
  zeros with written bytes after them, at or past the     |                    | the segment, delete later segments);
  checkpoint's flushed offset (or, for a 4.x checkpoint,  |                    | cut queues and index; re-dispatch;
  after the last message it says was flushed); with a     |                    | the report names the valid records
  replaced checkpoint, only where no valid record follows |                    | the cut dropped (dropped_messages,
  (power lost before unflushed pages reached the disk)    |                    | dropped_offset_first/_last)
`abort` marker; the walk stops (a bad record, zeros) below| CRASH_CORRUPT      | CorruptionError; repair=True: cut the
  the checkpoint's flushed offset (flushed bytes damaged),|                    | log there (see Repair)
  or anywhere with valid records after it while the       |                    |
  checkpoint was replaced (CHECKPOINT_REPLACED: nothing   |                    |
  says how far the log was flushed, so nothing says the   |                    |
  damage lies past the flush)                             |                    |
a segment file longer than the segment size (bytes        | SEGMENT_TOO_LONG   | CorruptionError (file size);
  appended to it)                                         |   (per file)       | repair=True: keep the extra bytes in
                                                          |                    | the repair folder, cut them
a segment file shorter than the segment size              | SEGMENT_TOO_SHORT  | CorruptionError (file size);
                                                          |   (per file)       | repair=True: keep it in the folder,
                                                          |                    | extend it with zeros: the log is cut
                                                          |                    | where its data ends (CLEAN_CORRUPT..)
a segment is missing between two others                   | SEGMENT_MISSING    | CorruptionError (not contiguous);
                                                          |                    | repair=True: cut the log at the gap,
                                                          |                    | move the later segments to the folder
a ConsumeQueue file breaks its format rule, or its last   | QUEUE_REBUILT      | delete that queue, rebuild it from
  entry does not match the record it points to (with a    |   (per queue)      | the CommitLog (from the tier's start
  tier, one below the local log is read back from the     |                    | when the tier holds the history below
  tier: one range read), or it has entries past the log's |                    | the local log: TIER_REPLAYED)
  end that no crash explains (any after a clean stop; one |                    |
  whose record starts inside the log), or dispatch finds  |                    |
  it ends before entries the log holds, or its first file |                    |
  is missing while the log still holds messages of it     |                    |
  (not retention: that deletes a queue file only once all |                    |
  its messages are gone; with a tier, none) or the tier's |                    |
  manifest lists an earlier file of it (or the queue,     |                    |
  missing), or an entry of a walked record                |                    |
  names another position or size (a file of another       |                    |
  queue), or it has entries past its last message in the  |                    |
  walked log (derived data naming records not its own is  |                    |
  rebuilt, never kept)                                    |                    |
a ConsumeQueue has entries for records past the end of a  | QUEUE_TRUNCATED    | drop those entries
  crashed (or repaired) log                               |   (per queue)      |
the walk meets a message its ConsumeQueue lacks (a queue  | QUEUE_REPLAYED     | re-dispatch from that message
  that lost its tail)                                     |   (per queue)      |
an index file breaks its format rule (1)-(3)              | INDEX_REBUILT      | delete the index, rebuild it (engine)
`abort` marker and an index (or the log was cut)          | INDEX_CUT          | cut the index at the checkpoint's
  (index pages written after the last index flush may be  |                    | index_flushed_end: check every file
  lost, stale or torn, in any file, not only the newest)  |                    | that may hold later entries (and the
                                                          |                    | newest) entry by entry, cut at the
                                                          |                    | first bad one, delete the files after
                                                          |                    | it; re-dispatch the rest (from below
                                                          |                    | the local log: TIER_REPLAYED)
no `abort` marker; an index file's header disagrees with  | INDEX_INCONSISTENT | check that file entry by entry, cut it
  its entries or its place (rules 7, 8: a zeroed tail     |                    | at the first bad entry, delete later
  under a header counting it, an older file not full), or |                    | files; cut where no message starts;
  the index ends where no message starts                  |                    | re-dispatch the rest
a corrupt checkpoint (rules 1-2 of flush/checkpoint.py), | CHECKPOINT_REPLACED| replace it with zeros: scan everything
  one with bytes past its fields that are not zero, a time|                    | (engine, or here); after a crash,
  past the year 9999, an offset past the log's files, or a|                    | damage followed by valid records is
  flushed offset inside a record; a missing one while the |                    | CRASH_CORRUPT, not a torn tail. The
  log has segments (it is made before the first); or the  |                    | marker `checkpoint.damaged` says so
  marker an open that found one so left                   |                    | until a recovery completes
a store with a tier: a queue rebuild, an index rebuild or | TIER_REPLAYED      | re-dispatch the tier's segment objects
  an index cut reaches below the local log's first        |                    | (mqstore/store/tier_history.py: range
  segment, whose records only the tier holds (a queue or  |                    | reads, CRCs checked) from there up to
  index file damaged, a crash with a replaced checkpoint; |                    | the local log into the queues and the
  not a plain crash: retention removes a segment only once|                    | index, then the local log as always
  its queue and index entries are on disk)                |                    |
a store with a tier: recovery needs its history below the | TIER_UNREADABLE    | a last entry it cannot check is kept
  local log and the tier cannot be read (a crash or damage|                    | (its segment left only once it was on
  during an outage; a tier refused as another store's; a  |                    | disk); a queue rebuild raises
  damaged record or manifest) or does not hold it         |                    | StoreIOError before anything changes
                                                          |                    | (rebuilt from the local log alone the
                                                          |                    | queue would lose its history); index
                                                          |                    | keys below the local log are not
                                                          |                    | re-dispatched. `tier_not_checked`
                                                          |                    | names each, and the log warns

Where the walk starts: after a clean stop, at the third-last segment with data (RocketMQ's recoverNormally);
after a crash, at the newest segment whose first message is older than the checkpoint's minimum time less
3 s (RocketMQ's recoverAbnormally), or at the first segment when no segment qualifies, and never past the
segment holding the checkpoint's flushed offset (store times come from a clock that can go back; that offset
is exact). Records are checked with rules (1)-(4) and (6) of commitlog/format.py and, with
check_crc_on_recover, their CRCs (rules 5 and 6). After a crash a ConsumeQueue may run ahead of the durable
log (it is flushed on its own schedule), so only the checkpoint's flushed offset says the log goes on there.

With a tier (docs/tier.md), retention removes segments from local disk once the tier's manifest lists them and keeps
the ConsumeQueue and index files that point into them, so entries may name records only the tier holds. Three
rules keep recovery from taking them for damage or losing them: (1) retention removes a segment only once the queue
and index entries of its records are flushed (mqstore/store/retention.py; the checkpoint's index_flushed_end is then
past the segment), so a crash's cuts and replays stay in the local log, and a crash needs the tier only to check a
queue's last entry below the local log (one range read: a quiet topic's queue, all of whose records left local
disk, is not rebuilt); (2) what only damage causes (a queue rebuilt, an index rebuilt or cut below the local log, a
replaced checkpoint) is re-dispatched from the tier's segment objects, from the tier's start (a queue rebuild: the
whole tier is read, its size divided by the object store's read rate) or from where the index ends, up to the local
log (TIER_REPLAYED); (3) nothing only the tier could rebuild is destroyed while the tier cannot be read
(TIER_UNREADABLE). A damaged tier object met by a re-dispatch raises CorruptionError naming the object and the
position in it; `mqstore tier verify` finds such objects.

Repair: repair=True walks the whole log (a segment cut short is first extended with zeros) and cuts the log at
the first bad record, dropping everything after it; records are never skipped, so the log stays a valid chain
that RocketMQ could read. Nothing cut is destroyed: the segment it cuts is copied, and every later segment (and
a segment's extra bytes, and the segments after a missing one) moved, into `repair-<time>/` inside the store's
directory (mqstore/store/repair.py). The report says what left the log: `dropped_messages` (the valid records found
past the cut, walking from the cut and from the start of each later segment, and named by queue entries),
`dropped_bytes` (to the last non-zero byte), `dropped_files`, `dropped_offset_first` and
`dropped_offset_last` (commitlog offsets of the first and last dropped message), and `repair_dir`. A plain
open after it finds case CLEAN. Bad bytes are never returned as a message.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch_batch import parse_records
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.flush.checkpoint import CHECKPOINT_DAMAGED_FILE_NAME, CHECKPOINT_DTYPE, Checkpoint
from mqstore.store.markers import remove_marker, write_marker
from mqstore.store.repair import count_dropped
from mqstore.store.tier_history import TierHistory

log = logging.getLogger(__name__)

RECOVERY_BATCH_RECORDS = 65_536  # records decoded at once while walking the log
CLEAN_STOP_SEGMENTS_CHECKED = 3  # RocketMQ checks the last three files after a clean stop
INDEX_RESUME_CHECKS_MAX = 16  # cuts of the index at an end where no message starts, before it is rebuilt whole
SCAN_CHUNK_BYTES = 1 << 20  # bytes looked at per step when searching a segment's tail for data
CHECKPOINT_TIME_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: a later checkpoint time is damage


class RecoveryCase(StrEnum):
    """The rows of the recovery table (this module's docstring); a str, so `case == "CLEAN"` holds too."""

    NEW_STORE = "NEW_STORE"  # no segment yet: nothing to recover
    CLEAN = "CLEAN"
    CLEAN_CORRUPT = "CLEAN_CORRUPT"
    CRASH_CLEAN_TAIL = "CRASH_CLEAN_TAIL"
    CRASH_TORN_TAIL = "CRASH_TORN_TAIL"
    CRASH_CORRUPT = "CRASH_CORRUPT"
    SEGMENT_TOO_LONG = "SEGMENT_TOO_LONG"
    SEGMENT_TOO_SHORT = "SEGMENT_TOO_SHORT"
    SEGMENT_MISSING = "SEGMENT_MISSING"
    QUEUE_REBUILT = "QUEUE_REBUILT"
    QUEUE_TRUNCATED = "QUEUE_TRUNCATED"
    QUEUE_REPLAYED = "QUEUE_REPLAYED"
    INDEX_REBUILT = "INDEX_REBUILT"
    INDEX_CUT = "INDEX_CUT"
    INDEX_INCONSISTENT = "INDEX_INCONSISTENT"
    CHECKPOINT_REPLACED = "CHECKPOINT_REPLACED"
    TIER_REPLAYED = "TIER_REPLAYED"
    TIER_UNREADABLE = "TIER_UNREADABLE"


@dataclass
class RecoveryReport:
    """What open() found and did; `MessageStore.recovery_report`.

    `case` is the log's row; `file_cases` ("commitlog/<segment>" -> SEGMENT_*), `queue_cases` ("topic/queue_id"
    -> QUEUE_*), `index_case`, `checkpoint_case` and `tier_case` the other rows that applied. `cases()` lists them
    all."""

    case: RecoveryCase = RecoveryCase.NEW_STORE
    crashed: bool = False
    log_end: int = 0
    scan_start: int = 0
    bytes_scanned: int = 0
    dropped_bytes: int = 0
    corruption: str | None = None
    queue_entries_dropped: int = 0
    queues_rebuilt: list[str] = field(default_factory=list)
    index_entries_dropped: int = 0
    messages_redispatched: int = 0
    seconds: float = 0.0
    replay_from: int | None = None  # the first scanned message a ConsumeQueue lacks (dispatch must start there)
    index_case: RecoveryCase | None = None  # INDEX_REBUILT, INDEX_CUT, INDEX_INCONSISTENT, or None (kept as it was)
    index_damage: list[str] = field(default_factory=list)  # index rules (7), (8) found broken
    checkpoint_case: RecoveryCase | None = None  # CHECKPOINT_REPLACED, or None
    file_cases: dict[str, RecoveryCase] = field(default_factory=dict)
    queue_cases: dict[str, RecoveryCase] = field(default_factory=dict)
    # What left the log (a cut, or a repair): the valid records found past the cut, and where they were.
    dropped_messages: int = 0
    dropped_offset_first: int | None = None
    dropped_offset_last: int | None = None
    dropped_files: list[str] = field(default_factory=list)  # the store's files cut, moved or resized
    repair_dir: str | None = None  # where repair kept what it cut (mqstore/store/repair.py), or None
    # A store with a tier (mqstore/store/tier_history.py): TIER_REPLAYED, TIER_UNREADABLE, or None (not needed).
    tier_case: RecoveryCase | None = None
    tier_replayed_from: int | None = None  # where the re-dispatch from the tier's segments started
    tier_messages_redispatched: int = 0  # of messages_redispatched, those read from the tier
    tier_problem: str | None = None  # why the tier could not be read
    tier_not_checked: list[str] = field(default_factory=list)  # what recovery could not check or rebuild from it

    def cases(self) -> list[RecoveryCase]:
        """Every row of the table that applied, the log's first."""
        found = [self.case, *self.file_cases.values(), *self.queue_cases.values(), self.index_case,
                 self.checkpoint_case, self.tier_case]
        return list(dict.fromkeys(case for case in found if case is not None))

    def as_dict(self) -> dict:
        """Plain data (cases as their names), for JSON and the command line."""
        return asdict(self, dict_factory=lambda items: {name: _plain(value) for name, value in items})


def _plain(value):
    if isinstance(value, RecoveryCase):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def note_queue_rebuilt(report: RecoveryReport, topic: str, queue_id: int) -> None:
    """Row QUEUE_REBUILT for one queue (recovery's, or the engine's when dispatch finds a queue's gap)."""
    name = f"{topic}/{queue_id}"
    report.queues_rebuilt.append(name)
    report.queue_cases[name] = RecoveryCase.QUEUE_REBUILT


def recover(commitlog: CommitLog, queues: ConsumeQueueTable, index, checkpoint: Checkpoint, *, crashed: bool,
            repair: bool, check_crc: bool, salvage=None, checkpoint_damage: str | None = None,
            tier: TierHistory | None = None) -> RecoveryReport:
    """Make the log, queues and index agree, following the table above. Re-dispatch is the caller's, from
    `dispatch_start(report, ...)`. `salvage` (mqstore.store.repair.Salvage, with repair) keeps what a cut drops.
    `checkpoint_damage` says why the checkpoint was replaced by zeros (corrupt, or missing while the log has
    segments), if it was: it then cannot tell how far the log was flushed. `tier` is the store's tier's history
    below the local log (mqstore/store/tier_history.py), for a store with a tier."""
    started = time.perf_counter()
    report = RecoveryReport(crashed=crashed)
    if checkpoint_damage is None:
        checkpoint_damage = _checkpoint_inconsistent(checkpoint, commitlog)
        if checkpoint_damage is not None:
            _forget_checkpoint(checkpoint, checkpoint_damage)
    if checkpoint_damage is not None:
        report.checkpoint_case = RecoveryCase.CHECKPOINT_REPLACED
    ends = {key: queue.max_offset for key, queue in queues.queues.items()}
    walked = _recover_log(commitlog, checkpoint, queues, report, crashed=crashed, repair=repair, check_crc=check_crc,
                          with_index=index is not None, queue_ends=ends, salvage=salvage,
                          checkpoint_damage=checkpoint_damage)
    _recover_queues(commitlog, queues, report, crashed=crashed, walked=walked, tier=tier)
    _rebuild_queues_missing_first_files(commitlog, queues, report, tier)
    if tier is not None:
        _rebuild_queues_the_tier_lists_earlier(queues, report, tier)
    if report.queues_rebuilt:
        # The rebuilt queues are only in memory yet: until they are flushed, a crash must replay the whole log.
        checkpoint.reset_logical_times()
        checkpoint.flush()
    if index is not None:
        _recover_index(commitlog, index, checkpoint, report, crashed=crashed)
    if report.checkpoint_case is RecoveryCase.CHECKPOINT_REPLACED:
        remove_marker(os.path.join(os.path.dirname(checkpoint.mapped.path), CHECKPOINT_DAMAGED_FILE_NAME))
    report.seconds = time.perf_counter() - started
    return report


def dispatch_start(report: RecoveryReport, commitlog: CommitLog, queues: ConsumeQueueTable, index, *,
                   crashed: bool, checkpoint: Checkpoint | None = None, tier: TierHistory | None = None) -> int:
    """Where dispatch resumes after `recover`: at or before the first message a queue or the index lacks. With a
    tier holding the history below the local log, that may be below the local log's start: the caller then
    re-dispatches from the tier's segments up to it first (row TIER_REPLAYED)."""
    log_min = commitlog.min_offset()
    floor = log_min  # the lowest offset dispatch may start at: the local log's start, or the tier's below it
    dispatched = max(queues.max_commitlog_end(), log_min)
    if report.queues_rebuilt or queues.corrupt:
        dispatched = floor = _history_floor(report, tier, log_min, "the rebuilt consume queues' entries")
    elif crashed:
        # Queue pages may have been lost in any queue: replay from where the recovery scan started (the
        # checkpoint says everything before was on disk); dispatchers skip the entries they already have.
        dispatched = min(dispatched, report.scan_start)
    if report.replay_from is not None:  # the walk met messages a queue lacks (it lost its tail)
        dispatched = min(dispatched, report.replay_from)
    if index is not None:
        # The index resumes at (or past) the message it indexed last, or rebuilds from the start.
        # With every index entry below the local log on disk (retention removes a segment only then, and the cut
        # and the checks above lower index_flushed_end when they drop one), nothing below it is to add.
        whole_below_log = checkpoint is not None and checkpoint.index_flushed_end >= log_min
        resume = _index_resume(commitlog, index, None if whole_below_log else tier)
        if whole_below_log:
            resume = max(resume, log_min)
        if resume < floor:
            floor = _history_floor(report, tier, log_min, f"the index's keys of the records from commitlog offset "
                                                          f"{resume}")
        dispatched = max(min(dispatched, resume), floor)
    return dispatched


def _history_floor(report: RecoveryReport, tier: TierHistory | None, log_min: int, what: str) -> int:
    """The lowest offset a re-dispatch can start at: the tier's start when it holds the history below the local log,
    else the local log's; a tier that cannot be read is reported (`what` is not re-dispatched below the log)."""
    start = tier.start() if tier is not None else None
    if start is not None:
        return start
    if tier is not None and tier.problem is not None:
        note_tier_unreadable(report, tier, f"{what}: not re-dispatched below the local log's start {log_min}")
    return log_min


def note_tier_unreadable(report: RecoveryReport, tier: TierHistory, what: str) -> None:
    """Row TIER_UNREADABLE: `what` recovery could not check or rebuild because the tier could not be read."""
    report.tier_case = RecoveryCase.TIER_UNREADABLE
    report.tier_problem = report.tier_problem or tier.problem
    report.tier_not_checked.append(what)
    log.warning("recovery without the tier %s: %s", tier.reader.location.uri, what)


def note_tier_replayed(report: RecoveryReport, start: int, records: int) -> None:
    """Row TIER_REPLAYED: the engine re-dispatched `records` from the tier's segments from `start` on."""
    if report.tier_case is None:
        report.tier_case = RecoveryCase.TIER_REPLAYED
    report.tier_replayed_from = start if report.tier_replayed_from is None else min(report.tier_replayed_from, start)
    report.tier_messages_redispatched += records


def _index_resume(commitlog: CommitLog, index, tier: TierHistory | None = None) -> int:
    """Where dispatch must resume for the index: at the message it indexed last while that message may lack
    some of its keys (a crash between two of them), past it when the index holds every one (any clean stop),
    so that a reopen re-dispatches nothing the queues and the index already have. A message below the local log
    is read from the tier's history (one range read)."""
    end = index.max_indexed_offset
    if index.entry_count == 0 or end >= commitlog.readable_end():
        return end
    if end < commitlog.min_offset():
        message = tier.message_at(end) if tier is not None else None
        if message is None:
            return end
    else:
        try:
            message = commitlog.read(end)
        except (CorruptionError, InvalidMessageError):
            return end  # _recover_index cuts the index where no message starts; the replay settles the rest
    properties = message.properties
    key_count = (properties.get(fmt.PROPERTY_UNIQ_KEY) is not None) + sum(
        1 for key in properties.get(fmt.PROPERTY_KEYS, "").split(fmt.KEY_SEPARATOR) if key)
    if index.indexed_key_count_at(end) < key_count:
        return end
    return end + message.size_bytes


def _recover_index(commitlog: CommitLog, index, checkpoint: Checkpoint, report: RecoveryReport, *,
                   crashed: bool) -> None:
    """Rows INDEX_CUT and INDEX_INCONSISTENT: make the index a gap-free prefix of the log (the caller re-dispatches
    from its `max_indexed_offset`). After a crash only index entries below the checkpoint's index_flushed_end are
    known to be whole on disk (later pages may be lost, stale or torn: missing or duplicate keys), so every file
    that may hold later entries is checked entry by entry and cut. At every open each file's header is also
    checked against its first and last entries and its place among the files, in O(1) per file (rules 7 and
    8 of indexfile/format.py): a file that fails is checked in full and cut at its first bad entry, and every
    later file is deleted. Last, the re-dispatch must resume at a message: while the index's end is not one
    (a damaged entry that kept the rules), the index is cut there. Keys are never silently missing: whatever
    is cut is re-dispatched."""
    cut = min(report.log_end, checkpoint.index_flushed_end) if crashed else report.log_end
    report.index_entries_dropped = index.truncate(cut, crashed=crashed)
    report.index_damage = list(index.damage_found)
    for _ in range(INDEX_RESUME_CHECKS_MAX):
        end = index.max_indexed_offset
        if end < max(1, commitlog.min_offset()) or _message_at(commitlog, end):
            break
        report.index_damage.append(f"the index ends at commitlog offset {end}, where no message starts")
        report.index_entries_dropped += index.truncate(end, crashed=False)
        report.index_damage += index.damage_found
    else:
        report.index_entries_dropped += index.truncate(0, crashed=False)  # rebuild it all
    if crashed or report.dropped_bytes:
        report.index_case = RecoveryCase.INDEX_CUT
    elif report.index_damage:
        report.index_case = RecoveryCase.INDEX_INCONSISTENT
    if report.index_entries_dropped or report.index_damage:
        # What the re-dispatch adds back is not on disk before the next index flush: a second crash must cut there.
        checkpoint.lower_index_flushed_end(index.max_indexed_offset)
        checkpoint.flush()


def _message_at(commitlog: CommitLog, commitlog_offset: int) -> bool:
    """Whether a valid message record starts at `commitlog_offset`, inside the log."""
    if commitlog_offset >= commitlog.readable_end():
        return False
    try:
        commitlog.read(commitlog_offset)
    except (CorruptionError, InvalidMessageError):
        return False
    return True


def _segment_start_time(commitlog: CommitLog, segment) -> int | None:
    """The store time of a segment's first message, or None when it does not start with a valid one."""
    size, magic = fmt.peek(segment.view, 0, segment.size_bytes)
    if magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2):
        return None
    try:
        from mqstore.commitlog.message import decode_message

        return decode_message(segment.view, 0, segment.size_bytes, segment.base_offset).store_timestamp_ms
    except CorruptionError:
        return None


def _scan_start(commitlog: CommitLog, checkpoint: Checkpoint, *, crashed: bool, with_index: bool) -> int:
    segments = list(commitlog.segments.segments)
    while segments and not any(fmt.peek(segments[-1].view, 0, segments[-1].size_bytes)):
        segments.pop()  # only trailing empty segments (made ahead of need) are skipped
    if not segments:
        return commitlog.min_offset()
    if not crashed:
        return segments[max(0, len(segments) - CLEAN_STOP_SEGMENTS_CHECKED)].base_offset
    start = commitlog.min_offset()
    threshold = checkpoint.min_timestamp_ms(with_index=with_index)
    for segment in reversed(segments):
        first_time = _segment_start_time(commitlog, segment)
        if first_time is not None and 0 < first_time <= threshold:
            start = segment.base_offset
            break
    flushed = checkpoint.physic_flushed_offset
    if flushed > 0:  # store times are a clock's; the flushed offset is exact: never start past its segment
        start = max(commitlog.min_offset(), min(start, flushed - flushed % commitlog.segment_size_bytes))
    return start


class WalkedQueues:
    """What the walk of the log saw of each queue: the entry count the walked records end at, and the queues
    whose entries name other records than the walked ones (another queue's, or another position)."""

    def __init__(self):
        self.ends: dict[tuple[str, int], int] = {}
        self.mismatched: dict[tuple[str, int], str] = {}


def _recover_log(commitlog: CommitLog, checkpoint: Checkpoint, queues: ConsumeQueueTable, report: RecoveryReport, *,
                 crashed: bool, repair: bool, check_crc: bool, with_index: bool, queue_ends: dict, salvage,
                 checkpoint_damage: str | None) -> WalkedQueues:
    walked = WalkedQueues()
    if salvage is not None:
        _note_file_cases(report, salvage, commitlog.segment_size_bytes)
    last = commitlog.segments.last()
    if last is None:
        report.case = RecoveryCase.NEW_STORE
        return walked
    # repair walks the whole log: damage anywhere is cut, not only in the segments a normal open checks
    start = commitlog.min_offset() if repair else _scan_start(commitlog, checkpoint, crashed=crashed,
                                                               with_index=with_index)
    report.scan_start = start
    limit = last.base_offset + last.size_bytes
    flushed = checkpoint.physic_flushed_offset
    flushed_checked = flushed <= start
    offset = start
    last_valid_time = 0
    error: CorruptionError | None = None
    while offset < limit:
        batch = parse_records(commitlog, offset, limit, records_max=RECOVERY_BATCH_RECORDS, zeros_end=True,
                              check_crc=check_crc)
        if len(batch):
            last_valid_time = int(batch.store_timestamps_ms[-1])
            if report.replay_from is None:
                report.replay_from = _first_missing_from_queues(batch, queue_ends, report)
            _note_queue_ends(batch, walked)
            if repair or checkpoint_damage is not None:  # every entry (else the last of each queue, below)
                _check_queue_entries(batch, queues, walked)
            if not flushed_checked and flushed <= batch.end_offset:
                flushed_checked = True
                checkpoint_damage = checkpoint_damage or _flushed_offset_inside_a_record(batch, checkpoint, report)
        if batch.error is not None:
            error = batch.error
            offset = batch.end_offset
            break
        if batch.end_offset == offset:
            break
        offset = batch.end_offset
    end = offset
    report.bytes_scanned = end - start
    written_end = _written_end(commitlog, end)
    if error is None:
        error = _log_goes_on(commitlog, checkpoint, queues, end, written_end, crashed=crashed,
                             last_valid_time=last_valid_time,
                             gap_after=salvage.gap_after if salvage is not None else None)
    torn = error is not None and crashed and _after_durable_point(checkpoint, end, last_valid_time)
    if torn and checkpoint_damage is not None and written_end > end:
        error, torn = _valid_records_after(commitlog, queues, end, salvage, error, checkpoint_damage)
    if error is None:
        report.case = RecoveryCase.CRASH_CLEAN_TAIL if crashed else RecoveryCase.CLEAN
    elif torn:
        report.case = RecoveryCase.CRASH_TORN_TAIL
        report.corruption = str(error)
    else:
        report.case = RecoveryCase.CRASH_CORRUPT if crashed else RecoveryCase.CLEAN_CORRUPT
        report.corruption = str(error)
        if not repair:
            raise error
        log.warning("repair: cutting the log at offset %d: %s", end, error)
    commitlog.set_end(end)
    _cut_log(commitlog, queues, end, written_end, report, salvage)
    report.log_end = end
    checkpoint.reset_flushed_offset(end)
    return walked


def _flushed_offset_inside_a_record(batch, checkpoint: Checkpoint, report: RecoveryReport) -> str | None:
    """Row CHECKPOINT_REPLACED when the checkpoint's flushed offset, which `batch` covers, falls inside one of its
    records (a flush ends between records): why, or None."""
    flushed = checkpoint.physic_flushed_offset
    if flushed == batch.end_offset or np.any(batch.commitlog_offsets == flushed) or \
            np.any(batch.commitlog_offsets + batch.sizes == flushed):
        return None
    damage = f"its flushed offset {flushed} lies inside a record of the log"
    _forget_checkpoint(checkpoint, damage)
    report.checkpoint_case = RecoveryCase.CHECKPOINT_REPLACED
    return damage


def _valid_records_after(commitlog: CommitLog, queues: ConsumeQueueTable, end: int, salvage,
                         error: CorruptionError, checkpoint_damage: str) -> tuple[CorruptionError, bool]:
    """(error, torn) for a crash whose checkpoint cannot tell how far the log was flushed and whose walk stopped
    at `end` with bytes written after it: valid records there say the log goes on (not torn, an error that
    names them); none, a torn tail."""
    count, first, last = count_dropped(commitlog, queues, end, salvage)
    if not count:
        return error, True
    return _with_reason(error, f"{count} valid records follow it (commitlog offsets {first}..{last}) and the "
                               f"checkpoint cannot tell how far the log was flushed ({checkpoint_damage})"), False


def _with_reason(error: CorruptionError, reason: str) -> CorruptionError:
    """`error` with `reason` added to its message (same file, offset, rule and flags)."""
    text = str(error)
    if error.path is not None:
        text = text.removesuffix(f" (file {error.path}, offset {error.offset})" if error.offset is not None
                                 else f" (file {error.path})")
    return CorruptionError(f"{text}; {reason}", path=error.path, offset=error.offset, rule=error.rule,
                           length_sound=error.length_sound, not_a_record=error.not_a_record)


def checkpoint_fields_damage(checkpoint: Checkpoint) -> CorruptionError | None:
    """What no writer of a checkpoint leaves, in one that kept its own rules (flush/checkpoint.py), or None:
    bytes past its fields that are not zero (mqstore and RocketMQ write only the fields; `checkpoint.reserved`)
    or a time past the year 9999 (`checkpoint.time`). Used by recovery and by `mqstore verify`."""
    raw = checkpoint.mapped.array
    path = checkpoint.mapped.path
    if raw[CHECKPOINT_DTYPE.itemsize :].any():
        position = CHECKPOINT_DTYPE.itemsize + int(np.flatnonzero(raw[CHECKPOINT_DTYPE.itemsize :])[0])
        return CorruptionError("bytes past the checkpoint's fields are not zero", path=path, offset=position,
                               rule="checkpoint.reserved")
    for name, value in (("physic_msg_timestamp", checkpoint.physic_msg_timestamp_ms),
                        ("logics_msg_timestamp", checkpoint.logics_msg_timestamp_ms),
                        ("index_msg_timestamp", checkpoint.index_msg_timestamp_ms)):
        if value > CHECKPOINT_TIME_MS_MAX:
            return CorruptionError(f"the checkpoint's {name} {value} lies past the year 9999", path=path,
                                   offset=CHECKPOINT_DTYPE.fields[name][1], rule="checkpoint.time")
    return None


def _checkpoint_inconsistent(checkpoint: Checkpoint, commitlog: CommitLog) -> str | None:
    """Why a checkpoint that kept its own rules cannot be what mqstore or RocketMQ wrote, or None: the damage
    `checkpoint_fields_damage` finds, or an offset past the end of the log's files. (Its flushed offset is also
    checked against the records while the log is walked: it must fall between two of them.)"""
    damage = checkpoint_fields_damage(checkpoint)
    if damage is not None:
        return str(damage)
    last = commitlog.segments.last()
    files_end = last.base_offset + last.size_bytes if last is not None else 0
    for name, value in (("physic_flushed_offset", checkpoint.physic_flushed_offset),
                        ("index_flushed_end", checkpoint.index_flushed_end)):
        if value > files_end:
            return f"its {name} {value} lies past the end of the log's files, {files_end}"
    return None


def _forget_checkpoint(checkpoint: Checkpoint, reason: str) -> None:
    """Row CHECKPOINT_REPLACED for a checkpoint recovery found inconsistent: all zeros, as a replaced one (the
    marker first, so that an open that fails after this still knows the zeros are not a new store's)."""
    root = os.path.dirname(checkpoint.mapped.path)
    log.warning("replacing the checkpoint of %s: %s", root, reason)
    note_checkpoint_damage(root)
    checkpoint.mapped.array[:] = 0
    checkpoint.flush()


def note_checkpoint_damage(root: str) -> None:
    """Leave the marker saying the checkpoint was found damaged (and replaced by zeros, which alone would read
    as "nothing flushed yet"), until a recovery completes."""
    write_marker(os.path.join(root, CHECKPOINT_DAMAGED_FILE_NAME))


def checkpoint_damage_noted(root: str) -> bool:
    """Whether an open found the checkpoint damaged and no recovery has completed since."""
    return os.path.exists(os.path.join(root, CHECKPOINT_DAMAGED_FILE_NAME))


def _cut_log(commitlog: CommitLog, queues: ConsumeQueueTable, end: int, written_end: int, report: RecoveryReport,
             salvage) -> None:
    """Cut everything written past `end` (the caller decided the log ends there), counting what leaves the log.

    Bytes past the end are cut even when the walk stopped at zeros: a page written after a lost one can hold a
    valid-looking record that a later walk would otherwise take back in."""
    if salvage is not None:
        report.dropped_bytes += salvage.moved_at_load_bytes + salvage.extra_bytes
    if written_end > end or (salvage is not None and salvage.moved_at_load):
        count, first, last = count_dropped(commitlog, queues, end, salvage)
        report.dropped_messages += count
        report.dropped_offset_first, report.dropped_offset_last = first, last
    if written_end > end:
        report.dropped_bytes += written_end - end
        report.dropped_files += [os.path.relpath(segment.path, os.path.dirname(commitlog.directory))
                                 for segment in commitlog.segments.segments
                                 if segment.base_offset + segment.size_bytes > end]
        commitlog.truncate(end, salvage)
    if salvage is not None:
        report.dropped_files = list(dict.fromkeys(report.dropped_files + salvage.files))
        report.repair_dir = salvage.directory


def _note_file_cases(report: RecoveryReport, salvage, segment_size_bytes: int) -> None:
    """Rows SEGMENT_TOO_LONG, SEGMENT_TOO_SHORT and SEGMENT_MISSING: what loading the segments repaired (the
    missing segment is named by the one after the last kept)."""
    for name, size in salvage.wrong_size.items():
        report.file_cases[f"commitlog/{name}"] = (RecoveryCase.SEGMENT_TOO_LONG if size > segment_size_bytes
                                                  else RecoveryCase.SEGMENT_TOO_SHORT)
    if salvage.gap_after is not None:
        missing = fmt.segment_name(salvage.gap_after + segment_size_bytes)
        report.file_cases[f"commitlog/{missing}"] = RecoveryCase.SEGMENT_MISSING


def _log_goes_on(commitlog: CommitLog, checkpoint: Checkpoint, queues: ConsumeQueueTable, end: int,
                 written_end: int, *, crashed: bool, last_valid_time: int, gap_after) -> CorruptionError | None:
    """When the walk stopped at zeros (or at the last segment's end) where the log goes on, the damage that
    stopped it: an error for the table's CLEAN_CORRUPT / CRASH_* rows, else None (the end of the log).

    After a clean stop, close flushed everything: written bytes after the end, the checkpoint's flushed offset
    past it, or a queue entry naming a record at it, each say so. After a crash only the checkpoint's flushed
    offset is exact (unflushed pages can be lost with later ones kept, and queues flushed ahead of the log);
    bytes written after the end then make a torn tail, which the caller tells from damage by that offset."""
    evidence = []
    if written_end > end:
        evidence.append(f"bytes are written after it, up to commitlog offset {written_end}")
    if gap_after is not None:
        evidence.append(f"a segment is missing after {fmt.segment_name(gap_after)}")
    if crashed:
        if not evidence and _after_durable_point(checkpoint, end, last_valid_time):
            return None
        if not evidence:
            evidence.append(f"the checkpoint says the log was flushed to {checkpoint.physic_flushed_offset}")
    else:
        if checkpoint.physic_flushed_offset > end:
            evidence.append(f"the checkpoint says the log was flushed to {checkpoint.physic_flushed_offset}")
        named = [f"{topic}/{queue_id}" for (topic, queue_id), queue in list(queues.queues.items())
                 if bool(np.any(queue.offsets_past(end) == end))]
        if named:
            evidence.append(f"ConsumeQueue {named[0]} has an entry for a record there")
    if not evidence:
        return None
    segment = commitlog.segments.segment_at(end) or commitlog.segments.last()
    position = end - segment.base_offset
    return CorruptionError(f"the log's walk stops at commitlog offset {end}, inside the written part of the log: "
                           + "; ".join(evidence), path=segment.path, offset=position, rule="commitlog.end")


QUEUE_KEYS_DENSE_MAX = 1 << 20  # (topic, queue id) pairs numbered densely when a batch's span of them is this small


def _queue_keys(batch) -> tuple[np.ndarray, int, int]:
    """A key per record for its (topic, queue id), the width and the low queue id that split it (key // width is
    the topic id, key % width + low the queue id): dense numbers (the queue ids' span for each topic) when the
    span is small, as in any real log, so that keys are grouped by counting instead of sorting; else 2**32."""
    queue_ids = batch.queue_ids
    low = int(queue_ids.min())
    width = int(queue_ids.max()) - low + 1
    if len(batch.topic_names) * width > QUEUE_KEYS_DENSE_MAX:
        width = 1 << 32
    return batch.topic_ids * width + (queue_ids - low), width, low


def _first_missing_from_queues(batch, queue_ends: dict, report: RecoveryReport) -> int | None:
    """The commitlog offset of the first message in `batch` whose queue entry is missing (its queue offset is at
    or past its queue's end, or its queue does not exist), or None; row QUEUE_REPLAYED for each existing queue
    that lacks one. Transaction-prepared and rolled-back messages never get an entry and are passed over.
    Vectorised: one comparison per distinct queue, the queues told apart by counting (_queue_keys)."""
    if not len(batch):
        return None
    transaction = batch.sys_flags & fmt.SYS_FLAG_TRANSACTION_MASK
    counted = (transaction != fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE) & (
        transaction != fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE)
    keys, width, low = _queue_keys(batch)
    names = batch.topic_names
    dense = width < 1 << 32

    def queue(key: int) -> tuple[str, int]:
        return names[key // width], key % width + low

    distinct = np.flatnonzero(np.bincount(keys)) if dense else np.unique(keys)
    ends = np.array([queue_ends.get(queue(key), 0) for key in distinct.tolist()], dtype=np.int64)
    if dense:
        table = np.zeros(int(distinct[-1]) + 1, dtype=np.int64)
        table[distinct] = ends
        row_ends = table[keys]
    else:
        row_ends = ends[np.searchsorted(distinct, keys)]
    missing = np.flatnonzero(counted & (batch.queue_offsets >= row_ends))
    lacking = keys[missing]
    for key in (np.flatnonzero(np.bincount(lacking)) if dense else np.unique(lacking)).tolist():
        name = queue(key)
        if name in queue_ends:  # a queue that lost its tail (not a new one: none to replay into)
            report.queue_cases.setdefault(f"{name[0]}/{name[1]}", RecoveryCase.QUEUE_REPLAYED)
    return int(batch.commitlog_offsets[missing[0]]) if len(missing) else None


def _dense_queue_keys(batch):
    """(rows with a queue entry, a dense key per record, a function from key to (topic, queue id)): the records
    that are not transaction-prepared or rolled back (those never get an entry) and _queue_keys numbered densely."""
    transaction = batch.sys_flags & fmt.SYS_FLAG_TRANSACTION_MASK
    counted = np.flatnonzero((transaction != fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE)
                             & (transaction != fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE))
    keys, width, low = _queue_keys(batch)
    distinct = None
    if width == 1 << 32:  # a span of queue ids too wide to number densely: number the distinct keys
        distinct, keys = np.unique(keys, return_inverse=True)

    def name(key: int) -> tuple[str, int]:
        dense = int(distinct[key]) if distinct is not None else key
        return batch.topic_names[dense // width], dense % width + low

    return counted, keys, name


def _note_queue_ends(batch, walked: WalkedQueues) -> None:
    """The entry count each queue's walked records end at (its last record's queue offset + 1)."""
    counted, keys, name = _dense_queue_keys(batch)
    if not len(counted):
        return
    last_row = np.full(int(keys.max()) + 1, -1, dtype=np.int64)
    last_row[keys[counted]] = counted  # the last write wins: each queue's last record in the batch
    for key in np.flatnonzero(last_row >= 0).tolist():
        queue = name(key)
        walked.ends[queue] = max(walked.ends.get(queue, 0), int(batch.queue_offsets[last_row[key]]) + 1)


def _check_queue_entries(batch, queues: ConsumeQueueTable, walked: WalkedQueues) -> None:
    """Compare the entry of every record in `batch` with the record: an entry that names another position or
    size (a queue file of another queue, or damaged units that keep the rules) marks its queue for a rebuild.
    Vectorised without sorting: a queue's records in a batch hold consecutive queue offsets, so one read of units
    per distinct queue (from its first record's queue offset to its last's) and one gather check them all."""
    counted, keys, name = _dense_queue_keys(batch)
    if not len(counted):
        return
    key_count = int(keys.max()) + 1
    first_row = np.full(key_count, -1, dtype=np.int64)
    first_row[keys[counted][::-1]] = counted[::-1]  # the last write wins: each queue's first record in the batch
    last_row = np.full(key_count, -1, dtype=np.int64)
    last_row[keys[counted]] = counted
    queue_offsets = batch.queue_offsets
    read_first = np.zeros(key_count, dtype=np.int64)
    read_stop = np.zeros(key_count, dtype=np.int64)  # [read_first, read_stop): the units read, at `at[key]`
    at = np.zeros(key_count, dtype=np.int64)
    parts, position = [], 0
    for key in np.flatnonzero(last_row >= 0).tolist():
        queue_name = name(key)
        queue = queues.queues.get(queue_name)
        if queue is None or queue_name in walked.mismatched:
            continue
        start = max(int(queue_offsets[first_row[key]]), queue.min_offset)
        stop = min(int(queue_offsets[last_row[key]]) + 1, queue.max_offset)
        if not 0 < stop - start <= len(keys):  # more entries than records: queue offsets out of order, unchecked
            continue
        try:
            units = queue.read(start, stop - start)
        except CorruptionError as exc:
            walked.mismatched[queue_name] = str(exc)
            continue
        read_first[key], read_stop[key], at[key] = start, start + len(units), position
        parts.append(units)
        position += len(units)
    if not parts:
        return
    units = np.concatenate(parts) if len(parts) > 1 else parts[0]
    rows = counted[(queue_offsets[counted] >= read_first[keys[counted]])
                   & (queue_offsets[counted] < read_stop[keys[counted]])]
    where = at[keys[rows]] + queue_offsets[rows] - read_first[keys[rows]]
    wrong = rows[(units["commitlog_offset"][where] != batch.commitlog_offsets[rows])
                 | (units["size"][where] != batch.sizes[rows])]
    for row in wrong.tolist():
        walked.mismatched.setdefault(name(int(keys[row])), f"entry {int(queue_offsets[row])} does not name its "
                                                           f"record at commitlog offset "
                                                           f"{int(batch.commitlog_offsets[row])}")


def _after_durable_point(checkpoint: Checkpoint, bad_offset: int, last_valid_time: int) -> bool:
    """Whether a bad record at `bad_offset` lies where a crash may have left unflushed bytes.

    With a flushed offset in the checkpoint (written by mqstore, or by RocketMQ 5.x) that is exact. Without
    one (RocketMQ 4.x), the last good record's store time is compared with the time of the last flushed
    message: an older good record means the flushed message, hence the bad record, was written to disk.
    """
    flushed = checkpoint.physic_flushed_offset
    if flushed > 0:
        return bad_offset >= flushed
    return last_valid_time >= checkpoint.physic_msg_timestamp_ms


def _written_end(commitlog: CommitLog, end: int) -> int:
    """Just past the last non-zero byte at or after `end` (what a cut there drops)."""
    written = end
    for segment in commitlog.segments.segments:
        if segment.base_offset + segment.size_bytes <= end:
            continue
        low = max(0, end - segment.base_offset)
        last = _last_nonzero(segment.array, low, segment.fileno())
        if last is not None:
            written = max(written, segment.base_offset + last + 1)
    return written


def _last_nonzero(data, low: int, fd: int | None = None) -> int | None:
    """Index of the last non-zero byte of data[low:], scanning back in chunks (no index array of the whole).

    With the file's descriptor, only its data extents are read (lseek SEEK_DATA / SEEK_HOLE): the never-written
    rest of a segment reserved by posix_fallocate is a hole there, and reading it through the mapping would
    fault in every page of zeros (seconds for a 1 GiB segment)."""
    for start, stop in reversed(list(_data_extents(fd, low, len(data)))):
        high = stop
        while high > start:
            chunk_start = max(start, high - SCAN_CHUNK_BYTES)
            chunk = data[chunk_start:high]
            if chunk.any():
                return chunk_start + int(chunk.nonzero()[0][-1])
            high = chunk_start
    return None


def _data_extents(fd: int | None, low: int, high: int):
    """The [start, stop) ranges of [low, high) that may hold data: all of it without a descriptor or where the
    file system cannot tell (holes and unwritten extents read as zeros, so skipping them is exact)."""
    if fd is None:
        yield low, high
        return
    position = low
    while position < high:  # bounded by the file's extents
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nothing but a hole from here on
            yield position, high  # SEEK_DATA unsupported: read everything
            return
        if start >= high:
            return
        stop = min(high, os.lseek(fd, start, os.SEEK_HOLE))
        yield start, stop
        position = stop


def _recover_queues(commitlog: CommitLog, queues: ConsumeQueueTable, report: RecoveryReport, *, crashed: bool,
                    walked: WalkedQueues, tier: TierHistory | None) -> None:
    for (topic, queue_id), error in list(queues.corrupt.items()):
        _rebuild_queue(queues, report, (topic, queue_id), f"{error}", tier)
    end = report.log_end
    for (topic, queue_id), queue in list(queues.queues.items()):
        past = queue.offsets_past(end)
        if len(past) and (report.case == "CLEAN" or int(past.min()) < end):
            # What the cut would drop is not a tail of entries for records past the log's end (which a crash
            # leaves): an entry is damaged, and cutting there would hide the good entries after it for good.
            _rebuild_queue(queues, report, (topic, queue_id), f"{len(past)} entries from one pointing at "
                           f"{int(past[0])} do not end by the log's end {end}", tier)
            continue
        dropped = queue.truncate_past(end)
        if dropped:
            report.queue_entries_dropped += dropped
            report.queue_cases[f"{topic}/{queue_id}"] = RecoveryCase.QUEUE_TRUNCATED
        walked_end = walked.ends.get((topic, queue_id))
        why = walked.mismatched.get((topic, queue_id))
        if why is None and walked_end is not None and queue.max_offset > walked_end:
            why = f"it has {queue.max_offset - walked_end} entries past its last message in the log"
        if why is not None:
            # Derived data naming records that are not its own: rebuilt, never kept (repair appends after it).
            _rebuild_queue(queues, report, (topic, queue_id), why, tier)
            continue
        if (crashed or report.case != RecoveryCase.CLEAN) and queue.max_offset > queue.min_offset \
                and not _last_entry_matches(commitlog, queue, tier, report):
            _rebuild_queue(queues, report, (topic, queue_id), "its last entry does not match the log", tier)


def _rebuild_queue(queues: ConsumeQueueTable, report: RecoveryReport, key: tuple[str, int], why: str,
                   tier: TierHistory | None) -> None:
    """Row QUEUE_REBUILT: delete the queue; dispatch rebuilds it from the start of the log, or of the tier's history
    below it (TIER_REPLAYED). With a tier that cannot be read, StoreIOError first, the queue kept (TIER_UNREADABLE:
    a queue rebuilt from the local log alone would lose its history for good)."""
    if tier is not None:
        tier.require(f"rebuild consume queue {key[0]}/{key[1]} ({why})")
    log.warning("rebuilding consume queue %s/%d: %s", key[0], key[1], why)
    queues.remove(*key)
    note_queue_rebuilt(report, *key)


def _last_entry_matches(commitlog: CommitLog, queue, tier: TierHistory | None, report: RecoveryReport) -> bool:
    """Whether a queue's last entry names its record: in the local log, or below it in the tier's history (one
    range read). An entry the tier cannot check (it cannot be read, or its record there is damaged) is kept and
    reported (TIER_UNREADABLE): retention removed its segment only once the entry was on disk."""
    unit = queue.read(queue.max_offset - 1, 1)
    if not len(unit):
        return False
    offset, size = int(unit["commitlog_offset"][0]), int(unit["size"][0])
    if offset < commitlog.min_offset() and tier is not None:
        matches, why = tier.entry_matches(offset, size, queue.topic, queue.queue_id, queue.max_offset - 1)
        if matches is None:
            note_tier_unreadable(report, tier, f"consume queue {queue.topic}/{queue.queue_id}: its last entry, for the "
                                               f"record at commitlog offset {offset}, kept unchecked ({why})")
            return True
        return matches
    if offset < commitlog.min_offset() or offset + size > commitlog.readable_end():
        return False
    try:
        message = commitlog.read(offset)
    except CorruptionError:
        return False
    return (message.size_bytes == size and message.topic == queue.topic and message.queue_id == queue.queue_id
            and message.queue_offset == queue.max_offset - 1)


def _rebuild_queues_the_tier_lists_earlier(queues: ConsumeQueueTable, report: RecoveryReport,
                                           tier: TierHistory) -> None:
    """Row QUEUE_REBUILT for a queue whose first file (or every file) local disk lacks while the tier's manifest
    lists an earlier one of it: with a tier, retention deletes no queue file, so the file was lost to damage, and the
    records it named may be in the tier only (where `_rebuild_queues_missing_first_files` cannot see them). One look
    at the manifest, which lists the queue files uploaded up to its queues_end (docs/tier.md)."""
    if tier.start() is None:
        if tier.problem is not None:
            note_tier_unreadable(report, tier, "consume queue files missing on local disk: not looked for in the "
                                               "tier's manifest")
        return
    manifest = tier.reader.manifest()
    for key, listed in sorted(manifest.queues.items()):
        queue = queues.queues.get(key)
        local_first = queue.files[0].base_offset if queue is not None and queue.files else None
        if listed and (local_first is None or int(listed[0].name) < local_first) and \
                f"{key[0]}/{key[1]}" not in report.queues_rebuilt:
            _rebuild_queue(queues, report, key, f"the tier lists its file {listed[0].name}, which local disk lacks "
                                                f"(its first file is {local_first})", tier)


def _rebuild_queues_missing_first_files(commitlog: CommitLog, queues: ConsumeQueueTable, report: RecoveryReport,
                                        tier: TierHistory | None) -> None:
    """Row QUEUE_REBUILT for a queue whose first file is missing while the log still holds its messages.

    Retention deletes a queue file only once every message it names is below the log's start, so a queue whose
    first remaining entry names a record above the log's start while the log holds an earlier message of that
    queue lost a file to damage: its entries for those messages would be unreachable. The log is read once,
    from its start to the furthest such first entry (only when a queue's first file is not its file 0)."""
    log_min = commitlog.min_offset()
    candidates: dict[tuple[str, int], int] = {}
    for key, queue in list(queues.queues.items()):
        if queue.max_offset <= queue.min_offset or not queue.files or queue.files[0].base_offset == 0:
            continue
        unit = queue.read(queue.min_offset, 1)
        if len(unit) and int(unit["commitlog_offset"][0]) > log_min:
            candidates[key] = int(unit["commitlog_offset"][0])
    if not candidates:
        return
    limit = min(max(candidates.values()), report.log_end)
    offset = log_min
    while offset < limit and candidates:
        batch = parse_records(commitlog, offset, limit, records_max=RECOVERY_BATCH_RECORDS, zeros_end=True)
        names = batch.topic_names
        for topic_id, queue_id, commitlog_offset in zip(batch.topic_ids.tolist(), batch.queue_ids.tolist(),
                                                        batch.commitlog_offsets.tolist()):
            key = (names[topic_id], queue_id)
            if key in candidates and commitlog_offset < candidates[key]:
                del candidates[key]
                _rebuild_queue(queues, report, key, f"its first file is missing, the log still holds message "
                                                    f"{commitlog_offset} of it", tier)
        if batch.error is not None or batch.end_offset == offset:
            break
        offset = batch.end_offset
