"""parse_records (the dispatch loop's decoder) and DispatchService, over segments written by hand."""

from __future__ import annotations

import pytest
from mqstore.commitlog import dispatch_batch
from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch import DispatchBatch, DispatchService, parse_records
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.message import Message
from mqstore.commitlog.segments import SegmentList

from tests.unit.commitlog import handmade
from tests.unit.commitlog.test_message import _three_record_segment

SEGMENT_SIZE = 4096


@pytest.fixture(autouse=True, params=["vector", "few"])
def decoder(request, monkeypatch):
    """Every test runs with each of parse_records' two decoders: numpy over the whole run of records, and
    record by record (what it uses for a few records)."""
    monkeypatch.setattr(dispatch_batch, "DECODE_FEW_RECORDS_MAX", 0 if request.param == "vector" else 1 << 30)
    return request.param


def _segments(directory) -> SegmentList:
    return SegmentList(str(directory), SEGMENT_SIZE, writable=False)


def _columns(batch: DispatchBatch) -> list[tuple]:
    return list(zip(batch.commitlog_offsets.tolist(), batch.sizes.tolist(), batch.topics, batch.queue_ids.tolist(),
                    batch.queue_offsets.tolist(), batch.tags_codes.tolist(), batch.store_timestamps_ms.tolist(),
                    batch.sys_flags.tolist()))


def test_records_across_segments_are_decoded_in_log_order(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    expected = []
    for index in range(40):
        topic, tags = ("alpha", "Tag4") if index % 3 else ("beta", None)
        properties = f"TAGS\x01{tags}\x02KEYS\x01k{index}\x02".encode() if tags else b""
        body = bytes([index]) * (index * 17)
        offset = writer.add(topic, body, queue_id=index % 2, queue_offset=index, properties=properties,
                            store_timestamp_ms=1000 + index, sys_flag=0x8 if index == 5 else 0)
        size = len(handmade.record(0, topic, body, properties=properties))
        expected.append((offset, size, topic, index % 2, index, 2598906 if tags else 0, 1000 + index,
                         0x8 if index == 5 else 0))
    writer.write()
    assert len(writer.segments) > 3
    batch = parse_records(_segments(tmp_path), 0, writer.end)
    assert batch.error is None
    assert _columns(batch) == expected
    assert batch.end_offset == writer.end and batch.start_offset == 0
    assert batch.keys == [f"k{i}".encode() if i % 3 else None for i in range(40)]
    assert batch.uniq_keys == [None] * 40


def test_records_max_cuts_a_batch_at_a_record_boundary(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    for index in range(30):
        writer.add("t", b"x" * 300, queue_offset=index)
    writer.write()
    segments = _segments(tmp_path)
    offset, seen = 0, []
    while offset < writer.end:
        batch = parse_records(segments, offset, writer.end, records_max=7)
        assert batch.error is None and 1 <= len(batch) <= 7
        seen += batch.commitlog_offsets.tolist()
        offset = batch.end_offset
    assert seen == writer.offsets and offset == writer.end


def test_a_blank_ending_the_range_moves_the_end_to_the_next_segment(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    while writer.end < SEGMENT_SIZE - 600:
        writer.add("t", b"y" * 500)
    last_in_first = writer.end
    writer.add("t", b"z" * 500)  # rolls: a blank ends segment 0
    writer.write()
    batch = parse_records(_segments(tmp_path), 0, SEGMENT_SIZE)
    assert batch.error is None and batch.end_offset == SEGMENT_SIZE
    assert batch.commitlog_offsets.tolist()[-1] < last_in_first


def test_zero_bytes_end_the_log_only_when_asked(tmp_path):
    writer, offsets, end = _three_record_segment(tmp_path)
    segments = _segments(tmp_path / "commitlog")
    found = parse_records(segments, 0, SEGMENT_SIZE, zeros_end=True)
    assert found.error is None and found.end_offset == end and len(found) == 3
    inside = parse_records(segments, 0, SEGMENT_SIZE)
    assert len(inside) == 3 and isinstance(inside.error, CorruptionError)
    assert inside.error.offset == end and inside.error.path == writer.path(0)


def test_v2_records_and_ipv6_hosts_are_dispatched(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    rows = [
        dict(topic="plain", v2=False, born_host="1.2.3.4", store_host="10.0.0.7"),
        dict(topic="v2topic", v2=True, born_host="1.2.3.4", store_host="10.0.0.7"),
        dict(topic="born6", v2=False, born_host="::1", store_host="10.0.0.7"),
        dict(topic="store6", v2=False, born_host="1.2.3.4", store_host="fe80::2"),
        dict(topic="both6v2", v2=True, born_host="2001:db8::1", store_host="fe80::2"),
        dict(topic="plain", v2=False, born_host="1.2.3.4", store_host="10.0.0.7"),
    ]
    for index, row in enumerate(rows):
        writer.add(row["topic"], b"body%d" % index, queue_id=index, queue_offset=10 + index,
                   store_timestamp_ms=5000 + index, v2=row["v2"], born_host=row["born_host"],
                   store_host=row["store_host"],
                   properties=f"TAGS\x01Tag4\x02KEYS\x01key{index}\x02UNIQ_KEY\x01U{index}\x02".encode())
    writer.write()
    batch = parse_records(_segments(tmp_path), 0, writer.end)
    assert batch.error is None and batch.end_offset == writer.end
    assert batch.topics == [row["topic"] for row in rows]
    assert batch.commitlog_offsets.tolist() == writer.offsets
    assert batch.queue_ids.tolist() == list(range(6)) and batch.queue_offsets.tolist() == list(range(10, 16))
    assert batch.store_timestamps_ms.tolist() == list(range(5000, 5006))
    assert batch.tags_codes.tolist() == [2598906] * 6
    assert batch.keys == [b"key%d" % i for i in range(6)] and batch.uniq_keys == [b"U%d" % i for i in range(6)]
    assert batch.sys_flags.tolist() == [0, 0, 0x10, 0x20, 0x30, 0]


def test_a_v2_topic_over_255_bytes_keeps_its_full_name_in_a_batch(tmp_path):
    topic = "L" * 300
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    writer.add("short", b"a")
    writer.add(topic, b"b", v2=True)
    writer.write()
    batch = parse_records(_segments(tmp_path), 0, writer.end)
    assert batch.error is None
    assert batch.topics == ["short", topic]


def _corrupted(tmp_path, at: int, bit: int):
    writer, offsets, end = _three_record_segment(tmp_path)
    handmade.flip_bit(writer.path(0), offsets[1] + at + 3 - bit // 8, bit % 8)
    return writer, offsets, end


SIZE_BITS_WITHIN_OR_PAST_THE_SEGMENT = list(range(8)) + list(range(16, 32))
FIELD_BITS = ([("magic", handmade.AT_MAGIC, bit) for bit in range(32)]
              + [("size", handmade.AT_TOTAL_SIZE, bit) for bit in SIZE_BITS_WITHIN_OR_PAST_THE_SEGMENT]
              + [("body length", handmade.AT_BODY_LENGTH_V4, bit) for bit in range(32)])


@pytest.mark.parametrize("field, at, bit", FIELD_BITS, ids=[f"{f}-bit{b}" for f, _, b in FIELD_BITS])
def test_a_flipped_bit_stops_the_batch_with_a_corruption_error(tmp_path, field, at, bit):
    writer, offsets, end = _corrupted(tmp_path, at, bit)
    batch = parse_records(_segments(tmp_path / "commitlog"), 0, end)
    assert batch.commitlog_offsets.tolist() == offsets[:1]  # nothing at or past the bad record
    assert isinstance(batch.error, CorruptionError)
    assert batch.error.path == writer.path(0) and batch.error.offset == offsets[1]
    assert batch.end_offset == offsets[1]


@pytest.mark.parametrize("which", [1, 2])
def test_a_record_whose_size_runs_past_the_written_end_is_corruption(tmp_path, which):
    """Below the written end every record is complete, so one that claims to run past it is corrupt."""
    writer, offsets, end = _three_record_segment(tmp_path)
    handmade.flip_bit(writer.path(0), offsets[which] + 2, 1)  # TOTALSIZE += 512: still inside the segment
    batch = parse_records(_segments(tmp_path / "commitlog"), 0, end)
    assert batch.commitlog_offsets.tolist() == offsets[:which]
    assert isinstance(batch.error, CorruptionError)
    assert batch.error.offset == offsets[which]


def test_a_bad_body_crc_is_reported_only_when_checked(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    writer.add("t", b"good")
    writer.add("t", b"bad", body_crc=1)
    writer.add("t", b"after")
    writer.write()
    segments = _segments(tmp_path)
    assert parse_records(segments, 0, writer.end).error is None
    checked = parse_records(segments, 0, writer.end, check_crc=True)
    assert checked.commitlog_offsets.tolist() == writer.offsets[:1]
    assert checked.error.rule == "commitlog.5" and checked.error.offset == writer.offsets[1]


def test_a_blank_of_the_wrong_size_is_corruption(tmp_path):
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    writer.add("t", b"one")
    writer.write()
    with open(writer.path(0), "r+b") as handle:
        handle.seek(writer.end)
        handle.write(handmade.blank(16)[:8])  # a blank, but not reaching the segment's end
    batch = parse_records(_segments(tmp_path), 0, SEGMENT_SIZE)
    assert len(batch) == 1 and batch.error.rule == "commitlog.blank" and batch.error.offset == writer.end


def test_from_rows_builds_columns():
    batch = DispatchBatch.from_rows([
        {"commitlog_offset": 100, "size": 10, "topic": "a", "queue_id": 1, "queue_offset": 5, "keys": b"k"},
        {"commitlog_offset": 110, "size": 20, "topic": "b", "queue_id": 0, "queue_offset": 0, "tags_code": 7},
    ])
    assert (batch.start_offset, batch.end_offset, len(batch)) == (100, 130, 2)
    assert batch.topics == ["a", "b"] and batch.keys == [b"k", None]
    assert batch.tags_codes.tolist() == [0, 7]


# --- DispatchService over a live CommitLog ------------------------------------------------------------------
class Recorder:
    def __init__(self):
        self.offsets: list[int] = []
        self.batches = 0

    def dispatch(self, batch):
        self.batches += 1
        self.offsets += batch.commitlog_offsets.tolist()


class Sizes(Recorder):
    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def dispatch(self, batch):
        super().dispatch(batch)
        self.sizes.append(len(batch))


class Failing:
    def dispatch(self, batch):
        raise RuntimeError("dispatcher failed")


def _log(tmp_path) -> CommitLog:
    return CommitLog(str(tmp_path / "log"), 65536, writable=True, max_message_size_bytes=1024,
                     max_queues_per_topic=4, born_host_raw=fmt.encode_host("1.2.3.4", 0),
                     store_host_raw=fmt.encode_host("10.0.0.7", 10911), preallocate=False)


def test_service_dispatches_everything_appended_while_it_runs(tmp_path):
    log = _log(tmp_path)
    recorder = Recorder()
    service = DispatchService(log, [recorder], 0)
    service.start()
    try:
        offsets = []
        for index in range(500):
            offsets.append(log.append(log.prepare(Message("t", b"m" * (index % 300))))[0])
            service.wake()
        assert service.wait_dispatched(30)
        assert recorder.offsets == offsets
        assert service.dispatched_offset == log.readable_end() and service.dispatched_records == 500
        assert len(log.segments.segments) > 1
    finally:
        service.stop()
        log.close()


def test_a_failing_dispatcher_stops_the_service_and_is_reported(tmp_path):
    log = _log(tmp_path)
    log.append(log.prepare(Message("t", b"x")))
    service = DispatchService(log, [Failing()], 0)
    service.start()
    try:
        assert service.wait_dispatched(30) is False
        assert isinstance(service.error, RuntimeError)
    finally:
        service.stop()
        log.close()


def test_dispatch_available_runs_in_the_calling_thread_and_resumes(tmp_path):
    log = _log(tmp_path)
    first = [log.append(log.prepare(Message("t", b"a")))[0] for _ in range(3)]
    recorder = Recorder()
    service = DispatchService(log, [recorder], 0)
    assert service.dispatch_available() == 3 and recorder.offsets == first
    second = [log.append(log.prepare(Message("t", b"b")))[0] for _ in range(2)]
    resumed = Recorder()
    assert DispatchService(log, [resumed], service.dispatched_offset).dispatch_available() == 2
    assert resumed.offsets == second
    log.close()


def test_header_dtype_agrees_with_the_format_offsets():
    from mqstore.commitlog.dispatch import HEADER_DTYPE

    assert HEADER_DTYPE.itemsize == 88
    assert all(HEADER_DTYPE.fields[name][0].byteorder in (">", "|") for name in HEADER_DTYPE.names)
    assert HEADER_DTYPE.fields["physical_offset"][1] == fmt.OFFSET_PHYSICAL_OFFSET
    assert HEADER_DTYPE.fields["sys_flag"][1] == fmt.OFFSET_SYS_FLAG


def test_corruption_in_a_later_segment_is_reported_at_its_position_in_that_file(tmp_path):
    """CorruptionError: with a path, `offset` is the byte position inside that file (commitlog/errors.py)."""
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    while writer.end < SEGMENT_SIZE + 500:
        writer.add("t", b"w" * 300)
    writer.write()
    corrupt = writer.offsets[-1]
    handmade.flip_bit(writer.path(SEGMENT_SIZE), corrupt - SEGMENT_SIZE + handmade.AT_MAGIC, 0)
    batch = parse_records(_segments(tmp_path), 0, writer.end)
    assert batch.commitlog_offsets.tolist() == writer.offsets[:-1] and batch.end_offset == corrupt
    assert batch.error.path == writer.path(SEGMENT_SIZE)
    assert batch.error.offset == corrupt - SEGMENT_SIZE


def test_a_topic_that_is_not_ascii_ends_the_batch_before_its_record(tmp_path):
    """Such a record is corrupt (format rule 3): the records before it are dispatched, it and the ones after it are
    not, and none of them is listed under another record's topic."""
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    writer.add("a", b"one", queue_offset=0)
    writer.add("zz", b"two", queue_offset=1)
    writer.add("a", b"three", queue_offset=2)
    writer.write()
    with open(writer.path(0), "r+b") as handle:
        data = bytearray(handle.read())
        at = data.index(b"zz")
        data[at : at + 2] = "é".encode()
        handle.seek(0)
        handle.write(data)
    batch = parse_records(_segments(tmp_path), 0, writer.end)
    assert batch.commitlog_offsets.tolist() == writer.offsets[:1] and batch.topics == ["a"]
    assert batch.end_offset == writer.offsets[1]
    assert batch.error.rule == "commitlog.3" and "not ASCII" in str(batch.error)
    assert batch.error.path == writer.path(0) and batch.error.offset == writer.offsets[1]


def test_the_tailing_thread_hands_over_batches_of_at_most_its_tail_size(tmp_path):
    log = _log(tmp_path)
    offsets = [log.append(log.prepare(Message("t", b"x" * 10)))[0] for _ in range(50)]
    sizes = Sizes()
    service = DispatchService(log, [sizes], 0, tail_batch_records=4)
    service.start()
    try:
        assert service.wait_dispatched(30)
        assert sizes.offsets == offsets and max(sizes.sizes) == 4 and len(sizes.sizes) >= 13
    finally:
        service.stop()
        log.close()


def test_the_properties_dispatchers_name_are_read_in_the_decoding_pass(tmp_path):
    log = _log(tmp_path)
    expected = []
    for index in range(30):
        keys = (f"k{index}", "shared") if index % 2 else ()
        log.append(log.prepare(Message("t", b"x" * index, tags="TagA" if index % 3 else None, keys=keys)))
        expected.append(f"k{index} shared".encode() if keys else None)

    class KeysReader:
        properties = (b"KEYS",)

        def __init__(self):
            self.cached, self.keys = [], []

        def dispatch(self, batch):
            self.cached.append(b"KEYS" in batch._cache)  # read before anyone asked
            self.keys.extend(batch.keys)

    reader, plain = KeysReader(), Recorder()
    service = DispatchService(log, [plain, reader], 0)
    assert service.dispatch_available(records_max=7) == 30
    assert reader.keys == expected and all(reader.cached) and len(reader.cached) == 5
    assert DispatchService(log, [plain], 0)._properties == ()  # nobody asked: KEYS stays on demand
    log.close()
