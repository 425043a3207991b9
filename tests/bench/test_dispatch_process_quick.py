"""The dispatch_process benchmark's --quick mode runs end to end: every cell both ways, and every record the
producer put was dispatched (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_dispatch_process_quick_runs_every_cell_both_ways(tmp_path):
    out = tmp_path / "dispatch_process.json"
    run_quick("dispatch_process.py", "--out", str(out))
    result = json.loads(out.read_text())
    cells = {(run["call"], run["flush"], run["body_bytes"], run["mode"]) for run in result["runs"]}
    assert cells == {(call, flush, size, mode)
                     for call, flush, size in (("put", "ASYNC", 100), ("put", "ASYNC", 1024), ("put", "SYNC", 100),
                                               ("put", "SYNC", 1024), ("put_batch", "ASYNC", 1024),
                                               ("put_batch", "SYNC", 1024))
                     for mode in ("thread", "process")}
    for run in result["runs"]:
        assert run["puts"] > 0 and run["dispatched"] == run["puts"], run
        assert run["puts_per_s"] >= run["puts_per_s_with_catch_up"] > 0 and run["catch_up_s"] >= 0, run
        assert 0 <= run["over_5ms"] <= run["puts"], run
    assert len(result["rows"]) == 12 and all(row["share_of_raw_loop"] > 0 for row in result["rows"]
                                             if row["flush"] == "SYNC" and row["call"] == "put")
    assert not any("share_of_raw_loop" in row for row in result["rows"] if row["call"] == "put_batch")
    assert (tmp_path / "dispatch_process.md").read_text().count("| SYNC |") == 6
