"""The two codecs side by side, with RocketMQ 4.4.0's own store in the same run (issue 21's put, put_batch and get).

    .venv/bin/python bench/native.py            # full run (a few minutes)
    .venv/bin/python bench/native.py --quick    # smoke run (seconds; RocketMQ rows with few messages)

Rows, each measured with the compiled codec and with the pure-Python one (MQSTORE_NATIVE=0, in a process of its
own, so that each runs with its own `Message` type):
  - put of 100 B and 1 KB bodies, ASYNC, one producer thread, 4 topics x 4 queues, the Message built in the loop
    (record CRCs on, as the default config; no index);
  - the same with the default config (index on: every message gets a UNIQ_KEY and is indexed by it and its
    keys) and messages of the shape RocketMQ's rows put: a tag (7 values) and a key per message;
  - put_batch of 1 KB bodies, 1000 a call (from a pool of 64 batches built beforehand), GB/s of records:
    warm: `warm_segments=True` (batches copied into the mapping), and every page the row writes pre-faulted
    with MADV_POPULATE_WRITE before the clock starts (what `warm_segments` does ahead of the writer), so the row
    stays inside the first 1 GiB segment (at most WARM_MESSAGES_MAX messages); cold: fresh pages, the default
    config (batches written with pwrite), all the messages (a 3M run spans 4 segments);
  - get of 100 B messages, 32 a call, every queue from its start.
The put_batch rows also give the producer thread's own CPU time (`cpu_mb_per_s`: the rate were that thread never
to wait for the interpreter or a core), and the limits of the same run: memcpy of the same 1.1 MB batches into a
pre-faulted file mapping (the physical limit of the warm row) and into fresh pages of a file (the page-fault
limit of the cold row).
RocketMQ's rows are `rmq put DIR SEG_BYTES N BODY async 4 4` (one thread; $MQSTORE_ROCKETMQ_HOME, else
../shared/rocketmq-4.4.0; left out, with the reason printed, when it or Java is missing). Prints a table and
writes bench/results/native.json (native_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOPICS = 4
QUEUES = 4
BATCH = 1000
BATCH_POOL = 64  # distinct batches the put_batch rows cycle through (3M Messages alive would make the GC the cost)
SEGMENT_BYTES = 1 << 30
PAGE = 4096
WARM_MESSAGES_MAX = 900_000  # the warm put_batch row stays inside the first segment: 900k x 1117 B = 1.0 GB
LIMIT_BYTES_MAX = 256 << 20  # the memcpy limits copy this much at most (fresh pages take 0.5 s a 256 MiB here)


def _config(record_crc: bool = True, warm_segments: bool = False, index: bool = False):
    from mqstore import StoreConfig

    return StoreConfig(store_host="10.0.0.1", index_enabled=index, record_crc=record_crc, warm_segments=warm_segments)


def _record_bytes(body: int, topic: str = "topic0", record_crc: bool = True) -> int:
    return 91 + body + len(topic) + (20 if record_crc else 0)


def _pre_fault(store, nbytes: int) -> None:
    """Pre-fault the pages of the current segment the next `nbytes` of records will use (MADV_POPULATE_WRITE, as
    `warm_segments` does; zeros written where the kernel lacks it: the bytes past the log's end are zeros)."""
    from mqstore.commitlog.mapped_file import MADV_POPULATE_WRITE, madvise

    segment = store._commitlog.segments.last()
    start = store._commitlog.readable_end() - segment.base_offset
    start -= start % PAGE
    stop = min(segment.size_bytes, start + nbytes + 2 * PAGE)
    array = segment.array
    if madvise is None or madvise(array.ctypes.data + start, stop - start, MADV_POPULATE_WRITE) != 0:
        array[start + PAGE:stop:PAGE] = 0


def worker_put(root: str, count: int, body_size: int) -> dict:
    from mqstore import Message, MessageStore

    body = os.urandom(body_size)
    topics = [f"topic{i}" for i in range(TOPICS)]
    with MessageStore.open(root, _config()) as store:
        store.put(Message("topic0", b"first"))
        put = store.put
        started = time.perf_counter()
        for i in range(count):
            put(Message(topics[i & 3], body, queue_id=(i >> 2) & 3))
        elapsed = time.perf_counter() - started
        store.wait_dispatched(300)
    return {"msgs_per_s": count / elapsed, "mb_per_s": count * _record_bytes(body_size) / elapsed / 1e6}


def worker_put_indexed(root: str, count: int, body_size: int) -> dict:
    """The put row with the default config (index on) and RocketMQ's message shape: a tag and a key each."""
    from mqstore import Message, MessageStore

    body = os.urandom(body_size)
    topics = [f"topic{i}" for i in range(TOPICS)]
    tags = [f"tag{i}" for i in range(7)]
    with MessageStore.open(root, _config(index=True)) as store:
        for topic in topics:
            store.put(Message(topic, b"first"))
        put = store.put
        start = store._commitlog.readable_end()
        started = time.perf_counter()
        for i in range(count):
            put(Message(topics[i & 3], body, queue_id=(i >> 2) & 3, tags=tags[i % 7], keys=(f"k{i}",)))
        elapsed = time.perf_counter() - started
        written = store._commitlog.readable_end() - start  # the records with their properties
        store.wait_dispatched(600)
    return {"msgs_per_s": count / elapsed, "mb_per_s": written / elapsed / 1e6}


def worker_put_batch(root: str, count: int, body_size: int, warm: bool) -> dict:
    from mqstore import Message, MessageStore

    body = os.urandom(body_size)
    pool = [[Message(f"topic{number % TOPICS}", body, queue_id=i % QUEUES) for i in range(BATCH)]
            for number in range(BATCH_POOL)]
    batches = count // BATCH
    record_bytes = _record_bytes(body_size)
    with MessageStore.open(root, _config(warm_segments=warm)) as store:
        for topic in range(TOPICS):
            store.put(Message(f"topic{topic}", b"first"))
        if warm:
            _pre_fault(store, batches * BATCH * record_bytes)
        cpu_started = time.thread_time()
        started = time.perf_counter()
        for number in range(batches):
            store.put_batch(pool[number % BATCH_POOL])
        elapsed = time.perf_counter() - started
        cpu = time.thread_time() - cpu_started
        store.wait_dispatched(300)
    count = batches * BATCH
    return {"messages": count, "msgs_per_s": count / elapsed, "mb_per_s": count * record_bytes / elapsed / 1e6,
            "cpu_mb_per_s": count * record_bytes / cpu / 1e6}


def copy_limits(total_bytes: int) -> dict:
    """GB/s of copying 1000-record batches' bytes into a file mapping, one batch after the other: into pages
    pre-faulted with MADV_POPULATE_WRITE, and into fresh pages (each page's first write a fault)."""
    import mmap

    from mqstore.commitlog.mapped_file import MADV_POPULATE_WRITE, madvise

    chunk = BATCH * _record_bytes(1000)
    source = os.urandom(chunk)
    size = max(chunk, min(total_bytes, LIMIT_BYTES_MAX) // chunk * chunk)
    limits = {}
    with tempfile.TemporaryDirectory(prefix="mqstore-native-limits-") as work:
        for name in ("memcpy_prefaulted_gb_per_s", "memcpy_fresh_pages_gb_per_s"):
            path = os.path.join(work, name)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, size)
                mapping = mmap.mmap(fd, size)
                view = memoryview(mapping)
                if name.startswith("memcpy_prefaulted"):
                    address = ctypes_address(mapping)
                    if madvise is None or madvise(address, size, MADV_POPULATE_WRITE) != 0:
                        for at in range(0, size, chunk):
                            view[at : at + chunk] = source
                started = time.perf_counter()
                for at in range(0, size, chunk):
                    view[at : at + chunk] = source
                limits[name] = size / (time.perf_counter() - started) / 1e9
                view.release()
                mapping.close()
            finally:
                os.close(fd)
    limits["bytes"] = size
    return limits


def ctypes_address(mapping) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


def worker_get(root: str, count: int) -> dict:
    from mqstore import GetStatus, Message, MessageStore

    body = b"x" * 100
    with MessageStore.open(root, _config()) as store:
        for start in range(0, count, BATCH):
            store.put_batch([Message(f"topic{i % TOPICS}", body, queue_id=(i // TOPICS) % QUEUES)
                             for i in range(start, start + BATCH)])
        store.wait_dispatched(300)
        read = 0
        started = time.perf_counter()
        for topic in range(TOPICS):
            for queue_id in range(QUEUES):
                offset = 0
                while True:
                    result = store.get(f"topic{topic}", queue_id, offset, 32)
                    if result.status is not GetStatus.FOUND:
                        break
                    read += len(result.messages)
                    offset = result.next_offset
        elapsed = time.perf_counter() - started
    assert read == count, (read, count)
    return {"msgs_per_s": read / elapsed}


def run_worker(args) -> int:
    """One codec's rows, in this process (the parent sets MQSTORE_NATIVE); prints one JSON object."""
    from mqstore.commitlog import native

    codec = "native" if native.NATIVE is not None else "python"
    work = tempfile.mkdtemp(prefix="mqstore-native-bench-")
    rows = {}
    try:
        def fresh(name):
            for old in os.listdir(work):
                shutil.rmtree(os.path.join(work, old), ignore_errors=True)
            return os.path.join(work, name)

        for body in (100, 1000):
            rows[f"put {body} B"] = worker_put(fresh(f"put{body}"), args.count, body)
        for body in (100, 1000):
            rows[f"put {body} B, index, tag+key"] = worker_put_indexed(fresh(f"indexed{body}"), args.count, body)
        warm_count = min(args.count, WARM_MESSAGES_MAX)
        rows["put_batch 1 KB x1000, warm"] = worker_put_batch(fresh("batch"), warm_count, 1000, True)
        rows["put_batch 1 KB x1000, cold"] = worker_put_batch(fresh("batch"), args.count, 1000, False)
        rows["get 100 B, 32 per call"] = worker_get(fresh("get"), args.count)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"codec": codec, "rows": rows}))
    return 0


def rocketmq_home() -> str | None:
    home = os.environ.get("MQSTORE_ROCKETMQ_HOME") or os.path.join(ROOT, "..", "shared", "rocketmq-4.4.0")
    return home if os.path.isfile(os.path.join(home, "rmq")) else None


def rocketmq_put(count: int, body: int) -> dict | str:
    """msgs/s of RocketMQ 4.4.0's putMessage from one thread (ASYNC, 4 topics x 4 queues), or why not measured."""
    home = rocketmq_home()
    if home is None:
        return "no RocketMQ 4.4.0 ($MQSTORE_ROCKETMQ_HOME or ../shared/rocketmq-4.4.0)"
    if shutil.which("java") is None:
        return "no java"
    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as store:
        env = dict(os.environ, RMQ_CACHE=os.environ.get("RMQ_CACHE", "/tmp/rmq-cache-codec"))
        done = subprocess.run([os.path.join(home, "rmq"), "put", os.path.join(store, "s"), str(SEGMENT_BYTES),
                               str(count), str(body), "async", str(TOPICS), str(QUEUES), "1"],
                              capture_output=True, text=True, env=env, timeout=900)
    found = re.search(r"([\d.]+) msg/s\s+([\d.]+) MB/s", done.stdout)
    if done.returncode != 0 or found is None:
        return f"rmq put failed: {(done.stdout + done.stderr)[-300:]}"
    return {"msgs_per_s": float(found.group(1)), "mb_per_s": float(found.group(2))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=None,
                        help="messages per row (default 3000000: fewer leave RocketMQ's JIT cold; 5000 quick)")
    args = parser.parse_args()
    args.count = args.count or (5_000 if args.quick else 3_000_000)  # 300k: RocketMQ 333k/s, 3M: 679k/s
    if args.worker:
        return run_worker(args)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    results = {}
    for codec, flag in (("native", "1"), ("python", "0")):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--count", str(args.count)],
                              capture_output=True, text=True, env=dict(os.environ, MQSTORE_NATIVE=flag), timeout=1800)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        results[codec] = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    warm_bytes = results["native"]["put_batch 1 KB x1000, warm"]["messages"] * _record_bytes(1000)
    limits = copy_limits(warm_bytes)
    rocketmq = {body: rocketmq_put(args.count if not args.quick else 20_000, body) for body in (100, 1000)}
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()[0]

    rows = []
    for case in results["native"]:
        native_row, python_row = results["native"][case], results["python"][case]
        reference = rocketmq.get(100 if "100 B" in case else 1000) if case.startswith("put ") else None
        row = {"case": case, "native": native_row, "python": python_row,
               "native_vs_python": native_row["msgs_per_s"] / python_row["msgs_per_s"]}
        if isinstance(reference, dict):
            row["rocketmq"] = reference
            row["native_vs_rocketmq"] = native_row["msgs_per_s"] / reference["msgs_per_s"]
        elif reference is not None:
            row["rocketmq_missing"] = reference
        rows.append(row)
    print(f"\nmqstore codecs ({args.count:,} messages per row; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; load {load_before:.1f} before, "
          f"{load_after:.1f} after)")
    print(f"{'case':<30} {'native msgs/s':>14} {'python msgs/s':>14} {'RocketMQ msgs/s':>16} {'native MB/s':>12} "
          f"{'vs python':>10} {'vs RocketMQ':>12}")
    for row in rows:
        reference = row.get("rocketmq")
        print(f"{row['case']:<30} {row['native']['msgs_per_s']:>14,.0f} {row['python']['msgs_per_s']:>14,.0f} "
              f"{(format(reference['msgs_per_s'], ',.0f') if reference else '-'):>16} "
              f"{row['native'].get('mb_per_s', 0):>12,.0f} {row['native_vs_python']:>9.2f}x "
              f"{(format(row['native_vs_rocketmq'], '.2f') + 'x') if reference else '-':>12}")
        if "rocketmq_missing" in row:
            print(f"    RocketMQ not measured: {row['rocketmq_missing']}")
        if "cpu_mb_per_s" in row["native"]:
            print(f"    {row['native']['messages']:,} messages; MB/s of the producer thread's CPU time: "
                  f"{row['native']['cpu_mb_per_s']:,.0f} compiled, {row['python']['cpu_mb_per_s']:,.0f} Python")
    print(f"limits, the same batches' bytes ({limits['bytes'] / 2**20:.0f} MiB) copied into a file mapping: "
          f"pre-faulted pages {limits['memcpy_prefaulted_gb_per_s']:.2f} GB/s, fresh pages "
          f"{limits['memcpy_fresh_pages_gb_per_s']:.2f} GB/s; put_batch target 1.50 GB/s warm")
    out = args.out or os.path.join(ROOT, "bench", "results", "native_quick.json" if args.quick else "native.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"command": "bench/native.py" + (" --quick" if args.quick else ""), "messages_per_row": args.count,
                   "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "seconds": round(elapsed, 1),
                   "load_average_1min": [load_before, load_after], "python": platform.python_version(),
                   "cores": os.cpu_count(), "rows": rows, "limits": limits}, handle, indent=2)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
