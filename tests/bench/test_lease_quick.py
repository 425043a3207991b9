"""bench/lease.py --quick produces every row (speeds are not asserted)."""

from __future__ import annotations

import json

import pytest

from tests.bench.quick import run_quick

pytest.importorskip("persistqueue", reason="persist-queue is in the bench extra: pip install -e .[bench]")
pytest.importorskip("litequeue", reason="litequeue is in the bench extra: pip install -e .[bench]")


def test_lease_quick_writes_every_row(tmp_path):
    out = tmp_path / "lease.json"
    run_quick("lease.py", "--out", str(out), "--dir", str(tmp_path))
    result = json.loads(out.read_text())
    assert result["command"] == "bench/lease.py --quick"
    assert len(result["rows"]) == 7 and len(result["targets"]) == 6
    assert all("durable to:" in target["name"] for target in result["targets"][:4])
    bound = result["targets"][4]
    assert bound["name"].startswith("bound, not a target") and bound["met"] is None and bound["ratio"] > 0
    for row in result["rows"]:
        assert row["errors"] == 0 and row["msgs_per_s_min"] <= row["msgs_per_s_median"], row
    assert (tmp_path / "lease.md").read_text().startswith("# bench/lease.py --quick")
