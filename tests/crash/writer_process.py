"""The writer process that tests/crash/test_kill_writer.py kills with SIGKILL.

    python tests/crash/writer_process.py ROOT --mode SYNC|ASYNC --generation G [--index] [--flush-every N]
                                         [--dispatch-process] [--threads T]

Opens the store at ROOT (recovering it after the previous writer's kill), then puts `planned_message(seq)`
(tests/crash/checks.py) for seq = G * 1_000_000, G * 1_000_000 + 1, ... until it is killed. With T threads,
thread t puts seq = G * 1_000_000 + t * 100_000, + 1, ... (puts from many threads meet at the writer lock,
where one appends the others'). Each line goes to stdout in one write(2) right after the call it reports
returned, so whatever the test reads after the kill was printed before it:

    OPENED <recovery case> <log end>
    ACK <seq> <topic> <queue_id> <queue_offset> <commitlog_offset> <size>    put returned PUT_OK
    FLUSHED <n>    store.flush() returned; it was called after the first n ACK lines of this process

The settings are the ones the test opens the store with (`kill_config`).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import FlushMode, MessageStore, PutStatus, StoreConfig  # noqa: E402
from tests.crash.checks import RETENTION_OFF, planned_message  # noqa: E402

GENERATION_SEQ_STRIDE = 1_000_000
THREAD_SEQ_STRIDE = 100_000  # seqs of one writer thread: generation base + thread * this + 0, 1, ...
WRITER_LIFETIME_MAX_S = 120.0  # a writer nobody kills stops by itself


def kill_config(mode: str, index: bool, dispatch_process: bool = False) -> StoreConfig:
    return StoreConfig(dispatch_process=dispatch_process, segment_size_bytes=64 * 1024,
                       consume_queue_entries_per_file=64, max_message_size_bytes=8192, store_host="10.0.0.7",
                       store_port=10911, preallocate_segments=True, index_enabled=index,
                       index_slot_count=64, index_entry_count_max=256, flush_mode=FlushMode(mode),
                       flush_interval_ms=5, flush_least_pages=1, flush_consume_queue_interval_ms=5, **RETENTION_OFF)


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


class _Producer:
    """One thread's puts. ACK lines are counted and written under one lock, so a FLUSHED line's n covers exactly
    the ACK lines written before the flush was called."""

    def __init__(self, store, first_seq: int, flush_every: int, printed: list, lock: threading.Lock):
        self.store, self.seq, self.flush_every, self.printed, self.lock = store, first_seq, flush_every, printed, lock

    def run(self, deadline: float) -> None:
        store = self.store
        while time.monotonic() < deadline:
            message = planned_message(self.seq, keys=True)
            result = store.put(message)
            if result.status is PutStatus.PUT_OK:
                with self.lock:
                    _say(f"ACK {self.seq} {message.topic} {message.queue_id} {result.queue_offset} "
                         f"{result.commitlog_offset} {result.size_bytes}")
                    self.printed[0] += 1
            self.seq += 1
            if self.flush_every and self.seq % self.flush_every == 0:
                with self.lock:
                    before = self.printed[0]
                store.flush()
                with self.lock:
                    _say(f"FLUSHED {before}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--mode", choices=("SYNC", "ASYNC"), required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--index", action="store_true")
    parser.add_argument("--flush-every", type=int, default=0)
    parser.add_argument("--dispatch-process", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    store = MessageStore.open(args.root, kill_config(args.mode, args.index, args.dispatch_process))
    report = store.recovery_report
    _say(f"OPENED {report.case} {report.log_end}")
    deadline = time.monotonic() + WRITER_LIFETIME_MAX_S
    printed, lock = [0], threading.Lock()
    base = args.generation * GENERATION_SEQ_STRIDE
    producers = [_Producer(store, base + thread * THREAD_SEQ_STRIDE, args.flush_every if thread == 0 else 0,
                           printed, lock) for thread in range(args.threads)]
    threads = [threading.Thread(target=producer.run, args=(deadline,)) for producer in producers[1:]]
    for thread in threads:
        thread.start()
    producers[0].run(deadline)
    for thread in threads:
        thread.join()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
