"""CommitLog: prepare checks and writes nothing, append places records and rolls segments, read and find_end."""

from __future__ import annotations

import struct

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog, validate_topic
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError, StoreClosedError
from mqstore.commitlog.message import Message

from tests.unit.commitlog import handmade

SEGMENT_SIZE = 65536
STORE_HOST = fmt.encode_host("10.0.0.7", 10911)
BORN_HOST = fmt.encode_host("192.168.1.2", 0)


def _log(directory, *, writable: bool = True) -> CommitLog:
    return CommitLog(str(directory), SEGMENT_SIZE, writable=writable, max_message_size_bytes=2048,
                     max_queues_per_topic=4, born_host_raw=BORN_HOST, store_host_raw=STORE_HOST, preallocate=False)


def _append(log: CommitLog, body: bytes = b"", topic: str = "t", **fields):
    return log.append(log.prepare(Message(topic, body, **fields)))


def _raw(log: CommitLog, start: int, length: int) -> bytes:
    segment = log.segments.segment_at(start)
    pos = start - segment.base_offset
    return bytes(segment.view[pos : pos + length])


def test_append_writes_the_record_rocketmq_writes(tmp_path):
    log = _log(tmp_path)
    offset, queue_offset, store_ts = _append(log, b"hello", queue_id=2, tags="Tag4", flag=9,
                                             born_timestamp_ms=1_700_000_000_000)
    expected = handmade.record(0, "t", b"hello", queue_id=2, flag=9, properties=b"TAGS\x01Tag4\x02",
                               born_host="192.168.1.2", born_port=0, store_timestamp_ms=store_ts)
    assert (offset, queue_offset) == (0, 0)
    assert _raw(log, 0, len(expected) + 8) == expected + bytes(8)
    assert log.readable_end() == len(expected)
    log.close()


def test_queue_offsets_are_dense_per_topic_and_queue(tmp_path):
    log = _log(tmp_path)
    got = [_append(log, topic=topic, queue_id=queue_id)[1]
           for topic, queue_id in [("a", 0), ("a", 1), ("a", 0), ("b", 0), ("a", 0), ("a", 1)]]
    assert got == [0, 0, 1, 0, 2, 1]
    assert log.queue_offsets == {("a", 0): 3, ("a", 1): 2, ("b", 0): 1}
    placed, _, _ = log.append_records([log.prepare(Message("a", b"", queue_id=1)), log.prepare(Message("b", b""))])
    assert [queue_offset for _, queue_offset in placed] == [2, 1]
    log.close()


def test_prepare_writes_nothing_and_refuses_bad_messages(tmp_path):
    log = _log(tmp_path)
    for bad in [Message("", b""), Message("t", "text"), Message("t", b"", queue_id=4),
                Message("t", b"x" * 2049), Message("t", b"", flag=2**31), Message("t", b"", born_timestamp_ms=-1),
                Message("t", b"", tags=""), Message("t", b"", keys=("has space",)),
                Message("t", b"", properties={"TAGS": "x"}), "not a message"]:
        with pytest.raises(InvalidMessageError):
            log.prepare(bad)
    assert log.readable_end() == 0 and log.segments.segments == [] and log.queue_offsets == {}
    assert log.prepare(Message("t", b"x" * 2048))[6] == 91 + 1 + 2048
    log.close()


@pytest.mark.parametrize("topic", ["a", "A-z_0%9|", "x" * 127])
def test_validate_topic_accepts_rocketmq_names(topic):
    assert validate_topic(topic) == topic.encode()


@pytest.mark.parametrize("topic", ["", "x" * 128, "../x", "a/b", "é", "a b", "a.b", "a\n", None, 5, b"t"])
def test_validate_topic_refuses_other_names(topic):
    with pytest.raises(InvalidMessageError):
        validate_topic(topic)


def _fill_to(log: CommitLog, left_low: int, left_high: int) -> int:
    """Append records until between left_low and left_high bytes are left in the current segment."""
    while True:
        left = SEGMENT_SIZE - log.readable_end() % SEGMENT_SIZE
        if left <= left_high:
            assert left >= left_low
            return left
        _append(log, b"f" * min(1500, left - left_low - 92))


def test_a_record_that_leaves_exactly_eight_bytes_fits_and_the_next_one_rolls(tmp_path):
    log = _log(tmp_path)
    left = _fill_to(log, 200, 1000)
    start = log.readable_end()
    offset, _, _ = _append(log, b"e" * (left - 8 - 92))  # record size = left - 8
    assert offset == start and log.readable_end() == SEGMENT_SIZE - 8
    next_offset, _, _ = _append(log, b"n")
    assert next_offset == SEGMENT_SIZE
    assert struct.unpack(">iI", _raw(log, SEGMENT_SIZE - 8, 8)) == (8, handmade.MAGIC_BLANK)
    log.close()


def test_a_record_that_would_leave_seven_bytes_goes_to_the_next_segment_behind_a_blank(tmp_path):
    log = _log(tmp_path)
    left = _fill_to(log, 200, 1000)
    start = log.readable_end()
    offset, _, _ = _append(log, b"s" * (left - 7 - 92))
    assert offset == SEGMENT_SIZE
    assert _raw(log, start, left) == handmade.blank(left)
    assert log.read(offset).body == b"s" * (left - 7 - 92)
    log.close()


def test_batches_roll_too_and_records_never_straddle_segments(tmp_path):
    log = _log(tmp_path)
    records = [log.prepare(Message("t", bytes([i % 256]) * (i * 7 % 2000))) for i in range(200)]
    placed, _, _ = log.append_records(records)
    assert len(log.segments.segments) > 2
    for (offset, _), record in zip(placed, records):
        assert offset // SEGMENT_SIZE == (offset + record[6] - 1) // SEGMENT_SIZE
    for index, (offset, _queue_offset) in enumerate(placed):
        message = log.read(offset)
        assert (message.body, message.queue_offset) == (bytes([index % 256]) * (index * 7 % 2000), index)
    log.close()


def test_read_outside_the_log_or_not_at_a_record_is_refused(tmp_path):
    log = _log(tmp_path)
    offset, _, _ = _append(log, b"abc")
    with pytest.raises(InvalidMessageError):
        log.read(log.readable_end())
    with pytest.raises(InvalidMessageError):
        log.read(-1)
    with pytest.raises(CorruptionError) as raised:
        log.read(offset + 4)
    assert raised.value.rule == "commitlog.1" and raised.value.offset == offset + 4
    log.close()


def test_find_end_after_reopen_walks_to_the_written_end(tmp_path):
    log = _log(tmp_path)
    for index in range(300):
        _append(log, b"r" * (index * 13 % 1500))
    end, segments = log.readable_end(), len(log.segments.segments)
    log.close()
    reopened = _log(tmp_path)
    assert reopened.find_end() == end and len(reopened.segments.segments) == segments == end // SEGMENT_SIZE + 1
    reopened.set_end(end)
    offset, _, _ = _append(reopened, b"after")
    assert offset == end and reopened.read(offset).body == b"after"
    reopened.close()


def test_find_end_of_an_empty_log_is_zero(tmp_path):
    log = _log(tmp_path)
    assert log.find_end() == 0
    log.close()


def test_find_end_reports_corruption_below_the_end(tmp_path):
    log = _log(tmp_path)
    offsets = [_append(log, b"c" * 100)[0] for _ in range(5)]
    path = log.segments.segment_at(0).path
    log.close()
    handmade.flip_bit(path, offsets[2] + handmade.AT_MAGIC, 0)
    with pytest.raises(CorruptionError) as raised:
        _log(tmp_path).find_end()
    assert raised.value.offset == offsets[2] and raised.value.path == path


def test_a_closed_log_refuses_appends(tmp_path):
    log = _log(tmp_path)
    offset, _, _ = _append(log, b"x")
    log.close()
    assert log.closed
    with pytest.raises(StoreClosedError):
        _append(log, b"y")
    with pytest.raises(StoreClosedError):
        log.append_records([log.prepare(Message("t", b"z"))])
    assert log.readable_end() == offset + 93


def test_a_closed_log_refuses_reads_as_closed(tmp_path):
    log = _log(tmp_path)
    offset, _, _ = _append(log, b"x")
    log.close()
    with pytest.raises(StoreClosedError):
        log.read(offset)


def test_a_read_only_log_refuses_appends(tmp_path):
    _log(tmp_path).close()
    (tmp_path / "00000000000000000000").write_bytes(bytes(SEGMENT_SIZE))
    reader = _log(tmp_path, writable=False)
    with pytest.raises(StoreClosedError):
        _append(reader, b"x")
    reader.close()


def test_a_roll_advises_the_segment_left_for_reading_itself_or_through_the_retirer(tmp_path):
    """The log advises the segment it appends to for random access (MappedFile.advise_appending) and, at a
    roll, the segment it leaves for reading again: through `segment_retirer` when one is set, else itself."""
    log = _log(tmp_path / "own")
    log.advise_random_appends = True
    _append(log, b"a")
    first = log.segments.segment_at(0)
    assert first.appending
    _fill_to(log, 200, 1000)
    _append(log, b"b" * 1000)
    assert log.readable_end() > SEGMENT_SIZE
    assert not first.appending and log.segments.segment_at(SEGMENT_SIZE).appending
    log.close()

    retired = []
    log = _log(tmp_path / "retirer")
    log.advise_random_appends = True
    log.segment_retirer = retired.append
    _append(log, b"a")
    first = log.segments.segment_at(0)
    _fill_to(log, 200, 1000)
    _append(log, b"b" * 1000)
    assert retired == [first] and first.appending  # the retirer's to do
    log.close()

    log = _log(tmp_path / "default")  # not asked: nothing advised, nothing retired
    log.segment_retirer = retired.append
    _fill_to(log, 200, 1000)
    _append(log, b"b" * 1000)
    assert retired == [first] and not any(segment.appending for segment in log.segments.segments)
    log.close()
