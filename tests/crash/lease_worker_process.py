"""The worker that tests/crash/test_lease_kill.py kills with SIGKILL while it holds leases.

    python tests/crash/lease_worker_process.py ROOT --seed S --visibility-ms V

Opens the store at ROOT as its writer (recovering it from the previous kill), then receives from topic `work`
for group `crash` with leases of V ms, acknowledging most messages one by one or in batches and leaving some
to expire, and prints one line per event in one write(2):

    OPENED
    LEASED <body> <delivery_count>       handed to this process (before anything is done with it)
    ACKING <body>                        ack() or ack_many() is called for it next
    ACKED <body>                         ack() or ack_many() returned for it

It runs until it is killed (or, idle for WORKER_LIFETIME_MAX_S, stops by itself). A small compaction size
makes it compact its journal often, so that kills fall inside compactions too.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import MessageStore, StoreConfig  # noqa: E402
from mqstore.lease import open_lease_consumer  # noqa: E402

TOPIC = "work"
GROUP = "crash"
WORKER_LIFETIME_MAX_S = 60.0
COMPACT_BYTES = 16 << 10
MAX_DELIVERY_COUNT = 1000  # the test checks redelivery, not the DLQ
LEAVE_PROBABILITY = 0.1  # a message left unacknowledged (its lease expires)


def lease_kill_config() -> StoreConfig:
    return StoreConfig(segment_size_bytes=1 << 20, index_enabled=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--visibility-ms", type=int, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    store = MessageStore.open(args.root, lease_kill_config())
    consumer = open_lease_consumer(store, GROUP, TOPIC, max_delivery_count=MAX_DELIVERY_COUNT,
                                   compact_bytes=COMPACT_BYTES)
    os.write(1, b"OPENED\n")
    stop_at = time.monotonic() + WORKER_LIFETIME_MAX_S
    while time.monotonic() < stop_at:
        received = consumer.receive(rng.randint(1, 16), args.visibility_ms, 50)
        if received:
            os.write(1, "".join(f"LEASED {leased.message.body.decode()} {leased.lease.delivery_count}\n"
                                for leased in received).encode())
        kept = [leased for leased in received if rng.random() >= LEAVE_PROBABILITY]
        if kept:
            os.write(1, "".join(f"ACKING {leased.message.body.decode()}\n" for leased in kept).encode())
        if rng.random() < 0.5:
            consumer.ack_many(leased.lease for leased in kept)
            if kept:
                os.write(1, "".join(f"ACKED {leased.message.body.decode()}\n" for leased in kept).encode())
        else:
            for leased in kept:
                consumer.ack(leased.lease)
                os.write(1, f"ACKED {leased.message.body.decode()}\n".encode())
    consumer.close()
    store.close()


if __name__ == "__main__":
    main()
