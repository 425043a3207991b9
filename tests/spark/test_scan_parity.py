"""The Spark source reads through store.scan()'s planner and reader: its batch and streaming rows are the rows
`scan_store` gives for the same store and filters, value for value (the RocketMQ 4.4.0 fixture, every kind of
record it holds, and a store with several segments)."""

from __future__ import annotations

import shutil

import pyarrow as pa

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


def test_a_streaming_read_gives_the_rows_of_scan_store(spark, fixture_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(fixture_store, store)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.format("commitlog").option("maxRecordsPerTrigger", "300").load(str(store))
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    expected = rows_by_offset(scan_store(store).read_all())
    got = rows_by_offset(spark.read.parquet(str(out)).toArrow())
    assert len(got) == len(expected) == 1200
    assert got == expected
