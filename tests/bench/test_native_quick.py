"""bench/native.py --quick runs both codecs end to end and writes a complete result file."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_native_quick_writes_every_row(tmp_path):
    out = tmp_path / "native.json"
    completed = run_quick("native.py", "--out", str(out), timeout_s=600)
    result = json.loads(out.read_text())
    cases = [row["case"] for row in result["rows"]]
    assert cases == ["put 100 B", "put 1000 B", "put 100 B, index, tag+key", "put 1000 B, index, tag+key",
                     "put_batch 1 KB x1000, warm", "put_batch 1 KB x1000, cold", "get 100 B, 32 per call"]
    for row in result["rows"]:
        assert row["native"]["msgs_per_s"] > 0 and row["python"]["msgs_per_s"] > 0, row
        if row["case"].startswith("put "):
            assert "rocketmq" in row or row["rocketmq_missing"], row
    for row in result["rows"][4:6]:  # put_batch: the producer thread's CPU rate beside the wall-clock one, which
        for codec in ("native", "python"):  # it can only exceed (the thread's CPU time is within the elapsed time)
            assert row[codec]["cpu_mb_per_s"] >= row[codec]["mb_per_s"] * 0.99, row
        assert row["native"]["messages"] == (5_000 // 1000) * 1000, row
    limits = result["limits"]
    assert limits["memcpy_prefaulted_gb_per_s"] > 0 and limits["memcpy_fresh_pages_gb_per_s"] > 0, limits
    assert "native msgs/s" in completed.stdout and "pre-faulted pages" in completed.stdout
