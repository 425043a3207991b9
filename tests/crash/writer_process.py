"""The writer process that tests/crash/test_kill_writer.py kills with SIGKILL.

    python tests/crash/writer_process.py ROOT --mode SYNC|ASYNC --generation G [--index] [--flush-every N]
                                         [--dispatch-process]

Opens the store at ROOT (recovering it after the previous writer's kill), then puts `planned_message(seq)`
(tests/crash/checks.py) for seq = G * 1_000_000, G * 1_000_000 + 1, ... until it is killed. Each line goes to
stdout in one write(2) right after the call it reports returned, so whatever the test reads after the kill
was printed before it:

    OPENED <recovery case> <log end>
    ACK <seq> <topic> <queue_id> <queue_offset> <commitlog_offset> <size>    put returned PUT_OK
    FLUSHED <n>    store.flush() returned; it was called after the first n ACK lines of this process

The settings are the ones the test opens the store with (`kill_config`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import FlushMode, MessageStore, PutStatus, StoreConfig  # noqa: E402
from tests.crash.checks import RETENTION_OFF, planned_message  # noqa: E402

GENERATION_SEQ_STRIDE = 1_000_000
WRITER_LIFETIME_MAX_S = 120.0  # a writer nobody kills stops by itself


def kill_config(mode: str, index: bool, dispatch_process: bool = False) -> StoreConfig:
    return StoreConfig(dispatch_process=dispatch_process, segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, max_message_size_bytes=8192,
                       store_host="10.0.0.7", store_port=10911, preallocate_segments=True, index_enabled=index,
                       index_slot_count=64, index_entry_count_max=256, flush_mode=FlushMode(mode),
                       flush_interval_ms=5, flush_least_pages=1, flush_consume_queue_interval_ms=5, **RETENTION_OFF)


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--mode", choices=("SYNC", "ASYNC"), required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--index", action="store_true")
    parser.add_argument("--flush-every", type=int, default=0)
    parser.add_argument("--dispatch-process", action="store_true")
    args = parser.parse_args(argv)
    store = MessageStore.open(args.root, kill_config(args.mode, args.index, args.dispatch_process))
    report = store.recovery_report
    _say(f"OPENED {report.case} {report.log_end}")
    seq = args.generation * GENERATION_SEQ_STRIDE
    acked = 0
    deadline = time.monotonic() + WRITER_LIFETIME_MAX_S
    while time.monotonic() < deadline:
        message = planned_message(seq, keys=True)
        result = store.put(message)
        if result.status is PutStatus.PUT_OK:
            _say(f"ACK {seq} {message.topic} {message.queue_id} {result.queue_offset} {result.commitlog_offset} "
                 f"{result.size_bytes}")
            acked += 1
        seq += 1
        if args.flush_every and seq % args.flush_every == 0:
            before = acked
            store.flush()
            _say(f"FLUSHED {before}")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
