"""The JVM reader, format "commitlog" in a session that loaded its jar (mqstore/spark/jvm/src), gives the rows of
store.scan() / the Python source ("commitlog-python"), value for value: on generated stores, the RocketMQ 4.4.0
fixture, a store MessageStore wrote and a store of rare record kinds; with each option and pushed filter; over
several stores. Bad bytes raise an error naming the file, the offset and the rule.

Every test shares the session of tests/spark/conftest.py, which loads the jar (built once, cached by its hash).
"""

from __future__ import annotations

import datetime
import random
import shutil

import pytest
from mqstore.commitlog import format as fmt

from mqstore import Message, MessageStore
from mqstore.store.scan import scan_store
from tests.conftest import small_config
from tests.spark.storegen import StoreWriter
from tests.spark.test_scan_parity import rows_by_offset, several_segments


def jvm_rows(spark, name, root, **options):
    return rows_by_offset(spark.read.format(name).options(**options).load(str(root)).toArrow())


def message_store(root):
    """A store MessageStore wrote: several topics and queues, tags, keys, user properties, UNIQ_KEY."""
    rng = random.Random(3)
    with MessageStore.open(root, small_config()) as store:
        for index in range(600):
            store.put(Message(f"topic{index % 3}", rng.randbytes(rng.choice([0, 7, 120, 1500])), queue_id=index % 4,
                              tags=rng.choice([None, "TagA", "TagB"]),
                              keys=tuple(f"k{index}-{n}" for n in range(rng.randrange(3))),
                              properties={"color": rng.choice(["red", "blue"]), "UNIQ_KEY": f"U{index:08X}"}
                              if index % 5 == 0 else {}))
    return root


def rare_store(root):
    """Records mqstore does not write: version 2, IPv6 hosts, non-ASCII text, properties that are not plain
    pairs (patched into the bytes), transaction flags; 32 KiB segments, so blanks and several segments."""
    patches = []
    with StoreWriter(root, segment_size_bytes=32 * 1024) as writer:
        rng = random.Random(9)
        for index in range(400):
            kind = index % 10
            offset = writer.put(
                f"t{index % 2}", rng.randbytes(rng.randrange(60)), queue_id=index % 3,
                tags=["A", "标签", None, "A B"][index % 4], keys=("x", "", "y") if kind == 1 else (),
                properties={"Ωmega": "ü"} if kind == 2 else ({"odd": "xyz"} if kind in (8, 9) else None),
                version=2 if kind == 4 else 1,
                born_host=("::1", 7) if kind == 5 else ("10.1.2.3", 41234),
                store_host=("fe80::9", 10911) if kind == 6 else ("::ffff:1.2.3.4", 1) if kind == 3
                else ("192.168.7.9", 10911),
                sys_flag=fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE if kind == 7 else 0)
            if kind in (8, 9):
                odd = b"odd\x01x\x01z\x02" if kind == 8 else b"odd\x01\xff\xfez\x02"  # two 0x01; not UTF-8
                patches.append((offset, b"odd\x01xyz\x02", odd))
    for offset, old, new in patches:  # same length: TOTALSIZE and the body CRC still hold
        path = root / "commitlog" / fmt.segment_name(offset - offset % (32 * 1024))
        data = bytearray(path.read_bytes())
        at = data.index(old, offset % (32 * 1024))
        data[at:at + len(old)] = new
        path.write_bytes(bytes(data))
    return root


def test_full_scans_give_the_rows_of_scan_store(spark, jvm_reader, fixture_store, tmp_path):
    stores = [fixture_store, several_segments(tmp_path), message_store(tmp_path / "written"),
              rare_store(tmp_path / "rare")]
    for root in stores:
        expected = rows_by_offset(scan_store(root).read_all())
        got = jvm_rows(spark, jvm_reader, root)
        assert len(got) == len(expected) > 0, root
        assert got == expected, root


def test_on_heap_vectors_give_the_same_rows(spark, jvm_reader, tmp_path):
    root = rare_store(tmp_path / "rare")
    spark.conf.set("spark.mqstore.commitlogJvm.offHeapVectors", "false")
    try:
        got = jvm_rows(spark, jvm_reader, root)
    finally:
        spark.conf.unset("spark.mqstore.commitlogJvm.offHeapVectors")
    assert got == rows_by_offset(scan_store(root).read_all())


def test_large_segments_are_split_into_partitions_at_record_starts(spark, jvm_reader, tmp_path):
    root = tmp_path / "big"
    with StoreWriter(root, segment_size_bytes=16 << 20) as writer:
        writer.put_bulk("bulk", 30000, 100, queue_count=3)
        writer.put_bulk("other", 3000, 1000, queue_count=2, seed=1)
    assert len(list((root / "commitlog").iterdir())) == 1
    df = spark.read.format(jvm_reader).load(str(root))
    # 7 MiB written in one segment, two partitions per core at least: the segment is cut at record starts
    assert df.rdd.getNumPartitions() >= 2
    assert rows_by_offset(df.toArrow()) == rows_by_offset(scan_store(root).read_all())


OPTIONS = [
    ({"topic": "orders"}, {"topic": "orders"}),
    ({"topic": "orders, payments", "queue_id": "1,3"}, {"topic": ["orders", "payments"], "queue_ids": [1, 3]}),
    ({"queue_id": "0"}, {"queue_ids": [0]}),
    ({"start_offset": "40000", "end_offset": "120000"}, {"start_offset": 40000, "end_offset": 120000}),
    ({"topic": "nothing"}, {"topic": "nothing"}),
]


@pytest.mark.parametrize("options, filters", OPTIONS)
def test_options_select_the_rows_scan_store_selects(spark, jvm_reader, fixture_store, options, filters):
    expected = rows_by_offset(scan_store(fixture_store, **filters).read_all())
    assert jvm_rows(spark, jvm_reader, fixture_store, **options) == expected
    assert options.get("topic") == "nothing" or expected


def test_time_options_take_milliseconds_and_iso_8601(spark, jvm_reader, fixture_store):
    stamps = sorted(r["store_timestamp"] for r in jvm_rows(spark, jvm_reader, fixture_store))
    lo, hi = stamps[len(stamps) // 4], stamps[3 * len(stamps) // 4]
    lo_ms, hi_ms = (int(t.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000) for t in (lo, hi))
    expected = rows_by_offset(scan_store(fixture_store, start_time=lo_ms, end_time=hi_ms).read_all())
    assert 0 < len(expected) < len(stamps)
    assert jvm_rows(spark, jvm_reader, fixture_store, start_time=str(lo_ms), end_time=str(hi_ms)) == expected
    iso = {"start_time": lo.isoformat(), "end_time": hi.replace(tzinfo=datetime.timezone.utc).isoformat()}
    assert jvm_rows(spark, jvm_reader, fixture_store, **iso) == expected


WHERE = [
    "topic = 'orders' AND queue_id IN (1, 3)",
    "topic IN ('orders', 'payments') AND queue_id = 2",
    "commitlog_offset >= 40000 AND commitlog_offset < 120000",
    "commitlog_offset > 40000 AND commitlog_offset <= 120000",
    "commitlog_offset = 0",
    "store_timestamp >= TIMESTAMP '{lo}' AND store_timestamp < TIMESTAMP '{hi}'",
    "store_timestamp > TIMESTAMP '{lo}' AND store_timestamp <= TIMESTAMP '{hi}'",
    "store_timestamp = TIMESTAMP '{lo}'",
    "tags IS NOT NULL AND size(keys) > 0",  # not pushed: Spark filters
]


@pytest.mark.parametrize("where", WHERE)
def test_pushed_filters_give_the_rows_spark_filtering_gives(spark, jvm_reader, python_source, fixture_store, where):
    spark.read.format(python_source).load(str(fixture_store)).createOrReplaceTempView("fixture")
    spark.read.format(jvm_reader).load(str(fixture_store)).createOrReplaceTempView("fixture_jvm")
    stamps = sorted(scan_store(fixture_store, columns=["store_timestamp"]).read_all().column(0).to_pylist())
    lo, hi = (stamps[len(stamps) * k // 10].replace(tzinfo=None).isoformat(sep=" ") for k in (3, 7))
    query = "SELECT * FROM {view} WHERE " + where.format(lo=lo, hi=hi).replace("{", "{{").replace("}", "}}")
    expected = rows_by_offset(spark.sql(query.format(view="fixture")).toArrow())
    pushed = spark.sql(query.format(view="fixture_jvm"))
    # pushdown off: the full scan checkpointed, then filtered by Spark (nothing reaches the reader)
    spark.read.format(jvm_reader).load(str(fixture_store)).localCheckpoint().createOrReplaceTempView("fixture_all")
    not_pushed = spark.sql(query.format(view="fixture_all"))
    assert "BatchScan" not in not_pushed._jdf.queryExecution().executedPlan().toString()
    assert 0 < len(expected)
    assert rows_by_offset(pushed.toArrow()) == expected
    assert rows_by_offset(not_pushed.toArrow()) == expected
    plan = pushed._jdf.queryExecution().executedPlan().toString()
    if "tags" not in where:
        assert "commitlog [" in plan and "topics=any, queue_ids=any, offsets=[null, null), store_timestamp_" \
            "us=[null, null)" not in plan  # something was pushed into the reader's filter


def test_pruned_columns_hold_the_same_values(spark, jvm_reader, fixture_store):
    expected = scan_store(fixture_store).read_all().select(["commitlog_offset", "tags", "keys", "body"])
    got = spark.read.format(jvm_reader).load(str(fixture_store)).select("commitlog_offset", "tags", "keys", "body")
    assert sorted(got.toArrow().to_pylist(), key=lambda r: r["commitlog_offset"]) == \
        sorted(expected.to_pylist(), key=lambda r: r["commitlog_offset"])
    assert spark.read.format(jvm_reader).load(str(fixture_store)).count() == expected.num_rows


def test_several_stores_and_a_glob_give_the_python_sources_rows(spark, jvm_reader, python_source, fixture_store,
                                                                tmp_path):
    first, second = tmp_path / "stores" / "a", tmp_path / "stores" / "b"
    shutil.copytree(fixture_store, first)
    several_segments(tmp_path / "gen").rename(second)
    for paths in ([str(first), str(second)], str(tmp_path / "stores" / "*")):
        expected = rows_by_offset_store(spark.read.format(python_source).load(paths).toArrow())
        got = rows_by_offset_store(spark.read.format(jvm_reader).load(paths).toArrow())
        assert {r["store"] for r in got} == {str(first), str(second)}
        assert len(got) == len(expected) > 0
        assert got == expected


def rows_by_offset_store(table):
    return sorted(table.to_pylist(), key=lambda r: (r["store"], r["commitlog_offset"]))


def corrupt_copy(tmp_path, at_record: int, patch) -> tuple:
    """A copy of a several-segment store with one record of its first segment patched: (root, path, position)."""
    root = several_segments(tmp_path)
    path = root / "commitlog" / fmt.segment_name(0)
    data = bytearray(path.read_bytes())
    position = 0
    for _ in range(at_record):
        position += fmt.I32.unpack_from(data, position)[0]
    patch(data, position)
    path.write_bytes(bytes(data))
    return root, path, position


def flip_magic(data, position):
    data[position + fmt.OFFSET_MAGIC_CODE] ^= 0xFF


def size_past_the_segment(data, position):
    fmt.I32.pack_into(data, position, len(data) - position + 100)


@pytest.mark.parametrize("patch, rule", [(flip_magic, "commitlog.1"), (size_past_the_segment, "commitlog.2")])
def test_bad_bytes_name_the_file_the_offset_and_the_rule(spark, jvm_reader, python_source, tmp_path, patch, rule):
    root, path, position = corrupt_copy(tmp_path, 37, patch)
    with pytest.raises(Exception) as python:
        spark.read.format(python_source).load(str(root)).collect()
    with pytest.raises(Exception) as jvm:
        spark.read.format(jvm_reader).load(str(root)).collect()
    message = str(jvm.value)
    assert f"file {path}, offset {position})" in message
    assert f"[rule {rule}]" in message and f"at commitlog offset {position}" in message
    assert "ArrayIndexOutOfBounds" not in message
    assert f"file {path}, offset {position})" in str(python.value)  # the same place the Python reader names


def test_the_deprecated_name_reads_the_same_rows(spark, jvm_reader, fixture_store):
    """"commitlog-jvm", the JVM reader's name before it took "commitlog", still reads (for one release)."""
    assert jvm_rows(spark, "commitlog-jvm", fixture_store, topic="orders") == \
        jvm_rows(spark, jvm_reader, fixture_store, topic="orders")


def test_register_leaves_the_name_to_the_jvm_reader(spark, jvm_reader):
    """In a session that loaded the jar, "commitlog" is the JVM reader: register() did not take the name (Spark
    would refuse it), and the Python source answers to "commitlog-python"."""
    import mqstore.spark

    assert mqstore.spark.register(spark) is spark  # again: harmless, no error, still the JVM reader
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
    conf = spark._jsparkSession.sessionState().conf()
    assert lookup("commitlog", conf).getName() == "io.mqstore.spark.CommitLogSource"
    assert lookup("commitlog-python", conf).getName().endswith(".PythonDataSourceV2")


def test_topics_beyond_the_dictionarys_bound_keep_their_names(spark, jvm_reader, tmp_path):
    """The topic column is a dictionary bounded at 4,096 names between batches (TopicDictionary): a log of more
    topics, interleaved, over two batches of 8,192 rows, gives every row its own topic."""
    root = tmp_path / "many"
    topics = 4500
    with StoreWriter(root, segment_size_bytes=4 << 20) as writer:
        for index in range(2 * topics):
            writer.put(f"t{index % topics}", b"x", queue_id=0)
    got = spark.read.format(jvm_reader).load(str(root)).select("commitlog_offset", "topic").toArrow()
    expected = scan_store(root, columns=["commitlog_offset", "topic"]).read_all()
    assert sorted(got.to_pylist(), key=lambda r: r["commitlog_offset"]) == \
        sorted(expected.to_pylist(), key=lambda r: r["commitlog_offset"])
    assert len({r["topic"] for r in got.to_pylist()}) == topics
