"""Spark read benchmark: format("commitlog") against Spark's own Parquet reader over the same rows, user-shaped.

    .venv/bin/python bench/spark_read.py            # full run: 1,000,000 messages, 5 interleaved rounds (~4 min)
    .venv/bin/python bench/spark_read.py --quick    # smoke run (100,000 messages, one round, ~1 min)

Prints a table and writes bench/results/spark_read.json (spark_read_quick.json with --quick), or --out PATH.

The store is written as a user writes one (`generate_user_store`): MessageStore with the default StoreConfig
(index on, so every message gets a UNIQ_KEY; record CRCs), messages of 100 B with a tag and a key each, ten
topics of four queues, put_batch of 1,000 messages per topic in turn. Its rows are copied once to a Parquet file
(pyarrow, row groups of 131,072), the peer every read is held to. The session (local[2], the target's master)
loads the JVM reader's jar (mqstore.spark.configure), so "commitlog" is the JVM reader; the Python source is
measured too, as "commitlog-python". Every query builds its DataFrame anew (planning included):

    full scan                spark.read.format(...).load(store), every column, into the noop sink
    group-by topic           .groupBy("topic").count().collect()
    topic+queue filter       .where("topic = 'topic-3' AND queue_id = 1"), every column, into the noop sink
                             (the store reads that queue's records through its ConsumeQueue; Parquet its file)
    streaming availableNow   readStream of the whole store into the noop sink, one trigger

After one warm-up of each (none with --quick), --rounds rounds run every query once, the order rotated each
round; each row gives the median wall time with its min-max, rows/s at the median, and the median CPU seconds
of the JVM (Spark's threads) and of the Python workers (/proc; Linux). Ratios against Parquet are the median of
the per-round ratios (Parquet's seconds over the query's, same round), so load that shifts between rounds
cancels. Targets (issue 30): full scan >= 1.5x, group-by >= 1.0x, topic+queue filter >= 2.0x.

The set-up functions (generate_user_store, write_parquet, spark_session, cpu_seconds, noop,
stream_available_now) are imported by other benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import mqstore.spark  # noqa: E402
from mqstore.spark import source  # noqa: E402
from mqstore.store import scan_options as spark_options  # noqa: E402
from tests.spark.storegen import StoreWriter  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
WORK_DIR = os.path.join(RESULTS_DIR, "tmp", "spark_read")
TOPICS = 10
RUN_MESSAGES = 1000
MASTER = "local[2]"  # the target's setting: two cores, as the project's machine has


def generate_store(root: str, count: int, body_size: int, segment_size: int) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with StoreWriter(root, segment_size_bytes=segment_size, queue_entries_per_file=300_000) as writer:
        done = run = 0
        while done < count:
            for topic in range(TOPICS):
                n = min(RUN_MESSAGES, count - done)
                if n <= 0:
                    break
                writer.put_bulk(f"topic-{topic}", n, body_size, queue_count=4, seed=run)
                done += n
                run += 1


def decode_all(root: str):
    """(rows, seconds, batches iterator factory) of the reader alone, no Spark."""
    options = spark_options.parse_options({"path": root})
    reader = source.CommitLogBatchReader(options, spark_options.commitlog_schema())
    started = time.perf_counter()
    rows = 0
    for partition in reader.partitions():
        for batch in reader.read(partition):
            rows += batch.num_rows
    return rows, time.perf_counter() - started


def write_copies(root: str, parquet_path: str, arrow_path: str) -> None:
    """The store's rows as a Parquet file (pyarrow) and as an Arrow IPC file (for the ceiling source)."""
    options = spark_options.parse_options({"path": root})
    reader = source.CommitLogBatchReader(options, spark_options.commitlog_schema())
    schema = spark_options.arrow_schema(reader.schema)
    with pq.ParquetWriter(parquet_path, schema) as parquet, pa.OSFile(arrow_path, "wb") as sink, \
            pa.ipc.new_file(sink, schema) as arrow:
        for partition in reader.partitions():
            for batch in reader.read(partition):
                parquet.write_batch(batch, row_group_size=131072)
                arrow.write_batch(batch)


def spark_session(master: str = MASTER):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    root = os.path.dirname(BENCH_DIR)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("mqstore-spark-read-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "4g").config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.session.timeZone", "UTC"))
    spark = mqstore.spark.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(spark)  # "commitlog" is the JVM reader (its jar is loaded); "commitlog-python" too
    spark.dataSource.register(_ceiling_source())
    return spark


def _ceiling_source():
    """A Python data source that yields ready batches of an Arrow file: Spark's cost of the Python source path."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class ArrowFileReader(DataSourceReader):
        def __init__(self, path, schema):
            self.path, self.schema = path, schema

        def partitions(self):
            batches = pa.ipc.open_file(pa.memory_map(self.path)).num_record_batches
            cores = os.cpu_count() or 1
            step = max(1, -(-batches // (2 * cores)))
            return [InputPartition((i, min(i + step, batches))) for i in range(0, batches, step)]

        def read(self, partition):
            file = pa.ipc.open_file(pa.memory_map(self.path))
            for i in range(*partition.value):
                yield file.get_batch(i)

    class ArrowFileSource(DataSource):
        @classmethod
        def name(cls):
            return "arrowfile"

        def schema(self):
            return spark_options.commitlog_schema()

        def reader(self, schema):
            return ArrowFileReader(self.options["path"], schema)

    return ArrowFileSource


def _process_tree() -> dict[int, tuple[int, str, float, float]] | None:
    """pid -> (parent pid, command name, own CPU seconds, reaped children's CPU seconds), from /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                raw = handle.read()
        except OSError:
            continue
        command = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
        found[int(name)] = (int(fields[1]), command, (utime + stime) / tick, (cutime + cstime) / tick)
    return found


def cpu_seconds() -> dict[str, float] | None:
    """CPU seconds used so far by this process's JVM (its own threads) and by the Python processes under it
    (PySpark's daemon and workers, the workers that exited included)."""
    tree = _process_tree()
    if tree is None:
        return None
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _, _) in tree.items():
        children.setdefault(parent, []).append(pid)
    used = {"jvm": 0.0, "python_workers": 0.0}
    todo = [(pid, False) for pid in children.get(os.getpid(), [])]
    while todo:
        pid, under_jvm = todo.pop()
        _, command, own, reaped = tree[pid]
        if command == "java":
            used["jvm"] += own
            under_jvm = True
        elif under_jvm:
            used["python_workers"] += own + reaped
        todo.extend((child, under_jvm) for child in children.get(pid, []))
    return used


def timed(action, repeat: int) -> tuple[float, dict | None]:
    """Best wall time of `repeat` runs after one warm-up (none in --quick mode: repeat == 0 means one run), and
    the CPU seconds (cpu_seconds()) of that run."""
    if repeat:
        action()
    best, best_cpu = float("inf"), None
    for _ in range(max(repeat, 1)):
        cpu_before = cpu_seconds()
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
        cpu_after = cpu_seconds()
        if seconds < best:
            best = seconds
            best_cpu = None if cpu_before is None else {
                key: round(cpu_after[key] - cpu_before[key], 2) for key in cpu_before}
    return best, best_cpu


def noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def stream_available_now(spark, root: str, checkpoint: str, name: str = "commitlog") -> None:
    shutil.rmtree(checkpoint, ignore_errors=True)
    query = (spark.readStream.format(name).load(root).writeStream.format("noop")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


TARGETS = {"full scan": 1.5, "group-by topic": 1.0, "topic+queue filter": 2.0}  # x Parquet, same run (issue 30)
USER_BATCH_MESSAGES = 1000  # put_batch size, as the demo writes
FILTER = "topic = 'topic-3' AND queue_id = 1"


def generate_user_store(root: str, count: int, body_size: int = 100) -> None:
    """`count` messages as a user writes them: default StoreConfig, a tag and a key each, put_batch of 1,000,
    TOPICS topics of four queues in turn."""
    import random

    from mqstore import Message, MessageStore

    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(30)
    done = run = 0
    with MessageStore.open(root) as store:
        while done < count:
            topic = f"topic-{run % TOPICS}"
            n = min(USER_BATCH_MESSAGES, count - done)
            store.put_batch([Message(topic, rng.randbytes(body_size), queue_id=(done + i) % 4, tags=f"Tag{i % 3}",
                                     keys=(f"order-{done + i}",)) for i in range(n)])
            done += n
            run += 1


def write_parquet(root: str, parquet_path: str) -> None:
    """The store's rows (every column, as the source gives them) as a Parquet file written by pyarrow."""
    options = spark_options.parse_options({"path": root})
    reader = source.CommitLogBatchReader(options, spark_options.commitlog_schema())
    schema = spark_options.arrow_schema(reader.schema)
    with pq.ParquetWriter(parquet_path, schema) as parquet:
        for partition in reader.partitions():
            for batch in reader.read(partition):
                parquet.write_batch(batch, row_group_size=131072)


def queries(spark, root: str, parquet: str, work_dir: str) -> dict:
    """name -> (rows it reads, the action). The rows are counted once here."""
    def full(name):
        return lambda: noop(spark.read.format(name).load(root))

    def grouped(name):
        return lambda: spark.read.format(name).load(root).groupBy("topic").count().collect()

    def filtered(name):
        return lambda: noop(spark.read.format(name).load(root).where(FILTER))

    total = spark.read.parquet(parquet).count()
    selected = spark.read.parquet(parquet).where(FILTER).count()
    found = {}
    for name in ("commitlog", source.PYTHON_FORMAT_NAME):
        found[f"full scan: {name}"] = (total, full(name))
        found[f"group-by topic: {name}"] = (total, grouped(name))
        found[f"topic+queue filter: {name}"] = (selected, filtered(name))
        found[f"streaming availableNow: {name}"] = (
            total, lambda name=name: stream_available_now(spark, root, os.path.join(work_dir, "checkpoint"), name))
    found["full scan: parquet"] = (total, lambda: noop(spark.read.parquet(parquet)))
    found["group-by topic: parquet"] = (total, lambda: spark.read.parquet(parquet).groupBy("topic").count().collect())
    found["topic+queue filter: parquet"] = (selected, lambda: noop(spark.read.parquet(parquet).where(FILTER)))
    return found


def run_rounds(found: dict, rounds: int, warm_up: bool) -> dict:
    """name -> [(seconds, cpu) per round]: every query once a round, the order rotated each round."""
    names = list(found)
    if warm_up:
        for name in names:
            found[name][1]()
    runs = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            cpu_before = cpu_seconds()
            started = time.perf_counter()
            found[name][1]()
            seconds = time.perf_counter() - started
            cpu_after = cpu_seconds()
            # a worker that exited unreaped between the two readings takes its CPU seconds with it: never below 0
            cpu = None if cpu_before is None else {k: max(0.0, cpu_after[k] - cpu_before[k]) for k in cpu_before}
            runs[name].append((seconds, cpu))
        print(f"  round {round_number + 1} of {rounds} done", flush=True)
    return runs


def results_of(found: dict, runs: dict) -> list[dict]:
    results = []
    for name, measured in runs.items():
        seconds = [s for s, _ in measured]
        median = statistics.median(seconds)
        result = dict(name=name, rows=found[name][0], rounds=len(seconds), seconds_median=round(median, 4),
                      seconds_min=round(min(seconds), 4), seconds_max=round(max(seconds), 4),
                      rows_per_s=round(found[name][0] / median))
        if measured[0][1] is not None:
            result["cpu_jvm_s"] = round(statistics.median(c["jvm"] for _, c in measured), 2)
            result["cpu_python_workers_s"] = round(statistics.median(c["python_workers"] for _, c in measured), 2)
        results.append(result)
    return results


def summarize(runs: dict) -> dict:
    """Per query kind and source: the median over rounds of Parquet's seconds over the source's (same round)."""
    summary = {}
    for kind, target in TARGETS.items():
        parquet = [s for s, _ in runs[f"{kind}: parquet"]]
        key = kind.replace(" ", "_").replace("-", "_").replace("+", "_")
        for name, label in (("commitlog", "commitlog"), (source.PYTHON_FORMAT_NAME, "python")):
            mine = [s for s, _ in runs[f"{kind}: {name}"]]
            ratios = [p / m for p, m in zip(parquet, mine)]
            summary[f"{key}_{label}_vs_parquet"] = round(statistics.median(ratios), 3)
            summary[f"{key}_{label}_vs_parquet_min_max"] = [round(min(ratios), 3), round(max(ratios), 3)]
        summary[f"{key}_target_vs_parquet"] = target
        summary[f"{key}_meets_target"] = summary[f"{key}_commitlog_vs_parquet"] >= target
    return summary


def measure(root: str, parquet: str, work_dir: str, rounds: int, warm_up: bool, spark=None,
            master: str = MASTER) -> tuple[list[dict], dict]:
    """(results, summary); uses `spark` when given (and leaves it running), else a session of its own."""
    own_session = spark is None
    if own_session:
        spark = spark_session(master)
    else:
        source.register(spark)
    pushdown_before = spark.conf.get("spark.sql.python.filterPushdown.enabled")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        found = queries(spark, root, parquet, work_dir)
        runs = run_rounds(found, rounds, warm_up)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown_before)
        if own_session:
            spark.stop()
    return results_of(found, runs), summarize(runs)


def main(argv=None, spark=None) -> str:
    """Run the benchmark (in `spark` when given, e.g. by a test); returns the path of the JSON written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small store, one round, no warm-up")
    parser.add_argument("--rows", type=int, help="messages of 100 B (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 1 with --quick)")
    parser.add_argument("--keep", action="store_true", help="keep the generated store and Parquet file")
    parser.add_argument("--out", metavar="PATH",
                        help="JSON result path (default: bench/results/spark_read.json, spark_read_quick.json "
                             "with --quick)")
    parser.add_argument("--work-dir", metavar="DIR",
                        help="directory to generate the store and copy under (default: bench/results/tmp)")
    parser.add_argument("--master", default=MASTER,
                        help=f"Spark master of the session the benchmark starts (default {MASTER}, the target's)")
    args = parser.parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 5)
    work_dir = (os.path.join(args.work_dir, os.path.basename(WORK_DIR)) if args.work_dir else WORK_DIR) \
        + ("_quick" if args.quick else "")
    os.makedirs(work_dir, exist_ok=True)
    load_before = os.getloadavg()
    root, parquet = os.path.join(work_dir, "store"), os.path.join(work_dir, "store.parquet")
    try:
        started = time.perf_counter()
        generate_user_store(root, rows)
        write_parquet(root, parquet)
        print(f"store: {rows} messages, written and copied to Parquet in {time.perf_counter() - started:.1f} s",
              flush=True)
        log_bytes = sum(os.path.getsize(os.path.join(root, "commitlog", f))
                        for f in os.listdir(os.path.join(root, "commitlog")))
        results, summary = measure(root, parquet, work_dir, rounds, not args.quick, spark, args.master)
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    print()
    print(f"{'query':<42} {'rows':>9} {'median s':>9} {'min-max s':>15} {'M rows/s':>9} {'CPU s JVM':>10} "
          f"{'CPU s Python':>13}")
    for r in results:
        print(f"{r['name']:<42} {r['rows']:>9} {r['seconds_median']:>9.3f} "
              f"{r['seconds_min']:>7.3f}-{r['seconds_max']:<7.3f} {r['rows_per_s'] / 1e6:>9.3f} "
              f"{r.get('cpu_jvm_s', ''):>10} {r.get('cpu_python_workers_s', ''):>13}")
    print()
    for key, value in summary.items():
        print(f"{key:<48} {value}")
    output = {
        "benchmark": "spark_read", "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "quick": args.quick,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "settings": {"rows": rows, "body_bytes": 100, "rounds": rounds, "warm_up": not args.quick,
                     "topics": TOPICS, "queues_per_topic": 4, "put_batch_messages": USER_BATCH_MESSAGES,
                     "filter": FILTER, "master": spark.sparkContext.master if spark is not None else args.master},
        "store": {"rows": rows, "log_bytes": log_bytes},
        "results": results, "summary": summary,
    }
    path = args.out or os.path.join(RESULTS_DIR, "spark_read_quick.json" if args.quick else "spark_read.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(output, handle, indent=2)
    print(f"\nwrote {path if args.out else os.path.relpath(path)}")
    return path


if __name__ == "__main__":
    main()
