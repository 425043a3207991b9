"""What users get: issue 30's table, one command, default settings, user-shaped messages, RocketMQ at its best.

    .venv/bin/python bench/users.py                  # the full run (about 30 minutes on 2 cores), 5 rounds
    .venv/bin/python bench/users.py --rounds 3       # fewer rounds
    .venv/bin/python bench/users.py --only sync-8,get   # some rows (their names: --list)
    .venv/bin/python bench/users.py --quick          # a smoke run of small counts (tests/bench/test_users_quick.py)

Rules (issue 30): `StoreConfig()` unless the row's name says otherwise (SYNC rows set flush_mode only); every
message has a tag (one of 7) and a key, and is built in the timed loop; 4 topics x 4 queues; bodies of 100 B,
1 KB and mixed sizes (16 B..4 KB, log-uniform, fixed seed; RocketMQ at the mean size); the ASYNC and put_batch
rows write more than one default 1 GiB segment (they roll); no pre-faulting or warm segments. RocketMQ 4.4.0's
own store through the `rmq` harness ($MQSTORE_ROCKETMQ_HOME, else ../shared/rocketmq-4.4.0), warmed up in its
JVM (`rmq put` does), index on, the same tag and key shape; SYNC rows against both of its put locks (spin, its
default, and `RMQ_LOCK=reentrant`, its advice for many producers), the better one as the reference. Every
measurement runs in a fresh process (bench/users_rows.py); round k runs mqstore then the reference, round k+1
the other way round; each row gives the median and min-max of each side and of the per-round ratio.
Writes bench/results/users.json (users_quick.json with --quick), then renders it in README.md and bench/README.md
with bench/report.py (a full run, or --only with --merge): one command makes the table.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from users_rows import SPARK_QUERIES, mixed_sizes  # noqa: E402

from mqstore import StoreConfig  # noqa: E402

SEGMENT_BYTES = StoreConfig().segment_size_bytes  # the default, 1 GiB (RocketMQ's too)
WORKER_TIMEOUT_S = 1200  # a measurement that takes longer is a hang: the row says so
ROLL_FACTOR = 1.1  # the throughput rows write this many segments' worth of log: at least one roll
RMQ_RECORD_OVERHEAD_BYTES = 90  # RocketMQ's record less its body, with this shape's tag and key (ours is larger)
SYNC_PRODUCERS = (1, 8, 32, 64)
FULL = {"sync_puts": {1: 4000, 8: 16000, 32: 32000, 64: 48000}, "aio_puts": 64000, "aio_inflight": 1024,
        "read_rows": 1_000_000, "rmq_warmup": None, "demo_messages": 300_000, "spark_warm": True,
         "spark_repeats": 3}
QUICK = {"sync_puts": {1: 200, 8: 400, 32: 640, 64: 640}, "aio_puts": 2048, "aio_inflight": 64,
         "read_rows": 20_000, "rmq_warmup": 500, "demo_messages": 20_000, "spark_warm": False,
         "spark_repeats": 1, "puts": 20_000}


class Run:
    """One invocation: its settings, its work directory, and the per-round RocketMQ SYNC rates rows share."""

    def __init__(self, rounds: int, quick: bool, work: str):
        self.rounds, self.quick, self.work = rounds, quick, work
        self.sizes = QUICK if quick else FULL
        self.rmq_home = rocketmq_home()
        self.rows: list[dict] = []  # the rows measured so far (with --merge, the result file's first)
        self.read_store: str | None = None
        self.parquet: str | None = None
        self.errors: list[str] = []
        self.timeout_s = 180 if quick else 400  # rmq runs: a JVM whose main thread died can linger

    def fresh(self, prefix: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=self.work)

    def puts_to_roll(self, mean_body_bytes: float) -> int:
        """Messages whose records fill more than one default segment (RocketMQ's smaller records too)."""
        if self.quick:
            return self.sizes["puts"]
        return int(ROLL_FACTOR * SEGMENT_BYTES / (mean_body_bytes + RMQ_RECORD_OVERHEAD_BYTES)) // 1000 * 1000


# --- processes --------------------------------------------------------------------------------------------------
def worker(name: str, **arguments) -> dict:
    """Run one bench/users_rows.py worker in a fresh process; its RESULT dict."""
    done = subprocess.run([sys.executable, os.path.join(HERE, "users_rows.py"), json.dumps({"worker": name,
                                                                                         **arguments})],
                          capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=ROOT)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"worker {name} failed ({done.returncode}): {done.stderr[-1500:]}")
    return json.loads(found[-1][len("RESULT "):])


def in_fresh_dir(run: Run, name: str, **arguments) -> dict:
    directory = run.fresh(f"{name}-")
    try:
        return worker(name, root=directory, **arguments)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def rocketmq_home() -> str | None:
    """The `rmq` harness's folder ($MQSTORE_ROCKETMQ_HOME, else ../shared/rocketmq-4.4.0), or None (or no java)."""
    home = os.environ.get("MQSTORE_ROCKETMQ_HOME") or os.path.join(ROOT, "..", "shared", "rocketmq-4.4.0")
    if not os.access(os.path.join(home, "rmq"), os.X_OK) or shutil.which("java") is None:
        return None
    return home


def rmq_env(run: Run, **extra) -> dict:
    env = dict(os.environ, RMQ_CACHE=os.environ.get("RMQ_CACHE", os.path.join(tempfile.gettempdir(),
                                                                             "rmq-cache-users")), **extra)
    if run.sizes["rmq_warmup"] is not None:
        env["RMQ_WARMUP"] = str(run.sizes["rmq_warmup"])
    return env


def rmq_process(run: Run, arguments: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run `rmq ARGUMENTS`; again (up to 3 times) when its main thread died at start, e.g. on a port another
    RocketMQ holds (its HA service binds one): such a JVM does not exit, its store threads keep it alive."""
    for attempt in range(3):
        with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
            process = subprocess.Popen([os.path.join(run.rmq_home, "rmq"), *arguments], stdout=out, stderr=err,
                                       text=True, env=env)
            deadline, died = time.monotonic() + run.timeout_s, False
            while process.poll() is None and time.monotonic() < deadline and not died:
                time.sleep(0.5)
                err.seek(0)
                died = 'Exception in thread "main"' in err.read()
            if process.poll() is None:
                process.kill()
            process.wait()
            out.seek(0)
            err.seek(0)
            done = subprocess.CompletedProcess(process.args, process.returncode, out.read(), err.read())
        if not died:
            return done
        print(f"    rmq's main thread died (attempt {attempt + 1}): {done.stderr[-160:]!r}", flush=True)
        time.sleep(5)
    return done


def rmq_put(run: Run, body: int, mode: str, threads: int, count: int, lock: str = "spin") -> float:
    """msgs/s of `rmq put DIR 1GiB N BODY mode 4 4 THREADS` (warmed, index on), RMQ_LOCK=reentrant for that lock."""
    directory = run.fresh("rmq-")
    extra = {"RMQ_LOCK": "reentrant"} if lock == "reentrant" else {}
    try:
        done = rmq_process(run, ["put", directory, str(SEGMENT_BYTES), str(count), str(body), mode, "4", "4",
                                 str(threads)], rmq_env(run, **extra))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    found = re.search(r"n=(\d+) .*: ([\d.]+) msg/s", done.stdout)
    if "put failed" in done.stderr:  # a thread died on a refused put (OS_PAGECACHE_BUSY): its rate would flatter
        raise RuntimeError("rmq put: " + done.stderr[done.stderr.index("put failed"):][:200])
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"rmq put failed ({done.returncode}): {done.stdout[-300:]} {done.stderr[-1000:]}")
    return float(found.group(2))


def rmq_load_seconds(run: Run, store: str) -> float:
    """`touch abort; rmq load` on a copy of `store`'s bytes (RocketMQ's crash path, index on)."""
    copy = run.fresh("rmq-load-")
    try:
        shutil.copytree(store, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock", "config"))
        open(os.path.join(copy, "abort"), "w").close()
        done = rmq_process(run, ["load", copy, str(SEGMENT_BYTES)], rmq_env(run))
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    found = re.search(r"load\(\): ([\d.]+) s", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"rmq load failed ({done.returncode}): {done.stdout[-300:]} {done.stderr[-1000:]}")
    return float(found.group(1))


# --- rounds and rows --------------------------------------------------------------------------------------------
def interleaved(run: Run, mine, references: dict) -> tuple[list, dict]:
    """`mine()` and each reference once a round, mqstore first in even rounds and last in odd ones. A measurement
    that fails counts as None (its error kept in run.errors); the others go on."""
    values, refs = [], {name: [] for name in references}
    for k in range(run.rounds):
        order = [("mine", mine)] + list(references.items())
        for name, measure in order if k % 2 == 0 else order[::-1]:
            try:
                value = measure()
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                value = None
                run.errors.append(f"{name}, round {k + 1}: {str(exc)[-400:]}")
                print(f"    {name} failed: {str(exc)[-200:]}", flush=True)
            (values if name == "mine" else refs[name]).append(value)
        print(f"    round {k + 1}: {values[-1]}" + "".join(f", {n} {v[-1]}" for n, v in refs.items()), flush=True)
    return values, refs


def spread(values: list | None) -> dict | None:
    values = [value for value in values or () if value is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "GB/s":
        return f"{value:.2f} GB/s"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "x":
        return f"{value:.2f}x"
    scaled = f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k" if value >= 1e4 else f"{value:,.0f}"
    return f"{scaled} {unit}"


def shown(stats: dict | None, unit: str) -> str:
    """"median (min-max)" of a spread in `unit`."""
    if stats is None:
        return "-"
    bare = [fmt(stats[key], unit).split(" ")[0] for key in ("min", "max")]
    return f"{fmt(stats['median'], unit)} ({bare[0]}-{bare[1]})"


def make_row(name: str, label: str, target: str, threshold: float | None, mine: list[float], unit: str, *,
             reference: list[float] | None = None, reference_label: str = "-", by_ratio: bool = True,
             lower_is_better: bool = False, readme: bool = True, note: str = "", **extra) -> dict:
    """A row: both sides' spreads, the per-round ratio (reference / mine when lower is better), the verdict."""
    ratios = None
    if reference:
        ratios = [(r / m if lower_is_better else m / r) for m, r in zip(mine, reference) if m and r]
    mine_spread = spread(mine)
    value = (statistics.median(ratios) if ratios else None) if by_ratio else mine_spread and mine_spread["median"]
    met = None if value is None or threshold is None else value >= threshold
    gap = ""
    if met is False:
        gap = f"{value / threshold:.0%} of the target"
    return {"name": name, "label": label, "target": target, "threshold": threshold, "unit": unit,
            "mine": spread(mine), "reference": spread(reference), "ratio": spread(ratios),
            "reference_label": reference_label, "value": value, "met": met, "gap": gap, "readme": readme,
            "note": note, "measured_text": shown(spread(mine), unit),
            "reference_text": (f"{reference_label}: {shown(spread(reference), unit)}" if reference
                               else reference_label), "ratio_text": shown(spread(ratios), "x"), **extra}


def unavailable_row(name: str, label: str, target: str, why: str, readme: bool = True) -> dict:
    return {"name": name, "label": label, "target": target, "threshold": None, "unit": "", "mine": None,
            "reference": None, "ratio": None, "reference_label": "-", "value": None, "met": False if readme else None,
            "gap": "", "readme": readme, "note": why, "measured_text": why, "reference_text": "-",
            "ratio_text": "-"}


NO_RMQ = "no RocketMQ 4.4.0 here ($MQSTORE_ROCKETMQ_HOME or ../shared/rocketmq-4.4.0, and java): no reference"


def sync_rows(run: Run) -> list[dict]:
    """Row 1: SYNC put 100 B tag+key from 1, 8, 32, 64 threads; RocketMQ's best of its two locks at each count,
    and at 1 producer the raw pwrite+fdatasync loop (bench/sync_share.py's)."""
    rows = []
    for producers in SYNC_PRODUCERS:
        count = run.sizes["sync_puts"][producers]
        print(f"  SYNC put 100 B, {producers} producer(s)", flush=True)
        references = {}
        if run.rmq_home:
            references["RocketMQ spin"] = lambda: rmq_put(run, 100, "sync", producers, count, "spin")
        if run.rmq_home and not run.quick:  # --quick: the spin lock only, to stay short
            references["RocketMQ reentrant"] = lambda: rmq_put(run, 100, "sync", producers, count, "reentrant")
        if producers == 1:
            references["raw loop"] = lambda: in_fresh_dir(run, "raw_loop", count=count)["rate"]
        mine, refs = interleaved(run, lambda: in_fresh_dir(run, "sync_put", producers=producers,
                                                           count=count)["rate"], references)
        best = [max(filter(None, pair), default=None)
                for pair in zip(*(refs[lock] for lock in ("RocketMQ spin", "RocketMQ reentrant") if lock in refs))]
        extra = {"producers": producers, "rocketmq_spin": spread(refs.get("RocketMQ spin")),
                 "rocketmq_reentrant": spread(refs.get("RocketMQ reentrant"))}
        label = f"SYNC put 100 B, tag+key, {producers} producer thread{'s' if producers > 1 else ''}"
        if producers == 1:
            rows.append(make_row("sync-1", label, ">= 90% of the raw pwrite+fdatasync loop", 0.9, mine, "msgs/s",
                                 reference=refs["raw loop"], reference_label="raw loop", rocketmq_best=spread(best),
                                 note=f"RocketMQ's best {shown(spread(best), 'msgs/s')}" if best else NO_RMQ,
                                 **extra))
        else:
            rows.append(make_row(f"sync-{producers}", label, ">= 2x RocketMQ's best (spin or reentrant)", 2.0, mine,
                                 "msgs/s", reference=best or None,
                                 reference_label="RocketMQ's best" if best else NO_RMQ, **extra))
    return rows


def aio_row(run: Run) -> list[dict]:
    """Row 2: SYNC puts from one event loop with many in flight, against RocketMQ's best SYNC rate of the round."""
    label = f"asyncio SYNC put 100 B, {run.sizes['aio_inflight']} in flight, one event loop"
    target = ">= 4x RocketMQ's best SYNC rate of the run"
    mine = []
    for k in range(run.rounds):
        result = in_fresh_dir(run, "aio_put", inflight=run.sizes["aio_inflight"], count=run.sizes["aio_puts"])
        if "unavailable" in result:
            return [unavailable_row("aio", label, target, "no asyncio API")]
        mine.append(result["rate"])
        print(f"    round {k + 1}: {mine[-1]:.4g}", flush=True)
    best = rocketmq_best_sync(run.rows)
    if best is None:
        return [make_row("aio", label, target, 4.0, mine, "msgs/s", by_ratio=False, reference_label=(
            "RocketMQ's best SYNC rate: run the sync rows first (or --merge into a file that has them)"
            if run.rmq_home else NO_RMQ)) | {"met": None}]
    count, lock, rate = best
    return [make_row("aio", label, target, 4.0, mine, "msgs/s", reference=[rate] * len(mine),
                     reference_label=f"RocketMQ's best SYNC median of the run ({count} threads, {lock} lock)")]


def rocketmq_best_sync(rows: list[dict]) -> tuple[int, str, float] | None:
    """(threads, lock, msgs/s) of the best median RocketMQ SYNC rate among the SYNC rows."""
    found = [(row.get("producers"), lock, row[f"rocketmq_{lock}"]["median"]) for row in rows
             if row["name"].startswith("sync-") for lock in ("spin", "reentrant") if row.get(f"rocketmq_{lock}")]
    return max(found, key=lambda item: item[2], default=None)


def async_rows(run: Run) -> list[dict]:
    """Row 3: ASYNC put (the default) tag+key, one thread, 100 B, 1 KB, mixed; more than a segment each."""
    rows = []
    mean = statistics.mean(mixed_sizes())
    for name, body, rmq_body in (("async-100", 100, 100), ("async-1k", 1000, 1000), ("async-mixed", "mixed",
                                                                                        round(mean))):
        count = run.puts_to_roll(mean if body == "mixed" else body)
        label = f"ASYNC put {({100: '100 B', 1000: '1 KB'}).get(body, 'mixed 16 B-4 KB')}, tag+key, 1 thread"
        print(f"  {label}: {count:,} puts", flush=True)
        references = {"RocketMQ": lambda: rmq_put(run, rmq_body, "async", 1, count)} if run.rmq_home else {}
        mine, refs = interleaved(run, lambda: in_fresh_dir(run, "async_put", body=body, count=count)["rate"],
                                 references)
        reference_label = ("RocketMQ" + (f" at the mean size, {rmq_body} B" if body == "mixed" else "")
                           if run.rmq_home else NO_RMQ)
        rows.append(make_row(name, label, ">= 1.5x RocketMQ", 1.5, mine, "msgs/s", reference=refs.get("RocketMQ"),
                             reference_label=reference_label, count=count))
    return rows


def read_store(run: Run) -> str:
    """The user-shaped store the read rows share (built once a run): 100 B, tag+key, default config."""
    if run.read_store is None:
        run.read_store = os.path.join(run.work, "read-store")
        print(f"  building the read store: {run.sizes['read_rows']:,} messages", flush=True)
        worker("build", root=run.read_store, count=run.sizes["read_rows"])
    return run.read_store


def get_row(run: Run) -> list[dict]:
    """Row 4: get 32 a call over every queue, reading .body, .tags and .keys."""
    root = read_store(run)
    print("  get 32 a call", flush=True)
    mine, _ = interleaved(run, lambda: worker("get", root=root)["rate"], {})
    return [make_row("get", f"get 32 a call, reading .body, .tags, .keys, {run.sizes['read_rows']:,} messages",
                     ">= 1.5M msgs/s", 1.5e6, mine, "msgs/s", by_ratio=False)]


def put_batch_rows(run: Run) -> list[dict]:
    """Row 5: put_batch 1 KB x 1000 across rolls, against put() in a loop; diagnostics for what keys cost."""
    count = run.puts_to_roll(1000)
    print(f"  put_batch 1 KB x 1000: {count:,} messages", flush=True)
    runs = {"put() loop": lambda: in_fresh_dir(run, "put_batch", count=count, loop=True),
            "no keys": lambda: in_fresh_dir(run, "put_batch", count=count, keys=False),
            "keys, index off": lambda: in_fresh_dir(run, "put_batch", count=count, index=False)}
    results = {name: [] for name in (*runs, "mine")}
    runs["mine"] = lambda: in_fresh_dir(run, "put_batch", count=count)

    def keep(name):
        def measure():
            results[name].append(None)  # stays None when the run fails
            results[name][-1] = runs[name]()
            return results[name][-1]["rate"]
        return measure

    interleaved(run, keep("mine"), {name: keep(name) for name in runs if name != "mine"})
    mine_results = results["mine"]
    gb = [r and r["gb_per_s"] for r in mine_results]
    rates = [r and r["rate"] for r in mine_results]
    label = "put_batch 1 KB x 1000 a call, tag+key, default config"
    rows = [make_row("put_batch", label + ", across rolls", ">= 1.0 GB/s of bodies", 1.0, gb, "GB/s",
                     by_ratio=False, rolls=[r and r["rolls"] for r in mine_results], count=count),
            make_row("put_batch-vs-put", label + ", a message against put() in a loop", ">= 1.0x put() in a loop",
                     1.0, rates, "msgs/s", reference=[r and r["rate"] for r in results["put() loop"]],
                     reference_label="put() in a loop, same shape")]
    for name in ("no keys", "keys, index off"):
        rows.append(make_row(f"put_batch-{name.replace(', ', '-').replace(' ', '-')}",
                             f"put_batch 1 KB x 1000, {name} (diagnostic)", "-", None,
                             [r and r["gb_per_s"] for r in results[name]], "GB/s", reference=gb,
                             reference_label="keys, index on (the row above)", readme=False))
    return rows


def scan_rows(run: Run) -> list[dict]:
    """Row 6: store.scan() every column, and scan(topic=...) matching rows/s against it, same round."""
    root = read_store(run)
    print("  scan()", flush=True)
    mine, refs = interleaved(run, lambda: worker("scan", root=root)["rate"],
                             {"scan(topic)": lambda: worker("scan", root=root, topic="T1")["rate"]})
    rows_label = f"{run.sizes['read_rows']:,} rows with tags, keys, UNIQ_KEY"
    return [make_row("scan", f"store.scan(), every column, {rows_label}", ">= 5M rows/s", 5e6, mine, "rows/s",
                     by_ratio=False),
            make_row("scan-topic", "store.scan(topic=one of 4), matching rows a second",
                     ">= 1.0x the full scan's rows/s", 1.0, refs["scan(topic)"], "rows/s", reference=mine,
                     reference_label="full scan, same round")]


def spark_rows(run: Run) -> list[dict]:
    """Row 7: Spark local[2] over the read store, `commitlog` as it is at run time, against Spark's Parquet reader
    of the same rows; each side in a fresh process a round, the three queries in turn, CPU-seconds beside wall."""
    root = read_store(run)
    if run.parquet is None:
        run.parquet = os.path.join(run.work, "read-store.parquet")
        worker("parquet", root=root, parquet=run.parquet)
    print("  Spark: commitlog against Parquet", flush=True)
    sides = {"commitlog": [], "parquet": []}

    def side(name):
        def measure():
            sides[name].append(None)  # stays None when the run fails
            sides[name][-1] = worker("spark", root=root, parquet=run.parquet, sides=[name],
                                     warm=run.sizes["spark_warm"], repeats=run.sizes["spark_repeats"])[name]
            return sides[name][-1]["full scan"]["seconds"]
        return measure

    if run.quick:  # one session for both sides: a smoke run, not a measurement
        both = worker("spark", root=root, parquet=run.parquet, sides=list(sides), warm=False, repeats=1)
        for name in sides:
            sides[name].append(both[name])
    else:
        interleaved(run, side("commitlog"), {"parquet": side("parquet")})
    rows_all = run.sizes["read_rows"]
    rows = []
    for query, target, name in zip(SPARK_QUERIES, (1.5, 1.0, 2.0), ("spark-full", "spark-groupby", "spark-filter")):
        count = rows_all // 16 if query == "topic+queue filter" else rows_all
        mine = [q and count / q[query]["seconds"] for q in sides["commitlog"]]
        theirs = [q and count / q[query]["seconds"] for q in sides["parquet"]]
        cpu = {s: spread([q and q[query]["cpu_seconds"] for q in sides[s]]) for s in sides}
        row = make_row(name, f"Spark local[2], {rows_all:,} rows: {query}, format(\"commitlog\")",
                       f">= {target:g}x Spark's Parquet reader", target, mine, "rows/s", reference=theirs,
                       reference_label="Parquet file of the same rows", cpu_seconds=cpu)
        for side, key in (("commitlog", "measured_text"), ("parquet", "reference_text")):
            if cpu[side]:
                row[key] += f", CPU {cpu[side]['median']:.1f} s (median)"
        rows.append(row)
    return rows


def recovery_row(run: Run) -> list[dict]:
    """Row 8: a crash open (abort marker as a crash leaves it) of a copy of the read store, until dispatched,
    against `touch abort; rmq load` of a copy of the same bytes; index on both sides."""
    root = read_store(run)
    print("  crash open against rmq load", flush=True)

    def mine():
        copy = run.fresh("recover-")
        try:
            shutil.copytree(root, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock"))
            open(os.path.join(copy, "abort"), "w").close()
            return worker("recover", root=copy)["seconds"]
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    references = {"rmq load": lambda: rmq_load_seconds(run, root)} if run.rmq_home else {}
    mine_s, refs = interleaved(run, mine, references)
    return [make_row("recovery", f"crash open of {run.sizes['read_rows']:,} messages, index on, until dispatched",
                     ">= 1.0x RocketMQ's load() (time ratio)", 1.0, mine_s, "s", reference=refs.get("rmq load"),
                     reference_label="touch abort; rmq load, same bytes" if run.rmq_home else NO_RMQ,
                     lower_is_better=True)]


def demo_rate(run: Run) -> float:
    """`python -m mqstore demo` in a fresh directory: the put rate it prints; stopped (SIGINT) once printed."""
    directory = run.fresh("demo-")
    process = subprocess.Popen([sys.executable, "-m", "mqstore", "demo", "--store", os.path.join(directory, "s"),
                                "--messages", str(run.sizes["demo_messages"])], cwd=directory, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        for line in process.stdout:
            found = re.search(r"wrote .* = ([\d,]+) msgs/s", line)
            if found:
                process.send_signal(2)  # SIGINT: the demo closes its store and stops before its read-back
                return float(found.group(1).replace(",", ""))
        raise RuntimeError("the demo printed no put rate")
    finally:
        try:
            process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        shutil.rmtree(directory, ignore_errors=True)


def demo_row(run: Run) -> list[dict]:
    """Row 9: what `make demo` prints as its write rate (put_batch of 1000, default config)."""
    print("  make demo's put phase", flush=True)
    mine, _ = interleaved(run, lambda: demo_rate(run), {})
    return [make_row("demo", f"`make demo` writes {run.sizes['demo_messages']:,} messages (put_batch of 1000)",
                     "- (shown, no target)", None, mine, "msgs/s", by_ratio=False)]


ROWS = (("sync", sync_rows), ("aio", aio_row), ("async", async_rows), ("get", get_row),
        ("put_batch", put_batch_rows), ("scan", scan_rows), ("spark", spark_rows), ("recovery", recovery_row),
        ("demo", demo_row))


def run_rows(run: Run, only: set[str] | None, save) -> list[dict]:
    """Each row group in turn; `save(rows)` after each, so that a run cut short keeps what it measured."""
    rows = []
    for name, function in ROWS:
        if only and name not in only:
            continue
        began = time.time()
        print(f"== {name}", flush=True)
        try:
            made = function(run)
        except Exception as exc:  # a failing row says so; the others still run
            made = [unavailable_row(name, name, "-", f"failed: {str(exc)[-300:]}")]
        for row in made:
            row["seconds"] = round(time.time() - began, 1)
            row["started_utc"] = time.strftime("%H:%M", time.gmtime(began))
        rows.extend(made)
        run.rows.extend(made)
        save(rows)
    return rows


def merged(previous: dict, rows: list[dict]) -> list[dict]:
    """`previous`'s rows with those of the same names replaced by `rows` (--merge), in ROWS' order."""
    fresh = {row["name"] for row in rows}
    kept = [row for row in previous.get("rows", []) if row["name"] not in fresh]
    order = {name: i for i, (name, _) in enumerate(ROWS)}

    def group(row):
        return order.get(row["name"].split("-")[0], len(order))
    return sorted(kept + rows, key=group)


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of small counts, one round")
    parser.add_argument("--only", help="comma-separated row groups: " + ", ".join(name for name, _ in ROWS))
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 1 with --quick)")
    parser.add_argument("--merge", action="store_true", help="keep the result file's other rows (with --only)")
    parser.add_argument("--out", help="result JSON path")
    parser.add_argument("--note", default="", help="a sentence on the run's conditions, kept in the JSON")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.only = set(args.only.split(",")) if args.only else None
    unknown = (args.only or set()) - {name for name, _ in ROWS}
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; known: {[name for name, _ in ROWS]}")
    args.out = args.out or os.path.join(HERE, "results", "users_quick.json" if args.quick else "users.json")
    return args


def main(argv=None) -> int:
    args = arguments(argv)
    global WORKER_TIMEOUT_S
    if args.quick:
        WORKER_TIMEOUT_S = 180
    began, load_before = time.time(), os.getloadavg()[0]
    previous = {}
    if args.merge and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as handle:
            previous = json.load(handle)
    work = tempfile.mkdtemp(prefix="users-bench-")
    run = Run(args.rounds, args.quick, work)
    run.rows = list(previous.get("rows", []))

    def save(rows: list[dict], partial: bool = True) -> dict:
        rows = merged(previous, rows) if previous else rows
        readme = [row for row in rows if row["readme"]]
        result = {"command": "bench/users.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else ""),
                  "rounds": args.rounds, "quick": args.quick, "only": sorted(args.only) if args.only else None,
                  "partial": partial, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(began)),
                  "minutes": round((time.time() - began) / 60, 1), "note": args.note,
                  "machine": {"python": platform.python_version(), "cores": os.cpu_count(),
                              "load_average_1min_before": round(load_before, 2),
                              "load_average_1min_after": round(os.getloadavg()[0], 2)},
                  "rocketmq": "rmq harness found" if run.rmq_home else NO_RMQ, "rows": rows, "errors": run.errors,
                  "met": sum(1 for row in readme if row["met"]),
                  "not_met": sum(1 for row in readme if row["met"] is False)}
        if previous:  # the first run's record, and when which rows were measured again
            result.update({key: previous[key] for key in ("date_utc", "minutes", "machine", "note", "rounds")
                           if key in previous})
            result["reruns"] = previous.get("reruns", []) + [
                {"only": sorted(args.only or ()), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(began)),
                 "rounds": args.rounds, "minutes": round((time.time() - began) / 60, 1), "note": args.note}]
            result["errors"] = previous.get("errors", []) + run.errors
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
        return result

    try:
        result = save(run_rows(run, args.only, save), partial=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in result["rows"]:
        verdict = {True: "met", False: "NOT met", None: "-"}[row["met"]]
        print(f"{verdict:>8}  {row['label']}: {row['measured_text']} | {row['reference_text']} | "
              f"ratio {row['ratio_text']} | {row['target']}")
    if not args.quick and args.out == os.path.join(HERE, "results", "users.json") and (not args.only or args.merge):
        import report  # bench/report.py, beside this file

        report.main(["--write"])  # README.md's table and bench/README.md's, from the file just written
    return 0


if __name__ == "__main__":
    sys.exit(main())
