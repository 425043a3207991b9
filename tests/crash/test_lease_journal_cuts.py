"""A lease journal cut at any byte (a power loss without sync=True, a torn write) loses no message.

A consumer leases and acknowledges messages, noting the journal's size after each ack. The journal is then cut
at every few bytes; on each cut a new consumer, on a clock a day ahead (every lease expired), drains the topic:
every message whose ack ended before the cut stays done, every other one is delivered, none twice.
"""

from __future__ import annotations

import os
import shutil

from mqstore import Message, MessageStore
from mqstore.lease import open_lease_consumer
from mqstore.lease.journal import journal_paths
from mqstore.store.clock import ManualClock
from tests.conftest import small_config

TOPIC = "jobs"
GROUP = "workers"
MESSAGES = 60
CUT_STEP_BYTES = 13
DAY_MS = 24 * 3600 * 1000


def build(root) -> list[tuple[int, set[bytes]]]:
    """Lease and ack in a pattern of batches, singles and leftovers; (journal size, acked so far) after each ack."""
    acks = []
    with MessageStore.open(root, small_config()) as store:
        store.put_batch([Message(TOPIC, b"%d" % i, queue_id=i % 2) for i in range(MESSAGES)])
        assert store.wait_dispatched(10)
        path = journal_paths(store.root_dir, TOPIC, GROUP)[0]
        consumer = open_lease_consumer(store, GROUP, TOPIC)
        acked: set[bytes] = set()
        for round_ in range(12):
            received = consumer.receive(max_count=1 + round_ % 7, visibility_ms=60_000)
            kept = [leased for leased in received if int(leased.message.body) % 5 != 3]  # leave some leased
            if round_ % 2:
                consumer.ack_many(leased.lease for leased in kept)
                acked |= {leased.message.body for leased in kept}
                acks.append((os.path.getsize(path), set(acked)))
            else:
                for leased in kept:
                    consumer.ack(leased.lease)
                    acked.add(leased.message.body)
                    acks.append((os.path.getsize(path), set(acked)))
        consumer._journal.close()  # as a kill would: no commit of the prefixes
    return acks


def test_a_journal_cut_anywhere_loses_no_message(tmp_path):
    root = tmp_path / "store"
    acks = build(root)
    path = journal_paths(root, TOPIC, GROUP)[0]
    whole = open(path, "rb").read()
    everything = {b"%d" % i for i in range(MESSAGES)}
    with MessageStore.open(root, small_config()) as store:
        for cut in range(0, len(whole) + 1, CUT_STEP_BYTES):
            shutil.rmtree(os.path.dirname(path))
            os.makedirs(os.path.dirname(path))
            with open(path, "wb") as journal:
                journal.write(whole[:cut])
            done = max((acked for size, acked in acks if size <= cut), key=len, default=set())
            clock = ManualClock(store.clock.now_ms() + DAY_MS)
            with open_lease_consumer(store, GROUP, TOPIC, clock=clock) as consumer:
                drained = []
                while received := consumer.receive(max_count=100, visibility_ms=60_000):
                    drained += [leased.message.body for leased in received]
                    consumer.ack_many(leased.lease for leased in received)
            assert len(drained) == len(set(drained)), cut
            assert not set(drained) & done, f"cut {cut}: an acknowledged message came back"
            assert set(drained) | done >= everything, f"cut {cut}: a message was lost"
            os.remove(os.path.join(root, "config", "consumerOffset.json"))  # the drain committed; next cut starts clean
