"""Core engine benchmark: put, put_batch, get and dispatch rates, against a bare-Python baseline.

    .venv/bin/python bench/put_get.py            # full run (about a minute)
    .venv/bin/python bench/put_get.py --quick    # smoke run (a few seconds)

Prints a table and writes bench/results/put_get.json (or put_get_quick.json). The baseline is measured in
the same run: a bare loop that packs the same 88-byte header with struct.pack_into into a pre-touched mmap
and copies the body, with no checks, no locking and no dispatch. Cold figures write into a fresh segment
(page faults on first touch); warm figures write into pages touched beforehand.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mqstore.commitlog import format as fmt  # noqa: E402
from mqstore.commitlog.dispatch import DispatchService  # noqa: E402
from mqstore.consumequeue.consume_queue import ConsumeQueueTable  # noqa: E402
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher  # noqa: E402
from mqstore.indexfile.dispatcher import IndexDispatcher  # noqa: E402
from mqstore.indexfile.index_service import IndexService  # noqa: E402

from mqstore import GetStatus, Message, MessageStore, StoreConfig  # noqa: E402

QUEUES = 8
PAGE = mmap.PAGESIZE


def baseline(count: int, body_size: int) -> float:
    """msgs/s of the bare loop: header pack + body copy into a pre-touched mapping."""
    body = b"x" * body_size
    tail = bytes((6,)) + b"orders" + b"\x00\x00"
    size = 88 + body_size + len(tail)
    buffer = mmap.mmap(-1, size * count + PAGE)
    for position in range(0, len(buffer), PAGE):
        buffer[position] = 1
    pack = fmt.HEADER_V1.pack_into
    crc32 = fmt.crc32  # the CRC the store uses (ISA-L's)
    host = b"\x0a\x00\x00\x01\x00\x00\x2a\x9f"
    started = time.perf_counter()
    position = 0
    for i in range(count):
        pack(buffer, position, size, fmt.MESSAGE_MAGIC_CODE, crc32(body) & 0x7FFFFFFF, i % QUEUES, 0, i, position,
             0, 1, host, 2, host, 0, 0, body_size)
        buffer[position + 88 : position + 88 + body_size] = body
        buffer[position + 88 + body_size : position + size] = tail
        position += size
    elapsed = time.perf_counter() - started
    buffer.close()
    return count / elapsed


def _config(index: bool = False, record_crc: bool = True, dispatch_process: bool = True) -> StoreConfig:
    """The core engine's rows run without the index (it adds a UNIQ_KEY and index entries to every message);
    one row measures put with it, as a store opened with the defaults runs. Record CRCs are on (the default)
    except in the rows that say so; dispatch runs in its own process (the default) except in the rows that say
    "dispatch thread"."""
    return StoreConfig(store_host="10.0.0.1", index_enabled=index, record_crc=record_crc,
                       dispatch_process=dispatch_process)


def _record_bytes(body_size: int, record_crc: bool) -> int:
    return fmt.RECORD_SIZE_FIXED + len("orders") + body_size + (fmt.RECORD_CRC_LENGTH if record_crc else 0)


def _pre_touch(store: MessageStore, nbytes: int) -> None:
    """Touch the pages of the current segment that the next `nbytes` of records will use (the 'warm' case), then
    write them back, so that the kernel is not writing a gigabyte of touched zeros during the measurement."""
    segment = store._commitlog.segments.last()
    view = segment.view
    start = store._commitlog.readable_end() - segment.base_offset
    stop = min(segment.size_bytes, start + nbytes + 2 * PAGE)
    for position in range(start - start % PAGE + PAGE, stop, PAGE):
        view[position] = 0
    segment.flush(start, stop)


def bench_put(root: str, count: int, body_size: int, warm: bool, index: bool = False,
              record_crc: bool = True, dispatch_process: bool = True) -> dict:
    messages = [Message("orders", b"x" * body_size, queue_id=i % QUEUES) for i in range(count)]
    with MessageStore.open(root, _config(index, record_crc, dispatch_process)) as store:
        store.put(Message("orders", b"first"))
        if warm:
            _pre_touch(store, count * _record_bytes(body_size, record_crc))
        started = time.perf_counter()
        for message in messages:
            store.put(message)
        elapsed = time.perf_counter() - started
        store.wait_dispatched(120)
        dispatched = time.perf_counter() - started
    size = _record_bytes(body_size, record_crc)
    return {"msgs_per_s": count / elapsed, "mb_per_s": count * size / elapsed / 1e6,
            "msgs_per_s_dispatched": count / dispatched}


def bench_put_batch(root: str, count: int, body_size: int, warm: bool, batch: int = 1000,
                    record_crc: bool = True, dispatch_process: bool = True) -> dict:
    messages = [Message("orders", b"x" * body_size, queue_id=i % QUEUES) for i in range(count)]
    with MessageStore.open(root, _config(record_crc=record_crc, dispatch_process=dispatch_process)) as store:
        store.put(Message("orders", b"first"))
        if warm:
            _pre_touch(store, count * _record_bytes(body_size, record_crc))
        started = time.perf_counter()
        for start in range(0, count, batch):
            store.put_batch(messages[start : start + batch])
        elapsed = time.perf_counter() - started
        store.wait_dispatched(120)
        dispatched = time.perf_counter() - started
    size = _record_bytes(body_size, record_crc)
    return {"msgs_per_s": count / elapsed, "mb_per_s": count * size / elapsed / 1e6,
            "msgs_per_s_dispatched": count / dispatched}


def bench_get(root: str, max_count: int = 32) -> dict:
    with MessageStore.open(root, _config()) as store:
        read = 0
        started = time.perf_counter()
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                result = store.get("orders", queue_id, offset, max_count)
                if result.status is not GetStatus.FOUND:
                    break
                for message in result.messages:
                    read += len(message.body) > -1
                offset = result.next_offset
        elapsed = time.perf_counter() - started
    return {"msgs_per_s": read / elapsed, "messages": read}


def bench_dispatch(root: str, index: bool = False) -> dict:
    """Rebuild every ConsumeQueue of the store from its CommitLog in one thread (and with `index`, the index
    too: every message has its UNIQ_KEY, one key each; default index file sizes)."""
    with MessageStore.open(root, _config()) as store:
        log = store._commitlog
        target = tempfile.mkdtemp(dir=root)
        table = ConsumeQueueTable(os.path.join(target, "consumequeue"), 300_000, writable=True)
        dispatchers = [ConsumeQueueDispatcher(table)]
        if index:
            index_service = IndexService(os.path.join(target, "index"))
            dispatchers.append(IndexDispatcher(index_service))
        service = DispatchService(log, dispatchers, log.min_offset())
        started = time.perf_counter()
        records = service.dispatch_available()
        elapsed = time.perf_counter() - started
        table.close()
        if index:
            index_service.close()
        shutil.rmtree(target)
    return {"msgs_per_s": records / elapsed, "messages": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs of every row (default 3, 1 with --quick); the table gives the median and the best")
    args = parser.parse_args()
    count = 20_000 if args.quick else 300_000
    repeat = args.repeat or (1 if args.quick else 3)
    work = tempfile.mkdtemp(prefix="mqstore-bench-")
    rows = []
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        def fresh(name):
            """A new store directory; the stores of earlier rows are removed (each reserves 1-2 GiB)."""
            for old in os.listdir(work):
                shutil.rmtree(os.path.join(work, old), ignore_errors=True)
            return os.path.join(work, name)

        def row(name, measure, base=None):
            """Run `measure` `repeat` times; the row keeps the median run, the best and every run's rate."""
            runs = sorted((measure() for _ in range(repeat)), key=lambda result: result["msgs_per_s"])
            result = {**runs[len(runs) // 2], "best_msgs_per_s": runs[-1]["msgs_per_s"],
                      "runs_msgs_per_s": [run["msgs_per_s"] for run in runs]}
            rows.append((name, result, base))
            return result

        base_100 = row("baseline pack+copy 100 B (warm mmap)",
                       lambda: {"msgs_per_s": baseline(count, 100)})["msgs_per_s"]
        base_1k = row("baseline pack+copy 1 KB (warm mmap)",
                      lambda: _with_mb(baseline(count, 1000), 1097))["msgs_per_s"]
        for body, base in ((100, base_100), (1000, base_1k)):
            for warm in (False, True):
                row(f"put {body} B, 1 thread, {'warm' if warm else 'cold'}",
                    lambda body=body, warm=warm: bench_put(fresh(f"put{body}{warm}"), count, body, warm), base)
        row("put 100 B, 1 thread, warm, index on",
            lambda: bench_put(fresh("put-index"), count, 100, True, index=True), base_100)
        row("put 100 B, 1 thread, warm, record_crc off",
            lambda: bench_put(fresh("put-nocrc"), count, 100, True, record_crc=False), base_100)
        row("put 100 B, 1 thread, warm, dispatch thread",
            lambda: bench_put(fresh("put-thread"), count, 100, True, dispatch_process=False), base_100)
        for warm in (False, True):
            row(f"put_batch 1 KB x1000, {'warm' if warm else 'cold'}",
                lambda warm=warm: bench_put_batch(fresh(f"batch{warm}"), count, 1000, warm), base_1k)
        row("put_batch 1 KB x1000, warm, record_crc off",
            lambda: bench_put_batch(fresh("batch-nocrc"), count, 1000, True, record_crc=False), base_1k)
        row("put_batch 1 KB x1000, warm, dispatch thread",
            lambda: bench_put_batch(fresh("batch-thread"), count, 1000, True, dispatch_process=False), base_1k)
        store = fresh("get")
        with MessageStore.open(store, _config()) as s:
            for start in range(0, count, 1000):
                s.put_batch([Message("orders", b"x" * 100, queue_id=i % QUEUES) for i in range(start, start + 1000)])
        row("get 100 B, 32 per call, sequential", lambda: bench_get(store))
        row("dispatch (rebuild ConsumeQueues), 100 B", lambda: bench_dispatch(store))
        row("dispatch (ConsumeQueues and index), 100 B", lambda: bench_dispatch(store, index=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()[0]

    print(f"\nmqstore put/get benchmark ({count:,} messages per row, {repeat} run(s) each; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load {load_before:.1f} before, {load_after:.1f} after)")
    print(f"{'case':<48} {'msgs/s':>10} {'best':>10} {'MB/s':>6} {'vs baseline':>12} {'dispatched/s':>13}")
    for name, result, base in rows:
        mb = f"{result['mb_per_s']:.0f}" if "mb_per_s" in result else ""
        ratio = f"{result['msgs_per_s'] / base:.2f}x" if base else ""
        dispatched = f"{result['msgs_per_s_dispatched']:,.0f}" if "msgs_per_s_dispatched" in result else ""
        print(f"{name:<48} {result['msgs_per_s']:>10,.0f} {result['best_msgs_per_s']:>10,.0f} {mb:>6} {ratio:>12} "
              f"{dispatched:>13}")
    print("msgs/s and MB/s are the median run's; best is the fastest run's msgs/s; the ratio is of medians; "
          "dispatched/s counts the time until every message was dispatched (visible to get()).")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "put_get_quick.json" if args.quick else "put_get.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = " ".join(["bench/put_get.py"] + (["--quick"] if args.quick else [])
                       + ([f"--repeat {args.repeat}"] if args.repeat else []))
    with open(out, "w") as handle:
        json.dump({"command": command, "messages_per_row": count, "runs_per_row": repeat,
                   "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "seconds": round(elapsed, 1),
                   "load_average_1min": [load_before, load_after],
                   "python": platform.python_version(), "cores": os.cpu_count(),
                   "rows": [{"case": name, **result, "baseline_msgs_per_s": base} for name, result, base in rows]},
                  handle, indent=2)
    print(f"results written to {out}")
    return 0


def _with_mb(msgs_per_s: float, record_bytes: int) -> dict:
    return {"msgs_per_s": msgs_per_s, "mb_per_s": msgs_per_s * record_bytes / 1e6}


if __name__ == "__main__":
    sys.exit(main())
