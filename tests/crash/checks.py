"""What every crash test checks after a reopen, with an oracle that does not use the engine's decoder.

`planned_message(seq)` is the message a writer puts as its seq-th: topic, queue, tags, keys and body all
follow from the number, and the body starts with it, so any record read back names the message it must be.
`walk_log()` walks CommitLog segment bytes by the format rule of commitlog/format.py (body CRC included).
`verify_reopened()` opens a store (writable, no repair) and checks:

  (1) the open succeeds; the walk of the files ends exactly at `recovery_report.log_end`, at zeros, and
      every byte past it (rest of its segment, later segments) is zero: nothing past the end can come back;
  (2) every record in the log is the planned message its body names (topic, queue, body, tags, keys), and
      with a live reference, the log is a byte-identical prefix of the live log (nothing invented, nothing
      skipped);
  (3) every message that must survive (acknowledged, by the caller's rule) is there at its commitlog offset
      with its queue offset and body;
  (4) queue offsets in the log are dense per (topic, queue) from 0; every ConsumeQueue reads back through
      `get()` as exactly the log's messages of that queue, in order (max_offset = their count);
  (5) with an index, keys of kept messages are found and keys of messages cut away are not;
  (6) a put after recovery gets the next queue offset and reads back; a second open is CLEAN.
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from mqstore.commitlog import format as fmt

from mqstore import Message, MessageStore, PutStatus, StoreConfig

TOPICS = ("orders", "audit", "t")
# Retention out of the way: it measures disk usage as 1 - f_bavail/f_blocks, which on a disk with many reserved
# blocks sits near its 0.75 default and would delete segments under the tests (a retention matter, not a crash one).
RETENTION_OFF = dict(disk_max_used_space_ratio=1.0, disk_clean_forcibly_ratio=1.0, disk_full_ratio=1.0)
QUEUE_COUNT = 3
GET_CHUNK_ENTRIES = 1000
INDEX_SAMPLE_COUNT = 12
_HEADER = struct.Struct(">iIiiiqqiq8sq8siqi")
_SIZE_MAGIC = struct.Struct(">iI")
_PROPERTIES_LENGTH = struct.Struct(">h")


def planned_message(seq: int, *, keys: bool = True) -> Message:
    """The seq-th message of a crash-test writer (deterministic; its body starts with b'<seq>|')."""
    rng = random.Random(seq * 7919 + 17)
    topic = TOPICS[rng.randrange(len(TOPICS))]
    queue_id = rng.randrange(QUEUE_COUNT)
    size = rng.choice((rng.randint(0, 120), rng.randint(120, 1500), rng.randint(1500, 5000)))
    tags = rng.choice((None, "red", "blue"))
    return Message(topic, b"%d|" % seq + rng.randbytes(size), queue_id=queue_id, tags=tags,
                   keys=(f"k{seq}",) if keys else ())


def body_seq(body: bytes) -> int | None:
    head, bar, _ = body[:24].partition(b"|")
    return int(head) if bar and head.isdigit() else None


class Record(NamedTuple):
    offset: int
    raw: bytes
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: bytes


@dataclass
class LogWalk:
    records: list[Record]
    end: int
    reason: str  # "zeros", "end of segments", or what broke the rule


class Acked(NamedTuple):
    """A put acknowledged with PUT_OK."""

    seq: int
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int


def read_segments(root: str) -> list[tuple[int, bytes]]:
    directory = os.path.join(root, "commitlog")
    names = sorted(n for n in os.listdir(directory) if fmt.parse_segment_name(n) is not None) \
        if os.path.isdir(directory) else []
    segments = []
    for name in names:
        with open(os.path.join(directory, name), "rb") as handle:
            segments.append((int(name), handle.read()))
    return segments


def segments_from_files(files: dict[str, bytes]) -> list[tuple[int, bytes]]:
    found = []
    for relative, data in files.items():
        directory, name = os.path.split(relative)
        if directory == "commitlog" and fmt.parse_segment_name(name) is not None:
            found.append((int(name), data))
    return sorted(found)


def _record_at(data: bytes, pos: int, offset: int) -> Record | str:
    """The valid v1 record at `pos`, or why there is none."""
    remaining = len(data) - pos
    size, magic = _SIZE_MAGIC.unpack_from(data, pos)
    if magic != fmt.MESSAGE_MAGIC_CODE or not fmt.RECORD_SIZE_MIN <= size <= remaining:
        return f"bad size/magic {size}/{magic:#x} at {offset}"
    fields = _HEADER.unpack_from(data, pos)
    body_length, physical = fields[-1], fields[6]
    if physical != offset or body_length < 0 or 88 + body_length + 3 > size:
        return f"bad header at {offset}"
    topic_at = pos + 88 + body_length
    topic_length = data[topic_at]
    properties_at = topic_at + 1 + topic_length
    if topic_length < 1 or properties_at + 2 > pos + size:
        return f"bad topic at {offset}"
    properties_length = _PROPERTIES_LENGTH.unpack_from(data, properties_at)[0]
    if properties_length < 0 or properties_at + 2 + properties_length != pos + size:
        return f"bad properties at {offset}"
    body = data[pos + 88 : topic_at]
    if zlib.crc32(body) & 0x7FFFFFFF != fields[2]:
        return f"bad body CRC at {offset}"
    return Record(offset, data[pos : pos + size], data[topic_at + 1 : properties_at].decode("ascii", "replace"),
                  fields[3], fields[5], body, data[properties_at + 2 : pos + size])


def walk_log(segments: list[tuple[int, bytes]]) -> LogWalk:
    """Valid records from the first segment on, crossing blanks, to the first zeros or broken record."""
    records: list[Record] = []
    if not segments:
        return LogWalk(records, 0, "end of segments")
    end = segments[0][0]
    for base, data in segments:
        if base != end:
            return LogWalk(records, end, f"segment {base} does not follow at {end}")
        pos = 0
        while True:
            if len(data) - pos < 8:
                return LogWalk(records, base + pos, "no room for a blank")
            size, magic = _SIZE_MAGIC.unpack_from(data, pos)
            if magic == fmt.BLANK_MAGIC_CODE and size == len(data) - pos:
                end = base + len(data)
                break
            if size == 0 and magic == 0:
                return LogWalk(records, base + pos, "zeros")
            found = _record_at(data, pos, base + pos)
            if isinstance(found, str):
                return LogWalk(records, base + pos, found)
            records.append(found)
            pos += size
    return LogWalk(records, end, "end of segments")


def nonzero_past(segments: list[tuple[int, bytes]], end: int) -> int | None:
    """The first commitlog offset at or past `end` holding a non-zero byte, or None."""
    for base, data in segments:
        if base + len(data) <= end:
            continue
        low = max(0, end - base)
        tail = data[low:]
        stripped = tail.lstrip(b"\x00")
        if stripped:
            return base + low + len(tail) - len(stripped)
    return None


def check_planned(record: Record, *, keys: bool) -> str | None:
    """Why `record` is not the planned message its body names, or None."""
    seq = body_seq(record.body)
    if seq is None:
        return f"record at {record.offset} has a body no writer put: {record.body[:20]!r}"
    planned = planned_message(seq, keys=keys)
    properties = fmt.decode_properties(record.properties)
    if (record.topic, record.queue_id, record.body) != (planned.topic, planned.queue_id, planned.body):
        return f"record at {record.offset} is not message {seq} as put"
    if properties.get("TAGS") != planned.tags or properties.get("KEYS", "") != " ".join(planned.keys):
        return f"record at {record.offset} (message {seq}) has other properties: {properties}"
    return None


FAILURE_KINDS = ("open", "acked", "log", "queues", "index", "after recovery")


@dataclass
class Outcome:
    """The result of one reopen-and-verify; `failures` are (kind, message), kind one of FAILURE_KINDS."""

    failures: list[tuple[str, str]] = field(default_factory=list)
    case: str = ""
    records: int = 0
    log_end: int = 0
    report: dict | None = None
    walk: LogWalk | None = None


def verify_reopened(root: str, config: StoreConfig, must_have: list[Acked], *, live: LogWalk | None = None,
                    keys: bool = True, rng: random.Random | None = None, label: str = "",
                    probe: bool = True) -> Outcome:
    """Open the store at `root` (writable, no repair) and check (1)-(6) of the module docstring."""
    rng = rng or random.Random(0)
    outcome = Outcome()

    def failing(kind):
        return lambda message: outcome.failures.append((kind, message))

    try:
        store = MessageStore.open(root, config)
    except Exception as exc:  # noqa: BLE001 - any failure to open is the finding
        failing("open")(f"{label}: open raised {type(exc).__name__}: {exc}")
        return outcome
    kind = "log"
    try:
        report = store.recovery_report
        outcome.case, outcome.log_end, outcome.report = str(report.case), report.log_end, report.as_dict()
        segments = read_segments(root)
        walk = walk_log(segments)
        outcome.records, outcome.walk = len(walk.records), walk
        _check_log(walk, segments, report, live, must_have, keys, failing("log"), failing("acked"), label)
        kind = "queues"
        by_queue = _check_queues(store, walk, failing("queues"), label)
        kind = "index"
        if config.index_enabled and keys:
            _check_index(store, walk, live, rng, failing("index"), label)
        kind = "after recovery"
        if probe and not any(kind in ("log", "queues") for kind, _ in outcome.failures):
            _probe(store, by_queue, failing("after recovery"), label)
    except Exception as exc:  # noqa: BLE001 - reads that raise are findings too
        failing(kind)(f"{label}: verification raised {type(exc).__name__}: {exc}")
    finally:
        store.close()
    if probe and not any(kind in ("log", "queues", "after recovery") for kind, _ in outcome.failures):
        try:
            with MessageStore.open(root, config) as again:
                if again.recovery_report.case != "CLEAN":
                    failing("after recovery")(f"{label}: the open after a clean close found "
                                              f"{again.recovery_report.case}")
        except Exception as exc:  # noqa: BLE001
            failing("after recovery")(f"{label}: the second open raised {type(exc).__name__}: {exc}")
    return outcome


def _check_log(walk, segments, report, live, must_have, keys, fail, fail_acked, label) -> None:
    if walk.end != report.log_end:
        fail(f"{label}: recovery says the log ends at {report.log_end}, its records end at {walk.end} "
             f"({walk.reason}); case {report.case}")
    past = nonzero_past(segments, walk.end)
    if past is not None:
        fail(f"{label}: non-zero bytes at {past}, past the log's end {walk.end} ({walk.reason})")
    for record in walk.records:
        problem = check_planned(record, keys=keys)
        if problem:
            fail(f"{label}: {problem}")
            break
    if live is not None:
        if len(walk.records) > len(live.records):
            fail(f"{label}: {len(walk.records)} records recovered, the live log had {len(live.records)}")
        for record, live_record in zip(walk.records, live.records):
            if record.offset != live_record.offset or record.raw != live_record.raw:
                fail(f"{label}: the record at {record.offset} differs from the live log's")
                break
    missing = lost_messages(walk, must_have, keys=keys)
    if missing:
        first = missing[0]
        fail_acked(f"{label}: {len(missing)} of {len(must_have)} messages that must survive are lost or changed, first "
             f"seq {first.seq} at {first.commitlog_offset} (log ends at {walk.end}, case {report.case}, "
             f"scan from {report.scan_start}, dropped {report.dropped_bytes} bytes)")
    counts: dict[tuple[str, int], int] = {}
    for record in walk.records:
        key = (record.topic, record.queue_id)
        if record.queue_offset != counts.get(key, 0):
            fail(f"{label}: message at {record.offset} has queue offset {record.queue_offset} in {key}, "
                 f"expected {counts.get(key, 0)}: queue offsets in the log are not dense")
            break
        counts[key] = record.queue_offset + 1


def lost_messages(walk: LogWalk, must_have: list[Acked], *, keys: bool = True) -> list[Acked]:
    """The messages of `must_have` that the walked log does not hold as they were put."""
    by_offset = {record.offset: record for record in walk.records}
    return [acked for acked in must_have if _lost(acked, by_offset.get(acked.commitlog_offset), keys)]


def _lost(acked: Acked, record: Record | None, keys: bool) -> bool:
    if record is None:
        return True
    planned = planned_message(acked.seq, keys=keys)
    return (record.topic, record.queue_id, record.queue_offset, len(record.raw), record.body) != (
        acked.topic, acked.queue_id, acked.queue_offset, acked.size, planned.body)


def _check_queues(store, walk: LogWalk, fail, label) -> dict[tuple[str, int], list[Record]]:
    by_queue: dict[tuple[str, int], list[Record]] = {}
    for record in walk.records:
        by_queue.setdefault((record.topic, record.queue_id), []).append(record)
    listed = {(topic, queue_id) for topic, ids in store.topics().items() for queue_id in ids}
    for key in sorted(set(by_queue) | listed):
        expected = by_queue.get(key, [])
        topic, queue_id = key
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        if (low, high) != (0, len(expected)):
            fail(f"{label}: queue {topic}/{queue_id} holds entries [{low}, {high}), the log has {len(expected)} "
                 "messages for it")
            continue
        offset = 0
        while offset < high:
            result = store.get(topic, queue_id, offset, max_count=GET_CHUNK_ENTRIES)
            if not result.messages:
                fail(f"{label}: get({topic}/{queue_id}, {offset}) returned {result.status.name}")
                break
            for message in result.messages:
                record = expected[offset]
                if (message.commitlog_offset, message.queue_offset, message.body) != (
                        record.offset, offset, record.body):
                    fail(f"{label}: entry {offset} of {topic}/{queue_id} reads as the message at "
                         f"{message.commitlog_offset}, the log's is at {record.offset}")
                    return by_queue
                offset += 1
    return by_queue


def _check_index(store, walk: LogWalk, live: LogWalk | None, rng, fail, label) -> None:
    kept = walk.records
    for record in rng.sample(kept, min(INDEX_SAMPLE_COUNT, len(kept))):
        seq = body_seq(record.body)
        found = [m.commitlog_offset for m in store.query(record.topic, f"k{seq}", max_count=4)]
        if found != [record.offset]:
            fail(f"{label}: query({record.topic}, k{seq}) gives {found}, the message is at {record.offset}")
            return
    if live is not None:
        cut = live.records[len(kept):]
        for record in rng.sample(cut, min(INDEX_SAMPLE_COUNT, len(cut))):
            seq = body_seq(record.body)
            found = store.query(record.topic, f"k{seq}", max_count=4)
            if found:
                fail(f"{label}: query for message {seq}, cut away by recovery, returns "
                     f"{[m.commitlog_offset for m in found]}")
                return


def _probe(store, by_queue, fail, label) -> None:
    key = max(by_queue, key=lambda k: by_queue[k][-1].offset) if by_queue else ("t", 0)
    result = store.put(Message(key[0], b"probe after recovery", queue_id=key[1]))
    expected = len(by_queue.get(key, []))
    if result.status is not PutStatus.PUT_OK or result.queue_offset != expected:
        fail(f"{label}: a put after recovery got {result.status.name} queue offset {result.queue_offset}, "
             f"expected {expected}")
        return
    if not store.wait_dispatched(10):
        fail(f"{label}: dispatch did not reach the probe")
        return
    got = store.get(key[0], key[1], expected).messages
    if [m.body for m in got] != [b"probe after recovery"]:
        fail(f"{label}: the probe put after recovery reads back as {got!r}")
