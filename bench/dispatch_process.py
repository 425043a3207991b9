"""Dispatch in a thread or in a process of its own (`StoreConfig.dispatch_process`): what one producer gets.

    .venv/bin/python bench/dispatch_process.py            # full run (about 2 minutes)
    .venv/bin/python bench/dispatch_process.py --quick    # smoke run (a few seconds)

The same puts two ways, the ways taking turns for ROUNDS rounds, each run in a fresh interpreter on a fresh
store (store defaults otherwise, index on): `thread` (dispatch_process=False, the default) and `process`
(dispatch_process=True). Per run: puts a second while the producer loops, p99 and max put latency, puts over
5 ms, how long dispatch then needs to catch up (`wait_dispatched`), and the rate counting that catch-up; every
put must be dispatched (checked: the queues hold every message). In the same run, the raw pwrite+fdatasync loop
for the SYNC sizes.

Until session 8 this was a probe of the design, with a child of its own made from the store's parts (see
bench/README.md); the figures in bench/README.md say which run measured what.

Writes bench/results/dispatch_process.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from flush_modes import sync_loop  # noqa: E402 - the raw pwrite+fdatasync loop, as flush_modes measures it

CELLS = (("ASYNC", 1024), ("SYNC", 100), ("SYNC", 1024))
MODES = ("thread", "process")
ROUNDS = 3
SECONDS = 3.0
QUEUES = 8


def cell(mode: str, flush: str, body_bytes: int, seconds: float, directory: str) -> dict:
    """One run of one producer's puts, in a fresh interpreter."""
    from mqstore import FlushMode, Message, MessageStore, StoreConfig

    root = tempfile.mkdtemp(dir=directory)
    try:
        store = MessageStore.open(os.path.join(root, "store"),
                                  StoreConfig(flush_mode=FlushMode[flush], dispatch_process=mode == "process"))
        messages = [Message("BenchTopic", os.urandom(body_bytes), queue_id=i % QUEUES) for i in range(64)]
        store.put(Message("BenchTopic", b"first", queue_id=0))
        clock = time.perf_counter
        latencies = []
        count = 0
        put = store.put
        started = clock()
        end = started + seconds
        while True:
            before = clock()
            if before > end:
                break
            put(messages[count & 63])
            latencies.append(clock() - before)
            count += 1
        caught_up_at = clock()
        assert store.wait_dispatched(600)
        catch_up_s = clock() - caught_up_at
        dispatched = sum(store.max_offset("BenchTopic", queue_id) for queue_id in range(QUEUES)) - 1  # the first
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    latencies.sort()
    return {"mode": mode, "flush": flush, "body_bytes": body_bytes, "puts": count, "dispatched": dispatched,
            "puts_per_s": count / seconds, "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
            "max_ms": latencies[-1] * 1e3, "over_5ms": sum(1 for value in latencies if value > 0.005),
            "catch_up_s": catch_up_s, "puts_per_s_with_catch_up": count / (seconds + catch_up_s)}


def _run_cell(mode: str, flush: str, body_bytes: int, seconds: float, directory: str) -> dict:
    completed = subprocess.run([sys.executable, os.path.abspath(__file__), "--cell", mode, flush, str(body_bytes),
                                str(seconds), directory], capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"cell {mode} {flush} {body_bytes} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict], raws: dict[int, list[float]]) -> list[dict]:
    rows = []
    for flush, body_bytes in CELLS:
        for mode in MODES:
            mine = [run for run in runs if (run["mode"], run["flush"], run["body_bytes"]) == (mode, flush, body_bytes)]
            row = {"flush": flush, "body_bytes": body_bytes, "mode": mode, "runs": len(mine)}
            for key in ("puts_per_s", "puts_per_s_with_catch_up", "p99_us", "max_ms", "over_5ms", "catch_up_s"):
                row[key] = statistics.median(run[key] for run in mine)
            if flush == "SYNC":
                row["share_of_raw_loop"] = row["puts_per_s"] / statistics.median(raws[body_bytes])
            rows.append(row)
    return rows


def _markdown(result: dict) -> str:
    lines = [
        "# Dispatch in a thread or in a process of its own (`dispatch_process`)", "",
        f"`{result['command']}`, {result['date_utc']} UTC, {result['cores']} cores, Python {result['python']}; "
        f"{result['rounds']} round(s) of {result['seconds_per_run']} s per run, the ways taking turns; medians.", "",
        "| flush | body | dispatch | puts/s | puts/s with catch-up | catch-up s | p99 us | max ms | puts > 5 ms | "
        "share of raw loop |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        share = f"{row['share_of_raw_loop']:.0%}" if "share_of_raw_loop" in row else ""
        lines.append(f"| {row['flush']} | {row['body_bytes']} B | {row['mode']} | {row['puts_per_s']:,.0f} | "
                     f"{row['puts_per_s_with_catch_up']:,.0f} | {row['catch_up_s']:.2f} | {row['p99_us']:,.0f} | "
                     f"{row['max_ms']:.1f} | {row['over_5ms']:.0f} | {share} |")
    raws = ", ".join(f"{size} B: {statistics.median(values):,.0f}/s" for size, values in result["raw_loop"].items())
    lines += ["", f"Raw pwrite+fdatasync loop (median of the rounds): {raws}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path (the .md goes beside it)")
    parser.add_argument("--cell", nargs=5, metavar=("MODE", "FLUSH", "BODY", "SECONDS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        mode, flush, body, seconds, directory = args.cell
        print(json.dumps(cell(mode, flush, int(body), float(seconds), directory)))
        return 0
    rounds, seconds = (1, 0.5) if args.quick else (ROUNDS, SECONDS)
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "dispatch_process_quick.json" if args.quick else "dispatch_process.json")
    directory = tempfile.mkdtemp(prefix="mqstore-dispatch-process-")
    started = time.time()
    runs: list[dict] = []
    raws: dict[int, list[float]] = {size: [] for flush, size in CELLS if flush == "SYNC"}
    try:
        for round_ in range(rounds):
            for flush, body_bytes in CELLS:
                for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                    run = _run_cell(mode, flush, body_bytes, seconds, directory)
                    run["round"] = round_
                    runs.append(run)
                    print(f"round {round_ + 1}/{rounds} {flush} {body_bytes} B {mode}: {run['puts_per_s']:,.0f} "
                          f"puts/s, p99 {run['p99_us']:,.0f} us, catch-up {run['catch_up_s']:.2f} s", flush=True)
            for size in raws:
                raws[size].append(sync_loop(directory, size, min(seconds, 2.0))[0]["ops_per_s"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    for run in runs:
        if run["dispatched"] != run["puts"]:
            raise RuntimeError(f"dispatch missed records: {run}")
    result = {"command": "bench/dispatch_process.py" + (" --quick" if args.quick else ""),
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), "cores": os.cpu_count(),
              "python": platform.python_version(), "rounds": rounds, "seconds_per_run": seconds,
              "seconds": round(time.time() - started, 1), "raw_loop": raws, "runs": runs,
              "rows": _summary(runs, raws)}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1)
    markdown = _markdown(result)
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
