"""Batch reads through Spark: the RocketMQ 4.4.0 fixture against its manifest, filters, pushdown, several stores."""

from __future__ import annotations

import calendar
import shutil
from collections import Counter

import pytest


def epoch_ms(moment) -> int:
    """Milliseconds since the epoch of a naive UTC datetime as Spark collects it (session time zone UTC)."""
    return calendar.timegm(moment.timetuple()) * 1000 + moment.microsecond // 1000


def row_as_manifest(row) -> dict:
    """A collected row in the manifest's terms."""
    return {
        "topic": row.topic, "queue_id": row.queue_id, "queue_offset": row.queue_offset,
        "commitlog_offset": row.commitlog_offset, "body_hex": row.body.hex(), "body_crc": row.body_crc,
        "flag": row.flag, "sys_flag": row.sys_flag, "born_timestamp_ms": epoch_ms(row.born_timestamp),
        "store_timestamp_ms": epoch_ms(row.store_timestamp), "born_host": row.born_host,
        "store_host": row.store_host, "reconsume_times": row.reconsume_times, "tags": row.tags,
        "keys": " ".join(row.keys) if row.keys else None, "msg_id": row.msg_id, "properties": dict(row.properties),
    }


def test_fixture_matches_manifest_field_by_field(spark, fixture_store, manifest):
    rows = spark.read.format("commitlog").load(str(fixture_store)).collect()
    assert len(rows) == len(manifest) == 1200
    got = {row.commitlog_offset: row_as_manifest(row) for row in rows}
    assert len(got) == len(rows)
    for expected in manifest:
        actual = got[expected["commitlog_offset"]]
        for field, value in actual.items():
            assert value == expected[field], (expected["commitlog_offset"], field)


def test_counts_per_topic_and_queue(spark, fixture_store, manifest):
    df = spark.read.format("commitlog").load(str(fixture_store))
    counts = {(r.topic, r.queue_id): r["count"] for r in df.groupBy("topic", "queue_id").count().collect()}
    assert counts == dict(Counter((m["topic"], m["queue_id"]) for m in manifest))
    last = {(r.topic, r.queue_id): r["max(queue_offset)"]
            for r in df.groupBy("topic", "queue_id").max("queue_offset").collect()}
    assert last == {key: count - 1 for key, count in counts.items()}


QUERIES = [  # (condition, whether Spark hands every filter of it to the source)
    ("topic = 'orders'", True),
    ("topic IN ('a|b', '%RETRY%group_a') AND queue_id = 3", True),
    ("topic = 'pay_events-v2' AND queue_id IN (0, 2) AND commitlog_offset >= 200000 AND commitlog_offset < 700000",
     True),
    ("store_timestamp >= timestamp'2026-11-22 06:16:36.100' AND store_timestamp < timestamp'2026-11-22 06:16:36.150'",
     True),
    ("commitlog_offset > 65536 AND commitlog_offset <= 196608 AND topic <> 'orders'", False),
    ("queue_id = 1 AND size(keys) = 2", False),
    ("topic = 'no-such-topic'", True),
]


@pytest.mark.parametrize("condition, all_pushed", QUERIES)
def test_pushdown_on_and_off_give_the_same_rows(spark, python_source, fixture_store, pushdown, condition, all_pushed):
    """The Python source's pushdown follows spark.sql.python.filterPushdown.enabled (the JVM reader's is always on)."""
    def run(enabled):
        pushdown(enabled)
        df = spark.read.format(python_source).load(str(fixture_store)).where(condition)
        plan = df._jdf.queryExecution().executedPlan().toString().replace("RuntimeFilters", "")
        return sorted(r.commitlog_offset for r in df.select("commitlog_offset").collect()), plan

    with_pushdown, plan_on = run(True)
    without_pushdown, plan_off = run(False)
    assert with_pushdown == without_pushdown
    assert "Filter" in plan_off  # Spark filtered the rows itself
    assert ("Filter" not in plan_on) == all_pushed, plan_on
    if "no-such" not in condition:
        assert with_pushdown


def manifest_where(manifest, *, topics=None, queue_ids=None, lo=None, hi=None, t_lo=None, t_hi=None) -> list[int]:
    return sorted(m["commitlog_offset"] for m in manifest
                  if (topics is None or m["topic"] in topics) and (queue_ids is None or m["queue_id"] in queue_ids)
                  and (lo is None or m["commitlog_offset"] >= lo) and (hi is None or m["commitlog_offset"] < hi)
                  and (t_lo is None or m["store_timestamp_ms"] >= t_lo)
                  and (t_hi is None or m["store_timestamp_ms"] < t_hi))


def test_options_filter_rows(spark, fixture_store, manifest):
    times = sorted(m["store_timestamp_ms"] for m in manifest)
    t_lo, t_hi = times[300], times[900]
    cases = [
        ({"topic": "orders"}, dict(topics={"orders"})),
        ({"topic": "TopicTest, a|b", "queue_id": "0,3"}, dict(topics={"TopicTest", "a|b"}, queue_ids={0, 3})),
        ({"queue_id": "2"}, dict(queue_ids={2})),
        ({"start_offset": "70331", "end_offset": "400000"}, dict(lo=70331, hi=400000)),
        ({"start_time": str(t_lo), "end_time": str(t_hi)}, dict(t_lo=t_lo, t_hi=t_hi)),
        ({"start_time": "2026-11-22T06:16:36", "topic": "orders"}, dict(t_lo=1795328196000, topics={"orders"})),
        ({"topic": "orders", "start_offset": "300000", "start_time": str(t_lo)}, dict(topics={"orders"}, lo=300000,
                                                                                       t_lo=t_lo)),
    ]
    for options, expected in cases:
        df = spark.read.format("commitlog").options(**options).load(str(fixture_store))
        got = sorted(r.commitlog_offset for r in df.select("commitlog_offset").collect())
        assert got == manifest_where(manifest, **expected), options


def test_several_stores_are_unioned_with_a_store_column(spark, fixture_store, manifest, tmp_path):
    for name in ("b-store", "a-store"):
        shutil.copytree(fixture_store, tmp_path / name)
    (tmp_path / "not-matched").mkdir()
    by_list = spark.read.format("commitlog").load([str(tmp_path / "a-store"), str(tmp_path / "b-store")])
    assert by_list.columns[-1] == "store"
    counts = {r.store: r["count"] for r in by_list.groupBy("store").count().collect()}
    assert counts == {str(tmp_path / "a-store"): 1200, str(tmp_path / "b-store"): 1200}
    by_glob = spark.read.format("commitlog").option("topic", "orders").load(str(tmp_path / "*-store"))
    counts = {r.store: r["count"] for r in by_glob.groupBy("store").count().collect()}
    orders = sum(1 for m in manifest if m["topic"] == "orders")
    assert counts == {str(tmp_path / "a-store"): orders, str(tmp_path / "b-store"): orders}
    single = spark.read.format("commitlog").load(str(fixture_store))
    assert "store" not in single.columns
