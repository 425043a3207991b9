"""The dispatch child's CPU per put_batch (1 KB x 1,000, a tag and a key each), measured in-process.

Writes the log once (bench/users_rows.py's put_batch worker), then for each round copies the CommitLog alone
to a fresh root and runs the child's DispatchService (mqstore/store/dispatch_process.py's _Child) over it in
batches of `batch` records, timing the thread's CPU. `--profile` prints a cProfile of one round instead.

    .venv/bin/python bench/dispatch_child_cpu.py DIR [--count 200000] [--rounds 3] [--batch 1000] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from users_rows import worker_put_batch  # noqa: E402

from mqstore.store.config import StoreConfig  # noqa: E402
from mqstore.store.dispatch_process import DISPATCHED, END, ControlWords, _Child, control_path  # noqa: E402


def child_settings(config: StoreConfig, record_crc_from: int) -> dict:
    settings = {name: getattr(config, name) for name in (
        "segment_size_bytes", "max_message_size_bytes", "max_queues_per_topic", "record_crc",
        "consume_queue_entries_per_file", "index_enabled", "index_slot_count", "index_entry_count_max",
        "flush_consume_queue_interval_ms", "check_crc_on_dispatch")}
    settings.update(record_crc_from=record_crc_from, sync_flush=False, consume_queue_flush_least_pages=2,
                    consume_queue_flush_thorough_interval_ms=10_000)
    return settings


def one_round(source: str, root: str, end: int, batch: int, profile: bool) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "config"))
    shutil.copytree(os.path.join(source, "commitlog"), os.path.join(root, "commitlog"))
    control = ControlWords(control_path(root), create=True)
    control[END] = end
    control[DISPATCHED] = 0
    child = _Child(root, child_settings(StoreConfig(), 0), control)
    try:
        profiler = cProfile.Profile() if profile else None
        records = 0
        began, cpu = time.perf_counter(), time.thread_time()
        if profiler:
            profiler.enable()
        while (done := child.service.dispatch_available(batch)):
            records += done
        if profiler:
            profiler.disable()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - began
    finally:
        child.close()
        control.close()
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return {"records": records, "cpu_s": cpu, "wall_s": wall, "cpu_us_per_1000": cpu / records * 1e9}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    source = os.path.join(args.dir, "source")
    if not os.path.isdir(source):
        worker_put_batch(source, args.count)
    end = sum(os.path.getsize(os.path.join(source, "commitlog", name))
              for name in sorted(os.listdir(os.path.join(source, "commitlog")))[:-1])
    with open(os.path.join(source, "commitlog", sorted(os.listdir(os.path.join(source, "commitlog")))[-1]), "rb") as f:
        data = f.read()
    end += len(data.rstrip(b"\0"))  # rough; dispatch stops at the log's blank end anyway
    rows = [one_round(source, os.path.join(args.dir, "child"), end, args.batch, args.profile)
            for _ in range(args.rounds)]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
