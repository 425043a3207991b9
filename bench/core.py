"""Issue 21's targets in one run: every benchmark that measures one, in turn, then one table of them all.

    .venv/bin/python bench/core.py              # the full run (about 15 minutes), then results/core.json
    .venv/bin/python bench/core.py --compose    # only the table, from the result files already there

Runs, one after the other on the same machine, each with its own baselines measured in its own run (RocketMQ
4.4.0's store through `rmq`, the peers, the machine's limits):
  bench/native.py              put, put_batch and get against RocketMQ's putMessage and the memcpy limits
  bench/native_scan.py         dispatch, the recovery walk with CRC against RocketMQ's load(), store.scan()
  bench/flush_modes.py --sync  SYNC puts against the raw pwrite+fdatasync loop and RocketMQ's SYNC puts; ASYNC p99
  bench/flush_modes.py --peers SYNC put_batch against lmdb, rocksdict and sqlite3 at equal durability
  bench/spark_read.py          Spark's full scan of a store against Spark's own Parquet reader
Each writes its own result file (bench/results/); this script then reads them and writes results/core.json: one
row per target, what was measured, the reference it is held against, and whether it is met. bench/report.py
renders that table in bench/README.md and README.md. A benchmark that fails leaves its row saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RUNS = (  # (result file, command line after the interpreter)
    ("native.json", ["bench/native.py"]),
    ("native_scan.json", ["bench/native_scan.py"]),
    ("flush_modes_sync.json", ["bench/flush_modes.py", "--sync"]),
    ("flush_modes_peers.json", ["bench/flush_modes.py", "--peers"]),
    ("spark_read.json", ["bench/spark_read.py"]),
)


def load(name: str) -> dict | None:
    try:
        with open(os.path.join(RESULTS, name), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def row(target: str, measured, reference, value, threshold, *, higher_is_better: bool = True, source: str,
        unit: str = "") -> dict:
    """One target's row; `value` is held against `threshold` (None when the run lacks it)."""
    met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    return {"target": target, "measured": measured, "reference": reference, "value": value, "threshold": threshold,
            "unit": unit, "met": met, "source": source}


def _native_row(data: dict, case: str) -> dict | None:
    return next((r for r in data.get("rows", []) if r.get("case") == case), None)


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k" if value >= 1e4 else f"{value:,.0f}"


def native_rows(data: dict | None) -> list[dict]:
    source = "native.json"
    if data is None:
        return [row("put, put_batch, get", "no result", "-", None, 1.0, source=source)]
    rows = []
    for case, label in (("put 100 B", "put 100 B, ASYNC, 1 thread"), ("put 1000 B", "put 1 KB, ASYNC, 1 thread"),
                        ("put 100 B, index, tag+key", "put 100 B with a tag and a key, index on (RocketMQ's shape)"),
                        ("put 1000 B, index, tag+key", "put 1 KB with a tag and a key, index on (RocketMQ's shape)")):
        found = _native_row(data, case)
        if found is None and "index" in case:
            continue  # a result file from before these rows
        mine = (found.get("native") or {}).get("msgs_per_s")
        theirs = (found.get("rocketmq") or {}).get("msgs_per_s")
        rows.append(row(f"{label} >= 1.0x RocketMQ 4.4.0 putMessage", f"{_rate(mine)} msgs/s",
                        f"RocketMQ {_rate(theirs)} msgs/s", mine / theirs if mine and theirs else None, 1.0,
                        source=source, unit="x"))
    warm = next((r for r in data.get("rows", []) if str(r.get("case", "")).startswith("put_batch")
                 and "warm" in r["case"]), None) or {}
    limits = data.get("limits") or {}
    mb = (warm.get("native") or {}).get("mb_per_s")
    memcpy = limits.get("memcpy_prefaulted_gb_per_s")
    rows.append(row("put_batch 1 KB x1000, warm segments >= 1.5 GB/s", f"{mb / 1000:.2f} GB/s" if mb else "-",
                    f"memcpy into pre-faulted pages {memcpy:.1f} GB/s" if memcpy else "-",
                    mb / 1000 if mb else None, 1.5, source=source, unit="GB/s"))
    got = (_native_row(data, "get 100 B, 32 per call") or {}).get("native", {}).get("msgs_per_s")
    rows.append(row("get 100 B, 32 a call >= 1M msgs/s", f"{_rate(got)} msgs/s", "-", got and got / 1e6, 1.0,
                    source=source, unit="M/s"))
    return rows


def native_scan_rows(data: dict | None) -> list[dict]:
    source = "native_scan.json"
    if data is None:
        return [row("dispatch, recovery walk, store.scan()", "no result", "-", None, 1.0, source=source)]
    native = next((r for r in data.get("rows", []) if r.get("codec") == "native"), {})
    load_ = ((data.get("reference") or {}).get("rocketmq_load") or {}).get("gb_per_s")
    walk = native.get("walk_crc_gb_per_s")
    pairs = (("dispatch to ConsumeQueues >= 5M msgs/s", "dispatch_cq_msgs_per_s", 5e6, "-"),
             ("dispatch with the index >= 2M msgs/s", "dispatch_cq_index_msgs_per_s", 2e6, "-"),
             ("store.scan() to Arrow >= 5M rows/s", "scan_rows_per_s", 5e6, "-"))
    rows = [row(target, f"{_rate(native.get(key))}/s", reference, native.get(key) and native[key] / 1e6,
                threshold / 1e6, source=source, unit="M/s") for target, key, threshold, reference in pairs]
    rows.insert(2, row("recovery walk with CRC >= 4 GB/s", f"{walk:.2f} GB/s" if walk else "-",
                       f"RocketMQ 4.4.0 load() {load_:.2f} GB/s" if load_ else "-", walk, 4.0, source=source,
                       unit="GB/s"))
    return rows


def sync_rows(data: dict | None) -> list[dict]:
    source = "flush_modes_sync.json"
    if data is None:
        return [row("SYNC puts, ASYNC p99", "no result", "-", None, 1.0, source=source)]
    rows = []
    for target in data.get("targets", []):
        if "pure-Python" in target["target"]:
            continue  # the same targets through MQSTORE_NATIVE=0's flush path: in bench/README.md
        lower = "p99" in target["target"]
        rows.append(row(target["target"], target.get("detail", ""), "in the same run", target.get("value"),
                        target.get("threshold"), higher_is_better=not lower, source=source))
    return rows


def peer_rows(data: dict | None) -> list[dict]:
    source = "flush_modes_peers.json"
    if data is None:
        return [row("SYNC put_batch ahead of lmdb, rocksdict, sqlite3", "no result", "-", None, 1.0, source=source)]
    against = data.get("mqstore_vs") or {}
    worst = min(against.items(), key=lambda item: item[1]) if against else None
    mine = next((r for r in data.get("rows", []) if r.get("name", "").startswith("mqstore")), {})
    return [row("SYNC put_batch 1 KB x1000 ahead of lmdb, rocksdict, sqlite3 (fdatasync a batch)",
                f"{_rate(mine.get('msgs_per_s'))} msgs/s",
                ", ".join(f"{name.split(' ')[0]} {ratio:.2f}x" for name, ratio in sorted(against.items())),
                worst[1] if worst else None, 1.0, source=source, unit="x")]


def spark_rows(data: dict | None) -> list[dict]:
    source = "spark_read.json"
    kinds = (("full scan", "full_scan", 1.5), ("group-by topic", "group_by_topic", 1.0),
             ("topic+queue filter", "topic_queue_filter", 2.0))
    if data is None:
        return [row(f"Spark {kind} >= {target:.1f}x Spark's Parquet reader", "no result", "-", None, target,
                    source=source) for kind, _, target in kinds]
    summary = data.get("summary") or {}
    rows = {r.get("name"): r for r in data.get("results", [])}
    master = (data.get("settings") or {}).get("master", "")
    found = []
    for kind, key, target in kinds:
        mine, parquet = rows.get(f"{kind}: commitlog", {}), rows.get(f"{kind}: parquet", {})
        found.append(row(f"Spark {kind}, user-shaped 100 B rows, {master} >= {target:.1f}x Spark's Parquet reader",
                         f"{_rate(mine.get('rows_per_s'))} rows/s",
                         f"Parquet {_rate(parquet.get('rows_per_s'))} rows/s",
                         summary.get(f"{key}_commitlog_vs_parquet"), summary.get(f"{key}_target_vs_parquet", target),
                         source=source, unit="x"))
    return found


def compose(runs: list[dict]) -> dict:
    rows = (native_rows(load("native.json")) + native_scan_rows(load("native_scan.json"))
            + sync_rows(load("flush_modes_sync.json")) + peer_rows(load("flush_modes_peers.json"))
            + spark_rows(load("spark_read.json")))
    dates = {name: (load(name) or {}).get("date_utc") or (load(name) or {}).get("date") for name, _ in RUNS}
    return {"command": "bench/core.py", "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "runs": runs,
            "result_dates": dates, "rows": rows,
            "met": sum(1 for r in rows if r["met"]), "not_met": sum(1 for r in rows if r["met"] is False)}


def run_all() -> list[dict]:
    runs = []
    root = os.path.dirname(HERE)
    for name, command in RUNS:
        began = time.time()
        load_before = os.getloadavg()[0]
        print(f"== {' '.join(command)}", flush=True)
        code = subprocess.call([sys.executable, *command], cwd=root)
        runs.append({"command": " ".join(command), "result": name, "exit": code,
                     "started_utc": time.strftime("%H:%M", time.gmtime(began)),
                     "seconds": round(time.time() - began, 1), "load_average_1min_before": load_before})
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", action="store_true", help="only the table, from the result files there")
    args = parser.parse_args(argv)
    previous = load("core.json") or {}
    runs = previous.get("runs", []) if args.compose else run_all()
    result = compose(runs)
    with open(os.path.join(RESULTS, "core.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    for r in result["rows"]:
        verdict = {True: "met", False: "NOT met", None: "no figure"}[r["met"]]
        print(f"{verdict:>9}  {r['target']}: {r['measured']} ({r['reference']})")
    return 1 if any(run["exit"] for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
