"""The cold-get benchmark's --quick mode runs end to end: every cold read returned the messages local disk held
(the benchmark checks each call and fails otherwise), each cold read cost one range read per tier object it
touched and no cache hit, the warm get none; timings are not asserted."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

COLD = ["get 1", "get 32", "read_at", "query", "get 32, object not open"]
ENDPOINT = ["GET same range", "GET 256 KiB", "GET 1 byte", "HEAD + GET 1 byte"]


def test_tier_get_quick_cold_gets_are_one_range_read(tmp_path):
    out = tmp_path / "tier_get.json"
    run_quick("tier_get.py", "--out", str(out))
    result = json.loads(out.read_text())
    shape = result["shape"]
    assert result["segments"] >= 4 and result["offload"]["local_min_offset"] == result["log_end"]
    assert result["offload"]["segments_removed"] >= result["segments"] - 1  # everything read is in the tier only
    assert list(result["endpoints"]) == ["file://", "S3 (moto)"]
    for name, found in result["endpoints"].items():
        rows = found["rows"]
        assert sorted(rows) == sorted(COLD + ENDPOINT + ["get 32, warm"])
        assert all(row["samples"] == shape["samples"] and row["p50_ms"] > 0 for row in rows.values())
        for row in ("get 1", "read_at", "query"):  # one record: one range read, its object already open
            assert rows[row]["range_reads"]["min"] == rows[row]["range_reads"]["max"] == 1, (name, row)
            assert rows[row]["objects_opened"]["total"] == 0 and rows[row]["block_hits"]["total"] == 0
        for run in result["samples"][name]:  # per row, a list per figure
            get, replay, closed = run["get 32"], run["GET same range"], run["get 32, object not open"]
            # 32 messages: one range read per object they lie in (two near an object's end)
            assert get["range_reads"] == replay["requests"] == replay["objects"], run
            assert set(get["range_reads"]) <= {1, 2} and set(get["block_hits"] + get["objects_opened"]) == {0}
            assert closed["objects_opened"] == closed["range_reads"]  # handles closed: each object opened again
            assert set(run["get 32, warm"]["range_reads"]) == {0} and len(get["s"]) == shape["samples"]
        assert set(found["ratios"]) == {f"{row} / {reference}" for row in COLD
                                        for reference in ("GET same range", "GET 256 KiB")}
    table = (tmp_path / "tier_get.md").read_text()
    assert table.count("| file:// |") == table.count("| S3 (moto) |") == len(COLD + ENDPOINT) + 1
