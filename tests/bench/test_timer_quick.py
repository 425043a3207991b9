"""The timer benchmark's --quick mode runs end to end and reports every section (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_timer_quick_reports_put_cost_firing_and_memory(tmp_path):
    out = tmp_path / "timer.json"
    run_quick("timer.py", "--out", str(out))
    result = json.loads(out.read_text())
    put = result["put_cost"]
    assert put["plain"] > 0 and put["delayed"] > 0 and put["delayed_with_link"] >= put["delayed"]
    firing = result["firing"]
    assert firing["pending_held"] >= firing["pending"] == 20_000
    assert firing["delivered"] == firing["probes"]
    assert firing["error_min_ms"] >= 0  # no probe was stored before its TIMER_DELIVER_MS
    assert [row["timers"] for row in result["memory"]] == [100_000, 1_000_000]
    for row in result["memory"]:
        assert row["pending"] == row["timers"] and row["rss_after_mib"] > 0
    assert (tmp_path / "timer.md").read_text().count("\n") == 8  # header, rule, 3 put rows, firing, 2 memory
