"""The tier scan benchmark's --quick mode runs end to end and reports every row (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

ROWS = ["local full", "file:// tier full", "file:// raw full", "S3 (moto) tier full", "S3 (moto) raw full",
        "local topic", "file:// tier topic", "file:// raw topic", "S3 (moto) tier topic", "S3 (moto) raw topic"]


def test_tier_scan_quick_reports_every_row(tmp_path):
    out = tmp_path / "tier_scan.json"
    run_quick("tier_scan.py", "--out", str(out))
    result = json.loads(out.read_text())
    assert sorted(result["medians"]) == sorted(ROWS) and all(rate > 0 for rate in result["medians"].values())
    rows = result["rows"]
    assert rows["full"] == result["shape"]["messages"] and 0 < rows["topic"] < rows["full"]
    assert result["segments"] >= 2
    for sample in result["samples"]:
        for name in ("file://", "S3 (moto)"):
            assert sample[f"{name} raw full"]["bytes"] >= result["rows"]["full"] * 100, sample  # 100 B bodies at least
    table = (tmp_path / "tier_scan.md").read_text()
    assert table.count("| every row |") == 3 and table.count("| topic=T0 |") == 3
