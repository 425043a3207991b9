"""Where one SYNC producer's points against the raw loop go: the raw pwrite+fdatasync loop, the same loop making
the store's own calls with no store code, the store with its dispatch child stopped, and the store as opened.

    .venv/bin/python bench/sync_share.py              # 30 rotated rounds (about 4 minutes)
    .venv/bin/python bench/sync_share.py --rounds 6   # fewer rounds, a wider error

Issue 21's SYNC target counts one producer's puts of a 100-byte body against a raw loop that writes 100 bytes
and fdatasyncs. A single run of `bench/flush_modes.py --sync` moves that ratio by 3-7 points between runs of
the same code, so this benchmark measures many short runs and reports, for each case, the mean and the standard
error of its ratio to the raw loop of the same round:

- raw: pwrite of a 100-byte body and fdatasync, in a file posix_fallocate'd ahead (flush_modes.py's loop);
- store's calls, no store: what a SYNC put of that body does to the disk, from a Python loop:
  1. a pwrite of the whole record (its size taken from a real put of the same message) into a segment made as the
     store makes one (sparse, its first SPACE_RESERVE_STEP_BYTES reserved);
  2. the end word stored into a mapped control file (the dispatch process's END);
  3. fdatasync;
  4. the checkpoint's two fields stored into a mapped checkpoint;
- store, dispatch child stopped: StoreConfig's defaults in SYNC, the child stopped (SIGSTOP) for the timed puts;
- store: StoreConfig's defaults in SYNC, as a user opens it.

Each run is a fresh process: N_PUTS timed puts after one untimed put and its dispatch. Runs of a round go in an
order rotated from round to round, each after os.sync() and a pause, so that no case always follows the
deletion of another's files. Writes bench/results/sync_share.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mqstore.commitlog.commitlog import SPACE_RESERVE_STEP_BYTES  # noqa: E402
from mqstore.flush.checkpoint import CHECKPOINT_DTYPE, CHECKPOINT_SIZE_BYTES  # noqa: E402

from mqstore import FlushMode, Message, MessageStore, StoreConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BODY_BYTES = 100
N_PUTS = 10_000
ROUNDS = 30
SETTLE_S = 0.3
RAW_FILE_BYTES = 64 << 20
TOPIC = "SyncShare"
CASES = ("raw", "store's calls, no store", "store, dispatch child stopped", "store")
_CHECKPOINT_FIELDS = tuple(CHECKPOINT_DTYPE.fields[name][1] for name in ("physic_msg_timestamp",
                                                                          "physic_flushed_offset"))


def _raw(directory: str) -> float:
    fd = os.open(os.path.join(directory, "raw"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, RAW_FILE_BYTES)
        body = b"x" * BODY_BYTES
        started = time.perf_counter()
        for index in range(N_PUTS):
            os.pwrite(fd, body, index * BODY_BYTES)
            os.fdatasync(fd)
        return N_PUTS / (time.perf_counter() - started)
    finally:
        os.close(fd)


def record_bytes(work: str) -> int:
    """The size of the record a SYNC put of the benchmark's message writes (a real put, in a store of its own)."""
    directory = tempfile.mkdtemp(prefix="sizing-", dir=work)
    try:
        with MessageStore.open(directory, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
            return store.put(Message(TOPIC, b"x" * BODY_BYTES)).size_bytes
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _store_calls(directory: str, record_size: int) -> float:
    record = b"x" * record_size
    segment_bytes = StoreConfig().segment_size_bytes
    mappings, descriptors = [], []

    def mapped(name: str) -> mmap.mmap:
        fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT, 0o644)
        descriptors.append(fd)
        os.ftruncate(fd, CHECKPOINT_SIZE_BYTES)
        mappings.append(mmap.mmap(fd, CHECKPOINT_SIZE_BYTES))
        return mappings[-1]

    fd = os.open(os.path.join(directory, "segment"), os.O_RDWR | os.O_CREAT, 0o644)
    descriptors.append(fd)
    try:
        os.ftruncate(fd, segment_bytes)
        os.posix_fallocate(fd, 0, SPACE_RESERVE_STEP_BYTES)
        control, checkpoint = mapped("control"), mapped("checkpoint")
        first, second = _CHECKPOINT_FIELDS
        position = 0
        started = time.perf_counter()
        for _ in range(N_PUTS):
            os.pwrite(fd, record, position)
            position += len(record)
            control[0:8] = position.to_bytes(8, sys.byteorder)
            os.fdatasync(fd)
            checkpoint[first:first + 8] = position.to_bytes(8, "big")
            checkpoint[second:second + 8] = position.to_bytes(8, "big")
        return N_PUTS / (time.perf_counter() - started)
    finally:
        for mapping in mappings:
            mapping.close()
        for descriptor in descriptors:
            os.close(descriptor)


def _store(directory: str, stop_child: bool) -> float:
    with MessageStore.open(os.path.join(directory, "store"), StoreConfig(flush_mode=FlushMode.SYNC)) as store:
        store.put(Message(TOPIC, b"first"))
        store.wait_dispatched()
        child = store._dispatch.pid if stop_child else None  # the dispatch process (StoreConfig's default)
        messages = [Message(TOPIC, b"x" * BODY_BYTES) for _ in range(4)]
        put = store.put
        if child is not None:
            os.kill(child, signal.SIGSTOP)
        try:
            started = time.perf_counter()
            for index in range(N_PUTS):
                put(messages[index & 3])
            elapsed = time.perf_counter() - started
        finally:
            if child is not None:
                os.kill(child, signal.SIGCONT)
    return N_PUTS / elapsed


def one(case: str, work: str, record_size: int) -> float:
    """One run of `case` in this process, in a directory of its own under `work`."""
    directory = tempfile.mkdtemp(prefix="run-", dir=work)
    try:
        if case == "raw":
            return _raw(directory)
        if case == "store's calls, no store":
            return _store_calls(directory, record_size)
        return _store(directory, stop_child=case == "store, dispatch child stopped")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(rounds: int, work: str) -> tuple[dict[str, list[float]], int]:
    record_size = record_bytes(work)
    rates: dict[str, list[float]] = {case: [] for case in CASES}
    for round_ in range(rounds):
        shift = round_ % len(CASES)
        for case in CASES[shift:] + CASES[:shift]:
            os.sync()
            time.sleep(SETTLE_S)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case, "--work", work,
                                  "--record-bytes", str(record_size)], capture_output=True, text=True, check=True)
            rates[case].append(float(out.stdout.split()[-1]))
        print(f"round {round_ + 1}/{rounds}: " + ", ".join(f"{case} {rates[case][-1]:,.0f}" for case in CASES),
              flush=True)
    return rates, record_size


def summary(rates: dict[str, list[float]]) -> list[dict]:
    rows = []
    for case in CASES:
        ratios = [value / raw for value, raw in zip(rates[case], rates["raw"])]
        error = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else None
        rows.append({"case": case, "mean_per_s": statistics.mean(rates[case]),
                     "median_per_s": statistics.median(rates[case]), "ratio_to_raw": statistics.mean(ratios),
                     "ratio_standard_error": error, "runs": len(ratios)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rotated rounds (default {ROUNDS})")
    parser.add_argument("--dir", help="a directory on the file system to measure (default: a temporary one)")
    parser.add_argument("--one", choices=CASES, help=argparse.SUPPRESS)  # one run, in a child process
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--record-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(f"{one(args.one, args.work, args.record_bytes):.1f}")
        return
    work = tempfile.mkdtemp(prefix="mqstore-sync-share-", dir=args.dir)
    load_before = os.getloadavg()[0]
    started = time.gmtime()
    try:
        rates, record_size = run(args.rounds, work)
        rows = summary(rates)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "python bench/sync_share.py" + ("" if args.rounds == ROUNDS else f" --rounds {args.rounds}")
    data = {"command": command, "date_utc": time.strftime("%Y-%m-%d %H:%M", started), "rounds": args.rounds,
            "puts_per_run": N_PUTS, "body_bytes": BODY_BYTES, "record_bytes": record_size,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_average_1min": [load_before, os.getloadavg()[0]], "rows": rows}
    out = os.path.join(HERE, "results", "sync_share.json")
    with open(out, "w") as handle:
        json.dump(data, handle, indent=2)
    lines = [f"`{command}`, {data['date_utc']} UTC, {args.rounds} rotated rounds of {N_PUTS:,} puts a run, "
             f"{BODY_BYTES} B bodies in {record_size} B records", "",
             "| case | msgs/s (mean) | ratio to the raw loop of its round |", "|---|---:|---:|"]
    for row in rows:
        error = f" ± {row['ratio_standard_error']:.3f}" if row["ratio_standard_error"] is not None else ""
        lines.append(f"| {row['case']} | {row['mean_per_s']:,.0f} | {row['ratio_to_raw']:.3f}{error} |")
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
