"""MessageStore.scan() / scan_store(): a store's records as Arrow, with the Spark source's columns and filters,
and the same table (or the same CorruptionError) from the compiled decoder and the Python one."""

from __future__ import annotations

import datetime
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from mqstore.commitlog import arrow_decode, dispatch_batch
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, InvalidConfigError
from mqstore.commitlog.native import NATIVE
from mqstore.flush.checkpoint import CHECKPOINT_DAMAGED_FILE_NAME, CHECKPOINT_DTYPE, CHECKPOINT_FILE_NAME

from mqstore import Message, MessageStore
from mqstore.store.scan import COLUMNS, SCAN_SCHEMA, scan_store
from tests.conftest import small_config
from tests.spark.storegen import StoreWriter

REPO = Path(__file__).resolve().parents[3]
CODECS = ["python"] + (["native"] if NATIVE is not None else [])


def _codec(monkeypatch, codec: str) -> None:
    module = NATIVE if codec == "native" else None
    monkeypatch.setattr(arrow_decode, "NATIVE", module)
    monkeypatch.setattr(dispatch_batch, "NATIVE", module)


@pytest.fixture
def store_dir(tmp_path) -> Path:
    """A store with several topics and queues, tags, keys, user properties and record CRCs."""
    root = tmp_path / "store"
    rng = random.Random(5)
    with MessageStore.open(root, small_config()) as store:
        for index in range(700):
            store.put(Message(f"topic{index % 3}", rng.randbytes(rng.choice([0, 5, 100, 900])), queue_id=index % 4,
                              tags=rng.choice([None, "TagA", "TagB"]),
                              keys=tuple(f"k{index}-{n}" for n in range(rng.randrange(3))),
                              properties={"color": rng.choice(["red", "blue"])} if index % 7 == 0 else {}))
    return root


def _odd_store(root: Path) -> None:
    """Records mqstore does not write: version 2, IPv6 hosts, non-ASCII tags, odd properties, transactions."""
    with StoreWriter(root, segment_size_bytes=32 * 1024) as writer:
        rng = random.Random(9)
        for index in range(400):
            kind = index % 9
            writer.put(f"t{index % 2}", rng.randbytes(rng.randrange(60)), queue_id=index % 3,
                       tags=["A", "标签", None, "A B"][index % 4], keys=("x", "y") if kind == 1 else (),
                       properties={"Ωmega": "ü"} if kind == 2 else ({"TAGS": "dup"} if kind == 3 else None),
                       version=2 if kind == 4 else 1,
                       born_host=("::1", 7) if kind == 5 else ("10.1.2.3", 41234),
                       store_host=("fe80::9", 10911) if kind == 6 else ("192.168.7.9", 10911),
                       sys_flag=fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE if kind == 7 else 0)


def _sorted(table: pa.Table) -> pa.Table:
    """Rows in log order (a topic filter reads through ConsumeQueues, group by group)."""
    return table.sort_by("commitlog_offset") if "commitlog_offset" in table.schema.names else table


def _outcome(root, **options):
    try:
        return scan_store(root, **options).read_all()
    except CorruptionError as exc:
        return (type(exc), str(exc), exc.path, exc.offset, exc.rule)


def test_the_schema_is_the_spark_sources():
    pytest.importorskip("pyspark")
    from mqstore.store.scan_options import arrow_schema, commitlog_schema

    assert arrow_schema(commitlog_schema()) == SCAN_SCHEMA
    assert arrow_schema(commitlog_schema(True)).names == list(COLUMNS) + ["store"]


@pytest.mark.parametrize("codec", CODECS)
def test_a_scan_gives_every_message_with_its_fields(store_dir, monkeypatch, codec):
    _codec(monkeypatch, codec)
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        table = store.scan().read_all()
        assert table.schema == SCAN_SCHEMA and table.num_rows == 700
        offsets = table.column("commitlog_offset").to_pylist()
        assert offsets == sorted(offsets)
        for row in table.to_pylist()[::13]:
            message = store.read_at(row["commitlog_offset"])
            assert (row["topic"], row["queue_id"], row["queue_offset"], row["body"]) == (
                message.topic, message.queue_id, message.queue_offset, message.body)
            assert row["tags"] == message.properties.get("TAGS")
            assert row["msg_id"] == message.msg_id
            assert dict(row["properties"]) == message.properties
        per_queue = table.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "max"),
                                                                     ("queue_offset", "count")])
        for group in per_queue.to_pylist():
            assert group["queue_offset_max"] + 1 == group["queue_offset_count"]  # dense, from 0


@pytest.mark.parametrize("codec", CODECS)
def test_filters_and_columns_select_what_a_filter_over_the_whole_table_does(store_dir, monkeypatch, codec):
    _codec(monkeypatch, codec)
    whole = scan_store(store_dir).read_all()
    offsets = whole.column("commitlog_offset")
    middle = offsets[350].as_py()
    times = whole.column("store_timestamp")
    t_lo = times[100].as_py()
    cases = [
        ({"topic": "topic1"}, pc.equal(whole.column("topic"), "topic1")),
        ({"topic": ["topic0", "topic2"], "queue_ids": [1, 3]},
         pc.and_(pc.is_in(whole.column("topic"), pa.array(["topic0", "topic2"])),
                 pc.is_in(whole.column("queue_id"), pa.array([1, 3], pa.int32())))),
        ({"start_offset": middle}, pc.greater_equal(offsets, middle)),
        ({"end_offset": middle, "queue_ids": 2}, pc.and_(pc.less(offsets, middle),
                                                         pc.equal(whole.column("queue_id"), 2))),
        ({"start_time": t_lo}, pc.greater_equal(times, pa.scalar(t_lo, times.type))),
        ({"end_time": int(t_lo.timestamp() * 1000)}, pc.less(times, pa.scalar(t_lo, times.type))),
        ({"topic": "nothing"}, pc.equal(whole.column("topic"), "nothing")),
    ]
    for options, mask in cases:
        assert _sorted(scan_store(store_dir, **options).read_all()).equals(whole.filter(mask)), options
    picked = scan_store(store_dir, columns=["body", "commitlog_offset"], topic="topic2").read_all()
    assert picked.schema.names == ["body", "commitlog_offset"]
    assert _sorted(picked).equals(whole.filter(pc.equal(whole.column("topic"), "topic2")).select(
        ["body", "commitlog_offset"]))
    with pytest.raises(InvalidConfigError):
        scan_store(store_dir, columns=["nope"])
    with pytest.raises(InvalidConfigError):
        scan_store(store_dir, start_time="yesterday")
    naive = t_lo.replace(tzinfo=None)  # a naive datetime means UTC
    assert scan_store(store_dir, start_time=naive).read_all().equals(scan_store(store_dir, start_time=t_lo).read_all())
    assert isinstance(naive, datetime.datetime)


@pytest.mark.skipif(NATIVE is None, reason="MQSTORE_NATIVE=0: the compiled decoder is not built or not chosen")
def test_both_codecs_give_the_same_tables(store_dir, tmp_path, monkeypatch):
    odd = tmp_path / "odd"
    _odd_store(odd)
    for root in (store_dir, odd):
        for options in ({}, {"topic": "t1"}, {"queue_ids": [0, 2]}, {"start_offset": 1000, "end_offset": 30000}):
            _codec(monkeypatch, "python")
            expected = _outcome(root, **options)
            _codec(monkeypatch, "native")
            assert _outcome(root, **options).equals(expected), (root, options)
    _codec(monkeypatch, "native")
    assert _outcome(odd).num_rows == 400


@pytest.mark.skipif(NATIVE is None, reason="MQSTORE_NATIVE=0: the compiled decoder is not built or not chosen")
@pytest.mark.parametrize("seed", range(2))
def test_both_codecs_refuse_damaged_bytes_alike(store_dir, tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    end = scan_store(store_dir, columns=["commitlog_offset"]).read_all().column(0)[-1].as_py()
    # damage lands in written segments only (the writer may have made the next, empty one already)
    segments = [path for path in sorted((store_dir / "commitlog").iterdir()) if int(path.name) <= end]
    errors = 0
    for trial in range(25):
        copy = tmp_path / f"copy{trial}"
        shutil.copytree(store_dir, copy)
        segment = copy / "commitlog" / rng.choice(segments).name
        data = bytearray(segment.read_bytes())
        at = rng.randrange(min(len(data), max(1, end - int(segment.name)))) if end > int(segment.name) else 0
        if rng.random() < 0.7:
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at : at + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00", b"\xda\xa3\x20\xab"])
        segment.write_bytes(bytes(data))
        options = rng.choice([{}, {"topic": "topic0"}, {"queue_ids": [1]}])
        _codec(monkeypatch, "python")
        expected = _outcome(copy, **options)
        _codec(monkeypatch, "native")
        actual = _outcome(copy, **options)
        if isinstance(expected, tuple):
            errors += 1
            assert actual == expected, trial
        else:
            assert isinstance(actual, pa.Table) and actual.equals(expected), trial
        shutil.rmtree(copy)
    assert errors >= 1, errors  # some damage was refused (a flip in a body scan does not check goes through)


def test_a_scan_needs_no_pyspark(store_dir):
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "from mqstore.store.scan import scan_store\n"
            f"print(scan_store({str(store_dir)!r}, topic='topic1').read_all().num_rows)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) == scan_store(store_dir, topic="topic1").read_all().num_rows > 0


def test_pandas_polars_and_duckdb_read_a_store_in_one_call(store_dir):
    pandas = pytest.importorskip("pandas")
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        frame = store.scan(columns=["topic", "queue_id", "body"]).read_pandas()
        assert isinstance(frame, pandas.DataFrame) and len(frame) == 700
        lazy = polars.from_arrow(store.scan(topic="topic1").read_all())
        assert lazy.height == 233 and set(lazy["topic"].to_list()) == {"topic1"}
        reader = store.scan(columns=["topic", "queue_id"])  # noqa: F841 - DuckDB finds it by its name
        counts = duckdb.sql("select topic, count(*) as n from reader group by topic order by topic").fetchall()
    assert counts == [("topic0", 234), ("topic1", 233), ("topic2", 233)]


def _partitions_and_filter(root: Path, **options):
    from mqstore.store.scan import row_filter
    from mqstore.store.scan_options import StoreRef
    from mqstore.store.scan_plan import plan_batch

    wanted = row_filter(**options)
    return plan_batch([StoreRef(str(root), None)], wanted, partition_bytes_max=64 * 1024), wanted


def _rows_until_error(partitions, wanted, threads: int):
    from mqstore.store.scan import _batches

    batches = []
    try:
        for batch in _batches(partitions, SCAN_SCHEMA, wanted, list(COLUMNS), threads=threads):
            batches.append(batch)
    except CorruptionError as exc:
        return batches, (str(exc), exc.path, exc.offset, exc.rule)
    return batches, None


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("options", [{}, {"topic": "topic1"}])
def test_partitions_read_on_threads_come_in_the_order_one_thread_gives(store_dir, monkeypatch, codec, options):
    _codec(monkeypatch, codec)
    partitions, wanted = _partitions_and_filter(store_dir, **options)
    assert len(partitions) >= (2 if options else 4), len(partitions)
    one, error_one = _rows_until_error(partitions, wanted, threads=1)
    two, error_two = _rows_until_error(partitions, wanted, threads=2)
    assert error_one is None and error_two is None
    assert pa.Table.from_batches(two, SCAN_SCHEMA).equals(pa.Table.from_batches(one, SCAN_SCHEMA))
    if not options:
        offsets = pa.Table.from_batches(two, SCAN_SCHEMA).column("commitlog_offset").to_pylist()
        assert offsets == sorted(offsets) and len(offsets) == 700


def test_damage_in_a_later_partition_is_raised_after_the_rows_before_it(store_dir):
    partitions, wanted = _partitions_and_filter(store_dir)
    last = partitions[-1].pieces[0]
    segment = store_dir / "commitlog" / fmt.segment_name(last.base)
    data = bytearray(segment.read_bytes())
    data[last.start - last.base + fmt.OFFSET_MAGIC_CODE] ^= 0x40  # the magic code of the last partition's first record
    segment.write_bytes(bytes(data))
    one, error_one = _rows_until_error(partitions, wanted, threads=1)
    two, error_two = _rows_until_error(partitions, wanted, threads=2)
    assert error_one is not None and error_two == error_one
    assert (error_one[1], error_one[2]) == (str(segment), last.start - last.base)
    assert pa.Table.from_batches(two, SCAN_SCHEMA).equals(pa.Table.from_batches(one, SCAN_SCHEMA))
    assert sum(batch.num_rows for batch in two) > 0


def test_a_scan_left_after_one_batch_stops_its_threads(store_dir):
    import threading

    from mqstore.store.scan import _batches

    partitions, wanted = _partitions_and_filter(store_dir)
    batches = _batches(partitions, SCAN_SCHEMA, wanted, list(COLUMNS), threads=2)
    assert next(batches).num_rows > 0
    assert any(thread.name.startswith("mqstore-scan") for thread in threading.enumerate())
    batches.close()
    assert not any(thread.name.startswith("mqstore-scan") for thread in threading.enumerate())


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("damage", [b"\0\0\0\x09", b"\0" * 8, b"\0\0\0\x05\xde\xad\xbe\xef"])
def test_damage_in_the_last_segment_before_more_records_is_an_error_not_the_end(tmp_path, monkeypatch, codec,
                                                                                damage):
    """Without ConsumeQueues to start from, the planning walk of the last segment reached a damaged record and
    took it for the end of the log: every row after it left the scan without an error."""
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        results = store.put_batch([Message(f"t{i % 2}", b"x" * 100, queue_id=i % 2, tags="a", keys=(f"k{i}",))
                                   for i in range(600)])
    segments = sorted((root / "commitlog").iterdir())
    base = int(segments[-1].name)
    in_last = [result.commitlog_offset for result in results if result.commitlog_offset >= base]
    victim = in_last[len(in_last) // 2]
    with open(segments[-1], "r+b") as segment:
        segment.seek(victim - base)
        segment.write(damage)
    shutil.rmtree(root / "consumequeue")  # the walk starts at the last segment's first record
    with MessageStore.open(root, small_config(), read_only=True) as store:
        with pytest.raises(CorruptionError) as from_read_at:
            store._commitlog.read(victim)  # read_at's reading (read_at calls a zeroed head "no record")
    with pytest.raises(CorruptionError) as raised:
        scan_store(root).read_all()
    assert (raised.value.path, raised.value.offset) == (str(segments[-1]), victim - base)
    assert (raised.value.path, raised.value.offset, raised.value.rule) == (
        from_read_at.value.path, from_read_at.value.offset, from_read_at.value.rule)


@pytest.mark.parametrize("codec", CODECS)
def test_a_half_written_record_at_the_end_of_the_last_segment_ends_the_scan(tmp_path, monkeypatch, codec):
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        results = store.put_batch([Message("t", b"x" * 100, keys=(f"k{i}",)) for i in range(300)])
    last = results[-1]
    segment = sorted((root / "commitlog").iterdir())[-1]
    with open(segment, "r+b") as file:  # the last record's first bytes only: a write still under way
        file.seek(last.commitlog_offset - int(segment.name) + 40)
        file.write(b"\0" * (last.size_bytes - 40))
    _set_checkpoint_flushed(root, last.commitlog_offset)  # as the writer's checkpoint was during that write
    shutil.rmtree(root / "consumequeue")
    assert scan_store(root).read_all().num_rows == 299


def _set_checkpoint_flushed(root: Path, offset: int) -> None:
    with open(root / CHECKPOINT_FILE_NAME, "r+b") as checkpoint:
        checkpoint.seek(CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1])
        checkpoint.write(offset.to_bytes(8, "big"))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("flushed", ["kept", "none", "damaged marker", "past the files"])
def test_zeros_below_the_checkpoints_flushed_offset_are_damage_not_the_end(tmp_path, monkeypatch, codec, flushed):
    """The log's tail was lost after it was flushed (zeros from a record start to the end of what was written):
    the planning walk stopped at the zeros and scan() returned the rows before them as the whole log, without an
    error. The checkpoint's flushed offset says those bytes were on disk: a plain open raises for them, and so
    does scan(), naming the place; without that evidence the zeros are the end, as before."""
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        results = store.put_batch([Message(f"t{i % 2}", b"x" * 100, queue_id=i % 2, tags="a", keys=(f"k{i}",))
                                   for i in range(600)])
    segment = sorted((root / "commitlog").iterdir())[-1]
    base = int(segment.name)
    victim = [result for result in results if result.commitlog_offset >= base][5]
    end = results[-1].commitlog_offset + results[-1].size_bytes
    with open(segment, "r+b") as file:
        file.seek(victim.commitlog_offset - base)
        file.write(b"\0" * (end - victim.commitlog_offset))
    shutil.rmtree(root / "consumequeue")
    if flushed == "none":
        _set_checkpoint_flushed(root, 0)  # a checkpoint without the offset, as RocketMQ 4.4.0 writes it
    elif flushed == "damaged marker":
        (root / CHECKPOINT_DAMAGED_FILE_NAME).write_bytes(b"")
    elif flushed == "past the files":
        _set_checkpoint_flushed(root, base + len(segment.read_bytes()) + 1)
    if flushed != "kept":
        assert scan_store(root).read_all().num_rows == results.index(victim)
        return
    with pytest.raises(CorruptionError) as raised:
        scan_store(root).read_all()
    assert (raised.value.path, raised.value.offset, raised.value.rule) == (
        str(segment), victim.commitlog_offset - base, "commitlog.end")
    with pytest.raises(CorruptionError) as opened:
        MessageStore.open(root, small_config()).close()
    assert opened.value.rule == "commitlog.end"


def _transaction_store(root: Path) -> None:
    """Two topics, three queues, 64-unit ConsumeQueue files filled several times, 32 KiB segments, IPv6 hosts and
    version-2 records, a transaction-prepared record in every ten (no ConsumeQueue unit, as in RocketMQ)."""
    with StoreWriter(root, segment_size_bytes=32 * 1024, queue_entries_per_file=64) as writer:
        rng = random.Random(11)
        for index in range(1200):
            kind = index % 10
            writer.put(f"t{index % 2}", rng.randbytes(rng.randrange(60)), queue_id=index % 3, tags="A",
                       version=2 if kind == 4 else 1, born_host=("::1", 7) if kind == 5 else ("10.1.2.3", 41234),
                       sys_flag=fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE if kind == 7 else 0)


@pytest.mark.parametrize("codec", CODECS)
def test_a_topic_scan_gives_the_topics_consumable_rows_across_queue_files(tmp_path, monkeypatch, codec):
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    _transaction_store(root)
    assert len(list((root / "consumequeue" / "t1" / "1").iterdir())) >= 3  # several full queue files
    full = scan_store(root).read_all()
    prepared = pc.equal(pc.bit_wise_and(full["sys_flag"], fmt.SYS_FLAG_TRANSACTION_MASK),
                        fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE)
    for topic in ("t0", "t1"):
        expected = full.filter(pc.and_(pc.equal(full["topic"], topic), pc.invert(prepared)))
        got = _sorted(scan_store(root, topic=topic).read_all())
        assert got.num_rows == expected.num_rows > 0
        assert got.equals(expected)
    # the committed records of each queue are numbered 0, 1, 2, ... as RocketMQ numbers them
    t1 = scan_store(root, topic="t1", queue_ids=1).read_all()
    assert sorted(t1["queue_offset"].to_pylist()) == list(range(t1.num_rows))


@pytest.mark.parametrize("codec", CODECS)
def test_a_queue_file_that_ends_before_the_next_one_is_refused_as_the_stores_open_refuses_it(
        tmp_path, monkeypatch, codec):
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    _transaction_store(root)
    path = root / "consumequeue" / "t0" / "2" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[10 * 20:11 * 20] = bytes(20)  # a free unit in the middle of a full file that has a successor
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as caught:
        scan_store(root, topic="t0").read_all()
    assert (caught.value.path, caught.value.offset, caught.value.rule) == (str(path), 10 * 20, "consumequeue.1")
    assert "ends after 10 entries but is not the last" in str(caught.value)
    assert scan_store(root, topic="t1").read_all().num_rows > 0  # the other topic's queues are whole


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("left", [8, 12, 16, 17, 40])
def test_records_at_a_segments_end_scan_through_and_beside_the_mapping(tmp_path, monkeypatch, codec, left):
    """The scan decodes records in the segment's mapping, except those within BUFFER_PAD_BYTES of the file's end
    (read into padded buffers): a segment whose last record leaves `left` bytes for its blank."""
    _codec(monkeypatch, codec)
    root = tmp_path / "store"
    segment = 8192
    expected = []
    with StoreWriter(root, segment_size_bytes=segment, queue_entries_per_file=64) as writer:
        record_empty = -writer.put("t0", b"") + writer.end_offset  # the size of a record with an empty body
        expected.append(("t0", b""))
        index = 1
        while segment - writer.end_offset - left >= record_empty + 300:
            body = bytes([index % 251]) * (index * 7 % 200)
            writer.put(f"t{index % 2}", body, queue_id=index % 3)
            expected.append((f"t{index % 2}", body))
            index += 1
        last = bytes(segment - writer.end_offset - left - record_empty)
        writer.put("t1", last, queue_id=1)
        expected.append(("t1", last))
        assert writer.end_offset == segment - left
        for body in (b"next", b"segment"):
            writer.put("t0", body)
            expected.append(("t0", body))
    full = scan_store(root).read_all()
    assert list(zip(full["topic"].to_pylist(), full["body"].to_pylist())) == expected
    for topic in ("t0", "t1"):
        got = _sorted(scan_store(root, topic=topic).read_all())
        assert got["body"].to_pylist() == [body for name, body in expected if name == topic]
