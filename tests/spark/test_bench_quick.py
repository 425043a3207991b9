"""bench/spark_read.py --quick runs end to end and writes its JSON (speed itself is not asserted).

Everything it writes goes under tmp_path (--out, --work-dir): a test run leaves the repository untouched.
"""

from __future__ import annotations

import importlib.util
import json

from tests.spark.conftest import REPO_ROOT


def test_spark_read_benchmark_quick_mode_runs(spark, tmp_path):
    spec = importlib.util.spec_from_file_location("spark_read_bench", REPO_ROOT / "bench" / "spark_read.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "results" / "spark_read_quick.json"
    path = bench.main(["--quick", "--rows", "20000", "--out", str(out), "--work-dir", str(tmp_path / "work")],
                      spark=spark)
    assert path == str(out)
    assert not (tmp_path / "work" / "spark_read_quick").exists()  # generated store removed afterwards
    result = json.loads(open(path, encoding="utf-8").read())
    names = {r["name"] for r in result["results"]}
    for kind in ("full scan", "group-by topic", "topic+queue filter"):
        assert {f"{kind}: commitlog", f"{kind}: commitlog-python", f"{kind}: parquet"} <= names
    assert {"streaming availableNow: commitlog", "streaming availableNow: commitlog-python"} <= names
    rows = {r["name"]: r["rows"] for r in result["results"]}
    assert rows["full scan: commitlog"] == 20000 and 0 < rows["topic+queue filter: commitlog"] < 20000
    assert all(r["seconds_median"] > 0 and r["seconds_min"] <= r["seconds_max"] for r in result["results"])
    summary = result["summary"]
    assert summary["full_scan_target_vs_parquet"] == 1.5 and summary["topic_queue_filter_target_vs_parquet"] == 2.0
    assert {"full_scan_commitlog_vs_parquet", "group_by_topic_commitlog_vs_parquet",
            "topic_queue_filter_python_vs_parquet", "full_scan_meets_target"} <= set(summary)
    assert result["settings"]["master"] == spark.sparkContext.master == "local[2]"
    assert all(r["cpu_jvm_s"] >= 0 and r["cpu_python_workers_s"] >= 0 for r in result["results"])  # from /proc
    assert sum(r["cpu_jvm_s"] for r in result["results"]) > 0
