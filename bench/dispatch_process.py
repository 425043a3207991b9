"""Dispatch in a thread or in a process of its own (`StoreConfig.dispatch_process`): what one producer gets.

    .venv/bin/python bench/dispatch_process.py            # full run (about 2 minutes)
    .venv/bin/python bench/dispatch_process.py --quick    # smoke run (a few seconds)

The same puts two ways, the ways taking turns for ROUNDS rounds, each run in a fresh interpreter on a fresh
store (store defaults otherwise, index on): `thread` (dispatch_process=False) and `process`
(dispatch_process=True). The cells: `put` of single messages (100 B and 1 KB, ASYNC and SYNC) and `put_batch`
of 1000 messages of 1 KB (ASYNC and SYNC). Per run: messages a second while the producer loops, p99 and max
latency of a call, calls over 5 ms, how long dispatch then needs to catch up (`wait_dispatched`: the dispatch
lag when the producer stops), and the rate counting that catch-up; every message must be dispatched (checked:
the queues hold every message). In the same run, the raw pwrite+fdatasync loop for the SYNC sizes.

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

CELLS = (("put", "ASYNC", 100), ("put", "ASYNC", 1024), ("put", "SYNC", 100), ("put", "SYNC", 1024),
         ("put_batch", "ASYNC", 1024), ("put_batch", "SYNC", 1024))  # (call, flush, body bytes)
BATCH_MESSAGES = 1000  # messages per put_batch call
MODES = ("thread", "process")
ROUNDS = 3
SECONDS = 3.0
QUEUES = 8


def cell(call: str, mode: str, flush: str, body_bytes: int, seconds: float, directory: str) -> dict:
    """One run of one producer's puts (`put` or `put_batch`), in a fresh interpreter."""
    from mqstore import FlushMode, Message, MessageStore, StoreConfig

    root = tempfile.mkdtemp(dir=directory)
    try:
        store = MessageStore.open(os.path.join(root, "store"),
                                  StoreConfig(flush_mode=FlushMode[flush], dispatch_process=mode == "process"))
        store.put(Message("BenchTopic", b"first", queue_id=0))
        latencies, count = _produce(store, call, body_bytes, seconds)
        caught_up_at = time.perf_counter()
        assert store.wait_dispatched(600)
        catch_up_s = time.perf_counter() - caught_up_at
        dispatched = sum(store.max_offset("BenchTopic", queue_id) for queue_id in range(QUEUES)) - 1  # the first
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    latencies.sort()
    return {"call": call, "mode": mode, "flush": flush, "body_bytes": body_bytes, "puts": count,
            "dispatched": dispatched,
            "puts_per_s": count / seconds, "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
            "max_ms": latencies[-1] * 1e3, "over_5ms": sum(1 for value in latencies if value > 0.005),
            "catch_up_s": catch_up_s, "puts_per_s_with_catch_up": count / (seconds + catch_up_s)}


def _produce(store, call: str, body_bytes: int, seconds: float) -> tuple[list[float], int]:
    """(latency of every call, messages stored): one producer calling `call` flat out for `seconds`."""
    from mqstore import Message

    clock = time.perf_counter
    latencies = []
    count = 0
    if call == "put":
        messages = [Message("BenchTopic", os.urandom(body_bytes), queue_id=i % QUEUES) for i in range(64)]
        put = store.put
    else:
        batch = [Message("BenchTopic", os.urandom(body_bytes), queue_id=i % QUEUES) for i in range(BATCH_MESSAGES)]
        put_batch = store.put_batch
    end = clock() + seconds
    while True:
        before = clock()
        if before > end:
            break
        if call == "put":
            put(messages[count & 63])
            count += 1
        else:
            put_batch(batch)
            count += BATCH_MESSAGES
        latencies.append(clock() - before)
    return latencies, count


def _run_cell(call: str, mode: str, flush: str, body_bytes: int, seconds: float, directory: str) -> dict:
    completed = subprocess.run([sys.executable, os.path.abspath(__file__), "--cell", call, mode, flush,
                                str(body_bytes), str(seconds), directory], capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"cell {call} {mode} {flush} {body_bytes} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict], raws: dict[int, list[float]]) -> list[dict]:
    rows = []
    for call, flush, body_bytes in CELLS:
        for mode in MODES:
            mine = [run for run in runs
                    if (run["call"], run["mode"], run["flush"], run["body_bytes"]) == (call, mode, flush, body_bytes)]
            row = {"call": call, "flush": flush, "body_bytes": body_bytes, "mode": mode, "runs": len(mine)}
            for key in ("puts_per_s", "puts_per_s_with_catch_up", "p99_us", "max_ms", "over_5ms", "catch_up_s"):
                row[key] = statistics.median(run[key] for run in mine)
            if flush == "SYNC" and call == "put":  # one fdatasync a put at most, as the raw loop
                row["share_of_raw_loop"] = row["puts_per_s"] / statistics.median(raws[body_bytes])
            rows.append(row)
    return rows


def _markdown(result: dict) -> str:
    lines = [
        "# Dispatch in a thread or in a process of its own (`dispatch_process`)", "",
        f"`{result['command']}`, {result['date_utc']} UTC, {result['cores']} cores, Python {result['python']}; "
        f"{result['rounds']} round(s) of {result['seconds_per_run']} s per run, the ways taking turns; medians; "
        f"load average (1 min) {result['load_average_1m'][0]:.2f} at the start, {result['load_average_1m'][1]:.2f} "
        f"at the end. put_batch: {BATCH_MESSAGES} messages a call; latencies are per call.", "",
        "| call | flush | body | dispatch | msgs/s | msgs/s with catch-up | catch-up s | p99 us | max ms "
        "| calls > 5 ms | share of raw loop |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        share = f"{row['share_of_raw_loop']:.0%}" if "share_of_raw_loop" in row else ""
        lines.append(f"| {row['call']} | {row['flush']} | {row['body_bytes']} B | {row['mode']} | "
                     f"{row['puts_per_s']:,.0f} | "
                     f"{row['puts_per_s_with_catch_up']:,.0f} | {row['catch_up_s']:.2f} | {row['p99_us']:,.0f} | "
                     f"{row['max_ms']:.1f} | {row['over_5ms']:.0f} | {share} |")
    raws = ", ".join(f"{size} B: {statistics.median(values):,.0f}/s" for size, values in result["raw_loop"].items())
    lines += ["", f"Raw pwrite+fdatasync loop (median of the rounds): {raws}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path (the .md goes beside it)")
    parser.add_argument("--cell", nargs=6, metavar=("CALL", "MODE", "FLUSH", "BODY", "SECONDS", "DIR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        call, mode, flush, body, seconds, directory = args.cell
        print(json.dumps(cell(call, mode, flush, int(body), float(seconds), directory)))
        return 0
    rounds, seconds = (1, 0.5) if args.quick else (ROUNDS, SECONDS)
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "dispatch_process_quick.json" if args.quick else "dispatch_process.json")
    directory = tempfile.mkdtemp(prefix="mqstore-dispatch-process-")
    started = time.time()
    runs: list[dict] = []
    raws: dict[int, list[float]] = {size: [] for _, flush, size in CELLS if flush == "SYNC"}
    load_before = os.getloadavg()[0]
    try:
        for round_ in range(rounds):
            for call, flush, body_bytes in CELLS:
                for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                    run = _run_cell(call, mode, flush, body_bytes, seconds, directory)
                    run["round"] = round_
                    runs.append(run)
                    print(f"round {round_ + 1}/{rounds} {call} {flush} {body_bytes} B {mode}: "
                          f"{run['puts_per_s']:,.0f} msgs/s, p99 {run['p99_us']:,.0f} us, catch-up "
                          f"{run['catch_up_s']:.2f} s", flush=True)
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
              "seconds": round(time.time() - started, 1), "load_average_1m": [load_before, os.getloadavg()[0]],
              "raw_loop": raws, "runs": runs,
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
