"""The dispatch-lag benchmark's --quick mode runs end to end and writes every row (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_dispatch_lag_quick_writes_every_row(tmp_path):
    out = tmp_path / "dispatch_lag.json"
    run_quick("dispatch_lag.py", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [row["max_dispatch_lag_bytes"] for row in rows] == [0, 4 << 20, 64 << 20]
    for row in rows:
        assert row["puts"] > 0 and row["puts_per_s"] >= row["puts_per_s_with_catch_up"] > 0, row
        assert 0 <= row["dispatched_share"] <= 1 and row["catch_up_s"] >= 0, row
        assert 0 <= row["over_5ms"] <= row["puts"], row
        if row["max_dispatch_lag_bytes"]:  # the bound holds whenever the lag was sampled
            assert row["lag_max_bytes"] <= row["max_dispatch_lag_bytes"], row
    assert (tmp_path / "dispatch_lag.md").read_text().count("\n") == 5  # header, rule, three rows
