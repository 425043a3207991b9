"""The demo's Spark part: per-topic counts through the commitlog source equal the API's; skipped without pyspark."""

from __future__ import annotations

import re
import sys

from mqstore.demo import TOPICS, run_demo

MESSAGES = 5000
COUNT_LINE = re.compile(r"^  (\S+) +([\d,]+) +([\d,]+)  (same|DIFFERENT)$", re.MULTILINE)


def printed_counts(out: str) -> dict[str, tuple[int, int]]:
    """{topic: (spark count, API count)} from the demo's table."""
    return {topic: (int(spark.replace(",", "")), int(api.replace(",", "")))
            for topic, spark, api, _ in COUNT_LINE.findall(out)}


def test_demo_spark_counts_equal_the_api_counts(spark, tmp_path, capsys):
    assert run_demo(str(tmp_path / "demo-store"), MESSAGES, spark=spark) == 0
    out = capsys.readouterr().out
    counts = printed_counts(out)
    assert sorted(counts) == sorted(TOPICS)
    assert all(spark_count == api_count == MESSAGES // len(TOPICS) for spark_count, api_count in counts.values())
    shown = re.findall(r"^\|\s*orders\|\s*0\|\s*(\d+)\|", out, re.MULTILINE)  # the rows of orders/0 shown
    assert shown == ["0", "1", "2", "3", "4"]
    assert "spark OK" in out
    assert spark.range(3).count() == 3  # the session given is left running


def test_demo_counts_a_second_run_in_the_whole_store(spark, tmp_path, capsys):
    store = str(tmp_path / "demo-store")
    assert run_demo(store, 400, spark=spark) == 0
    assert run_demo(store, 400, spark=spark) == 0
    counts = printed_counts(capsys.readouterr().out.rsplit("spark: session ready", 1)[1])
    assert counts == {topic: (200, 200) for topic in TOPICS}  # Spark and the API count the whole store


def test_without_pyspark_the_spark_part_is_skipped_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    assert run_demo(str(tmp_path / "demo-store"), 400) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if "spark" in line.lower() and "skipped" in line]
    assert len(skipped) == 1 and "pyspark cannot be imported" in skipped[0]
    assert "demo OK" in out and printed_counts(out) == {}
