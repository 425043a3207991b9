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
    path = bench.main(["--quick", "--rows-100b", "40000", "--rows-1kb", "8000", "--out", str(out),
                       "--work-dir", str(tmp_path / "work")], spark=spark)
    assert path == str(out)
    assert not (tmp_path / "work" / "spark_read_quick").exists()  # generated stores removed afterwards
    result = json.loads(open(path, encoding="utf-8").read())
    names = {r["name"] for r in result["results"]}
    assert {"full scan 100b: commitlog", "full scan 100b: parquet (pyarrow file)",
            "one topic (1/10) 100b: commitlog, pushdown", "streaming availableNow 100b: commitlog"} <= names
    assert all(r["rows"] > 0 and r["seconds"] > 0 for r in result["results"])
    assert set(result["summary"]) >= {"full_scan_100b_rows_per_s", "topic_scan_time_ratio",
                                      "full_scan_100b_vs_parquet", "full_scan_100b_meets_target"}
    assert result["summary"]["full_scan_100b_target_vs_parquet"] == 1.0
    assert result["settings"]["master"] == spark.sparkContext.master == "local[2]"
    spark_rows = [r for r in result["results"] if not r["name"].startswith("decode only")]
    assert all(r["cpu_jvm_s"] >= 0 and r["cpu_python_workers_s"] >= 0 for r in spark_rows)  # Linux: from /proc
    assert sum(r["cpu_jvm_s"] for r in spark_rows) > 0
