"""The put-stall benchmark's --quick mode runs end to end and writes every row (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_put_stalls_quick_writes_every_row(tmp_path):
    out = tmp_path / "put_stalls.json"
    run_quick("put_stalls.py", "--out", str(out))
    rows = {row["case"]: row for row in json.loads(out.read_text())["rows"]}
    assert len(rows) == 10
    assert sum(name.startswith("bare:") for name in rows) == 3
    assert sum(name.startswith("store:") for name in rows) == 7
    for row in rows.values():
        assert row["ops"] > 0 and row["ops_per_s"] > 0 and row["max_ms"] >= row["p999_us"] / 1000 > 0, row
        assert 0 <= row["over_5ms"] <= row["over_1ms"] <= row["ops"], row
    assert all(row["segments"] >= 1 for name, row in rows.items() if name.startswith("store:"))
    assert (tmp_path / "put_stalls.md").read_text().count("\n") == 12  # header, rule, ten rows
