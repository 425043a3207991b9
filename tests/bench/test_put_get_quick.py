"""The put/get benchmark's --quick mode runs end to end and writes a complete result file."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_put_get_quick_writes_every_row(tmp_path):
    out = tmp_path / "put_get.json"
    completed = run_quick("put_get.py", "--out", str(out))
    result = json.loads(out.read_text())
    cases = [row["case"] for row in result["rows"]]
    assert any(case.startswith("put 100 B") for case in cases)
    assert any(case.startswith("put_batch") for case in cases)
    assert any(case.startswith("get") for case in cases)
    assert any(case.startswith("dispatch") for case in cases)
    for row in result["rows"]:
        assert row["msgs_per_s"] > 0, row
    for case in ("put 100 B, 1 thread, warm, dispatch thread", "put_batch 1 KB x1000, warm, dispatch thread"):
        assert case in cases
    for row in result["rows"]:
        if row["case"].startswith("put"):  # the loop alone, then until every message was dispatched
            assert 0 < row["msgs_per_s_dispatched"] <= row["msgs_per_s"], row
    get_row = next(row for row in result["rows"] if row["case"].startswith("get"))
    assert get_row["messages"] == result["messages_per_row"]
    dispatch_rows = [row for row in result["rows"] if row["case"].startswith("dispatch")]
    assert [row["case"] for row in dispatch_rows] == ["dispatch (rebuild ConsumeQueues), 100 B",
                                                      "dispatch (ConsumeQueues and index), 100 B"]
    assert all(row["messages"] == result["messages_per_row"] for row in dispatch_rows)  # every message, both
    assert "baseline" in completed.stdout
