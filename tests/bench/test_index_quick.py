"""The index benchmark's --quick mode runs end to end and writes every row with positive numbers.

Speed is not asserted (tests never assert on timings): only that each expected row is there, that each of
its numbers is positive, and that the build target was evaluated.
"""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

# Each expected row (by the start of its case name) and the numbers it must hold.
EXPECTED_ROWS = {
    "baseline: index_key_hashes only": ("count", "keys_per_s"),
    "IndexService.put_keys, 16,384 keys/call": ("count", "keys_per_s"),
    "IndexService.put_keys, 2 keys/call": ("count", "keys_per_s"),
    "IndexService.put_keys, 256 keys/call": ("count", "keys_per_s"),
    "baseline: index_key_hash, one key": ("count", "p50_us", "p99_us"),
    "IndexService.query hit": ("count", "p50_us", "p99_us"),
    "IndexService.query miss": ("count", "p50_us", "p99_us"),
    "store build: put_batch": ("count", "msgs_per_s", "msgs_per_s_dispatched"),
    "parse_records, decode only": ("count", "msgs_per_s"),
    "IndexDispatcher.dispatch, real batches": ("count", "keys_per_s", "msgs_per_s"),
    "baseline: store.read_at": ("count", "p50_us", "p99_us"),
    "store.query(topic, KEYS key) hit": ("count", "p50_us", "p99_us"),
    "store.query miss": ("count", "p50_us", "p99_us"),
    "store.get_by_unique_key": ("count", "p50_us", "p99_us"),
    "store.get_by_msg_id": ("count", "p50_us", "p99_us"),
    "store rebuild (dispatch), index off": ("count", "msgs_per_s"),
    "store rebuild (dispatch), index on": ("count", "msgs_per_s"),
    "put 100 B, 1 thread, index off": ("count", "msgs_per_s", "msgs_per_s_dispatched"),
    "put 100 B, 1 thread, index on": ("count", "msgs_per_s", "msgs_per_s_dispatched"),
}


def test_index_quick_writes_every_row(tmp_path):
    out = tmp_path / "results" / "index.json"
    completed = run_quick("index.py", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["command"] == "bench/index.py --quick"
    rows = result["rows"]
    for prefix, fields in EXPECTED_ROWS.items():
        matching = [row for row in rows if row["case"].startswith(prefix)]
        assert len(matching) == 1, (prefix, [row["case"] for row in rows])
        for name in fields:
            assert isinstance(matching[0].get(name), (int, float)) and matching[0][name] > 0, (name, matching[0])
    assert len(rows) == len(EXPECTED_ROWS)
    for row in rows:
        for name, value in row.items():
            if name != "case":
                assert isinstance(value, (int, float)) and value > 0, (name, row)
    targets = result["targets"]
    assert isinstance(targets["put_keys_met"], bool) and isinstance(targets["dispatcher_met"], bool)
    assert targets["put_keys_keys_per_s"] > 0 and targets["dispatcher_keys_per_s"] > 0
    assert "targets: build >= 500,000 keys/s" in completed.stdout
