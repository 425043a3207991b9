"""The asyncio benchmark's --quick mode runs end to end and writes its rows (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_aio_put_quick_writes_every_row(tmp_path):
    out = tmp_path / "aio_put.json"
    run_quick("aio_put.py", "--out", str(out), "--dir", str(tmp_path))
    result = json.loads(out.read_text())
    assert result["command"] == "bench/aio_put.py --quick"
    names = [row["name"] for row in result["rows"]]
    assert sum(name.startswith("mqstore.aio") for name in names) == 3
    for row in result["rows"]:
        assert row["msgs_per_s_min"] <= row["msgs_per_s_median"] <= row["msgs_per_s_max"], row
        for run in row["runs"]:
            assert run["not_ok"] == 0 and run["count"] > 0, row["name"]
    assert (tmp_path / "aio_put.md").read_text().startswith("# bench/aio_put.py --quick")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["aio_put.json", "aio_put.md"]
