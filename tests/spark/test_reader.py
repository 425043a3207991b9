"""The source's planning and decoding without Spark: rare record kinds, splits, written ends, damaged stores."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from mqstore.commitlog import arrow_decode
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.message import decode_message
from mqstore.consumequeue import format as cqfmt
from mqstore.consumequeue.mark import mark_path, read_mark

from mqstore import Message, MessageStore, StoreConfig
from mqstore.spark import source
from mqstore.store import scan_options as spark_options
from mqstore.store import scan_plan as spark_plan
from mqstore.store import scan_read as spark_scan
from tests.spark.storegen import StoreWriter, encode_record

SEGMENT = 64 * 1024


def read_rows(root, **options) -> list[dict]:
    """Every row a batch read of `root` gives, through the reader Spark would use (pushdown reader)."""
    parsed = spark_options.parse_options({"path": str(root), **options})
    reader = source.CommitLogBatchReader(parsed, spark_options.commitlog_schema(parsed.with_store_column))
    return [row for partition in reader.partitions() for batch in reader.read(partition)
            for row in batch.to_pylist()]


def stored(root, offset: int):
    """decode_message of the record at `offset` (the reference decoder)."""
    base = offset - offset % SEGMENT
    data = (root / "commitlog" / fmt.segment_name(base)).read_bytes()
    return decode_message(memoryview(data), offset - base, base + SEGMENT - offset, offset, check_crc=True)


def assert_row_is(row: dict, message) -> None:
    assert row["topic"] == message.topic
    assert (row["queue_id"], row["queue_offset"]) == (message.queue_id, message.queue_offset)
    assert row["commitlog_offset"] == message.commitlog_offset
    assert row["body"] == message.body and row["body_crc"] == message.body_crc
    assert row["properties"] == list(message.properties.items())
    assert row["tags"] == message.tags and row["keys"] == list(message.keys)
    assert (row["flag"], row["sys_flag"], row["reconsume_times"]) == (message.flag, message.sys_flag,
                                                                      message.reconsume_times)
    assert int(row["born_timestamp"].timestamp() * 1000) == message.born_timestamp_ms
    assert round(row["store_timestamp"].timestamp() * 1000) == message.store_timestamp_ms
    assert (row["born_host"], row["store_host"], row["msg_id"]) == (message.born_host, message.store_host,
                                                                    message.msg_id)


def test_rare_records_decode_like_decode_message(tmp_path):
    root = tmp_path / "store"
    offsets = []
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        offsets.append(writer.put("plain", b"hello", tags="TagA", keys=("k1", "k2"), properties={"p": "v"}))
        offsets.append(writer.put("v2-topic", b"version two", version=2, tags="TagB"))
        offsets.append(writer.put("six", b"ipv6 born", born_host=("2001:db8::1", 7), keys=("x",)))
        offsets.append(writer.put("six", b"ipv6 store", store_host=("::1", 10911)))
        offsets.append(writer.put("empty", b""))
        offsets.append(writer.put("odd", b"\x01\x02", properties={"bad": "a\x01b", "ok": "1"}))
        offsets.append(writer.put("keys", b"k", keys=("", "a", "", "b"), properties={"": "empty name", "e": ""}))
        offsets.append(writer.put("utf8", "é".encode(), properties={"user.prop": "vérité ✓", "TAGS": "Ünïcode"}))
        offsets.append(writer.put("big", os.urandom(40_000), tags="Big"))
        for i in range(300):
            offsets.append(writer.put(f"t{i % 3}", bytes([i % 256]) * (i % 97), queue_id=i % 4, tags=f"T{i % 5}",
                                      keys=(f"key-{i}",) * (i % 3), flag=i % 3, reconsume_times=i % 2))
    rows = read_rows(root)
    assert [r["commitlog_offset"] for r in rows] == offsets
    for row, offset in zip(rows, offsets):
        assert_row_is(row, stored(root, offset))


def test_a_body_holding_a_record_header_does_not_fool_the_reader(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        first = writer.put("a", b"x" * 10)
        # The next record's body starts at its offset + 88 + 0; plant a complete fake record there, with the
        # PHYSICALOFFSET its position would have.
        at = writer.end_offset + fmt.OFFSET_BODY
        fake = encode_record(commitlog_offset=at, topic="fake", body=b"f" * 30, queue_id=0, queue_offset=0,
                             properties={}, born_timestamp_ms=1, store_timestamp_ms=1)
        second = writer.put("a", fake + b"tail")
        third = writer.put("a", b"after")
    walks = []
    walk = arrow_decode._walk_python
    monkeypatch.setattr(arrow_decode, "_walk_python", lambda *a, **k: walks.append(a[2]) or walk(*a, **k))
    rows = read_rows(root)
    assert [r["commitlog_offset"] for r in rows] == [first, second, third]
    assert rows[1]["body"] == fake + b"tail"
    if arrow_decode.NATIVE is None:  # the compiled walk (mq_walk_chain) follows the chain record by record anyway
        assert walks  # the chain check saw the planted header and handed over to the record-by-record walk


def test_a_large_segment_is_split_at_record_starts(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=4 * 1024 * 1024, queue_entries_per_file=1000) as writer:
        writer.put_bulk("bulk", 20_000, 100, queue_count=3)
        writer.put_bulk("other", 2_000, 10, queue_count=2, seed=1)
    monkeypatch.setattr(spark_plan, "PARTITION_BYTES_MAX", 512 * 1024)
    parsed = spark_options.parse_options({"path": str(root)})
    partitions = spark_plan.plan_batch(parsed.stores, parsed.row_filter)
    pieces = [piece for partition in partitions for piece in partition.pieces]
    assert len([p for p in pieces if p.base == 0]) > 2  # the first segment was split
    rows = read_rows(root)
    offsets = [r["commitlog_offset"] for r in rows]
    assert len(offsets) == 22_000 == len(set(offsets))
    assert offsets == sorted(offsets)


def test_a_split_that_is_not_a_record_start_is_refused(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        offsets = [writer.put("a", b"y" * 50) for _ in range(20)]
    schema = spark_options.arrow_schema(spark_options.commitlog_schema())
    decoder = arrow_decode.Decoder(schema, spark_options.RowFilter(), None)
    piece = spark_scan.Piece(0, 0, offsets[5] + 7)
    with pytest.raises(CorruptionError, match="runs past the end"):
        list(spark_scan._read_piece(decoder, str(root / "commitlog"), SEGMENT, piece))


def test_written_end_ignores_preallocated_segments_and_unfinished_records(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for _ in range(30):
            writer.put("a", b"z" * 100)
        end = writer.end_offset
        record = encode_record(commitlog_offset=end, topic="a", body=b"q" * 500, queue_id=0, queue_offset=30,
                               properties={}, born_timestamp_ms=1, store_timestamp_ms=2)
    with open(root / "commitlog" / fmt.segment_name(SEGMENT), "wb") as handle:  # preallocated, still zeros
        handle.truncate(SEGMENT)
    plan = spark_plan.plan_store(spark_options.StoreRef(str(root), None))
    assert plan.end == end
    # a record whose header is written but not all of its body yet
    with open(root / "commitlog" / fmt.segment_name(0), "r+b") as handle:
        handle.seek(end)
        handle.write(record[:300])
    assert spark_plan.plan_store(spark_options.StoreRef(str(root), None)).end == end
    assert len(read_rows(root)) == 30
    # every field in place but part of the body not visible yet: only the body CRC tells
    with open(root / "commitlog" / fmt.segment_name(0), "r+b") as handle:
        handle.seek(end)
        handle.write(record[:fmt.OFFSET_BODY + 100] + bytes(200) + record[fmt.OFFSET_BODY + 300:])
    assert spark_plan.plan_store(spark_options.StoreRef(str(root), None)).end == end
    with open(root / "commitlog" / fmt.segment_name(0), "r+b") as handle:
        handle.seek(end)
        handle.write(record)
    assert spark_plan.plan_store(spark_options.StoreRef(str(root), None)).end == end + len(record)
    assert len(read_rows(root)) == 31


def test_topic_filter_finds_records_past_the_dispatched_end(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for i in range(200):
            writer.put(f"t{i % 2}", b"d" * 150, queue_id=i % 3)
    with StoreWriter(root, segment_size_bytes=SEGMENT, dispatch=False) as writer:  # dispatch lags behind
        for i in range(200, 260):
            writer.put(f"t{i % 2}", b"d" * 150, queue_id=i % 3)
    plan = spark_plan.plan_store(spark_options.StoreRef(str(root), None))
    assert plan.dispatched_end < plan.end
    every = read_rows(root)
    for options in ({"topic": "t1"}, {"topic": "t0", "queue_id": "2"}, {"topic": "t0,t1", "start_offset": "20000"}):
        rows = read_rows(root, **options)
        topics = set(options["topic"].split(","))
        expected = [r["commitlog_offset"] for r in every if r["topic"] in topics
                    and ("queue_id" not in options or r["queue_id"] == int(options["queue_id"]))
                    and r["commitlog_offset"] >= int(options.get("start_offset", 0))]
        assert sorted(r["commitlog_offset"] for r in rows) == expected
        parsed = spark_options.parse_options({"path": str(root), **options})
        kinds = {type(p).__name__ for p in spark_plan.plan_batch(parsed.stores, parsed.row_filter)}
        assert kinds == {"QueuePartition", "LogPartition"}


def _zero_units_from(queue_dir, commitlog_offset: int) -> int:
    """Zero a queue's units that point at or past `commitlog_offset` (what a dispatcher has not written yet)."""
    zeroed = 0
    for path in sorted(queue_dir.iterdir()):
        units = np.fromfile(path, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        late = np.flatnonzero((units["size"] > 0) & (units["commitlog_offset"] >= commitlog_offset))
        if len(late):
            with open(path, "r+b") as handle:
                handle.seek(int(late[0]) * cqfmt.UNIT_SIZE_BYTES)
                handle.write(bytes((len(units) - int(late[0])) * cqfmt.UNIT_SIZE_BYTES))
            zeroed += len(late)
    return zeroed


def test_a_topic_read_while_dispatch_is_between_queues_misses_nothing(tmp_path):
    # The dispatcher writes a batch queue by queue: t0's queues already point past records that t1's do not
    # list yet. The queues' furthest unit is then no "dispatched up to here"; the writer's mark is.
    root = tmp_path / "store"
    config = StoreConfig(segment_size_bytes=SEGMENT, max_message_size_bytes=4096, consume_queue_entries_per_file=64)
    with MessageStore.open(str(root), config) as store:
        for i in range(150):
            store.put(Message(f"t{i % 2}", f"{i}".encode() * 20, queue_id=i % 3))
        assert store.wait_dispatched(10)
        batch_start = store.dispatched_offset
        for i in range(150, 230):
            store.put(Message(f"t{i % 2}", f"{i}".encode() * 20, queue_id=i % 3))
        assert store.wait_dispatched(10)
        mark = Path(mark_path(str(root)))
        assert read_mark(str(mark)) == store.dispatched_offset  # published after each batch
        every = read_rows(root)
        assert len(every) == 230
        # The dispatcher is in the middle of the batch [batch_start, end): t0 is written, t1 is not.
        for queue_dir in (root / "consumequeue" / "t1").iterdir():
            _zero_units_from(queue_dir, batch_start)
        mark.write_bytes(batch_start.to_bytes(8, "big"))
        plan = spark_plan.plan_store(spark_options.StoreRef(str(root), None))
        assert plan.dispatched_end == batch_start
        for topic in ("t1", "t0", "t0,t1"):
            wanted = [r["commitlog_offset"] for r in every if r["topic"] in topic.split(",")]
            assert sorted(r["commitlog_offset"] for r in read_rows(root, topic=topic)) == wanted
        # A mark that is no record start (left by another run, the log rewritten since) is not trusted: the
        # topic read walks the whole log instead.
        mark.write_bytes((batch_start + 3).to_bytes(8, "big"))
        assert spark_plan.plan_store(spark_options.StoreRef(str(root), None)).dispatched_end is None
        wanted = [r["commitlog_offset"] for r in every if r["topic"] == "t1"]
        assert sorted(r["commitlog_offset"] for r in read_rows(root, topic="t1")) == wanted
        mark.write_bytes(store.dispatched_offset.to_bytes(8, "big"))
    assert read_mark(str(mark)) is None  # a clean close removes it: the queues are complete


def test_the_dispatched_mark_is_trusted_only_at_a_record_start(tmp_path):
    root = tmp_path / "store"
    starts = []
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for i in range(120):  # 1 200-byte bodies: the first segment ends with a blank
            starts.append(writer.put(f"t{i % 2}", b"b" * 1200, queue_id=i % 2))
    second = next(offset for offset in starts if offset >= SEGMENT)
    last_in_first = max(offset for offset in starts if offset < SEGMENT)
    first_segment = (root / "commitlog" / fmt.segment_name(0)).read_bytes()
    blank_at = last_in_first + fmt.I32.unpack_from(first_segment, last_in_first)[0]
    assert blank_at < SEGMENT == second  # a blank fills [blank_at, SEGMENT)
    mark = Path(mark_path(str(root)))
    mark.parent.mkdir(exist_ok=True)
    every = read_rows(root)
    wanted = [r["commitlog_offset"] for r in every if r["topic"] == "t0"]
    for offset, trusted in ((starts[7], True), (blank_at, True), (second, True), (starts[7] + 1, False),
                            (0, False), (10 * SEGMENT, False)):
        mark.write_bytes(offset.to_bytes(8, "big"))
        plan = spark_plan.plan_store(spark_options.StoreRef(str(root), None))
        assert plan.dispatched_end == (offset if trusted else None), offset
        assert sorted(r["commitlog_offset"] for r in read_rows(root, topic="t0")) == wanted


def test_push_filters_folds_what_it_applies_exactly():
    from datetime import datetime, timezone

    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNotNull, LessThanOrEqual, Not, StringStartsWith

    filters = [EqualTo(("topic",), "a"), In(("topic",), ("a", "b")), In(("queue_id",), (1, 2)),
               GreaterThan(("commitlog_offset",), 10), LessThanOrEqual(("store_timestamp",),
                                                                      datetime(2024, 1, 1, tzinfo=timezone.utc)),
               IsNotNull(("body",)),
               Not(EqualTo(("topic",), "c")), StringStartsWith(("topic",), "a"), EqualTo(("flag",), 1),
               IsNotNull(("tags",)), In(("queue_id",), (1, "x"))]
    folded, rest = spark_options.push_filters(spark_options.RowFilter(), filters)
    assert len(rest) == 5 and all(a is b for a, b in zip(rest, filters[6:]))
    assert folded.topics == {"a"} and folded.queue_ids == {1, 2}
    assert folded.offset_lo == 11 and folded.offset_hi is None
    assert folded.time_hi_us == 1704067200_000_000 + 1


def test_a_segment_deleted_under_a_read_is_a_clear_error(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for _ in range(1200):
            writer.put("a", b"w" * 200)
    parsed = spark_options.parse_options({"path": str(root)})
    reader = source.CommitLogBatchReader(parsed, spark_options.commitlog_schema())
    partitions = reader.partitions()
    os.remove(root / "commitlog" / fmt.segment_name(SEGMENT))
    with pytest.raises(StoreIOError, match=fmt.segment_name(SEGMENT) + " was deleted"):
        for partition in partitions:
            list(reader.read(partition))


def test_corruption_is_reported_with_file_and_offset(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        offsets = [writer.put("a", b"v" * 100) for _ in range(50)]
    with open(root / "commitlog" / fmt.segment_name(0), "r+b") as handle:
        handle.seek(offsets[20] + fmt.OFFSET_MAGIC_CODE)
        handle.write(b"\x12\x34\x56\x78")
    with pytest.raises(CorruptionError) as caught:
        read_rows(root, end_offset=str(offsets[30]))
    assert caught.value.path.endswith(fmt.segment_name(0)) and caught.value.offset == offsets[20]


def test_a_queue_entry_with_a_negative_size_is_corruption_not_the_queues_end(tmp_path):
    # Taken for the end, it would hide the entries after it and a topic read would miss their records.
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for i in range(40):
            writer.put("t" if i % 2 else "u", b"d" * 100)
    path = root / "consumequeue" / "t" / "0" / cqfmt.file_name(0)
    with open(path, "r+b") as handle:
        handle.seek(5 * cqfmt.UNIT_SIZE_BYTES + 8)
        handle.write((-1).to_bytes(4, "big", signed=True))
    with pytest.raises(CorruptionError) as caught:
        read_rows(root, topic="t")
    assert caught.value.rule == "consumequeue.1" and caught.value.path == str(path)
    assert caught.value.offset == 5 * cqfmt.UNIT_SIZE_BYTES


def test_snapshot_stops_at_the_planned_end_while_records_are_appended(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for _ in range(500):
            writer.put("a", b"s" * 300)
    parsed = spark_options.parse_options({"path": str(root)})
    reader = source.CommitLogBatchReader(parsed, spark_options.commitlog_schema())
    partitions = reader.partitions()
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        for _ in range(500):
            writer.put("a", b"s" * 300)
    rows = [r for p in partitions for b in reader.read(p) for r in b.to_pylist()]
    assert len(rows) == 500
    assert len(read_rows(root)) == 1000


def test_empty_and_unwritten_stores(tmp_path):
    (tmp_path / "empty" / "commitlog").mkdir(parents=True)
    assert read_rows(tmp_path / "empty") == []
    root = tmp_path / "zeros"
    (root / "commitlog").mkdir(parents=True)
    with open(root / "commitlog" / fmt.segment_name(0), "wb") as handle:
        handle.truncate(SEGMENT)
    assert read_rows(root) == []


def test_fixture_through_the_reader_without_spark(fixture_store, manifest):
    rows = read_rows(fixture_store)
    assert sorted(r["commitlog_offset"] for r in rows) == sorted(m["commitlog_offset"] for m in manifest)
    for row in rows[::37]:
        assert_row_is(row, stored_fixture(fixture_store, row["commitlog_offset"]))


def stored_fixture(root, offset):
    base = offset - offset % SEGMENT
    data = (root / "commitlog" / fmt.segment_name(base)).read_bytes()
    return decode_message(memoryview(data), offset - base, base + SEGMENT - offset, offset, check_crc=True)


def test_a_copy_of_the_fixture_with_its_consume_queues_removed_reads_the_same(fixture_store, manifest, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(fixture_store, root)
    shutil.rmtree(root / "consumequeue")
    rows = read_rows(root, topic="orders")
    assert sorted(r["commitlog_offset"] for r in rows) == sorted(m["commitlog_offset"] for m in manifest
                                                                 if m["topic"] == "orders")
    assert np.all(np.diff([r["commitlog_offset"] for r in read_rows(root)]) > 0)


def test_records_larger_than_a_read_chunk(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT) as writer:
        bodies = [[10, 9000, 30_000, 200][i % 4] for i in range(40)]
        offsets = [writer.put(f"t{i % 2}", os.urandom(body), tags="T") for i, body in enumerate(bodies)]
    sizes = [fmt.RECORD_SIZE_FIXED + body + 2 + len(fmt.encode_properties({"TAGS": "T"})) for body in bodies]
    expected = read_rows(root)
    monkeypatch.setattr(spark_scan, "READ_CHUNK_BYTES", 4096)
    assert read_rows(root) == expected
    assert [r["commitlog_offset"] for r in expected] == offsets
    plan = spark_plan.plan_store(spark_options.StoreRef(str(root), None))
    assert plan.end == writer.end_offset
    ref = spark_options.StoreRef(str(root), None)
    assert spark_scan.admit(ref, 0, plan.end, 3, None) == offsets[3]
    assert spark_scan.admit(ref, 0, plan.end, None, 1) == offsets[1]  # one record at least
    cut = spark_scan.admit(ref, offsets[5], plan.end, None, 40_000)
    taken = offsets.index(cut) - 5
    assert sum(sizes[5:5 + taken]) <= 40_000 < sum(sizes[5:6 + taken])


def test_slices_in_any_order_and_overlapping():
    import pyarrow as pa

    buf = np.frombuffer(b"hello world, a longer string than twelve", dtype=np.uint8)
    starts, lengths = np.array([6, 0, 13, 0, 40]), np.array([5, 5, 27, 40, 0])
    expected = [bytes(buf[a:a + n]) for a, n in zip(starts, lengths)]
    assert arrow_decode._slices(pa.binary(), buf, starts, lengths).to_pylist() == expected
    assert arrow_decode._slices(pa.binary(), buf, starts[:3:2], lengths[:3:2]).to_pylist() == expected[:3:2]
