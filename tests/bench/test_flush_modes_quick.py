"""The flush-mode benchmark's --quick mode runs end to end and writes every row, target and plot.

Speed is not asserted (tests never assert on timings): only that every expected row is there with positive
numbers and that each target was evaluated.
"""

from __future__ import annotations

import json

from tests.bench.quick import run_quick

BODIES = {100: "100 B", 1024: "1 KB", 16384: "16 KB"}
PRODUCERS = (1, 4, 16, 64)
PEER_ENGINES = ("mqstore", "sqlite3 WAL", "lmdb", "rocksdict")


def _positive(row: dict, *fields: str) -> None:
    for name in fields:
        assert isinstance(row.get(name), (int, float)) and row[name] > 0, (name, row)


def test_flush_modes_quick_writes_every_row(tmp_path):
    completed = run_quick("flush_modes.py", "--out-dir", str(tmp_path))
    result = json.loads((tmp_path / "flush_modes_quick.json").read_text())
    rows = {row["name"]: row for row in result["rows"]}
    assert len(rows) == len(result["rows"]), "row names are unique"

    for size, label in BODIES.items():
        for mode in ("SYNC", "ASYNC"):
            for producers in PRODUCERS:
                name = f"{mode} {label}, {producers} producer{'s' if producers > 1 else ''}"
                assert name in rows, name
                row = rows[name]
                assert (row["mode"], row["body_bytes"], row["producers"]) == (mode, size, producers)
                _positive(row, "count", "msgs_per_s", "mb_per_s", "p50_us", "p99_us", "p999_us", "max_us")
                assert row["flush_disk_timeouts"] >= 0 and row["other_statuses"] == {}
            for producers in (1, 64):  # the same cells with dispatch_process=True
                name = f"{mode} {label}, {producers} producer{'s' if producers > 1 else ''}, dispatch process"
                assert name in rows, name
                row = rows[name]
                assert (row["mode"], row["body_bytes"], row["dispatch_process"]) == \
                    (f"{mode}, dispatch process", size, True)
                _positive(row, "count", "msgs_per_s", "mb_per_s", "p50_us", "p99_us", "max_us")
                assert row["other_statuses"] == {}

    rolling = [row for row in result["rows"] if row["section"] == "rolling"]
    assert sorted((row["body_bytes"], row["warm_segments"], row["write_fault_readahead"], row["dispatch_process"])
                  for row in rolling) == [(body, *variant) for body in (1024, 16384) for variant in (
                      (False, False, False), (False, False, True), (False, True, False), (True, True, False))]
    for row in rolling:
        _positive(row, "msgs_per_s", "mb_per_s", "max_us", "roll_count", "roll_max_us", "first_roll_us")

    copies = [row for row in result["rows"] if row["section"] == "write_buffer"]
    assert [row["name"][:3] for row in copies] == ["(a)", "(b)", "(c)"]
    for row in copies:
        _positive(row, "gb_per_s")

    for label in ("100 B", "1 KB", "16 KB", "1024 KB"):
        _positive(rows[f"pwrite+fdatasync loop, {label}"], "ops_per_s", "mb_per_s", "p50_us", "p99_us")
    _positive(rows["fdatasync latency, 1 KB overwrite of a written block"], "p50_us", "p99_us")
    for label in ("100 B", "1 KB", "16 KB"):
        for threads in (1, 64):
            bare = rows[f"bare group commit in CPython, {label}, {threads} thread{'s' if threads > 1 else ''}"]
            _positive(bare, "ops_per_s", "mb_per_s", "p50_us", "p99_us")
            assert bare["threads"] == threads
    _positive(rows["Python thread wake-up round trip (two lock handoffs)"], "ops_per_s", "p50_us", "p99_us")
    _positive(rows["mmap copy+msync loop, 1 KB"], "ops_per_s")
    gil = next(row for row in result["rows"] if row["name"].startswith("mmap.flush (msync)"))
    _positive(gil, "flush_ms", "other_thread_stall_ms")

    peers = [row for row in result["rows"] if row["section"] == "peers"]
    assert {(row["engine"], row["durability"], row["batch"]) for row in peers} == {
        (engine, durability, batch) for engine in PEER_ENGINES for durability in ("sync", "async")
        for batch in (1, 1000)}
    for row in peers:
        _positive(row, "count", "msgs_per_s", "mb_per_s", "p50_us", "p99_us")
        assert row["not_ok"] == 0, row

    goals = result["targets"]
    assert len(goals) == 32  # SYNC and ASYNC throughput targets twice (thread, dispatch process); the eight
    # rolling rows have two each: any put, and the rolling puts
    assert all(isinstance(goal["met"], bool) and goal["value"] >= 0 for goal in goals)
    assert "## Targets" in completed.stdout

    for suffix in (".md", "_throughput.png", "_latency.png"):
        path = tmp_path / f"flush_modes_quick{suffix}"
        assert path.stat().st_size > 0, path
    assert (tmp_path / "flush_modes_quick_throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flush_modes_sync_quick_writes_the_sync_rows_and_targets(tmp_path):
    """--sync --quick: the raw loop, the store's SYNC cells with both flush paths, the bare group commit and ASYNC 100 B
    (RocketMQ's rows are left out of --quick: each starts a JVM)."""
    completed = run_quick("flush_modes.py", "--sync", "--out-dir", str(tmp_path))
    result = json.loads((tmp_path / "flush_modes_sync_quick.json").read_text())
    rows = {row["name"]: row for row in result["rows"]}
    assert len(rows) == len(result["rows"]), "row names are unique"
    for label in ("100 B", "1 KB"):
        _positive(rows[f"pwrite+fdatasync loop, {label}"], "ops_per_s", "p50_us")
        _positive(rows[f"bare group commit in CPython, {label}, 64 threads"], "ops_per_s", "p50_us")
        for producers in (1, 8, 64):
            for suffix in ("", ", pure-Python flush path"):
                row = rows[f"SYNC {label}, {producers} producer{'s' if producers > 1 else ''}{suffix}"]
                _positive(row, "count", "msgs_per_s", "p50_us", "p99_us", "commitlog_flushes")
                assert row["producers"] == producers and row["other_statuses"] == {}
    _positive(rows["ASYNC 100 B, 1 producer"], "count", "p99_us")
    assert not [row for row in result["rows"] if row["section"] == "rocketmq"]
    goals = result["targets"]
    assert len(goals) == 5  # SYNC vs raw at two sizes with both flush paths, and the ASYNC p99
    assert all(isinstance(goal["met"], bool) and goal["value"] >= 0 for goal in goals)
    assert "## Targets" in completed.stdout


def test_flush_modes_peers_quick_compares_sync_batches(tmp_path):
    """--peers: the SYNC put_batch of 1000 x 1 KB and each peer's batch at the same durability, with the raw
    pwrite+fdatasync loop of the batch's bytes, and mqstore's ratio to each."""
    completed = run_quick("flush_modes.py", "--peers", "--out-dir", str(tmp_path))
    result = json.loads((tmp_path / "flush_modes_peers_quick.json").read_text())
    names = [row["name"] for row in result["rows"]]
    assert names == ["pwrite+fdatasync loop, 1000 KB", "mqstore SYNC, 1000 msgs/put_batch",
                     "sqlite3 WAL synchronous=FULL, 1000 msgs/txn", "lmdb sync=True, 1000 msgs/txn",
                     "rocksdict WriteOptions.sync=True, 1000 msgs/write"]
    for row in result["rows"][1:]:
        assert row["durability"] == "sync" and row["batch"] == 1000 and row.get("not_ok", 0) == 0, row
        _positive(row, "count", "msgs_per_s", "mb_per_s", "p99_us")
    assert sorted(result["mqstore_vs"]) == sorted(names[2:])
    assert all(ratio > 0 for ratio in result["mqstore_vs"].values()) and result["mqstore_vs_raw_loop"] > 0
    assert "mqstore vs" in completed.stdout
