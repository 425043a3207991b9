"""The user-shaped put diagnostic's --quick mode runs every mqstore row end to end."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_put_keys_quick_runs_every_row(tmp_path):
    out = tmp_path / "put_keys.json"
    rows = ["put", "batch keys", "batch nokeys", "batch keys noindex", "batch keys prebuilt", "demo"]
    completed = run_quick("put_keys.py", "--rows", ",".join(rows), "--out", str(out))
    result = json.loads(out.read_text())
    assert sorted(result["rows"]) == sorted(rows)
    for row in rows:
        assert len(result["rows"][row]) == 1 and result["rows"][row][0]["msgs_per_s"] > 0, row
        assert row in completed.stdout
    for row in rows[1:5]:  # the batch rows split the writer's time a batch by step (decision 0045)
        steps = result["rows"][row][0]["steps_ms_a_batch"]
        assert sorted(steps) == ["all", "append", "prepare", "reserve (wall)", "results"], row
        assert 0 < steps["prepare"] + steps["append"] + steps["results"] <= steps["all"], (row, steps)
    assert "ms a batch (writer CPU; reservations wall-clock): all " in completed.stdout
