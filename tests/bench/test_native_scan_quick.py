"""The native-scan benchmark's --quick mode runs end to end and writes a row per codec with positive numbers.

Speed is not asserted (tests never assert on timings): only that each codec's row is there with its figures.
"""

from __future__ import annotations

import json

from mqstore.commitlog.native import NATIVE

from tests.bench.quick import run_quick

FIELDS = ("dispatch_cq_msgs_per_s", "dispatch_cq_index_msgs_per_s", "walk_crc_gb_per_s", "scan_rows_per_s",
          "scan_topic_two_columns_rows_per_s")


def test_native_scan_quick_writes_a_row_per_codec(tmp_path):
    out = tmp_path / "native_scan.json"
    run_quick("native_scan.py", "--messages", "20000", "--out", str(out))
    result = json.loads(out.read_text())
    codecs = [row["codec"] for row in result["rows"]]
    assert codecs == ["python"] + (["native"] if NATIVE is not None else [])
    for row in result["rows"]:
        assert all(row[field] > 0 for field in FIELDS), row
        assert row["scan_rows"] == 20000 and row["scanned_bytes"] == result["log_bytes"]
    assert result["reference"]["zlib_crc32_gb_per_s"] > 0 and result["command"].startswith("bench/native_scan.py")
