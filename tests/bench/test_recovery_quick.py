"""The recovery benchmark's --quick mode runs end to end and writes every row with positive numbers.

Speed is not asserted (tests never assert on timings): only that each expected row is there, that its numbers
are positive, and that the scan target was evaluated.
"""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

# Each expected row (the case name after the size label) and the numbers it must hold.
OPEN_FIELDS = ("open_s", "recover_s", "scanned_bytes", "scan_gb_per_s", "walk_gb_per_s", "store_bytes")
EXPECTED_ROWS = {
    "baseline zlib.crc32, 1 MiB chunks": ("recover_s", "scanned_bytes", "scan_gb_per_s", "store_bytes"),
    "baseline zlib.crc32 per record": ("recover_s", "scanned_bytes", "scan_gb_per_s", "records"),
    "baseline isal crc32 (the store's), 1 MiB chunks": ("recover_s", "scanned_bytes", "scan_gb_per_s",
                                                        "store_bytes"),
    "baseline isal crc32 (the store's) per record": ("recover_s", "scanned_bytes", "scan_gb_per_s", "records"),
    "baseline mq_crc32 (the compiled core's), 1 MiB chunks": ("recover_s", "scanned_bytes", "scan_gb_per_s",
                                                              "store_bytes"),
    "baseline mq_crc32 (the compiled core's) per record": ("recover_s", "scanned_bytes", "scan_gb_per_s",
                                                           "records"),
    "clean stop": OPEN_FIELDS,
    "crash, checkpoint kept": OPEN_FIELDS + ("tail_check_s", "messages_redispatched"),
    "crash, full scan, CRC on": OPEN_FIELDS + ("tail_check_s", "messages_redispatched"),
    "crash, full scan, CRC off": OPEN_FIELDS + ("tail_check_s", "messages_redispatched"),
    "crash, full scan, CRC on, cold": OPEN_FIELDS + ("tail_check_s", "messages_redispatched"),
}


def test_recovery_quick_writes_every_row(tmp_path):
    out = tmp_path / "results" / "recovery.json"
    completed = run_quick("recovery.py", "--out", str(out), "--dir", str(tmp_path), timeout_s=600)
    result = json.loads(out.read_text())
    assert result["command"] == "bench/recovery.py --quick"
    rows = result["rows"]
    assert len(rows) == len(EXPECTED_ROWS)
    for name, fields in EXPECTED_ROWS.items():
        matching = [row for row in rows if row["case"] == f"64 MB: {name}"]
        assert len(matching) == 1, (name, [row["case"] for row in rows])
        for field in fields:
            value = matching[0].get(field)
            assert isinstance(value, (int, float)) and value > 0, (field, matching[0])
    full_scans = [row for row in rows if "full scan" in row["case"]]
    assert all(row["scanned_bytes"] >= 0.9 * row["store_bytes"] for row in full_scans)  # the scan read it all
    assert isinstance(result["targets"]["met"], bool) and result["targets"]["scan_gb_per_s_min"] == 4.0
    assert "target: >= 4 GB/s scanned with CRC on" in completed.stdout
    assert result["crc32_path"] in ("zlib", "pclmul", "vpclmul", "pure-Python codec (isal)")
    assert "warm" in result["page_cache"]
    assert list(tmp_path.iterdir()) == [tmp_path / "results"]  # the stores were removed
