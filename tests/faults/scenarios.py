"""Stores whose flushes fail: each scenario runs in a process of its own with tests/faults/disk_double.c
preloaded, arms it at a chosen moment, and prints what the store did as one JSON line.

    python -m tests.faults.scenarios SCENARIO ROOT MODE [--dispatch-process] [--threads N]

MODE is SYNC or ASYNC. The process is killed by nothing: it closes the store (or tries to) and exits, and the test
reopens the store without the double to see what recovery makes of it. Each outcome of a call is recorded as
"ok" / a PutStatus name / the name of the exception it raised.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore.flush.checkpoint import Checkpoint  # noqa: E402

from mqstore import FlushMode, Message, MessageStore, StoreConfig  # noqa: E402
from mqstore.store.markers import ABORT_FILE_NAME  # noqa: E402

MESSAGES_BEFORE = 20  # puts made (and flushed) before the double is armed
FAILURE_WAIT_S = 30.0  # how long a scenario waits for a background thread to meet the failure
STALL_TIMEOUT_S = 5.0  # how long the double stalls a write nobody releases
TOPIC = "faults"


def config(mode: str, dispatch_process: bool) -> StoreConfig:
    return StoreConfig(flush_mode=FlushMode[mode], dispatch_process=dispatch_process, segment_size_bytes=256 * 1024,
                       max_message_size_bytes=4096, consume_queue_entries_per_file=64, flush_interval_ms=10,
                       flush_consume_queue_interval_ms=10, sync_flush_timeout_ms=10_000,
                       disk_max_used_space_ratio=1.0, disk_clean_forcibly_ratio=1.0, disk_full_ratio=1.0)


def message(seq: int) -> Message:
    return Message(TOPIC, f"message {seq:06d} ".encode() * 4, queue_id=seq % 4, tags=f"t{seq % 3}", keys=[f"k{seq}"])


def outcome(call) -> str:
    """What `call()` did: "ok", the status name of a PutResult, or the name of what it raised."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is recorded
        return type(exc).__name__
    status = getattr(result, "status", None)
    return "ok" if status is None else status.name


def arm(pattern: str, skip: int = 0, count: int = 1) -> None:
    """Make the next `count` fdatasyncs of files whose path holds `pattern` fail with EIO, after `skip` of them."""
    double = ctypes.CDLL(None)
    double.mqfault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    double.mqfault_arm(pattern.encode(), skip, count, errno.EIO)


def directory(root: str, name: str) -> str:
    """The pattern that matches the files of the store's directory `name` and nothing else."""
    return os.path.join(os.path.abspath(root), name) + os.sep


def failed_count() -> int:
    double = ctypes.CDLL(None)
    double.mqfault_failed.restype = ctypes.c_long
    return double.mqfault_failed()


def wait_for(condition) -> bool:
    deadline = time.monotonic() + FAILURE_WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def put_refused(store: MessageStore) -> bool:
    try:
        store.put(message(10**6))
    except Exception:  # noqa: BLE001 - any refusal; the scenario records which below
        return True
    return False


def run(scenario: str, root: str, mode: str, dispatch_process: bool, threads: int) -> dict:
    store = MessageStore.open(root, config(mode, dispatch_process))
    report: dict = {"before": [outcome(lambda seq=seq: store.put(message(seq))) for seq in range(MESSAGES_BEFORE)]}
    store.flush()
    store.wait_dispatched(FAILURE_WAIT_S)
    store.flush()
    report["durable_before"] = store.stats()["flush"]["flushed_offset"]
    if scenario == "log":  # the next flush of a CommitLog segment fails: a SYNC put's, or flush()'s
        arm(directory(root, "commitlog"))
        report["failed_put"] = outcome(lambda: store.put(message(MESSAGES_BEFORE)))
    elif scenario == "log_thread":  # the ASYNC flusher thread meets the failure, nobody calls flush()
        arm(directory(root, "commitlog"))
        report["failed_put"] = outcome(lambda: store.put(message(MESSAGES_BEFORE)))
        report["refused_in_time"] = wait_for(lambda: put_refused(store))
    elif scenario in ("queue", "index"):  # a ConsumeQueue or index file, flushed in this process
        arm(directory(root, "consumequeue" if scenario == "queue" else "index"))
        report["failed_put"] = outcome(lambda: store.put(message(MESSAGES_BEFORE)))
        store.wait_dispatched(FAILURE_WAIT_S)
    elif scenario == "close":  # the failure is first met by close()
        arm(directory(root, "commitlog"))
        report["failed_put"] = outcome(lambda: store.put(message(MESSAGES_BEFORE)))
    elif scenario == "threads":  # SYNC producers in threads; one flush in the middle of them fails
        arm(directory(root, "commitlog"), skip=25)
        results: list = [None] * (threads * 50)

        def produce(thread: int) -> None:
            for seq in range(thread * 50, (thread + 1) * 50):
                try:
                    result = store.put(message(MESSAGES_BEFORE + seq))
                    results[seq] = [result.status.name, result.commitlog_offset, result.size_bytes]
                except Exception as exc:  # noqa: BLE001
                    results[seq] = [type(exc).__name__, -1, 0]

        workers = [threading.Thread(target=produce, args=(thread,)) for thread in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        report["results"] = results
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if scenario != "close":
        report["flush"] = [outcome(store.flush), outcome(store.flush)]
        report["put_after"] = outcome(lambda: store.put(message(10**6 + 1)))
        report["put_batch_after"] = outcome(lambda: store.put_batch([message(10**6 + 2)]))
        report["durable_after"] = store.stats()["flush"]["flushed_offset"]
        report["stats_failed"] = store.stats()["flush"]["failed"]
    report["close"] = outcome(store.close)
    report["failed_calls"] = failed_count()
    report["abort_marker"] = os.path.exists(os.path.join(root, ABORT_FILE_NAME))
    checkpoint = Checkpoint.open(root, writable=False)
    report["checkpoint_flushed"] = checkpoint.physic_flushed_offset
    report["checkpoint_logics_ms"] = checkpoint.logics_msg_timestamp_ms
    checkpoint.close()
    return report


def child_queue(root: str, mode: str) -> dict:
    """A queue flush of the dispatch process fails: the writer refuses puts once its watcher sees it. The double
    is armed through the environment, which the child inherits (this process's copy was armed, or not, at its
    start)."""
    os.environ["MQFAULT_PATTERN"] = directory(root, "consumequeue")
    store = MessageStore.open(root, config(mode, True))
    report: dict = {"before": [outcome(lambda seq=seq: store.put(message(seq))) for seq in range(MESSAGES_BEFORE)]}
    report["first_flush"] = outcome(store.flush)  # raises when the child's own flush met the failure first
    report["refused_in_time"] = wait_for(lambda: put_refused(store))
    report["flush"] = [outcome(store.flush), outcome(store.flush)]
    report["put_after"] = outcome(lambda: store.put(message(10**6 + 1)))
    report["close"] = outcome(store.close)
    report["abort_marker"] = os.path.exists(os.path.join(root, ABORT_FILE_NAME))
    return report


def fd_reuse(root: str) -> dict:
    """A SYNC put's flush is held inside fdatasync while the segment's descriptor is closed and its number given to
    another file: the sync must still land on the segment (the flush works on a descriptor of its own)."""
    store = MessageStore.open(root, config("SYNC", False))
    store.put(message(0))
    segment = store._commitlog._segment
    double = ctypes.CDLL(None)
    double.mqfault_synced_path.restype = ctypes.c_char_p
    double.mqfault_hold(directory(root, "commitlog").encode())
    putter = threading.Thread(target=store.put, args=(message(1),))
    putter.start()
    report = {"held": wait_for(lambda: double.mqfault_held() == 1)}
    number = segment.fileno()
    segment.close()  # what a close in another thread does while the flush runs
    other_path = os.path.join(root, "another-file")
    other = os.open(other_path, os.O_RDWR | os.O_CREAT, 0o644)
    if other != number:
        os.dup2(other, number)  # the number the flush was given, now naming another file
    double.mqfault_release()
    putter.join()
    report.update(segment=segment.path, synced=os.fsdecode(double.mqfault_synced_path()), other=other_path)
    os.close(other)
    if other != number:
        os.close(number)
    outcome(store.close)
    return report


def write_stall(root: str) -> dict:
    """A SYNC put's write of its record stalls (a disk that hangs): the process's other threads go on running
    Python meanwhile, and release it; when the write keeps the interpreter lock, nobody can, and the double's timeout
    ends the stall instead."""
    store = MessageStore.open(root, config("SYNC", False))
    store.put(message(0))
    double = ctypes.CDLL(None)
    double.mqfault_stall_write(directory(root, "commitlog").encode(), int(STALL_TIMEOUT_S * 1000))
    putter = threading.Thread(target=lambda: report.update(put=outcome(lambda: store.put(message(1)))))
    report: dict = {}
    putter.start()
    if wait_for(lambda: double.mqfault_held() == 1):
        double.mqfault_release()  # only runs while the stalled put lets other threads run
    putter.join()
    report["released_by_another_thread"] = double.mqfault_write_released() == 1
    report["close"] = outcome(store.close)
    return report


def aio_puts(root: str) -> dict:
    """SYNC puts in flight from one event loop (mqstore.aio) when a flush fails: each awaiting put gets
    FLUSH_DISK_FAILED or, written after the failure, FlushFailedError; none is acknowledged past the failure."""
    import asyncio

    from mqstore.aio import AsyncMessageStore

    async def put(store, seq: int) -> list:
        try:
            result = await store.put(message(seq))
        except Exception as exc:  # noqa: BLE001 - the outcome is what is recorded
            return [type(exc).__name__, -1, 0]
        return [result.status.name, result.commitlog_offset, result.size_bytes]

    async def main() -> dict:
        store = await AsyncMessageStore.open(root, config("SYNC", False))
        report: dict = {"before": [(await put(store, seq))[0] for seq in range(MESSAGES_BEFORE)]}
        report["durable_before"] = store.sync.stats()["flush"]["flushed_offset"]
        arm(directory(root, "commitlog"))
        report["results"] = await asyncio.gather(*(put(store, MESSAGES_BEFORE + seq) for seq in range(200)))
        report["put_after"] = (await put(store, 10**6 + 1))[0]
        report["durable_after"] = store.sync.stats()["flush"]["flushed_offset"]
        try:
            await store.close()
            report["close"] = "ok"
        except Exception as exc:  # noqa: BLE001
            report["close"] = type(exc).__name__
        return report

    report = asyncio.run(main())
    report["failed_calls"] = failed_count()
    checkpoint = Checkpoint.open(root, writable=False)
    report["checkpoint_flushed"] = checkpoint.physic_flushed_offset
    checkpoint.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("root")
    parser.add_argument("mode", choices=["SYNC", "ASYNC"])
    parser.add_argument("--dispatch-process", action="store_true")
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    if args.scenario == "child_queue":  # armed from the start, through the environment the child inherits
        report = child_queue(args.root, args.mode)
    elif args.scenario == "fd_reuse":
        report = fd_reuse(args.root)
    elif args.scenario == "write_stall":
        report = write_stall(args.root)
    elif args.scenario == "aio":
        report = aio_puts(args.root)
    else:
        report = run(args.scenario, args.root, args.mode, args.dispatch_process, args.threads)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
