"""The writer process that tests/crash/test_timer_kill.py kills with SIGKILL while timers are pending and firing.

    python tests/crash/timer_writer_process.py ROOT --generation G --count N --window-ms W

Opens the store at ROOT (recovering it from the previous kill; its timer service starts and delivers what is
due), then puts N messages on topic `timed`, each with TIMER_DELIVER_MS = now + a random 0..W ms and body
`<seq>`, seq = G * 1_000_000, + 1, ..., printing one line per event in one write(2):

    OPENED
    ACK <seq> <deliver_ms>        put returned PUT_OK

then keeps the store open (delivering) until it is killed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import Message, MessageStore, PutStatus, StoreConfig  # noqa: E402

GENERATION_SEQ_STRIDE = 1_000_000
WRITER_LIFETIME_MAX_S = 60.0  # a writer nobody kills stops by itself
TOPIC = "timed"


def timer_kill_config() -> StoreConfig:
    return StoreConfig(segment_size_bytes=1 << 20, timer_log_file_size_bytes=8192, index_enabled=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--window-ms", type=int, required=True)
    args = parser.parse_args()
    rng = random.Random(args.generation)
    store = MessageStore.open(args.root, timer_kill_config())
    os.write(1, b"OPENED\n")
    for index in range(args.count):
        seq = args.generation * GENERATION_SEQ_STRIDE + index
        deliver_ms = time.time_ns() // 1_000_000 + rng.randrange(args.window_ms)
        result = store.put(Message(TOPIC, str(seq).encode(), properties={"TIMER_DELIVER_MS": str(deliver_ms)}))
        if result.status is PutStatus.PUT_OK:
            os.write(1, f"ACK {seq} {deliver_ms}\n".encode())
    time.sleep(WRITER_LIFETIME_MAX_S)
    store.close()


if __name__ == "__main__":
    main()
