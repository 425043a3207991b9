"""Checking a store's files (`mqstore verify`) and measuring them as a reader sees them (`mqstore stats`).

Everything here maps files read-only, takes no lock and writes nothing, so it may run beside a writer.
`verify_store` checks, and reports (never raises) what breaks:

    (1) the CommitLog segments load: names, sizes and contiguity (commitlog.segments);
    (2) every record of every segment is valid by rules 1-6 of commitlog.format, CRCs included; a record
        whose only fault is its CRC is reported and the walk goes on (its TOTALSIZE is sound), any other
        fault ends the walk of that segment;
    (3) the log ends at the first eight zero bytes where a record should start; every segment before that
        one ends with an end-of-segment blank; segments after it (made ahead of need) hold nothing yet;
    (4) every ConsumeQueue loads (file names, sizes, entry order: consumequeue.format rules 1-3);
    (5) every ConsumeQueue entry points below the log's written end, to a valid record whose TOTALSIZE, topic,
        queue id and queue offset are the entry's size, the queue's topic and id, and the entry's number.
        Entries pointing below the log's first segment were deleted by retention: counted, not reported;
    (6) the index files follow rules 1-9 of indexfile.format, every slot and entry (IndexService.problems: the
        first break in each file is reported). With index_enabled=False, or index files of another size than the
        config's index_slot_count and index_entry_count_max make (written with other settings, which the
        command line can give), they are not checked and the report says why (`index_not_checked`).
    (7) the checkpoint is there when the log has segments (`checkpoint.missing`), keeps rules 1-2 of
        flush/checkpoint.py, and holds nothing a writer never leaves (mqstore/store/recovery.py's
        checkpoint_fields_damage: bytes past its fields, a time past the year 9999). A crash recovery could not
        tell from it how far the log was flushed.

At most VERIFY_PROBLEMS_MAX problems are kept; the rest are counted. A problem is a CorruptionError carrying
the file and the byte position inside it (commitlog/errors.py).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import TOPIC_PATTERN
from mqstore.commitlog.errors import ConfigMismatchError, CorruptionError, StoreIOError
from mqstore.commitlog.segments import SegmentList
from mqstore.consumequeue import format as cqf
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.flush.checkpoint import CHECKPOINT_FILE_NAME, Checkpoint
from mqstore.indexfile import format as index_format
from mqstore.indexfile.index_service import IndexService
from mqstore.store.config import RECORD_CRC_FROM_KEY, StoreConfig, save_or_check_format
from mqstore.store.index_queries import check_index_sizes
from mqstore.store.recovery import checkpoint_fields_damage

INDEX_DISABLED = "the config has index_enabled=False"
VERIFY_PROBLEMS_MAX = 100  # problems a report keeps (the rest are only counted)
QUEUE_READ_CHUNK_ENTRIES = 65_536  # ConsumeQueue entries read at once
_I64 = struct.Struct(">q")


@dataclass
class VerifyReport:
    """What `verify_store` found. `problems` holds the first VERIFY_PROBLEMS_MAX of `problem_count`."""

    problems: list[CorruptionError] = field(default_factory=list)
    problem_count: int = 0
    segments: int = 0
    records: int = 0
    blanks: int = 0
    log_min_offset: int = 0
    log_end_offset: int = 0
    queues: int = 0
    entries: int = 0
    entries_removed: int = 0
    index_files: int = 0
    index_not_checked: str = ""  # why the index files were not checked ("" when they were, or there are none)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def add(self, problem: CorruptionError) -> None:
        self.problem_count += 1
        if len(self.problems) < VERIFY_PROBLEMS_MAX:
            self.problems.append(problem)

    def as_dict(self) -> dict:
        counts = {name: getattr(self, name) for name in (
            "segments", "records", "blanks", "log_min_offset", "log_end_offset", "queues", "entries",
            "entries_removed", "index_files", "index_not_checked")}
        return {"ok": self.ok, "problem_count": self.problem_count, **counts,
                "problems": [{"path": p.path, "offset": p.offset, "rule": p.rule, "message": str(p)}
                             for p in self.problems]}


class _NoProgress:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def _no_progress(total: int, description: str, unit: str) -> _NoProgress:
    return _NoProgress()


# --- the CommitLog -------------------------------------------------------------------------------------------
def _walk_segment(segment, pos: int, *, check_crc: bool, report: VerifyReport | None,
                  record_crc_from: int | None = None) -> tuple[int, int, str]:
    """Walk the records of one segment from `pos`: (records, where the walk stopped, why).

    Why is "blank" (an end-of-segment blank; stopped at the segment's end), "zeros" (end of written data),
    "full" (a record ends exactly at the segment's end) or "corrupt" (reported to `report`, or raised).
    """
    view, size_bytes, base = segment.view, segment.size_bytes, segment.base_offset
    records = 0
    while pos < size_bytes:
        remaining = size_bytes - pos
        size, magic = fmt.peek(view, pos, remaining)
        if magic == fmt.MESSAGE_MAGIC_CODE or magic == fmt.MESSAGE_MAGIC_CODE_V2:
            try:
                layout = fmt.locate(view, pos, remaining, base + pos, path=segment.path)
                required = record_crc_from is not None and base + pos >= record_crc_from
                fmt.check_crcs(view, layout, pos, base + pos, required=required, check_crc=check_crc,
                               path=segment.path)
            except CorruptionError as exc:
                if report is None:
                    raise
                report.add(exc)
                if not exc.length_sound:
                    return records, pos, "corrupt"
            records += 1
            pos += size
        elif magic == fmt.BLANK_MAGIC_CODE and size == remaining:
            return records, size_bytes, "blank"
        elif size == 0 and magic == 0:
            return records, pos, "zeros"
        else:
            problem = CorruptionError(f"neither a record, a blank nor the end of data: TOTALSIZE {size}, "
                                      f"MAGICCODE 0x{magic & 0xFFFFFFFF:08X} at commitlog offset {base + pos}",
                                      path=segment.path, offset=pos, rule="commitlog.1")
            if report is None:
                raise problem
            report.add(problem)
            return records, pos, "corrupt"
    return records, pos, "full"


def _load_segments(root: str, config: StoreConfig) -> SegmentList:
    directory = os.path.join(root, "commitlog")
    if not os.path.isdir(directory):
        raise StoreIOError(f"{root} is not a store: it has no commitlog directory")
    return SegmentList(directory, config.segment_size_bytes, writable=False)


def _has_data(segment) -> bool:
    """Whether a segment starts with something other than eight zero bytes (segments made ahead do not)."""
    return any(fmt.peek(segment.view, 0, segment.size_bytes))


def _check_log(segments: SegmentList, report: VerifyReport, make_progress,
               record_crc_from: int | None = None) -> None:
    listed = segments.segments
    report.segments = len(listed)
    report.log_min_offset = report.log_end_offset = segments.first_base_offset
    gap = None  # (segment, position) of the zeros where the log seemed to end
    progress = make_progress(len(listed) * segments.segment_size_bytes, "verify commitlog", "B")
    try:
        for segment in listed:
            progress.update(segment.size_bytes)
            if gap is not None and not _has_data(segment):
                continue  # made ahead of need by the allocator: nothing written yet
            if gap is not None:
                report.add(CorruptionError(f"the log ends here but segment {os.path.basename(segment.path)} "
                                           "after it holds records: an end-of-segment blank is missing",
                                           path=gap[0].path, offset=gap[1], rule="commitlog.blank"))
                gap = None
            records, stop, why = _walk_segment(segment, 0, check_crc=True, report=report,
                                               record_crc_from=record_crc_from)
            report.records += records
            report.blanks += why == "blank"
            report.log_end_offset = segment.base_offset + stop
            if why == "zeros":
                gap = (segment, stop)
    finally:
        progress.close()


def log_written_end(root, config: StoreConfig) -> int:
    """The commitlog offset just past the last record on disk (walks the last segment with data; no CRCs)."""
    segments = _load_segments(os.fspath(root), config)
    try:
        for segment in reversed(segments.segments):  # the last one or two: segments made ahead are empty
            if _has_data(segment):
                _, stop, _ = _walk_segment(segment, 0, check_crc=False, report=None)
                return segment.base_offset + stop
        return segments.first_base_offset
    finally:
        segments.close()


# --- the ConsumeQueues ---------------------------------------------------------------------------------------
def _open_queues(root: str, entries_per_file: int, report: VerifyReport | None) -> list[ConsumeQueue]:
    """Every ConsumeQueue under `<root>/consumequeue`, read-only; one that fails to load is reported."""
    directory = os.path.join(root, "consumequeue")
    queues = []
    try:
        topics = sorted(os.listdir(directory))
    except FileNotFoundError:
        return queues
    except OSError as exc:
        raise StoreIOError(f"cannot list {directory}: {exc.strerror}") from exc
    for topic in topics:
        topic_dir = os.path.join(directory, topic)
        if not TOPIC_PATTERN.fullmatch(topic) or not os.path.isdir(topic_dir):
            continue  # not a queue directory: the store ignores it too
        for name in sorted(os.listdir(topic_dir), key=lambda n: (len(n), n)):
            if not (name.isascii() and name.isdigit() and len(name) <= 9):
                continue
            try:
                queues.append(ConsumeQueue(os.path.join(topic_dir, name), topic, int(name), entries_per_file,
                                           writable=False))
            except CorruptionError as exc:
                if report is None:
                    raise
                report.add(exc)
    return queues


def _entry_location(queue: ConsumeQueue, entry: int) -> tuple[str, int]:
    """(file, byte position in it) of a queue's entry."""
    first = queue.files[0].base_offset // cqf.UNIT_SIZE_BYTES
    index, position = divmod(entry - first, queue.entries_per_file)
    return queue.files[index].path, position * cqf.UNIT_SIZE_BYTES


def _check_entry(queue, entry: int, commitlog_offset: int, size: int, segments: SegmentList,
                 log_end: int) -> str | None:
    """Rule (5) for one entry: None when it holds, else what is wrong."""
    if commitlog_offset + size > log_end:
        return f"points to [{commitlog_offset}, {commitlog_offset + size}), past the log's written end {log_end}"
    segment = segments.segment_at(commitlog_offset)
    if segment is None:
        return f"points to commitlog offset {commitlog_offset}, in no segment"
    pos = commitlog_offset - segment.base_offset
    try:
        layout = fmt.locate(segment.view, pos, segment.size_bytes - pos, commitlog_offset, path=segment.path)
    except CorruptionError as exc:
        return f"points to an invalid record: {exc}"
    queue_id = fmt.I32.unpack_from(segment.view, pos + fmt.OFFSET_QUEUE_ID)[0]
    queue_offset = _I64.unpack_from(segment.view, pos + fmt.OFFSET_QUEUE_OFFSET)[0]
    topic = bytes(segment.view[layout.topic_start : layout.topic_start + layout.topic_length])
    found = (layout.size, topic, queue_id, queue_offset)
    wanted = (size, queue.topic.encode("ascii"), queue.queue_id, entry)
    if found != wanted:
        return (f"points to the record at {commitlog_offset} of {topic.decode('ascii', 'replace')}/{queue_id} "
                f"entry {queue_offset} size {layout.size}, not {queue.topic}/{queue.queue_id} entry {entry} "
                f"size {size}")
    return None


def _check_queue(queue: ConsumeQueue, segments: SegmentList, report: VerifyReport, progress) -> None:
    log_min, log_end = report.log_min_offset, report.log_end_offset
    offset = queue.min_offset
    while offset < queue.max_offset:
        try:
            units = queue.read(offset, QUEUE_READ_CHUNK_ENTRIES)
        except CorruptionError as exc:
            report.add(exc)
            return
        for row, (commitlog_offset, size, _) in enumerate(units.tolist()):
            entry = offset + row
            report.entries += 1
            if commitlog_offset < log_min:
                report.entries_removed += 1
                continue
            wrong = _check_entry(queue, entry, commitlog_offset, size, segments, log_end)
            if wrong is not None:
                path, position = _entry_location(queue, entry)
                report.add(CorruptionError(f"queue {queue.topic}/{queue.queue_id} entry {entry} {wrong}",
                                           path=path, offset=position, rule="consumequeue.matches-log"))
        progress.update(len(units))
        offset += len(units)


# --- entry points --------------------------------------------------------------------------------------------
def verify_store(root, config: StoreConfig, make_progress=_no_progress) -> VerifyReport:
    """Check the store under `root` (read-only) and report what breaks the rules of this module's docstring.

    `make_progress(total, description, unit)` returns an object with update(count) and close() (a tqdm).
    Raises StoreError only when `root` is not a store or its saved format settings differ from `config`.
    """
    root = os.fspath(root)
    settings = save_or_check_format(os.path.join(root, "config"), config, writable=False)
    report = VerifyReport()
    try:
        segments = _load_segments(root, config)
    except CorruptionError as exc:
        report.add(exc)
        return report
    queues: list[ConsumeQueue] = []
    try:
        _check_log(segments, report, make_progress, settings.get(RECORD_CRC_FROM_KEY))
        queues = _open_queues(root, config.consume_queue_entries_per_file, report)
        report.queues = len(queues)
        progress = make_progress(sum(q.max_offset - q.min_offset for q in queues), "verify consumequeue",
                                 "entry")
        try:
            for queue in queues:
                _check_queue(queue, segments, report, progress)
        finally:
            progress.close()
        _check_index(os.path.join(root, "index"), config, report)
        _check_checkpoint(root, segments, report)
    finally:
        for queue in queues:
            queue.close()
        segments.close()
    return report


def _check_checkpoint(root: str, segments: SegmentList, report: VerifyReport) -> None:
    """(7): the checkpoint."""
    try:
        checkpoint = Checkpoint.open(root, writable=False)
    except CorruptionError as exc:
        report.add(exc)
        return
    if checkpoint is None:
        if segments.segments:
            report.add(CorruptionError("the checkpoint is missing while the log has segments",
                                       path=os.path.join(root, CHECKPOINT_FILE_NAME), rule="checkpoint.missing"))
        return
    try:
        damage = checkpoint_fields_damage(checkpoint)
        if damage is not None:
            report.add(damage)
    finally:
        checkpoint.close()


def _check_index(directory: str, config: StoreConfig, report: VerifyReport) -> None:
    """(6): every index file, if they have the size the config makes."""
    if not os.path.isdir(directory) or not any(index_format.parse_file_name(n) is not None
                                               for n in os.listdir(directory)):
        return
    if not config.index_enabled:
        report.index_not_checked = INDEX_DISABLED
        return
    try:
        check_index_sizes(directory, config)
    except ConfigMismatchError as exc:
        report.index_not_checked = str(exc)
        return
    try:
        service = IndexService(directory, config.index_slot_count, config.index_entry_count_max, read_only=True)
    except CorruptionError as exc:  # a file that does not load (header, size)
        report.add(exc)
        return
    try:
        report.index_files = len(service.files)
        for problem in service.problems():
            report.add(problem)
    finally:
        service.close()


def queue_usage(root, config: StoreConfig, make_progress=_no_progress) -> dict[tuple[str, int], dict]:
    """Per (topic, queue_id): min_offset, max_offset, bytes (record bytes its entries point to) and
    commitlog_end (just past the record of its last entry), from the ConsumeQueue files, read-only."""
    queues = _open_queues(os.fspath(root), config.consume_queue_entries_per_file, None)
    result = {}
    progress = make_progress(sum(q.max_offset - q.min_offset for q in queues), "measure queues", "entry")
    try:
        for queue in queues:
            total = 0
            offset = queue.min_offset
            while offset < queue.max_offset:
                units = queue.read(offset, QUEUE_READ_CHUNK_ENTRIES)
                if not len(units):
                    break
                total += int(units["size"].sum(dtype="int64"))
                offset += len(units)
                progress.update(len(units))
            result[(queue.topic, queue.queue_id)] = {
                "min_offset": queue.min_offset, "max_offset": queue.max_offset, "bytes": total,
                "commitlog_end": queue.last_commitlog_end()}
    finally:
        progress.close()
        for queue in queues:
            queue.close()
    return result

