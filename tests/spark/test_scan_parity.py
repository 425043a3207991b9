"""format("commitlog") gives the rows `scan_store` gives for the same store and filters, value for value, in batch
and streaming reads, with filters as options and pushed down (the RocketMQ 4.4.0 fixture, every kind of record it
holds, and a store with several segments). In the test session "commitlog" is the JVM reader; the Python source,
"commitlog-python", reads through store.scan()'s own planner and reader and is held to the same rows."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from mqstore.store.scan import COLUMNS, scan_store
from tests.spark.storegen import StoreWriter

SEGMENT = 64 * 1024


def rows_by_offset(table: pa.Table) -> list[dict]:
    """The rows of `table` as Python values, in commitlog order, columns in the source's order."""
    table = table.select(list(COLUMNS)).sort_by("commitlog_offset")
    return table.to_pylist()


def several_segments(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT, queue_entries_per_file=500) as writer:
        writer.put_bulk("bulk", 1500, 120, queue_count=3)
        writer.put_bulk("other", 400, 30, queue_count=2, seed=1)
    return root


def test_a_batch_read_gives_the_rows_of_scan_store(spark, fixture_store, tmp_path):
    for root in (fixture_store, several_segments(tmp_path)):
        expected = rows_by_offset(scan_store(root).read_all())
        got = rows_by_offset(spark.read.format("commitlog").load(str(root)).toArrow())
        assert len(got) == len(expected) > 0
        assert got == expected


def test_a_filtered_read_gives_the_rows_of_scan_store_with_the_same_filter(spark, fixture_store):
    expected = rows_by_offset(scan_store(fixture_store, topic="orders", queue_ids=[1, 3]).read_all())
    for options in ({"topic": "orders", "queue_id": "1,3"}, {}):
        df = spark.read.format("commitlog").options(**options).load(str(fixture_store))
        if not options:
            df = df.where("topic = 'orders' AND queue_id IN (1, 3)")  # pushed down (the session enables it)
        got = rows_by_offset(df.toArrow())
        assert len(got) == len(expected) > 0
        assert got == expected


def test_filters_pushed_or_given_as_options_give_the_rows_of_scan_store(spark, tmp_path):
    """Topic and queue filters read through the ConsumeQueues, time filters skip segments: the rows stay those of
    scan_store with the same filters, across several segments."""
    root = several_segments(tmp_path)
    stamps = sorted(scan_store(root, columns=["store_timestamp"]).read_all().column(0).to_pylist())
    lo, hi = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    lo_ms, hi_ms = (int(t.timestamp() * 1000) for t in (lo, hi))
    cases = [
        ({"topic": "other"}, "topic = 'other'"),
        ({"topic": "bulk", "queue_ids": [2]}, "topic = 'bulk' AND queue_id = 2"),
        ({"topic": "bulk", "start_time": lo_ms, "end_time": hi_ms},
         f"topic = 'bulk' AND store_timestamp >= TIMESTAMP_MILLIS({lo_ms}) "
         f"AND store_timestamp < TIMESTAMP_MILLIS({hi_ms})"),
        ({"topic": ["bulk", "other"], "start_offset": 70000, "end_offset": 150000},
         "topic IN ('bulk', 'other') AND commitlog_offset >= 70000 AND commitlog_offset < 150000"),
    ]
    for filters, where in cases:
        expected = rows_by_offset(scan_store(root, **filters).read_all())
        assert expected, filters
        pushed = rows_by_offset(spark.read.format("commitlog").load(str(root)).where(where).toArrow())
        assert pushed == expected, where
    options = {"topic": "bulk", "queue_id": "2", "start_time": str(lo_ms), "end_time": str(hi_ms)}
    expected = rows_by_offset(scan_store(root, topic="bulk", queue_ids=[2], start_time=lo_ms,
                                         end_time=hi_ms).read_all())
    assert rows_by_offset(spark.read.format("commitlog").options(**options).load(str(root)).toArrow()) == expected


@pytest.mark.parametrize("name", ["commitlog", "commitlog-python"])
def test_a_streaming_read_gives_the_rows_of_scan_store(spark, fixture_store, tmp_path, name):
    store = tmp_path / "store"
    shutil.copytree(fixture_store, store)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.format(name).option("maxRecordsPerTrigger", "300").load(str(store))
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    expected = rows_by_offset(scan_store(store).read_all())
    got = rows_by_offset(spark.read.parquet(str(out)).toArrow())
    assert len(got) == len(expected) == 1200
    assert got == expected


def test_a_filtered_stream_gives_the_rows_of_scan_store(spark, tmp_path):
    root = several_segments(tmp_path)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.format("commitlog").option("topic", "bulk").option("queue_id", "1")
             .option("maxBytesPerTrigger", "50000").load(str(root))
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # the limit made several micro-batches
    expected = rows_by_offset(scan_store(root, topic="bulk", queue_ids=[1]).read_all())
    assert rows_by_offset(spark.read.parquet(str(out)).toArrow()) == expected
