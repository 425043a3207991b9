"""Records the writer describes to the dispatch thread (CommitLog.written_records, batch_from_written): the
batches built from them must be exactly what parse_records decodes from the same records' bytes."""

from __future__ import annotations

import collections
import random

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import DESCRIBED_TAIL_BYTES_MAX, CommitLog
from mqstore.commitlog.dispatch import DispatchService, parse_records
from mqstore.commitlog.dispatch_batch import batch_from_written
from mqstore.commitlog.message import Message
from mqstore.commitlog.unique_key import UniqueKeyGenerator

BORN_HOST = bytes([10, 0, 0, 1]) + (4321).to_bytes(4, "big")
STORE_HOST = bytes([10, 0, 0, 2]) + (10911).to_bytes(4, "big")
NAMES = (b"TAGS", b"KEYS", b"UNIQ_KEY", b"a", b"XKEYS", b"KEYSX",  # the last ones end in / begin with KEYS
         fmt.PROPERTY_RECORD_CRC.encode())  # not a property: the record-CRC pair is no part of them


def _log(directory, segment_size: int, *, record_crc: bool, unique_keys: bool) -> CommitLog:
    log = CommitLog(str(directory), segment_size, writable=True, max_message_size_bytes=4096, max_queues_per_topic=4,
                    born_host_raw=BORN_HOST, store_host_raw=STORE_HOST, preallocate=False, record_crc=record_crc)
    log.unique_keys = UniqueKeyGenerator(BORN_HOST[:4]) if unique_keys else None
    return log


def _message(rng: random.Random, index: int, body_max: int = 300) -> Message:
    properties = rng.choice([{}, {}, {"a": "1"}, {"XKEYS": "x y", "a": "\u00e9t\u00e9"}, {"UNIQ_KEY": f"mine-{index}"},
                             {"KEYSX": "z", "b": ""}])
    return Message(rng.choice(["t", "orders", "a_b-c|d%e"]), rng.randbytes(rng.randrange(0, body_max)),
                   queue_id=rng.randrange(4), tags=rng.choice([None, None, "TagA", "\u00fcn\u00efc\u00f6de", "B"]),
                   keys=rng.choice([(), (), (f"k{index}",), (f"k{index}", "shared")]), properties=properties,
                   flag=rng.randrange(-5, 5), born_timestamp_ms=rng.choice([None, 1_700_000_000_000 + index]))


def _columns(batch) -> list[tuple]:
    return list(zip(batch.commitlog_offsets.tolist(), batch.sizes.tolist(), batch.topics, batch.queue_ids.tolist(),
                    batch.queue_offsets.tolist(), batch.tags_codes.tolist(), batch.store_timestamps_ms.tolist(),
                    batch.sys_flags.tolist()))


def _everything(batch) -> tuple:
    return _columns(batch), [batch.property_values(name) for name in NAMES]


@pytest.mark.parametrize("record_crc", [True, False])
@pytest.mark.parametrize("unique_keys", [True, False])
@pytest.mark.parametrize("count", [1, 10, 200])  # one record; the few-record property scan; the numpy scan
def test_a_batch_from_written_records_is_the_batch_parsed_from_their_bytes(tmp_path, record_crc, unique_keys, count):
    rng = random.Random(count * 4 + record_crc * 2 + unique_keys)
    log = _log(tmp_path, 1 << 20, record_crc=record_crc, unique_keys=unique_keys)
    log.written_records = collections.deque()
    start = log.readable_end()
    for index in range(count):
        log.append(log.prepare(_message(rng, index)))
    written = list(log.written_records)
    assert len(written) == count
    for preread in ((), (b"UNIQ_KEY", b"KEYS")):  # properties read in the decoding pass, or on demand
        described = batch_from_written(written, fmt.RECORD_CRC_LENGTH if record_crc else 0, preread)
        parsed = parse_records(log, start, log.readable_end(), properties=preread)
        assert parsed.error is None and len(parsed) == count
        assert _everything(described) == _everything(parsed)
        assert (described.start_offset, described.end_offset) == (parsed.start_offset, parsed.end_offset)
    values = _everything(described)[1]
    assert any(values[NAMES.index(b"KEYS")]) and any(values[NAMES.index(b"a")]) or count == 1
    log.close()


class _Recorder:
    """A dispatcher that keeps every column and property it was handed."""

    properties = (b"UNIQ_KEY", b"KEYS")

    def __init__(self):
        self.rows: list[tuple] = []
        self.values: list[tuple] = []

    def dispatch(self, batch) -> None:
        self.rows.extend(_columns(batch))
        self.values.extend(zip(*(batch.property_values(name) for name in NAMES)))


def test_dispatch_takes_described_records_and_parses_the_gaps_between_them(tmp_path):
    """Single appends are described; batches are not, a full deque drops its oldest entries, rolls leave blanks:
    whatever mix the dispatch loop reads, the dispatchers get every record once, in log order, as a parse of
    the whole log gives them."""
    rng = random.Random(7)
    log = _log(tmp_path, 64 * 1024, record_crc=True, unique_keys=True)
    log.written_records = collections.deque(maxlen=6)
    recorder = _Recorder()
    service = DispatchService(log, [recorder], log.readable_end(), tail_batch_records=4,
                              written=log.written_records)
    index = 0
    for round_ in range(60):
        for _ in range(rng.choice([0, 1, 3, 9])):  # 9 > maxlen: the oldest descriptions are dropped
            log.append(log.prepare(_message(rng, index, 3000)))
            index += 1
        if round_ % 5 == 2:
            records = []
            for _ in range(rng.randrange(1, 6)):
                records.append(log.prepare(_message(rng, index, 3000)))
                index += 1
            log.append_records(records)
        service.dispatch_available(rng.choice([1, 4, 100]))
    service.dispatch_available()
    assert service.dispatched_offset == log.readable_end()
    assert len(log.segments.segments) > 3  # rolls happened
    parsed = parse_records(log, log.min_offset(), log.readable_end())
    assert parsed.error is None and len(parsed) == index
    assert recorder.rows == _columns(parsed)
    assert recorder.values == list(zip(*(parsed.property_values(name) for name in NAMES)))
    assert 0 < service.written_records_dispatched < index  # both ways were taken
    log.close()


def test_dispatch_of_described_records_starts_where_the_log_was_dispatched_to(tmp_path):
    """Descriptions of records below the dispatched offset (dispatched already, from the log) are passed over."""
    log = _log(tmp_path, 1 << 20, record_crc=False, unique_keys=False)
    log.written_records = collections.deque()
    for index in range(5):
        log.append(log.prepare(Message("t", b"%d" % index)))
    recorder = _Recorder()
    last_two = [record[0] for record in log.written_records][3:]
    service = DispatchService(log, [recorder], last_two[0], written=log.written_records)
    assert service.dispatch_available() == 2
    assert [row[0] for row in recorder.rows] == last_two
    assert service.written_records_dispatched == 2 and not log.written_records
    log.close()


def test_a_service_that_checks_crcs_takes_no_descriptions(tmp_path):
    log = _log(tmp_path, 1 << 20, record_crc=True, unique_keys=False)
    with pytest.raises(AssertionError):
        DispatchService(log, [], 0, check_crc=True, written=collections.deque())
    log.close()


def test_a_record_whose_description_was_dropped_is_parsed_and_the_rest_taken_as_described(tmp_path):
    """Exactly the gap is parsed: the record before the first description left, nothing more."""
    log = _log(tmp_path, 1 << 20, record_crc=True, unique_keys=True)
    log.written_records = collections.deque()
    for index in range(5):
        log.append(log.prepare(Message("t", b"%d" % index, keys=(f"k{index}",))))
    log.written_records.popleft()  # as a full deque drops its oldest entry
    recorder = _Recorder()
    service = DispatchService(log, [recorder], log.min_offset(), written=log.written_records)
    assert service.dispatch_available() == 5
    assert service.written_records_dispatched == 4
    parsed = parse_records(log, log.min_offset(), log.readable_end())
    assert recorder.rows == _columns(parsed)
    assert [values[1] for values in recorder.values] == [f"k{i}".encode() for i in range(5)]
    log.close()


def test_a_record_with_long_properties_is_not_described_and_is_parsed(tmp_path):
    """The deque keeps what it holds alive: a record whose topic and properties are long is left to the parser."""
    log = _log(tmp_path, 1 << 20, record_crc=True, unique_keys=True)
    log.written_records = collections.deque()
    long_value = "v" * DESCRIBED_TAIL_BYTES_MAX
    for index in range(4):
        properties = {"big": long_value} if index == 2 else {}
        log.append(log.prepare(Message("t", b"%d" % index, keys=(f"k{index}",), properties=properties)))
    assert [record[3] for record in log.written_records] == [0, 1, 3]
    recorder = _Recorder()
    service = DispatchService(log, [recorder], log.min_offset(), written=log.written_records)
    assert service.dispatch_available() == 4 and service.written_records_dispatched == 3
    parsed = parse_records(log, log.min_offset(), log.readable_end())
    assert recorder.rows == _columns(parsed)
    assert recorder.values == list(zip(*(parsed.property_values(name) for name in NAMES)))
    assert parsed.property_values(b"big")[2] == long_value.encode()
    log.close()
