"""A probe, not a store feature: what would dispatch in a process of its own give one producer?

    .venv/bin/python bench/dispatch_process.py            # full run (about 2 minutes)
    .venv/bin/python bench/dispatch_process.py --quick    # smoke run (a few seconds)

The store dispatches in a thread of the writer's process, on the producers' interpreter lock. This probe
runs the same puts two ways, the ways taking turns for ROUNDS rounds, each run in a fresh interpreter:

- thread: the store as it is (store defaults, index on);
- process: the store's dispatch thread is not started; after each append the writer publishes the log's end
  in an 8-byte shared file (through a wrapper around `CommitLog.append_locked`: a real implementation would
  cost less), and a child process (this script with --child) follows that end and dispatches the log with the
  store's own DispatchService, ConsumeQueue and index dispatchers, into directories of its own (tail batches
  of 16 records with SYNC, 512 with ASYNC, idle wait 1 ms: the thread's settings), and flushes them on the
  store's interval with the store's flush service (until session 8 it did not flush them, which flattered it).

Per run: puts a second while the producer loops, p99 and max put latency, puts over 5 ms, how long dispatch
then needs to catch up, and the rate counting that catch-up. The child must dispatch every record (checked).
In the same run, the raw pwrite+fdatasync loop for the SYNC sizes. It reaches into the store's internals
(it replaces `DispatchService.start` and the store's append function): it measures a design, it is no API.

Writes bench/results/dispatch_process.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from flush_modes import sync_loop  # noqa: E402 - the raw pwrite+fdatasync loop, as flush_modes measures it

CELLS = (("ASYNC", 1024), ("SYNC", 100), ("SYNC", 1024))
MODES = ("thread", "process")
ROUNDS = 3
SECONDS = 3.0
CHILD_START_S = 1.0  # the child's imports, before the producer starts
# The end is published as one aligned native int64 (one 8-byte store and load on x86-64, so never torn):
# struct.pack_into(">q") stores the bytes one by one, and a reader could see half an update, an end that is
# no record boundary.
END_BYTES = 8


def child(root: str, end_path: str, target: str, tail_batch: int) -> None:
    """Follow the end the writer publishes in `end_path`; dispatch into `target`; print the records
    dispatched once `target/stop` exists and everything published is dispatched."""
    from commitlog.commitlog import CommitLog
    from commitlog.dispatch import DispatchService
    from consumequeue.consume_queue import ConsumeQueueTable
    from consumequeue.dispatcher import ConsumeQueueDispatcher
    from flush.services import IntervalFlusher
    from indexfile.dispatcher import IndexDispatcher
    from indexfile.index_service import IndexService
    from mqstore import StoreConfig
    from mqstore.engine import CONSUME_QUEUE_FLUSH_LEAST_PAGES, CONSUME_QUEUE_FLUSH_THOROUGH_INTERVAL_MS
    from mqstore.engine_index import IndexFlushable

    config = StoreConfig()
    fd = os.open(end_path, os.O_RDONLY)
    published = np.frombuffer(mmap.mmap(fd, END_BYTES, prot=mmap.PROT_READ), dtype=np.int64)
    log = CommitLog(os.path.join(root, "commitlog"), config.segment_size_bytes, writable=False,
                    max_message_size_bytes=config.max_message_size_bytes,
                    max_queues_per_topic=config.max_queues_per_topic, born_host_raw=bytes(8),
                    store_host_raw=bytes(8), record_crc=config.record_crc)

    class Published:
        record_crc = config.record_crc
        record_crc_from = None

        def readable_end(self) -> int:
            return int(published[0])

        def segment_at(self, offset: int):
            return log.segment_at(offset)

    reader = Published()
    table = ConsumeQueueTable(os.path.join(target, "consumequeue"), config.consume_queue_entries_per_file,
                              writable=True)
    index = IndexService(os.path.join(target, "index"), config.index_slot_count, config.index_entry_count_max)
    service = DispatchService(reader, [ConsumeQueueDispatcher(table), IndexDispatcher(index)], log.min_offset())
    # The queues and the index are flushed as the store flushes them (their fdatasyncs share the disk with the
    # writer's): without this the process way would be measured doing less work than the thread way.
    flusher = IntervalFlusher([table, IndexFlushable(index)], interval_ms=config.flush_consume_queue_interval_ms,
                              least_pages=CONSUME_QUEUE_FLUSH_LEAST_PAGES,
                              thorough_interval_ms=CONSUME_QUEUE_FLUSH_THOROUGH_INTERVAL_MS,
                              name="probe-flush-consumequeue")
    flusher.start()
    stop = os.path.join(target, "stop")
    while True:
        if service.dispatch_available(tail_batch) == 0:
            if os.path.exists(stop) and service.dispatched_offset >= reader.readable_end():
                break
            time.sleep(0.001)
    flusher.stop()
    table.close()
    index.close()
    log.close()
    print(service.dispatched_records)


def cell(mode: str, flush: str, body_bytes: int, seconds: float, directory: str) -> dict:
    """One run of one producer's puts (in a fresh interpreter: `process` replaces DispatchService.start)."""
    from commitlog import dispatch

    if mode == "process":
        dispatch.DispatchService.start = lambda self: None
    from mqstore import FlushMode, Message, MessageStore, StoreConfig

    root = tempfile.mkdtemp(dir=directory)
    try:
        store_dir = os.path.join(root, "store")
        store = MessageStore.open(store_dir, StoreConfig(flush_mode=FlushMode[flush]))
        messages = [Message("BenchTopic", os.urandom(body_bytes), queue_id=i % 8) for i in range(64)]
        store.put(Message("BenchTopic", b"first"))
        worker = None
        if mode == "process":
            log = store._commitlog
            log.written_records = None  # nothing takes them in this process
            end_path = os.path.join(root, "end")
            with open(end_path, "wb") as handle:
                handle.write(bytes(END_BYTES))
            end_fd = os.open(end_path, os.O_RDWR)
            end_map = mmap.mmap(end_fd, END_BYTES)
            published = np.frombuffer(end_map, dtype=np.int64)
            published[0] = log.readable_end()
            append = store._append_locked

            def append_and_publish(record):
                placed = append(record)
                published[0] = log.readable_end()
                return placed

            store._append_locked = append_and_publish
            target = os.path.join(root, "dispatched")
            os.makedirs(target)
            worker = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", store_dir, end_path, target,
                 "16" if flush == "SYNC" else "512"], stdout=subprocess.PIPE, text=True)
            time.sleep(CHILD_START_S)
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
        if worker is not None:
            open(os.path.join(target, "stop"), "w").close()
            output, _ = worker.communicate(timeout=600)
            dispatched = int(output) - 1  # the first message
            store._dispatch.dispatched_offset = store._commitlog.readable_end()  # dispatched in the child
        else:
            assert store.wait_dispatched(600)
            dispatched = count
        catch_up_s = clock() - caught_up_at
        store.close()
        if worker is not None:
            del published
            end_map.close()
            os.close(end_fd)
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
        "# Dispatch in a thread or in a process of its own (a probe)", "",
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
    parser.add_argument("--child", nargs=4, metavar=("STORE", "END", "TARGET", "TAIL"), help=argparse.SUPPRESS)
    parser.add_argument("--cell", nargs=5, metavar=("MODE", "FLUSH", "BODY", "SECONDS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2], int(args.child[3]))
        return 0
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
