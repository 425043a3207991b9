"""Diagnostic for issue 30's write rows: puts of user-shaped messages (a tag and a key each) into a store with
the default StoreConfig (index on, a UNIQ_KEY per message, dispatch process), against RocketMQ 4.4.0's
putMessage of the same shape (`rmq put`, warmed), interleaved rounds, medians.

Rows (each round runs every row once, in turn; each row in a fresh process and store on the same disk):
- put: ASYNC put() of 100 B bodies, tag + key, one thread, the Message built in the loop (1 GiB segments, as
  `rmq put DIR 1073741824 N 100 async 4 4 1`).
- batch keys / batch nokeys / batch keys noindex: put_batch of 1000 x 1 KB, 64 MiB segments (the run rolls), the
  Messages of a batch built in the loop before its put_batch (inside the clock), a tag + a key each (nokeys: the
  tag only; noindex: index_enabled=False).
- batch keys prebuilt: the same, the Messages built before the clock (the store's own cost).
- put 1k: the messages of "batch keys" put one by one with put(), built in the loop (64 MiB segments).
- rmq: RocketMQ's putMessage of 100 B, ASYNC, 4 topics x 4 queues, one thread, tag + key, JIT warmed.
- demo: `mqstore demo`'s writes (its messages, put_batch of 1000, the default StoreConfig).
With `--baseline OTHER/.venv/bin/python` every row but rmq also runs on that checkout ("base ROW"), in the same
rounds: before/after of a change in one sitting.

    .venv/bin/python bench/put_keys.py [--rounds 3] [--count 1000000] [--batch-count 300000] [--rows put,batch]
Prints one line per row and round, then medians with min-max (for the batch rows also the writer's CPU time a batch
in put_batch's steps, decision 0045); `--quick` is a smoke run. Not in bench/README's tables: a diagnostic of issue
30 (the README rows come from the benchmark the issue asks for).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = 4
QUEUES = 4
TAG_COUNT = 7


def _worker(row: str, directory: str, count: int) -> dict:
    import mqstore
    from mqstore import Message, MessageStore, StoreConfig

    if row == "put":
        body = os.urandom(100)
        topics = [f"T{t}" for t in range(TOPICS)]
        tags = [f"tag{t}" for t in range(TAG_COUNT)]
        with MessageStore.open(directory, StoreConfig()) as store:
            put = store.put
            started = time.perf_counter()
            cpu = time.thread_time()
            for g in range(count):
                put(Message(topics[g % TOPICS], body, (g // TOPICS) % QUEUES, tags[g % TAG_COUNT], (f"k{g}",)))
            cpu = time.thread_time() - cpu
            seconds = time.perf_counter() - started
        return {"msgs_per_s": count / seconds, "mb_per_s": count * 100 / seconds / 1e6,
                "cpu_msgs_per_s": count / cpu, "mqstore": os.path.dirname(os.path.dirname(mqstore.__file__))}
    if row == "demo":  # mqstore demo's writes: its messages, put_batch of 1000, the default StoreConfig
        from mqstore.demo import _message

        with MessageStore.open(directory, StoreConfig()) as store:
            started = time.perf_counter()
            cpu = time.thread_time()
            for start in range(0, count, 1000):
                store.put_batch([_message(i) for i in range(start, min(count, start + 1000))])
            cpu = time.thread_time() - cpu
            seconds = time.perf_counter() - started
        return {"msgs_per_s": count / seconds, "mb_per_s": 0.0, "cpu_msgs_per_s": count / cpu}
    keys = "nokeys" not in row
    index = "noindex" not in row
    prebuilt = "prebuilt" in row
    body = os.urandom(1024)
    config = StoreConfig(segment_size_bytes=64 << 20, index_enabled=index)
    if row == "put 1k":  # the batch rows' messages put one by one, for "never slower a message than put()"
        with MessageStore.open(directory, config) as store:
            put = store.put
            started = time.perf_counter()
            cpu = time.thread_time()
            for i in range(count):
                put(Message(f"T{(i // 1000) % TOPICS}", body, (i // 1000 // TOPICS) % QUEUES, f"tag{i % TAG_COUNT}",
                            (f"order-{i}",)))
            cpu = time.thread_time() - cpu
            seconds = time.perf_counter() - started
        return {"msgs_per_s": count / seconds, "mb_per_s": count * 1024 / seconds / 1e6, "cpu_msgs_per_s": count / cpu}

    def batch(start: int) -> list:
        return [Message(f"T{(start // 1000) % TOPICS}", body, (start // 1000 // TOPICS) % QUEUES,
                        f"tag{i % TAG_COUNT}", (f"order-{i}",) if keys else ()) for i in range(start, start + 1000)]

    with MessageStore.open(directory, config) as store:
        batches = [batch(start) for start in range(0, count, 1000)] if prebuilt else None
        spent = _time_steps(store)
        started = time.perf_counter()
        cpu = time.thread_time()
        for number, start in enumerate(range(0, count, 1000)):
            store.put_batch(batches[number] if prebuilt else batch(start))
        cpu = time.thread_time() - cpu
        seconds = time.perf_counter() - started
        segments = store.stats()["commitlog"]["segments"]
    steps = {name: value / (count / 1000) * 1e3 for name, value in spent.items()}
    return {"msgs_per_s": count / seconds, "mb_per_s": count * 1024 / seconds / 1e6, "cpu_msgs_per_s": count / cpu,
            "segments": segments, "steps_ms_a_batch": {"all": cpu / (count / 1000) * 1e3, **steps}}


def _time_steps(store) -> dict[str, float]:
    """Seconds spent in put_batch's steps, filled in as the row runs: the writer thread's CPU time in prepare_batch,
    append (encode + pwrite + the numpy steps around) and the PutResults; the wall-clock time of the segments'
    disk reservations (posix_fallocate, which can wait on the file system's journal: decision 0045)."""
    from mqstore.commitlog import mapped_file

    spent = {"prepare": 0.0, "append": 0.0, "results": 0.0, "reserve (wall)": 0.0}

    def timed(owner, attribute: str, step: str, clock) -> None:
        inner = getattr(owner, attribute)

        def step_timed(*args):
            began = clock()
            try:
                return inner(*args)
            finally:
                spent[step] += clock() - began
        setattr(owner, attribute, step_timed)

    timed(store._commitlog, "prepare_batch", "prepare", time.thread_time)
    timed(store._commitlog, "append_columns_holding_lock", "append", time.thread_time)
    timed(store, "_batch_results", "results", time.thread_time)
    timed(mapped_file, "_reserve", "reserve (wall)", time.perf_counter)
    return spent


def _rocketmq(directory: str, count: int) -> dict | str:
    home = os.environ.get("MQSTORE_ROCKETMQ_HOME") or os.path.join(ROOT, "..", "shared", "rocketmq-4.4.0")
    if not os.path.isfile(os.path.join(home, "rmq")) or shutil.which("java") is None:
        return "no RocketMQ 4.4.0 or no java"
    env = dict(os.environ, RMQ_CACHE=os.environ.get("RMQ_CACHE", "/tmp/rmq-cache-codec"))
    done = subprocess.run([os.path.join(home, "rmq"), "put", os.path.join(directory, "s"), str(1 << 30), str(count),
                           "100", "async", str(TOPICS), str(QUEUES), "1"], capture_output=True, text=True, env=env,
                          timeout=900)
    found = re.search(r"([\d.]+) msg/s\s+([\d.]+) MB/s", done.stdout)
    if done.returncode != 0 or found is None:
        return f"rmq put failed: {(done.stdout + done.stderr)[-300:]}"
    return {"msgs_per_s": float(found.group(1)), "mb_per_s": float(found.group(2))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=1_000_000, help="put() messages a round")
    parser.add_argument("--batch-count", type=int, default=300_000, help="put_batch messages a round")
    parser.add_argument("--rows", default="put,rmq,batch keys,batch keys prebuilt,batch nokeys,batch keys noindex,demo")
    parser.add_argument("--baseline", default=None,
                        help="another checkout's Python (its .venv/bin/python): its rows run too, as 'base ROW'")
    parser.add_argument("--out", default=None, help="also write every round's figures to this JSON file")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        row, directory, count = args.worker
        print(json.dumps(_worker(row, directory, int(count))))
        return 0
    if args.quick:
        args.rounds, args.count, args.batch_count = 1, 5_000, 5_000
    rows = args.rows.split(",")
    if args.baseline:
        rows += [f"base {row}" for row in rows if row != "rmq"]
    results: dict[str, list[dict]] = {row: [] for row in rows}
    work = tempfile.mkdtemp(prefix="put-keys-", dir=os.environ.get("MQSTORE_BENCH_DIR", ROOT))
    try:
        for round_number in range(args.rounds):
            for row in rows:
                directory = os.path.join(work, f"{round_number}-{row.replace(' ', '-')}")
                if row == "rmq":
                    result = _rocketmq(directory, args.count)
                else:
                    python, worker_row = (args.baseline, row[5:]) if row.startswith("base ") else (sys.executable, row)
                    count = args.count if worker_row == "put" else args.batch_count  # "put 1k" too
                    done = subprocess.run([python, os.path.abspath(__file__), "--worker", worker_row, directory,
                                           str(count)], capture_output=True, text=True, timeout=1800)
                    result = json.loads(done.stdout) if done.returncode == 0 else done.stderr[-500:]
                shutil.rmtree(directory, ignore_errors=True)
                print(f"round {round_number} {row:<22} {result}", flush=True)
                if isinstance(result, dict):
                    results[row].append(result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"rounds": args.rounds, "load_average": os.getloadavg()[0], "rows": results}, handle, indent=1)
    print(f"medians of {args.rounds} rounds, load {os.getloadavg()[0]:.1f}:")
    for row, values in results.items():
        if values:
            rates = [v["msgs_per_s"] for v in values]
            mbs = [v["mb_per_s"] for v in values]
            cpu = [v["cpu_msgs_per_s"] for v in values if "cpu_msgs_per_s" in v]
            print(f"  {row:<26} {statistics.median(rates):>12,.0f} msgs/s ({min(rates):,.0f}-{max(rates):,.0f}) "
                  f"{statistics.median(mbs):>8,.0f} MB/s" +
                  (f"  writer CPU rate {statistics.median(cpu):,.0f} msgs/s" if cpu else ""))
            steps = [v["steps_ms_a_batch"] for v in values if "steps_ms_a_batch" in v]
            if steps:
                print("      ms a batch (writer CPU; reservations wall-clock): " + ", ".join(
                    f"{name} {statistics.median(s[name] for s in steps):.3f}" for name in steps[0]))
    rmq = [v["msgs_per_s"] for v in results.get("rmq", [])]
    for row in ("put", "base put"):
        if rmq and results.get(row) and len(results[row]) == len(rmq):
            ratios = [v["msgs_per_s"] / r for v, r in zip(results[row], rmq)]
            print(f"  {row} / rmq, per round: median {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
