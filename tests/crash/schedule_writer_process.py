"""The writer process that tests/crash/test_schedule_kill.py kills with SIGKILL while delay levels are pending.

    python tests/crash/schedule_writer_process.py ROOT --generation G --count N

Opens the store at ROOT (recovering it from the previous kill; its schedule service starts and delivers what is
due), then puts N messages on topic `delayed`, each with a random delay level of SCHEDULE_KILL_LEVELS and body
`<seq>`, seq = G * 1_000_000 + index, printing one line per event in one write(2):

    OPENED
    ACK <seq> <level> <store_timestamp_ms>        put returned PUT_OK

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
TOPIC = "delayed"
SCHEDULE_KILL_LEVELS = "50ms 100ms 200ms 400ms"  # real short delays: no clock shared across processes


def schedule_kill_config() -> StoreConfig:
    return StoreConfig(segment_size_bytes=1 << 20, index_enabled=False, delay_levels=SCHEDULE_KILL_LEVELS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    rng = random.Random(args.generation)
    store = MessageStore.open(args.root, schedule_kill_config())
    os.write(1, b"OPENED\n")
    levels = len(SCHEDULE_KILL_LEVELS.split())
    for index in range(args.count):
        seq = args.generation * GENERATION_SEQ_STRIDE + index
        level = rng.randint(1, levels)
        result = store.put(Message(TOPIC, str(seq).encode(), properties={"DELAY": str(level)}))
        if result.status is PutStatus.PUT_OK:
            os.write(1, f"ACK {seq} {level} {result.store_timestamp_ms}\n".encode())
    time.sleep(WRITER_LIFETIME_MAX_S)
    store.close()


if __name__ == "__main__":
    main()
