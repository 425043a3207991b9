"""Diagnostic for issue 30's SYNC row: SYNC puts from many producer threads, where the time goes.

Each producer thread calls `store.put` in a loop: 100 B bodies with a tag and a key, the default StoreConfig with
flush_mode SYNC, 4 topics x 4 queues. Beside the rate it prints, for the store's process over the timed part:
- flushes a second and puts a flush (the group commit's `stats()["flush"]`: each flush is one fdatasync);
- voluntary and involuntary context switches a put, and user + system CPU a put (getrusage of the process,
  every thread; the dispatch child is not counted);
- the FlushGate's wake-ups a put, and those that found their position not yet durable (`FlushGate.wakeups`).
Interleaved with RocketMQ 4.4.0's SYNC putMessage from as many threads (`RMQ_LOCK=reentrant rmq put ... sync 4 4
T`, warmed), each in turn, medians with min-max. `--switch S` runs the store's rounds with sys.setswitchinterval(S).

    .venv/bin/python bench/sync_threads.py [--rounds 3] [--threads 8,64] [--seconds 4] [--switch 0.005]
Not in bench/README's tables (findings: docs/decisions/0030-sync-lead-in-c.md, "Many producer threads").
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.flush_modes import rocketmq_home, rocketmq_sync  # noqa: E402
from mqstore import FlushMode, Message, MessageStore, StoreConfig  # noqa: E402

BODY_BYTES = 100
TOPICS = 4
MESSAGES_PER_THREAD = 64  # prebuilt messages a producer cycles through (a key each)


def produce_for(store: MessageStore, threads: int, seconds: float) -> tuple[int, float]:
    """`threads` producers put for `seconds`; the puts and the elapsed seconds."""
    body = os.urandom(BODY_BYTES)
    stop = threading.Event()
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def produce(index: int) -> None:
        messages = [Message(f"SyncTopic{index % TOPICS}", body, queue_id=index % 4, tags="TagA",
                            keys=(f"key-{index}-{n}",)) for n in range(MESSAGES_PER_THREAD)]
        put, count, stopped = store.put, 0, stop.is_set
        barrier.wait()
        while not stopped():
            put(messages[count % MESSAGES_PER_THREAD])
            count += 1
        counts[index] = count

    workers = [threading.Thread(target=produce, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(counts), time.perf_counter() - started


def store_round(work: str, threads: int, seconds: float) -> dict:
    """One fresh store, `threads` producers: the rate and the profile figures of the module docstring."""
    root = tempfile.mkdtemp(prefix="sync-threads-", dir=work)
    try:
        with MessageStore.open(root, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
            store.put(Message("SyncTopic0", b"first"))
            before_flushes = store.stats()["flush"]["commitlog_flusher"]["flushes"]
            gate = store._group_commit.gate
            woken_before = getattr(gate, "wakeups", (0, 0))
            before = resource.getrusage(resource.RUSAGE_SELF)
            puts, elapsed = produce_for(store, threads, seconds)
            after = resource.getrusage(resource.RUSAGE_SELF)
            woken = [now - then for now, then in zip(getattr(gate, "wakeups", (0, 0)), woken_before)]
            flushes = store.stats()["flush"]["commitlog_flusher"]["flushes"] - before_flushes
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"rate": puts / elapsed, "flushes_per_s": flushes / elapsed, "puts_per_flush": puts / max(flushes, 1),
            "vcsw_per_put": (after.ru_nvcsw - before.ru_nvcsw) / puts,
            "ivcsw_per_put": (after.ru_nivcsw - before.ru_nivcsw) / puts,
            "user_us_per_put": (after.ru_utime - before.ru_utime) / puts * 1e6,
            "sys_us_per_put": (after.ru_stime - before.ru_stime) / puts * 1e6,
            "wakeups_per_put": woken[0] / puts, "empty_wakeups_per_put": woken[1] / puts}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="8,64")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval for the store's rounds")
    parser.add_argument("--work", default=None, help="folder for the stores (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="sync-threads-")
    home = rocketmq_home()
    rows: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for threads in (int(text) for text in args.threads.split(",")):
            default_switch = sys.getswitchinterval()
            if args.switch:
                sys.setswitchinterval(args.switch)
            row = store_round(work, threads, args.seconds)
            sys.setswitchinterval(default_switch)
            rows.setdefault(f"mqstore {threads}", []).append(row)
            print(f"round {round_} mqstore T={threads} " + " ".join(f"{k}={v:.2f}" for k, v in row.items()), flush=True)
            if home is not None:
                os.environ["RMQ_LOCK"] = "reentrant"
                measured, _ = rocketmq_sync(work, home, BODY_BYTES, threads, int(row["rate"] * args.seconds) + 1000)
                rows.setdefault(f"rocketmq {threads}", []).append({"rate": measured["msgs_per_s"]})
                print(f"round {round_} rocketmq T={threads} rate={measured['msgs_per_s']:.0f}", flush=True)
    for name, measured in rows.items():
        print(f"{name}: " + "; ".join(f"{key} {summary([row[key] for row in measured])}" for key in measured[0]))


if __name__ == "__main__":
    main()
