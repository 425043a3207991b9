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
                     "put_batch 1 KB x1000, warm", "get 100 B, 32 per call"]
    for row in result["rows"]:
        assert row["native"]["msgs_per_s"] > 0 and row["python"]["msgs_per_s"] > 0, row
        if row["case"].startswith("put "):
            assert "rocketmq" in row or row["rocketmq_missing"], row
    assert "native msgs/s" in completed.stdout
