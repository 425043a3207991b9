"""Recovery: what a writable open does to make the store consistent after any stop, as a decision table.

What is observed                                         | case               | decision
---------------------------------------------------------|--------------------|---------------------------------------
no `abort` marker; the last 3 segments walk cleanly       | CLEAN              | keep everything
no `abort` marker; a record breaks the format rule        | CLEAN_CORRUPT      | CorruptionError; repair=True: cut the
  (close flushed everything: this is damage, not a crash) |                    | log at that record
`abort` marker; the log walks cleanly to its end          | CRASH_CLEAN_TAIL   | keep the log; cut queue and index
  (the process died, the page cache survived)             |                    | entries past its end; re-dispatch
`abort` marker; the first bad record lies at or past the  | CRASH_TORN_TAIL    | cut the log there (zero the rest of
  checkpoint's flushed offset (or, for a 4.x checkpoint,  |                    | the segment, delete later segments);
  after the last message it says was flushed)             |                    |
  (power lost before unflushed pages reached the disk)    |                    | cut queues and index; re-dispatch
`abort` marker; the first bad record lies below the       | CRASH_CORRUPT      | CorruptionError; repair=True: cut the
  checkpoint's flushed offset (flushed bytes are damaged) |                    | log there
a ConsumeQueue file breaks its format rule, or its last   | QUEUE_REBUILT      | delete that queue, rebuild it from
  entry does not match the record it points to, or it has |   (per queue)      | the CommitLog
  entries past the log's end that no crash explains (any  |                    |
  after a clean stop; one whose record starts inside the  |                    |
  log): damage, which a cut would hide the rest behind    |                    |
a ConsumeQueue has entries for records past the end of a  | QUEUE_TRUNCATED    | drop those entries
  crashed (or repaired) log                               |                    |
the walk meets a message its ConsumeQueue lacks (a queue  | QUEUE_REPLAYED     | re-dispatch from that message
  that lost its tail)                                     |                    |
an index file breaks its format rule (1)-(3)              | (engine)           | delete the index, rebuild it
`abort` marker and an index (or the log was cut)          | INDEX_CUT          | cut the index at the checkpoint's
  (index pages written after the last index flush may be  |                    | index_flushed_end: check every file
  lost, stale or torn, in any file, not only the newest)  |                    | that may hold later entries (and the
                                                          |                    | newest) entry by entry, cut at the
                                                          |                    | first bad one, delete the files after
                                                          |                    | it; re-dispatch the rest
no `abort` marker; an index file's header disagrees with  | INDEX_INCONSISTENT | check that file entry by entry, cut it
  its entries or its place (rules 7, 8: a zeroed tail     |                    | at the first bad entry, delete later
  under a header counting it, an older file not full), or |                    | files; cut where no message starts;
  the index ends where no message starts                  |                    | re-dispatch the rest
a corrupt checkpoint                                      | (engine)           | replace it with zeros: scan everything

Where the walk starts: after a clean stop, at the third-last segment with data (RocketMQ's recoverNormally);
after a crash, at the newest segment whose first message is older than the checkpoint's minimum time less
3 s (RocketMQ's recoverAbnormally), or at the first segment when no segment qualifies, and never past the
segment holding the checkpoint's flushed offset (store times come from a clock that can go back; that offset
is exact). Records are checked with rules (1)-(4) and (6) of commitlog/format.py and, with
check_crc_on_recover, their CRCs (rules 5 and 6).

Repair policy: repair=True walks the whole log (a segment cut short is first extended with zeros) and cuts the
log at the first bad record, dropping everything after it (reported in
the report's `dropped_bytes` and queue entry counts); records are never skipped, so the log stays a valid
chain that RocketMQ could read. Bad bytes are never returned as a message.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.commitlog.record_batch import parse_records
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.flush.checkpoint import Checkpoint

log = logging.getLogger(__name__)

RECOVERY_BATCH_RECORDS = 65_536  # records decoded at once while walking the log
CLEAN_STOP_SEGMENTS_CHECKED = 3  # RocketMQ checks the last three files after a clean stop
INDEX_RESUME_CHECKS_MAX = 16  # cuts of the index at an end where no message starts, before it is rebuilt whole
SCAN_CHUNK_BYTES = 1 << 20  # bytes looked at per step when searching a segment's tail for data


@dataclass
class RecoveryReport:
    """What open() found and did; `MessageStore.recovery_report`."""

    case: str = "NEW_STORE"
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
    index_case: str | None = None  # INDEX_CUT, INDEX_INCONSISTENT, or None (the index was kept as it was)
    index_damage: list[str] = field(default_factory=list)  # index rules (7), (8) found broken

    def as_dict(self) -> dict:
        return asdict(self)


def recover(commitlog: CommitLog, queues: ConsumeQueueTable, index, checkpoint: Checkpoint, *, crashed: bool,
            repair: bool, check_crc: bool) -> RecoveryReport:
    """Make the log, queues and index agree, following the table above. Re-dispatch is the caller's, from
    `dispatch_start(report, ...)`."""
    started = time.perf_counter()
    report = RecoveryReport(crashed=crashed)
    ends = {key: queue.max_offset for key, queue in queues.queues.items()}
    _recover_log(commitlog, checkpoint, report, crashed=crashed, repair=repair, check_crc=check_crc,
                 with_index=index is not None, queue_ends=ends)
    _recover_queues(commitlog, queues, report, crashed=crashed)
    if report.queues_rebuilt:
        # The rebuilt queues are only in memory yet: until they are flushed, a crash must replay the whole log.
        checkpoint.reset_logical_times()
        checkpoint.flush()
    if index is not None:
        _recover_index(commitlog, index, checkpoint, report, crashed=crashed)
    report.seconds = time.perf_counter() - started
    return report


def dispatch_start(report: RecoveryReport, commitlog: CommitLog, queues: ConsumeQueueTable, index, *,
                   crashed: bool) -> int:
    """Where dispatch resumes after `recover`: at or before the first message a queue or the index lacks."""
    log_min = commitlog.min_offset()
    dispatched = max(queues.max_commitlog_end(), log_min)
    if report.queues_rebuilt or queues.corrupt:
        dispatched = log_min
    elif crashed:
        # Queue pages may have been lost in any queue: replay from where the recovery scan started (the
        # checkpoint says everything before was on disk); dispatchers skip the entries they already have.
        dispatched = min(dispatched, report.scan_start)
    if report.replay_from is not None:  # the walk met messages a queue lacks (it lost its tail)
        dispatched = min(dispatched, report.replay_from)
    if index is not None:
        # The index resumes at (or past) the message it indexed last, or rebuilds from the start.
        dispatched = max(min(dispatched, _index_resume(commitlog, index)), log_min)
    return dispatched


def _index_resume(commitlog: CommitLog, index) -> int:
    """Where dispatch must resume for the index: at the message it indexed last while that message may lack
    some of its keys (a crash between two of them), past it when the index holds every one (any clean stop),
    so that a reopen re-dispatches nothing the queues and the index already have."""
    end = index.max_indexed_offset
    if index.entry_count == 0 or end >= commitlog.readable_end():
        return end
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
        report.index_case = "INDEX_CUT"
    elif report.index_damage:
        report.index_case = "INDEX_INCONSISTENT"
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


def _recover_log(commitlog: CommitLog, checkpoint: Checkpoint, report: RecoveryReport, *, crashed: bool,
                 repair: bool, check_crc: bool, with_index: bool, queue_ends: dict) -> None:
    last = commitlog.segments.last()
    if last is None:
        report.case = "NEW_STORE"
        return
    # repair walks the whole log: damage anywhere is cut, not only in the segments a normal open checks
    start = commitlog.min_offset() if repair else _scan_start(commitlog, checkpoint, crashed=crashed,
                                                               with_index=with_index)
    report.scan_start = start
    limit = last.base_offset + last.size_bytes
    offset = start
    last_valid_time = 0
    error: CorruptionError | None = None
    while offset < limit:
        batch = parse_records(commitlog, offset, limit, records_max=RECOVERY_BATCH_RECORDS, zeros_end=True,
                              check_crc=check_crc)
        if len(batch):
            last_valid_time = int(batch.store_timestamps_ms[-1])
            if report.replay_from is None:
                report.replay_from = _first_missing_from_queues(batch, queue_ends)
        if batch.error is not None:
            error = batch.error
            offset = batch.end_offset
            break
        if batch.end_offset == offset:
            break
        offset = batch.end_offset
    end = offset
    report.bytes_scanned = end - start
    if error is None:
        report.case = "CRASH_CLEAN_TAIL" if crashed else "CLEAN"
    elif crashed and _after_durable_point(checkpoint, end, last_valid_time):
        report.case = "CRASH_TORN_TAIL"
        report.corruption = str(error)
    else:
        report.case = "CRASH_CORRUPT" if crashed else "CLEAN_CORRUPT"
        report.corruption = str(error)
        if not repair:
            raise error
        log.warning("repair: cutting the log at offset %d: %s", end, error)
    commitlog.set_end(end)
    if crashed or error is not None:
        # Bytes past the end are cut even when the walk stopped at zeros: a page written after a lost one
        # can hold a valid-looking record that a later walk would otherwise take back in.
        written_end = _written_end(commitlog, end)
        if written_end > end:
            report.dropped_bytes = written_end - end
            commitlog.truncate(end)
    report.log_end = end
    checkpoint.reset_flushed_offset(end)


def _first_missing_from_queues(batch, queue_ends: dict) -> int | None:
    """The commitlog offset of the first message in `batch` whose queue entry is missing (its queue offset is at
    or past its queue's end, or its queue does not exist), or None. Transaction-prepared and rolled-back
    messages never get an entry and are passed over. Vectorised: one comparison per distinct queue."""
    if not len(batch):
        return None
    transaction = batch.sys_flags & fmt.SYS_FLAG_TRANSACTION_MASK
    counted = (transaction != fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE) & (
        transaction != fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE)
    keys = batch.topic_ids * (1 << 32) + batch.queue_ids
    distinct, inverse = np.unique(keys, return_inverse=True)
    names = batch.topic_names
    ends = np.array([queue_ends.get((names[int(key >> 32)], int(key & 0xFFFFFFFF)), 0) for key in distinct.tolist()],
                    dtype=np.int64)
    missing = np.flatnonzero(counted & (batch.queue_offsets >= ends[inverse.ravel()]))
    return int(batch.commitlog_offsets[missing[0]]) if len(missing) else None


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


def _recover_queues(commitlog: CommitLog, queues: ConsumeQueueTable, report: RecoveryReport, *, crashed: bool) -> None:
    for (topic, queue_id), error in list(queues.corrupt.items()):
        log.warning("rebuilding consume queue %s/%d from the CommitLog: %s", topic, queue_id, error)
        queues.remove(topic, queue_id)
        report.queues_rebuilt.append(f"{topic}/{queue_id}")
    end = report.log_end
    for (topic, queue_id), queue in list(queues.queues.items()):
        past = queue.offsets_past(end)
        if len(past) and (report.case == "CLEAN" or int(past.min()) < end):
            # What the cut would drop is not a tail of entries for records past the log's end (which a crash
            # leaves): an entry is damaged, and cutting there would hide the good entries after it for good.
            log.warning("rebuilding consume queue %s/%d: %d entries from one pointing at %d do not end by the "
                        "log's end %d", topic, queue_id, len(past), int(past[0]), end)
            queues.remove(topic, queue_id)
            report.queues_rebuilt.append(f"{topic}/{queue_id}")
            continue
        report.queue_entries_dropped += queue.truncate_past(end)
        if crashed and queue.max_offset > queue.min_offset and not _last_entry_matches(commitlog, queue):
            log.warning("rebuilding consume queue %s/%d: its last entry does not match the log", topic, queue_id)
            queues.remove(topic, queue_id)
            report.queues_rebuilt.append(f"{topic}/{queue_id}")


def _last_entry_matches(commitlog: CommitLog, queue) -> bool:
    unit = queue.read(queue.max_offset - 1, 1)
    if not len(unit):
        return False
    offset, size = int(unit["commitlog_offset"][0]), int(unit["size"][0])
    if offset < commitlog.min_offset() or offset + size > commitlog.readable_end():
        return False
    try:
        message = commitlog.read(offset)
    except CorruptionError:
        return False
    return (message.size_bytes == size and message.topic == queue.topic and message.queue_id == queue.queue_id
            and message.queue_offset == queue.max_offset - 1)
