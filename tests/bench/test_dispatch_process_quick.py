"""The dispatch_process benchmark's --quick mode runs end to end: every cell both ways, and every record the
producer put was dispatched (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_dispatch_process_quick_runs_every_cell_both_ways(tmp_path):
    out = tmp_path / "dispatch_process.json"
    run_quick("dispatch_process.py", "--out", str(out))
    result = json.loads(out.read_text())
    cells = {(run["flush"], run["body_bytes"], run["mode"]) for run in result["runs"]}
    assert cells == {(flush, size, mode) for flush, size in (("ASYNC", 1024), ("SYNC", 100), ("SYNC", 1024))
                     for mode in ("thread", "process")}
    for run in result["runs"]:
        assert run["puts"] > 0 and run["dispatched"] == run["puts"], run
        assert run["puts_per_s"] >= run["puts_per_s_with_catch_up"] > 0 and run["catch_up_s"] >= 0, run
        assert 0 <= run["over_5ms"] <= run["puts"], run
    assert len(result["rows"]) == 6 and all(row["share_of_raw_loop"] > 0 for row in result["rows"]
                                            if row["flush"] == "SYNC")
    assert (tmp_path / "dispatch_process.md").read_text().count("| SYNC |") == 4
