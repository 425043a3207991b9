"""The disk-reservation benchmark's --quick mode runs end to end and writes every row (timings are not asserted)."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

MIB = 1 << 20


def test_disk_reservation_quick_writes_every_row(tmp_path):
    out = tmp_path / "disk_reservation.json"
    run_quick("disk_reservation.py", "--out", str(out), "--dir", str(tmp_path))
    result = json.loads(out.read_text())
    rows = {row["case"]: row for row in result["rows"]}
    stores = [name for name in rows if name.startswith("store:")]
    assert len(stores) == 8 and sum(name.startswith("baseline:") for name in rows) == 6
    for row in rows.values():
        assert row["min"] <= row["median"] <= row["max"] and row["median"] >= 0, row
    for name in stores:  # the full variant takes a whole segment; the others about what they wrote
        used = rows[name]["disk_used_bytes"]
        if name.startswith("store: full"):
            assert used >= result["segment_size_bytes"]
        else:
            assert used < result["segment_size_bytes"]
    assert result["command"].endswith("--quick")
    assert (tmp_path / "disk_reservation.md").read_text().count("\n") == 4 + len(rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk_reservation.json", "disk_reservation.md"]
