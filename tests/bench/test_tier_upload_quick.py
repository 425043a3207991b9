"""The tier upload benchmark's --quick mode runs end to end and writes every row (timings are not asserted)."""

from __future__ import annotations

import json

from mqstore.tier.location import UPLOAD_PHASES
from tests.bench.quick import run_quick


def test_tier_upload_quick_writes_every_row(tmp_path):
    out = tmp_path / "tier_upload.json"
    run_quick("tier_upload.py", "--out", str(out))
    result = json.loads(out.read_text())
    names = [row["row"] for row in result["rows"]]
    tmpfs = ["file:// tier on tmpfs", "file:// tier on tmpfs, uploader thread",
             "file:// tier on tmpfs, uploader thread, no cuts",
             "file:// tier on tmpfs, listed segments deleted (they leave the machine)"] \
        if "file:// tier on tmpfs" in names else []
    stand_in = ["no tier, an uploader stand-in process to tmpfs",
                "no tier, an uploader stand-in process to tmpfs, copies kept"] if tmpfs else []
    assert names == ["no tier", "file:// tier", *tmpfs, "S3 tier (moto, loopback)", *stand_in]
    for row in result["rows"]:
        assert row["rate"] > 0 and row["sealed_segments"] >= 2 and row["failures"] == 0, row
        assert row["lag_at_end_s"] >= 0 and row["lag_max_sampled_s"] >= 0, row
        assert row["process_cpu_s_per_gb_put"] > 0, row
    for row in result["rows"][1:]:
        assert row["uploader_cpu_s_per_gb"] > 0, row
        if row["row"] not in stand_in:  # the stand-in has no phases: its process's CPU alone
            assert set(row["phase_cpu_s_per_gb"]) == set(UPLOAD_PHASES), row
        for run in row["runs"]:
            assert run["bytes_uploaded"] >= run["sealed_segments"] * result["shape"]["segment_size_bytes"], run
    assert all(rates["put_mb_per_s"] > 0 for rates in result["endpoints"].values())
    assert (tmp_path / "tier_upload.md").read_text().count("| ") >= 4
