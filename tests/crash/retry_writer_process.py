"""The writer process that tests/crash/test_retry_kill.py kills with SIGKILL while retries are pending.

    python tests/crash/retry_writer_process.py ROOT --generation G --count N

Opens the store at ROOT (recovering the previous kill; its schedule service delivers what is due), puts N messages
on topic `jobs` with body `<seq>` (seq = G * GENERATION_SEQ_STRIDE + index), then consumes them as group `workers`
and fails every one (`nack`, max_reconsume_times RETRY_KILL_MAX_RECONSUME_TIMES), committing after each poll, until
it is killed. One line per event, each in one write(2):

    OPENED
    ACK <seq>                                     put returned PUT_OK
    NACK <seq> <reconsume times of the copy>      nack returned
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import Message, MessageStore, PutStatus, StoreConfig  # noqa: E402
from tests.crash.schedule_writer_process import GENERATION_SEQ_STRIDE, WRITER_LIFETIME_MAX_S  # noqa: E402

TOPIC = "jobs"
GROUP = "workers"
RETRY_KILL_LEVELS = "50ms 100ms 150ms 200ms"  # first retry at level 3 (150 ms), the second at level 4
RETRY_KILL_MAX_RECONSUME_TIMES = 2  # two retries, then the DLQ


def retry_kill_config() -> StoreConfig:
    return StoreConfig(segment_size_bytes=1 << 20, index_enabled=False, delay_levels=RETRY_KILL_LEVELS)


def fail_everything(store, deadline: float) -> None:
    """Consume `jobs` as `workers` and nack every message until `deadline` (time.monotonic)."""
    consumer = store.consumer(GROUP, TOPIC, max_reconsume_times=RETRY_KILL_MAX_RECONSUME_TIMES)
    while time.monotonic() < deadline:
        for message in consumer.poll(max_count=64, timeout_ms=100):
            result = consumer.nack(message)
            copy = store.read_at(result.commitlog_offset)
            os.write(1, f"NACK {int(message.body)} {copy.reconsume_times}\n".encode())
        consumer.commit()
    consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    store = MessageStore.open(args.root, retry_kill_config())
    os.write(1, b"OPENED\n")
    for index in range(args.count):
        seq = args.generation * GENERATION_SEQ_STRIDE + index
        if store.put(Message(TOPIC, str(seq).encode())).status is PutStatus.PUT_OK:
            os.write(1, f"ACK {seq}\n".encode())
    fail_everything(store, time.monotonic() + WRITER_LIFETIME_MAX_S)
    store.close()


if __name__ == "__main__":
    main()
