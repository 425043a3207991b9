"""Spark read benchmark: the commitlog data source against Spark reading the same rows from Parquet.

    .venv/bin/python bench/spark_read.py            # full run (a few minutes; stores of 1 GiB segments)
    .venv/bin/python bench/spark_read.py --quick    # smoke run (small stores, one cold run each, ~40 s)

Prints a table and writes bench/results/spark_read.json (spark_read_quick.json with --quick), or --out PATH.

Stores are generated with tests/spark/storegen.py (ten topics, four queues each, written in interleaved runs of
1 000 messages, TAGS/KEYS/UNIQ_KEY properties like a RocketMQ producer sets), in bench/results/tmp/ (or under
--work-dir; removed afterwards unless --keep). Measured on local[2] (--master; the target's setting), best of
--repeat runs after one warm-up, every query building its DataFrame anew (planning included) and materializing
all columns (noop sink):

    full scan 100 B / 1 KB   spark.read.format("commitlog") of the whole store, and format("commitlog-jvm"), the
                             JVM reader (mqstore/spark/jvm.py; the session is started with its jar)
    one topic (1/10)         .where("topic = 'topic-3'") with filter pushdown (ConsumeQueue path), and without
    streaming availableNow   readStream of the whole store into a noop sink, one trigger
    Parquet (peer)           the same rows, written by pyarrow, read by Spark's Parquet source
    ceiling (physical limit) a Python data source yielding the same rows as ready Arrow batches from a memory-
                             mapped Arrow file: what Spark's Python data source path costs with no decoding
    decode only              the source's reader in this process, no Spark, one core

Each Spark row also gives the CPU seconds its best run cost, split between the JVM (Spark's own threads: task
setup, reading the Arrow stream or the Parquet file, turning columns into rows) and the Python workers (the
reader: planning, decoding, writing Arrow to the JVM), from /proc (Linux; absent elsewhere). On a shared machine
CPU seconds say more than wall time, which other processes' load stretches.

Target (issue 21): the full scan of 100 B records at >= 1.0x the rows/s of Spark's own Parquet reader over the
same rows, in the same run, met by the JVM reader (summary: full_scan_100b_vs_parquet, full_scan_100b_meets_target;
the Python source's own ratio is full_scan_100b_python_vs_parquet).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mqstore.spark import jvm, source  # noqa: E402
from mqstore.store import scan_options as spark_options  # noqa: E402
from tests.spark.storegen import StoreWriter  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
WORK_DIR = os.path.join(RESULTS_DIR, "tmp", "spark_read")
TOPICS = 10
RUN_MESSAGES = 1000
MASTER = "local[2]"  # the target's setting: two cores, as the project's machine has
TARGET_FULL_SCAN_VS_PARQUET = 1.0  # full scan 100 B: commitlog rows/s over Parquet rows/s, same run


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
    spark = jvm.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(source.CommitLogDataSource)
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


def stream_available_now(spark, root: str, checkpoint: str) -> None:
    shutil.rmtree(checkpoint, ignore_errors=True)
    query = (spark.readStream.format("commitlog").load(root).writeStream.format("noop")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def prepare_stores(work_dir: str, rows_100b: int, rows_1kb: int, segment_bytes: int) -> dict:
    """Generate both stores and their Parquet and Arrow copies in `work_dir`."""
    stores = {}
    for name, count, body in (("100b", rows_100b, 100), ("1kb", rows_1kb, 1000)):
        root = os.path.join(work_dir, f"store-{name}")
        started = time.perf_counter()
        generate_store(root, count, body, segment_bytes)
        parquet_path, arrow_path = os.path.join(work_dir, f"{name}.parquet"), os.path.join(work_dir, f"{name}.arrow")
        write_copies(root, parquet_path, arrow_path)
        log_dir = os.path.join(root, "commitlog")
        stores[name] = dict(root=root, rows=count, parquet=parquet_path, arrow=arrow_path,
                            log_bytes=sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir)))
        print(f"store {name}: {count} messages, prepared in {time.perf_counter() - started:.1f} s", flush=True)
    return stores


def measure(stores: dict, repeat: int, spark=None, master: str = MASTER) -> list[dict]:
    """Every measurement; uses `spark` when given (and leaves it running), else a session of its own on `master`."""
    results = []

    def record(name, rows, measured):
        seconds, cpu = measured if isinstance(measured, tuple) else (measured, None)
        result = dict(name=name, rows=rows, seconds=round(seconds, 4), rows_per_s=round(rows / seconds))
        if cpu is not None:
            result.update(cpu_jvm_s=cpu["jvm"], cpu_python_workers_s=cpu["python_workers"])
        results.append(result)
        cpu_text = "" if cpu is None else f"  CPU s: JVM {cpu['jvm']:.2f}, Python workers {cpu['python_workers']:.2f}"
        print(f"  {name:<48} {rows:>10} rows {seconds:8.3f} s {rows / seconds / 1e6:8.3f} M rows/s{cpu_text}",
              flush=True)

    for name in stores:
        rows, seconds = decode_all(stores[name]["root"])
        record(f"decode only, {name} (no Spark, 1 core)", rows, seconds)
    own_session = spark is None
    if own_session:
        spark = spark_session(master)
    else:
        spark.dataSource.register(source.CommitLogDataSource)
        spark.dataSource.register(_ceiling_source())
    pushdown_before = spark.conf.get("spark.sql.python.filterPushdown.enabled")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        # every run builds its DataFrame anew, so planning (snapshot end, partitions, pushdown) is timed too
        for name, info in stores.items():
            record(f"full scan {name}: commitlog", info["rows"],
                   timed(lambda info=info: noop(spark.read.format("commitlog").load(info["root"])), repeat))
            record(f"full scan {name}: commitlog-jvm", info["rows"],
                   timed(lambda info=info: noop(spark.read.format(jvm.FORMAT_NAME).load(info["root"])), repeat))
            record(f"full scan {name}: parquet (pyarrow file)", info["rows"],
                   timed(lambda info=info: noop(spark.read.parquet(info["parquet"])), repeat))
            record(f"full scan {name}: ceiling (ready Arrow batches)", info["rows"],
                   timed(lambda info=info: noop(spark.read.format("arrowfile").load(info["arrow"])), repeat))
        info = stores["100b"]
        topic_rows = spark.read.format("commitlog").option("topic", "topic-3").load(info["root"]).count()

        def topic_scan():
            noop(spark.read.format("commitlog").load(info["root"]).where("topic = 'topic-3'"))

        record("one topic (1/10) 100b: commitlog, pushdown", topic_rows, timed(topic_scan, repeat))
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
        record("one topic (1/10) 100b: commitlog, no pushdown", topic_rows, timed(topic_scan, repeat))
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
        record("one topic (1/10) 100b: parquet", topic_rows,
               timed(lambda: noop(spark.read.parquet(info["parquet"]).where("topic = 'topic-3'")), repeat))
        checkpoint = os.path.join(os.path.dirname(info["root"]), "checkpoint")
        record("streaming availableNow 100b: commitlog", info["rows"],
               timed(lambda: stream_available_now(spark, info["root"], checkpoint), repeat))
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown_before)
        if own_session:
            spark.stop()
    return results


def summarize(results: list[dict]) -> dict:
    by_name = {r["name"]: r for r in results}
    python = by_name["full scan 100b: commitlog"]
    full = by_name["full scan 100b: commitlog-jvm"]  # the target is the JVM reader's
    topic = by_name["one topic (1/10) 100b: commitlog, pushdown"]
    parquet = by_name["full scan 100b: parquet (pyarrow file)"]["rows_per_s"]
    parquet_1kb = by_name["full scan 1kb: parquet (pyarrow file)"]["rows_per_s"]
    vs_parquet = full["rows_per_s"] / parquet
    return {
        "full_scan_100b_rows_per_s": full["rows_per_s"],
        "full_scan_100b_vs_parquet": round(vs_parquet, 3),
        "full_scan_100b_target_vs_parquet": TARGET_FULL_SCAN_VS_PARQUET,
        "full_scan_100b_meets_target": vs_parquet >= TARGET_FULL_SCAN_VS_PARQUET,
        "full_scan_100b_python_vs_parquet": round(python["rows_per_s"] / parquet, 3),
        "full_scan_100b_python_vs_ceiling": round(
            python["rows_per_s"] / by_name["full scan 100b: ceiling (ready Arrow batches)"]["rows_per_s"], 3),
        "full_scan_1kb_vs_parquet": round(by_name["full scan 1kb: commitlog-jvm"]["rows_per_s"] / parquet_1kb, 3),
        "full_scan_1kb_python_vs_parquet": round(by_name["full scan 1kb: commitlog"]["rows_per_s"] / parquet_1kb, 3),
        "topic_scan_time_ratio": round(topic["seconds"] / python["seconds"], 3),
    }


def main(argv=None, spark=None) -> str:
    """Run the benchmark (in `spark` when given, e.g. by a test); returns the path of the JSON written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small stores, one cold run per measurement")
    parser.add_argument("--rows-100b", type=int, help="messages of 100-byte bodies")
    parser.add_argument("--rows-1kb", type=int, help="messages of 1 KB bodies")
    parser.add_argument("--segment-bytes", type=int, help="CommitLog segment size")
    parser.add_argument("--keep", action="store_true", help="keep the generated stores and copies")
    parser.add_argument("--out", metavar="PATH",
                        help="JSON result path (default: bench/results/spark_read.json, spark_read_quick.json "
                             "with --quick)")
    parser.add_argument("--work-dir", metavar="DIR",
                        help="directory to generate the stores and copies under (default: bench/results/tmp)")
    parser.add_argument("--repeat", type=int, help="timed runs after a warm-up (best is kept); 0: one cold run")
    parser.add_argument("--master", default=MASTER,
                        help=f"Spark master of the session the benchmark starts (default {MASTER}, the target's)")
    args = parser.parse_args(argv)
    rows_100b = args.rows_100b or (200_000 if args.quick else 3_000_000)
    rows_1kb = args.rows_1kb or (40_000 if args.quick else 500_000)
    segment_bytes = args.segment_bytes or ((16 << 20) if args.quick else (1 << 30))
    repeat = args.repeat if args.repeat is not None else (0 if args.quick else 2)
    work_dir = (os.path.join(args.work_dir, os.path.basename(WORK_DIR)) if args.work_dir else WORK_DIR) \
        + ("_quick" if args.quick else "")
    os.makedirs(work_dir, exist_ok=True)
    load_before = os.getloadavg()
    stores = prepare_stores(work_dir, rows_100b, rows_1kb, segment_bytes)
    try:
        results = measure(stores, repeat, spark, args.master)
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarize(results)
    print()
    print(f"{'measurement':<52} {'rows':>10} {'seconds':>9} {'M rows/s':>9} {'CPU s JVM':>10} {'CPU s Python':>13}")
    for r in results:
        print(f"{r['name']:<52} {r['rows']:>10} {r['seconds']:>9.3f} {r['rows_per_s'] / 1e6:>9.3f} "
              f"{r.get('cpu_jvm_s', ''):>10} {r.get('cpu_python_workers_s', ''):>13}")
    print()
    for key, value in summary.items():
        print(f"{key:<40} {value}")
    output = {
        "benchmark": "spark_read", "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "quick": args.quick,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "settings": {"rows_100b": rows_100b, "rows_1kb": rows_1kb, "segment_bytes": segment_bytes, "repeat": repeat,
                     "topics": TOPICS, "run_messages": RUN_MESSAGES,
                     "master": spark.sparkContext.master if spark is not None else args.master},
        "stores": {name: {k: info[k] for k in ("rows", "log_bytes")} for name, info in stores.items()},
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
