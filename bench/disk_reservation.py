"""What reserving a segment's disk costs the put path: ASYNC puts (one producer, 100 B and 1 KB bodies, index
off) with a segment's blocks reserved in full when it is made, left sparse, and reserved ahead of the writer
in steps (the default), against the machine's baselines measured in the same run.

    .venv/bin/python bench/disk_reservation.py            # full run (about two minutes)
    .venv/bin/python bench/disk_reservation.py --quick    # smoke run (a few seconds)

Rows, each run ROUNDS times interleaved (the median is reported, with the spread):

- baselines: the bare Python loop of the put path's copy (a body sliced into a bytearray, the interpreter's
  floor); first writes into a fresh mapping of a file whose blocks are reserved (posix_fallocate) and of a
  sparse one (ftruncate), a 4 KiB page at a time (the page-fault cost the writer pays either way); one
  posix_fallocate of a 4 MiB step and of a whole segment;
- the store, with `segment_size_bytes` = SEGMENT_BYTES so that runs cross segments: "full" (each segment's
  blocks reserved in full when it is made: what the store did before), "sparse" (preallocate_segments=False:
  nothing reserved, a full disk is a SIGBUS), and "steps 4 MiB" / "steps 64 MiB" (blocks reserved
  SPACE_RESERVE_STEP_BYTES ahead of the writer, the next segment made near the end of the current one).

Writes bench/results/disk_reservation.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mqstore.commitlog.commitlog as commitlog_module  # noqa: E402

import mqstore.store.engine as engine_module  # noqa: E402
from mqstore import Message, MessageStore, StoreConfig  # noqa: E402

MIB = 1 << 20
SEGMENT_BYTES = 128 * MIB
BODY_SIZES = (100, 1024)
LOG_BYTES_PER_RUN = 160 * MIB  # each store run writes about this much log: more than one segment
BASELINE_FILE_BYTES = 64 * MIB
ROUNDS = 3


def _variants():
    """(name, config overrides, reservation step)."""
    return [
        ("full", {"preallocate_segments": True}, SEGMENT_BYTES),
        ("sparse", {"preallocate_segments": False}, commitlog_module.SPACE_RESERVE_STEP_BYTES),
        ("steps 4 MiB", {"preallocate_segments": True}, 4 * MIB),
        ("steps 64 MiB", {"preallocate_segments": True}, 64 * MIB),
    ]


def _store_run(directory: str, body_bytes: int, count: int, overrides: dict, step: int) -> dict:
    """Put `count` messages flat out; puts a second, and the disk the store took."""
    saved = commitlog_module.SPACE_RESERVE_STEP_BYTES
    commitlog_module.SPACE_RESERVE_STEP_BYTES = engine_module.SPACE_RESERVE_STEP_BYTES = step
    try:
        config = StoreConfig(segment_size_bytes=SEGMENT_BYTES, index_enabled=False, store_host="127.0.0.1",
                             **overrides)
        messages = [Message("bench", os.urandom(body_bytes)) for _ in range(256)]
        with MessageStore.open(directory, config) as store:
            put = store.put
            started = time.perf_counter()
            for i in range(count):
                put(messages[i & 255])
            elapsed = time.perf_counter() - started
            store.wait_dispatched(60)
        used = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, files in os.walk(directory)
                   for f in files)
    finally:
        commitlog_module.SPACE_RESERVE_STEP_BYTES = engine_module.SPACE_RESERVE_STEP_BYTES = saved
    return {"puts_per_s": count / elapsed, "disk_used_bytes": used}


def _copy_loop(body_bytes: int, count: int) -> float:
    """The interpreter's floor: the put path's body copy into a buffer, nothing else."""
    buffer = bytearray(64 * MIB)
    view = memoryview(buffer)
    body = os.urandom(body_bytes)
    size = body_bytes + 100
    limit = len(buffer) - size
    position = 0
    started = time.perf_counter()
    for _ in range(count):
        view[position : position + body_bytes] = body
        position += size
        if position > limit:
            position = 0
    return count / (time.perf_counter() - started)


def _first_writes(directory: str, reserve: bool, total_bytes: int) -> float:
    """MB/s of first writes (one byte per 4 KiB page, in order) into a fresh mapping: the page-fault floor."""
    path = os.path.join(directory, "baseline")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, total_bytes)
        if reserve:
            os.posix_fallocate(fd, 0, total_bytes)
        mapping = mmap.mmap(fd, total_bytes)
        started = time.perf_counter()
        for position in range(0, total_bytes, mmap.PAGESIZE):
            mapping[position] = 1
        elapsed = time.perf_counter() - started
        mapping.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return total_bytes / elapsed / 1e6


def _fallocate_ms(directory: str, length: int) -> float:
    path = os.path.join(directory, "baseline")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, length)
        started = time.perf_counter()
        os.posix_fallocate(fd, 0, length)
        return (time.perf_counter() - started) * 1000
    finally:
        os.close(fd)
        os.unlink(path)


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", help="where the JSON goes (the .md goes beside it)")
    parser.add_argument("--dir", help="a directory on the file system to measure (default: a temporary one)")
    args = parser.parse_args()
    rounds = 1 if args.quick else ROUNDS
    log_bytes = 2 * MIB if args.quick else LOG_BYTES_PER_RUN
    baseline_bytes = 4 * MIB if args.quick else BASELINE_FILE_BYTES
    base = tempfile.mkdtemp(prefix="mqstore-disk-reservation-", dir=args.dir)
    samples: dict[str, list[float]] = {}
    used: dict[str, int] = {}
    try:
        for _ in range(rounds):
            for body_bytes in BODY_SIZES:
                count = log_bytes // (body_bytes + 100)
                samples.setdefault(f"baseline: body copy loop, {body_bytes} B", []).append(
                    _copy_loop(body_bytes, count))
                for name, overrides, step in _variants():
                    directory = os.path.join(base, "store")
                    result = _store_run(directory, body_bytes, count, overrides, step)
                    shutil.rmtree(directory)
                    key = f"store: {name}, {body_bytes} B"
                    samples.setdefault(key, []).append(result["puts_per_s"])
                    used[key] = result["disk_used_bytes"]
            for reserve in (True, False):
                samples.setdefault(f"baseline: first writes, {'reserved' if reserve else 'sparse'} file (MB/s)",
                                   []).append(_first_writes(base, reserve, baseline_bytes))
            samples.setdefault("baseline: posix_fallocate of 4 MiB (ms)", []).append(_fallocate_ms(base, 4 * MIB))
            samples.setdefault(f"baseline: posix_fallocate of {SEGMENT_BYTES // MIB} MiB (ms)", []).append(
                _fallocate_ms(base, SEGMENT_BYTES))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = [{"case": key, **_summary(values), "disk_used_bytes": used.get(key)} for key, values in samples.items()]
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    out = args.out or os.path.join(results, "disk_reservation_quick.json" if args.quick else "disk_reservation.json")
    command = "python bench/disk_reservation.py" + (" --quick" if args.quick else "")
    with open(out, "w") as handle:
        json.dump({"command": command, "date": time.strftime("%Y-%m-%d", time.gmtime()), "rounds": rounds,
                   "segment_size_bytes": SEGMENT_BYTES, "log_bytes_per_run": log_bytes,
                   "python": platform.python_version(), "cpus": os.cpu_count(), "rows": rows}, handle, indent=2)
    lines = [f"`{command}`, {time.strftime('%Y-%m-%d', time.gmtime())}, {rounds} round(s), "
             f"{SEGMENT_BYTES // MIB} MiB segments, {log_bytes // MIB} MiB of log a run", "",
             "| case | median | min | max | disk used after the run |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        disk = f"{row['disk_used_bytes'] / MIB:.1f} MiB" if row["disk_used_bytes"] is not None else ""
        lines.append(f"| {row['case']} | {row['median']:,.1f} | {row['min']:,.1f} | {row['max']:,.1f} | {disk} |")
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
