"""A lease consumer in its own process, on the store opened read_only (another process writes it).

    python tests/unit/lease/lease_worker.py ROOT GROUP TOPIC [--no-ack-after N] [--batch B]

Receives (visibility 60 s) and acknowledges until a receive waiting 300 ms finds nothing, printing one line
`GOT <body>` per message received, written before its ack; with --no-ack-after N it stops acknowledging after N
messages and prints `HELD <body>` instead (those leases stay live).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from mqstore import MessageStore  # noqa: E402
from mqstore.lease import open_lease_consumer  # noqa: E402

VISIBILITY_MS = 60_000
IDLE_TIMEOUT_MS = 300


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("--no-ack-after", type=int, default=None)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    acked = 0
    with MessageStore.open(args.root, read_only=True) as store, \
            open_lease_consumer(store, args.group, args.topic) as consumer:
        while True:
            received = consumer.receive(args.batch, VISIBILITY_MS, IDLE_TIMEOUT_MS)
            if not received:
                break
            for leased in received:
                holding = args.no_ack_after is not None and acked >= args.no_ack_after
                os.write(1, (("HELD " if holding else "GOT ") + leased.message.body.decode() + "\n").encode())
                if not holding:
                    consumer.ack(leased.lease)
                    acked += 1


if __name__ == "__main__":
    main()
