"""SYNC puts from one asyncio event loop (mqstore.aio) against RocketMQ 4.4.0's SYNC puts from Java threads.

    .venv/bin/python bench/aio_put.py              # 5 interleaved rounds (5-16 minutes)
    .venv/bin/python bench/aio_put.py --quick      # one short round, without RocketMQ (a smoke run)

Each round runs, in turn and each in a fresh process:
- mqstore.aio: `StoreConfig(flush_mode=SYNC)` (defaults otherwise: index on, UNIQ_KEY, dispatch process), one
  event loop, INFLIGHT producer tasks each looping `await store.put(Message(...))` with a 100 B body, a tag and a
  key, over 4 topics x 4 queues, the Message built in the loop; a put counts once acknowledged (durable);
- mqstore's sync put from 64 threads, the same messages (for reference: what threads make today);
- RocketMQ 4.4.0: `rmq put DIR 1073741824 N 100 sync 4 4 THREADS` at 8, 32 and 64 threads, with
  RMQ_LOCK=reentrant (its advice for SYNC with many producers) and with its default spin lock; warmed up by the
  harness (RMQ_WARMUP's untimed puts in the same JVM).
The target (issue 30): the aio row >= 4x RocketMQ's best row, medians of the same run.
Writes bench/results/aio_put.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GIB = 1 << 30
BODY_BYTES = 100
TOPICS = 4
QUEUES = 4
ROUNDS = 5
AIO_PUTS = 200_000
INFLIGHT = (256, 1024)
TUNED_SWITCH_INTERVAL_S = 0.0005  # the tuned row's sys.setswitchinterval (CPython's default: 0.005)
THREAD_PUTS = 60_000
THREADS_MQSTORE = 64
RMQ_PUTS = 100_000
RMQ_THREADS = (8, 32, 64)
RMQ_LOCKS = ("reentrant", "spin")
RMQ_TIMEOUT_S = 180  # one `rmq put` cell; past it the cell is recorded as timed out
TARGET_RATIO = 4.0


def messages_factory():
    """Message(i): a 100 B body (from a pool of random ones), a tag and a key, over 4 topics x 4 queues."""
    from mqstore import Message

    pool = [os.urandom(BODY_BYTES) for _ in range(1024)]
    topics = [f"AioBench{index}" for index in range(TOPICS)]

    def make(index: int) -> Message:
        return Message(topics[index % TOPICS], pool[index & 1023], tags="TagA", keys=[f"key-{index}"],
                       queue_id=(index // TOPICS) % QUEUES)

    return make


def aio_cell(directory: str, puts: int, inflight: int, switch_interval_s: float | None = None) -> dict:
    """One loop, `inflight` tasks putting `puts` messages in all; puts a second counting acknowledged ones.
    `switch_interval_s`: sys.setswitchinterval first (the tuned row)."""
    import asyncio

    from mqstore import FlushMode, PutStatus, StoreConfig
    from mqstore.aio import AsyncMessageStore

    make = messages_factory()
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)

    async def main() -> dict:
        async with AsyncMessageStore.open(directory, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
            await store.put(make(0))
            flushes_before = store.sync._group_commit.stats.flush_count
            each = puts // inflight
            bad = 0

            async def producer(first: int) -> None:
                nonlocal bad
                for index in range(first, first + each):
                    if (await store.put(make(index))).status is not PutStatus.PUT_OK:
                        bad += 1

            started = time.perf_counter()
            cpu = time.process_time()
            await asyncio.gather(*(producer(1 + task * each) for task in range(inflight)))
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu
            flushes = store.sync._group_commit.stats.flush_count - flushes_before
        done = each * inflight
        return {"count": done, "seconds": seconds, "msgs_per_s": done / seconds, "not_ok": bad,
                "flushes": flushes, "puts_per_flush": done / max(flushes, 1), "cpu_s_per_put_us": cpu / done * 1e6}

    return asyncio.run(main())


def threads_cell(directory: str, puts: int, threads: int) -> dict:
    """mqstore's sync put from `threads` threads (the same messages)."""
    import threading

    from mqstore import FlushMode, MessageStore, PutStatus, StoreConfig

    make = messages_factory()
    each = puts // threads
    bad = []
    with MessageStore.open(directory, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
        store.put(make(0))

        def produce(first: int) -> None:
            for index in range(first, first + each):
                if store.put(make(index)).status is not PutStatus.PUT_OK:
                    bad.append(index)

        workers = [threading.Thread(target=produce, args=(1 + thread * each,)) for thread in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - started
    done = each * threads
    return {"count": done, "seconds": seconds, "msgs_per_s": done / seconds, "not_ok": len(bad)}


def run_cell(work: str, kind: str, puts: int, width: int) -> dict:
    """A cell in a fresh interpreter (as RocketMQ's each run in a fresh JVM)."""
    directory = tempfile.mkdtemp(prefix=f"aio-{kind}-", dir=work)
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--cell", kind, directory, str(puts),
                               str(width)], capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} cell failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rocketmq_home() -> str | None:
    home = os.environ.get("MQSTORE_ROCKETMQ_HOME") or os.path.join(ROOT, "..", "shared", "rocketmq-4.4.0")
    if not os.access(os.path.join(home, "rmq"), os.X_OK) or shutil.which("java") is None:
        return None
    return home


def rocketmq_cell(work: str, home: str, puts: int, threads: int, lock: str) -> dict:
    """`RMQ_LOCK=LOCK rmq put DIR 1073741824 N 100 sync 4 4 THREADS`, timed by the harness (warm JIT)."""
    directory = tempfile.mkdtemp(prefix="rmq-", dir=work)
    # A cache of its own: another run compiling the harness into a shared one deletes the classes under a JVM
    # that is loading them (seen: a put that hung with its main thread gone).
    env = dict(os.environ, RMQ_LOCK=lock,
               RMQ_CACHE=os.environ.get("RMQ_CACHE") or os.path.join(tempfile.gettempdir(), "rmq-cache-aio-put"))
    try:
        done = subprocess.run([os.path.join(home, "rmq"), "put", directory, str(GIB), str(puts), str(BODY_BYTES),
                               "sync", str(TOPICS), str(QUEUES), str(threads)], capture_output=True, text=True,
                              timeout=RMQ_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:  # the spin lock with many threads on a busy machine: recorded, not a rate
        return {"count": 0, "seconds": RMQ_TIMEOUT_S, "msgs_per_s": None, "error": f"timed out ({RMQ_TIMEOUT_S} s)"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    match = re.search(r"n=(\d+) .*: ([\d.]+) msg/s", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"rmq put failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-2000:]}")
    count, rate = int(match.group(1)), float(match.group(2))
    return {"count": count, "seconds": count / rate, "msgs_per_s": rate}


def plan(work: str, quick: bool, with_rocketmq: bool) -> list[tuple[str, callable]]:
    """The cells of one round, in the order they run."""
    aio_puts = 20_000 if quick else AIO_PUTS
    cells = [(f"mqstore.aio SYNC, one loop, {inflight} puts in flight",
              lambda inflight=inflight: run_cell(work, "aio", aio_puts, inflight)) for inflight in INFLIGHT]
    cells.append((f"mqstore.aio SYNC, one loop, {INFLIGHT[-1]} puts in flight, switch interval "
                  f"{TUNED_SWITCH_INTERVAL_S * 1000:g} ms (tuned)",
                  lambda: run_cell(work, "aio-tuned", aio_puts, INFLIGHT[-1])))
    cells.append((f"mqstore SYNC put, {THREADS_MQSTORE} threads",
                  lambda: run_cell(work, "threads", 6_400 if quick else THREAD_PUTS, THREADS_MQSTORE)))
    home = rocketmq_home() if with_rocketmq else None
    if home is not None:
        for lock in RMQ_LOCKS:
            for threads in RMQ_THREADS:
                cells.append((f"RocketMQ 4.4.0 SYNC, {threads} threads, {lock} lock",
                              lambda threads=threads, lock=lock: rocketmq_cell(work, home, RMQ_PUTS, threads, lock)))
    return cells


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for name, measured in runs.items():
        rates = [run["msgs_per_s"] for run in measured if run["msgs_per_s"] is not None]
        if not rates:  # every run timed out
            rates = [0.0]
        row = {"name": name, "msgs_per_s_median": statistics.median(rates), "msgs_per_s_min": min(rates),
               "msgs_per_s_max": max(rates), "timed_out": sum(run["msgs_per_s"] is None for run in measured),
               "runs": measured}
        for key in ("puts_per_flush", "cpu_s_per_put_us"):
            if key in measured[0]:
                row[key + "_median"] = statistics.median(run[key] for run in measured)
        rows.append(row)
    return rows


def targets(rows: list[dict]) -> list[dict]:
    """Each aio row against RocketMQ's best median row of the run."""
    rocketmq = [row for row in rows if row["name"].startswith("RocketMQ")]
    if not rocketmq:
        return []
    best = max(rocketmq, key=lambda row: row["msgs_per_s_median"])
    goals = []
    for row in rows:
        if row["name"].startswith("mqstore.aio") and "(tuned)" not in row["name"]:
            ratio = row["msgs_per_s_median"] / best["msgs_per_s_median"]
            goals.append({"name": row["name"], "against": best["name"], "ratio": ratio, "target": TARGET_RATIO,
                          "met": ratio >= TARGET_RATIO})
    return goals


def markdown(rows: list[dict], goals: list[dict], header: str) -> str:
    lines = [header, "", "| row | msgs/s median | min-max | puts a flush | CPU us a put |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        per_flush = row.get("puts_per_flush_median")
        cpu = row.get("cpu_s_per_put_us_median")
        name = row["name"] + (f" ({row['timed_out']} run(s) timed out)" if row.get("timed_out") else "")
        lines.append(f"| {name} | {row['msgs_per_s_median']:,.0f} | {row['msgs_per_s_min']:,.0f}-"
                     f"{row['msgs_per_s_max']:,.0f} | {'' if per_flush is None else f'{per_flush:,.0f}'} | "
                     f"{'' if cpu is None else f'{cpu:.1f}'} |")
    if goals:  # the tuned row is shown, not judged
        lines += ["", "| target | ratio | met |", "|---|---:|---|"]
        for goal in goals:
            lines.append(f"| {goal['name']} >= {goal['target']:.0f}x {goal['against']} | {goal['ratio']:.2f}x | "
                         f"{'yes' if goal['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round, without RocketMQ")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help="the JSON file (the .md goes beside it)")
    parser.add_argument("--dir", default=None, help="where the stores are made (a temporary folder by default)")
    parser.add_argument("--cell", nargs=4, metavar=("KIND", "DIR", "PUTS", "WIDTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell is not None:
        kind, directory, puts, width = args.cell
        if kind == "threads":
            measured = threads_cell(directory, int(puts), int(width))
        else:
            measured = aio_cell(directory, int(puts), int(width),
                                TUNED_SWITCH_INTERVAL_S if kind == "aio-tuned" else None)
        print(json.dumps(measured))
        return
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out = args.out or os.path.join(ROOT, "bench", "results", "aio_put_quick.json" if args.quick else "aio_put.json")
    work = tempfile.mkdtemp(prefix="aio-bench-", dir=args.dir)
    runs: dict[str, list[dict]] = {}
    try:
        cells = plan(work, args.quick, not args.quick)
        for round_ in range(rounds):
            for name, cell in cells:
                measured = cell()
                runs.setdefault(name, []).append(measured)
                shown = measured.get("error") or f"{measured['msgs_per_s']:,.0f} msgs/s"
                print(f"round {round_ + 1}/{rounds}  {name}: {shown}", flush=True)
            write_results(out, runs, round_ + 1, args)  # after each round: an interrupted run keeps its rounds
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(write_results(out, runs, rounds, args))


def write_results(out: str, runs: dict[str, list[dict]], rounds: int, args) -> str:
    """The JSON and the Markdown of the rounds so far; returns the Markdown."""
    rows = summarize(runs)
    goals = targets(rows)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "bench/aio_put.py" + (" --quick" if args.quick else "") + (f" --rounds {rounds}" if args.rounds else "")
    header = (f"# {command}, {started}: medians of {rounds} interleaved round(s), each cell a fresh process; "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    result = {"command": command, "date": started, "rounds": rounds, "python": platform.python_version(),
              "cores": os.cpu_count(), "load_average_1min": os.getloadavg()[0], "rows": rows, "targets": goals}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    text = markdown(rows, goals, header)
    with open(os.path.splitext(out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(text)
    return text


if __name__ == "__main__":
    main()
