"""Structured Streaming: availableNow, admission control, restart from a checkpoint with messages appended."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.spark.storegen import StoreWriter

SEGMENT = 64 * 1024


def run_available_now(spark, store, out, checkpoint, name="commitlog", **options):
    """One availableNow run into a Parquet sink; returns the numInputRows of each micro-batch."""
    query = (spark.readStream.format(name).options(**options).load(str(store))
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_restart_from_checkpoint_reads_every_message_exactly_once(spark, fixture_store, manifest, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(fixture_store, store)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    batches = run_available_now(spark, store, out, checkpoint, maxRecordsPerTrigger="250")
    assert sum(batches) == 1200 and len(batches) == 5 and max(batches) <= 250
    with StoreWriter(store, segment_size_bytes=SEGMENT) as writer:  # written while the query is down
        appended = [writer.put(f"late-{i % 3}", b"L" * (i % 500), queue_id=i % 4, tags="Late") for i in range(700)]
    batches = run_available_now(spark, store, out, checkpoint, maxRecordsPerTrigger="250")
    assert sum(batches) == 700 and len(batches) == 3
    assert run_available_now(spark, store, out, checkpoint, maxRecordsPerTrigger="250") == []
    rows = spark.read.parquet(str(out)).select("commitlog_offset", "topic").collect()
    offsets = [r.commitlog_offset for r in rows]
    assert len(offsets) == len(set(offsets)) == 1900
    assert set(offsets) == {m["commitlog_offset"] for m in manifest} | set(appended)
    logs = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    offsets_log = max(logs, key=lambda p: int(p.name)).read_text()
    committed = json.loads(offsets_log.strip().splitlines()[-1])
    assert committed == {"stores": {str(store): writer.end_offset}}


def test_max_bytes_per_trigger_and_filters(spark, tmp_path):
    store = tmp_path / "store"
    with StoreWriter(store, segment_size_bytes=SEGMENT) as writer:
        sizes = {}
        for i in range(600):
            offset = writer.put(f"t{i % 2}", b"B" * 300, queue_id=i % 3)
            sizes[offset] = writer.end_offset - offset
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    batches = run_available_now(spark, store, out, checkpoint, maxBytesPerTrigger="40000", topic="t1")
    assert len(batches) >= 5
    rows = spark.read.parquet(str(out)).select("commitlog_offset", "topic", "queue_id").collect()
    assert sorted(r.commitlog_offset for r in rows) == sorted(o for i, o in enumerate(sizes) if i % 2 == 1)
    assert {r.topic for r in rows} == {"t1"}


@pytest.mark.parametrize("name", ["commitlog"])
def test_starting_at_latest_reads_only_what_is_appended_after(spark, tmp_path, name):
    """The JVM reader keeps where a startingOffsets=latest query began in its checkpoint: restarted before its
    first micro-batch, it reads what was appended since (the Python source takes "latest" again)."""
    store = tmp_path / "store"
    with StoreWriter(store, segment_size_bytes=SEGMENT) as writer:
        for i in range(300):
            writer.put("before", b"b" * 50, queue_id=i % 2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {"startingOffsets": "latest"}
    assert run_available_now(spark, store, out, checkpoint, name=name, **options) == []
    with StoreWriter(store, segment_size_bytes=SEGMENT) as writer:
        appended = [writer.put("after", b"a" * 70, queue_id=i % 2) for i in range(120)]
    assert sum(run_available_now(spark, store, out, checkpoint, name=name, **options)) == 120
    rows = spark.read.parquet(str(out)).select("commitlog_offset", "topic").collect()
    assert sorted(r.commitlog_offset for r in rows) == appended and {r.topic for r in rows} == {"after"}
