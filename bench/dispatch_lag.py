"""How far dispatch falls behind one producer putting flat out, and what bounding it (max_dispatch_lag_bytes) costs.

    .venv/bin/python bench/dispatch_lag.py            # full run (about 40 s)
    .venv/bin/python bench/dispatch_lag.py --quick    # smoke run (a few seconds)

ASYNC puts of 1 KB bodies from one thread for a fixed time, dispatch in the writer's thread
(dispatch_process=False: the lag the bound is for), store defaults otherwise (index on), for each
max_dispatch_lag_bytes in LIMITS, the settings taking turns for ROUNDS rounds. Per row: puts a second during
the loop, the share of them dispatched (visible to get()) when the loop ends, the largest lag seen (sampled
every SAMPLE_EVERY puts), how long dispatch then takes to catch up, puts a second counting that catch-up, and
the puts over 5 ms. The baseline is the unbounded row of the same round: the bound moves dispatch work into
the producer's time, so the figure to compare is "puts/s with catch-up".

Writes bench/results/dispatch_lag.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mqstore import Message, MessageStore, StoreConfig  # noqa: E402

MIB = 1 << 20
BODY_BYTES = 1024
LIMITS = (0, 4 * MIB, 64 * MIB)
ROUNDS = 2
SAMPLE_EVERY = 1000


def run_row(work: str, limit: int, seconds: float) -> dict:
    """One producer puts for `seconds` into a fresh store with max_dispatch_lag_bytes=limit."""
    root = tempfile.mkdtemp(prefix="store-", dir=work)
    body = random.Random(7).randbytes(BODY_BYTES)
    try:
        with MessageStore.open(root, StoreConfig(store_host="10.0.0.1", max_dispatch_lag_bytes=limit,
                                                 dispatch_process=False)) as store:
            message, put, clock = Message("lag", body), store.put, time.perf_counter
            latencies, lags = [], []
            started = clock()
            deadline = started + seconds
            while True:
                before = clock()
                result = put(message)
                after = clock()
                latencies.append(after - before)
                if len(latencies) % SAMPLE_EVERY == 0:
                    lags.append(result.commitlog_offset + result.size_bytes - store.dispatched_offset)
                if after >= deadline:
                    break
            elapsed = after - started
            dispatched = store.stats()["dispatch"]["records"]
            caught_up_from = clock()
            assert store.wait_dispatched(600)
            catch_up = clock() - caught_up_from
    finally:
        shutil.rmtree(root, ignore_errors=True)
    count = len(latencies)
    seconds_taken = np.asarray(latencies)
    return {"max_dispatch_lag_bytes": limit, "puts": count, "seconds": elapsed, "puts_per_s": count / elapsed,
            "dispatched_share": min(1.0, dispatched / count), "lag_max_bytes": max(lags, default=0),
            "catch_up_s": catch_up, "puts_per_s_with_catch_up": count / (elapsed + catch_up),
            "over_5ms": int((seconds_taken > 0.005).sum()), "max_ms": float(seconds_taken.max() * 1000)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path (the Markdown table goes beside it)")
    args = parser.parse_args()
    seconds, rounds = (0.2, 1) if args.quick else (3.0, ROUNDS)
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    out = args.out or os.path.join(results, "dispatch_lag_quick.json" if args.quick else "dispatch_lag.json")
    work = tempfile.mkdtemp(prefix="mqstore-lag-")
    rows = []
    try:
        for round_ in range(rounds):
            for limit in LIMITS:
                rows.append({"round": round_ + 1, **run_row(work, limit, seconds)})
                os.sync()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = ["| round | max_dispatch_lag_bytes | puts/s | dispatched at the end | largest lag | catch-up | "
             "puts/s with catch-up | puts > 5 ms | longest put |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        limit = row["max_dispatch_lag_bytes"]
        table.append(f"| {row['round']} | {f'{limit // MIB} MiB' if limit else '0 (unbounded)'} | "
                     f"{row['puts_per_s']:,.0f} | {row['dispatched_share']:.0%} | "
                     f"{row['lag_max_bytes'] / MIB:.1f} MiB | {row['catch_up_s']:.2f} s | "
                     f"{row['puts_per_s_with_catch_up']:,.0f} | {row['over_5ms']} | {row['max_ms']:.1f} ms |")
    print("\n".join(table))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump({"seconds_per_row": seconds, "body_bytes": BODY_BYTES, "python": platform.python_version(),
                   "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "load_average_1m": os.getloadavg()[0],
                   "command": "bench/dispatch_lag.py" + (" --quick" if args.quick else ""), "rows": rows},
                  handle, indent=2)
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
