"""Where long puts come from: ASYNC puts of 1 KB, one producer, while segments roll, with the store's background
work turned off piece by piece, against bare loops that do only the write.

    .venv/bin/python bench/put_stalls.py            # full run (about a minute)
    .venv/bin/python bench/put_stalls.py --quick    # smoke run (a few seconds)

Every row times each put (or each bare write) for the same number of seconds and counts the ones over 1 ms and
over 5 ms (#3's target: no put above 5 ms). Rows:

- bare loops, the machine's floor, paced at 200 000 writes a second (about the store's put rate): a 1 KB copy
  into a mapped, pre-faulted file (plus the Python cost of a header), alone and with a second thread calling
  fdatasync every 500 ms as the ASYNC flusher does; and the same copy into an in-memory ring buffer that a
  committer thread pwrites to the file (RocketMQ's write buffer, TransientStorePool), with the same fdatasync
  thread;
- the store with its defaults (index on) and 64 MiB segments made and pre-faulted in the background
  (warm_segments); then without the index; then also without the flushers (flush intervals of an hour);
  then also with the interpreter's thread switch interval at 0.5 ms instead of 5 ms (sys.setswitchinterval);
- the store with its defaults and segments not pre-faulted (warm_segments=False, the default: a put's page
  fault reads around it, 8 MiB here); then with write_fault_readahead=False (each fault fills its own page);
  then also with dispatch in a child process (dispatch_process).

Writes bench/results/put_stalls.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import shutil
import struct
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mqstore.flush.modes import FlushMode  # noqa: E402

from mqstore import Message, MessageStore, StoreConfig  # noqa: E402

MIB = 1 << 20
BODY_BYTES = 1024
SEGMENT_BYTES = 64 * MIB
FLUSH_EVERY_S = 0.5  # the ASYNC flusher's default interval
RING_BYTES = 64 * MIB  # the write-buffer row's buffer
BARE_FILE_BYTES = 256 * MIB  # the bare loops write round and round a file of this size
BARE_RATE_PER_S = 200_000  # the bare loops' pace: about the store's put rate, so the disk sees the same load
COMMIT_CHUNK_BYTES = 4 * MIB  # at most this much per pwrite of the committer
MADV_POPULATE_WRITE = 23
COLD = {"warm_segments": False}
NO_READAROUND = {"write_fault_readahead": False}
CHILD = {"dispatch_process": True}
SWITCH_INTERVAL_S = 0.0005
NO_FLUSH = {"flush_interval_ms": 3_600_000, "flush_thorough_interval_ms": 0,
            "flush_consume_queue_interval_ms": 3_600_000}
_HEADER = struct.Struct(">iIiiiqqiq")


def _summary(latencies_ns: list[int], seconds: float, extra: dict | None = None) -> dict:
    ms = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    return {"ops_per_s": len(ms) / seconds, "p99_us": float(np.percentile(ms, 99) * 1000),
            "p999_us": float(np.percentile(ms, 99.9) * 1000), "max_ms": float(ms.max()),
            "over_1ms": int((ms > 1).sum()), "over_5ms": int((ms > 5).sum()), "ops": len(ms), **(extra or {})}


def _python_cost() -> None:
    """About the Python work of a put besides its copy (a header pack)."""
    _HEADER.pack(1, 2, 3, 4, 5, 6, 7, 8, 9)


def _paced_writes(seconds: float, write) -> tuple[list[int], float]:
    """Call `write` BARE_RATE_PER_S times a second for `seconds`, each after the Python cost of a put; returns
    each call's nanoseconds (the spin until the next is due is not counted) and the seconds taken."""
    latencies, clock = [], time.perf_counter_ns
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        due = began + len(latencies) / BARE_RATE_PER_S
        while time.perf_counter() < due:
            pass
        started = clock()
        _python_cost()
        write()
        latencies.append(clock() - started)
    return latencies, time.perf_counter() - began


def _flush_figures(durations: list[float]) -> dict:
    return {"flushes": len(durations), "longest_flush_ms": max(durations, default=0) * 1000}


def _flusher(fd: int, stop: threading.Event, durations: list[float]) -> None:
    while not stop.wait(FLUSH_EVERY_S):
        started = time.perf_counter()
        os.fdatasync(fd)
        durations.append(time.perf_counter() - started)


def _fresh_file(work: str, name: str, size: int) -> int:
    fd = os.open(os.path.join(work, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, size)
    return fd


def bare_mmap(work: str, seconds: float, flush: bool) -> dict:
    """1 KB copies into a pre-faulted mapping (MADV_POPULATE_WRITE), round and round the file, optionally with
    an fdatasync thread (after which each page faults again at its next write, as the store's pages do)."""
    size = BARE_FILE_BYTES
    fd = _fresh_file(work, "bare", size)
    mapping = mmap.mmap(fd, size)
    address = ctypes.c_char.from_buffer(mapping)
    ctypes.CDLL(None).madvise(ctypes.c_void_p(ctypes.addressof(address)), ctypes.c_size_t(size),
                              MADV_POPULATE_WRITE)
    del address
    chunk = os.urandom(BODY_BYTES)
    stop, durations = threading.Event(), []
    flusher = threading.Thread(target=_flusher, args=(fd, stop, durations)) if flush else None
    if flusher:
        flusher.start()
    position = 0

    def write():
        nonlocal position
        mapping[position : position + BODY_BYTES] = chunk
        position = (position + BODY_BYTES) % size

    latencies, elapsed = _paced_writes(seconds, write)
    stop.set()
    if flusher:
        flusher.join()
    mapping.close()
    os.close(fd)
    os.unlink(os.path.join(work, "bare"))
    return _summary(latencies, elapsed, _flush_figures(durations))


def bare_write_buffer(work: str, seconds: float) -> dict:
    """1 KB copies into an in-memory ring; a committer thread pwrites it to the file; an fdatasync thread."""
    size = BARE_FILE_BYTES
    fd = _fresh_file(work, "buffer", size)
    ring = bytearray(RING_BYTES)
    view = memoryview(ring)
    state = {"written": 0, "committed": 0}
    stop, durations = threading.Event(), []

    def committer():
        while not stop.is_set() or state["committed"] < state["written"]:
            written, committed = state["written"], state["committed"]
            if written == committed:
                time.sleep(0.001)
                continue
            at = committed % RING_BYTES
            length = min(written - committed, RING_BYTES - at, COMMIT_CHUNK_BYTES)
            os.pwrite(fd, view[at : at + length], committed % size)  # RING_BYTES divides size
            state["committed"] = committed + length

    threads = [threading.Thread(target=_flusher, args=(fd, stop, durations)), threading.Thread(target=committer)]
    for thread in threads:
        thread.start()
    chunk = os.urandom(BODY_BYTES)

    def write():
        written = state["written"]
        while written + BODY_BYTES - state["committed"] > RING_BYTES:  # the ring is full: wait for the committer
            time.sleep(0.0001)
        at = written % RING_BYTES
        view[at : at + BODY_BYTES] = chunk
        state["written"] = written + BODY_BYTES

    latencies, elapsed = _paced_writes(seconds, write)
    stop.set()
    for thread in threads:
        thread.join()
    view.release()
    os.close(fd)
    os.unlink(os.path.join(work, "buffer"))
    return _summary(latencies, elapsed, _flush_figures(durations))


def store_row(work: str, seconds: float, *, index: bool, settings: dict, switch_interval_s: float | None) -> dict:
    root = tempfile.mkdtemp(dir=work)
    config = StoreConfig(flush_mode=FlushMode.ASYNC, segment_size_bytes=SEGMENT_BYTES,
                         max_message_size_bytes=4 * MIB, index_enabled=index, **{"warm_segments": True, **settings})
    saved_interval = sys.getswitchinterval()
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    try:
        message = Message("bench", os.urandom(BODY_BYTES), queue_id=0)
        latencies, clock = [], time.perf_counter_ns
        with MessageStore.open(root, config) as store:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                started = clock()
                store.put(message)
                latencies.append(clock() - started)
            segments = store.stats()["commitlog"]["segments"]
    finally:
        sys.setswitchinterval(saved_interval)
        shutil.rmtree(root, ignore_errors=True)
    return _summary(latencies, seconds, {"segments": segments})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path (the Markdown table goes beside it)")
    args = parser.parse_args()
    seconds = 0.3 if args.quick else 6.0
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    out = args.out or os.path.join(results, "put_stalls_quick.json" if args.quick else "put_stalls.json")
    work = tempfile.mkdtemp(prefix="mqstore-stalls-")
    rows = []
    try:
        rows.append(("bare: 1 KB copy into a pre-faulted 256 MiB mapping, round and round",
                     bare_mmap(work, seconds, flush=False)))
        rows.append(("bare: the same, fdatasync every 500 ms in another thread", bare_mmap(work, seconds, flush=True)))
        rows.append(("bare: copy into a write buffer, committer pwrites, fdatasync every 500 ms",
                     bare_write_buffer(work, seconds)))
        cells = [("store: defaults (index on), warm 64 MiB segments", True, {}, None),
                 ("store: index off", False, {}, None),
                 ("store: index off, no flushes", False, NO_FLUSH, None),
                 ("store: index off, no flushes, switch interval 0.5 ms", False, NO_FLUSH, SWITCH_INTERVAL_S),
                 ("store: defaults (index on), cold 64 MiB segments", True, COLD, None),
                 ("store: the same, write_fault_readahead=False", True, {**COLD, **NO_READAROUND}, None),
                 ("store: the same, and the dispatch process", True, {**COLD, **NO_READAROUND, **CHILD}, None)]
        for name, index, settings, interval in cells:
            rows.append((name, store_row(work, seconds, index=index, settings=settings, switch_interval_s=interval)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = ["| row | ops/s | p99 | p99.9 | max | > 1 ms | > 5 ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows:
        table.append(f"| {name} | {row['ops_per_s']:,.0f} | {row['p99_us']:.0f} us | {row['p999_us']:.0f} us | "
                     f"{row['max_ms']:.1f} ms | {row['over_1ms']} | {row['over_5ms']} |")
    print("\n".join(table))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump({"seconds_per_row": seconds, "body_bytes": BODY_BYTES, "python": platform.python_version(),
                   "command": "bench/put_stalls.py" + (" --quick" if args.quick else ""),
                   "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "rows": [{"case": name, **row} for name, row in rows]}, handle, indent=2)
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
