"""Several lease consumers of one group, in threads and in processes, never hold one message at once."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mqstore import Message, MessageStore
from mqstore.lease import open_lease_consumer
from tests.conftest import small_config

TOPIC = "jobs"
GROUP = "workers"
WORKER = Path(__file__).resolve().parent / "lease_worker.py"
VISIBILITY_MS = 60_000  # no lease expires during a test: any message seen twice was handed out twice


def put(store, count: int, queues: int = 2) -> None:
    store.put_batch([Message(TOPIC, b"%d" % i, queue_id=i % queues) for i in range(count)])
    assert store.wait_dispatched(10)


def drain(consumer, seen: list, batch: int) -> None:
    while True:
        received = consumer.receive(max_count=batch, visibility_ms=VISIBILITY_MS)
        if not received:
            return
        seen.extend(leased.message.body for leased in received)
        consumer.ack_many(leased.lease for leased in received)


def test_threads_share_a_queue(tmp_path):
    with MessageStore.open(tmp_path / "store", small_config()) as store:
        put(store, 2000)
        shared = open_lease_consumer(store, GROUP, TOPIC)
        consumers = [shared, shared] + [open_lease_consumer(store, GROUP, TOPIC) for _ in range(3)]
        seen: list[bytes] = []
        threads = [threading.Thread(target=drain, args=(consumer, seen, 1 + index * 3))
                   for index, consumer in enumerate(consumers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        counts = collections.Counter(seen)
        assert len(seen) == 2000 and set(counts) == {b"%d" % i for i in range(2000)}
        assert shared.commit() == {0: 1000, 1: 1000}
        for consumer in consumers[1:]:
            consumer.close()


@pytest.mark.slow
def test_processes_on_read_only_stores_share_a_queue(tmp_path):
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        put(store, 3000)
        workers = [subprocess.Popen([sys.executable, str(WORKER), str(root), GROUP, TOPIC, "--batch", str(batch)],
                                    stdout=subprocess.PIPE) for batch in (1, 7, 32)]
        seen: list[bytes] = []
        with open_lease_consumer(store, GROUP, TOPIC) as consumer:
            drain(consumer, seen, 16)
            outputs = [worker.communicate(timeout=120)[0] for worker in workers]
            assert all(worker.returncode == 0 for worker in workers)
            for output in outputs:
                seen.extend(line.split()[1].encode() for line in output.decode().splitlines())
            counts = collections.Counter(seen)
            assert len(seen) == 3000 and set(counts) == {b"%d" % i for i in range(3000)}
            assert consumer.commit() == {0: 1500, 1: 1500}


@pytest.mark.slow
def test_a_lease_held_in_another_process_is_not_handed_out(tmp_path):
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        put(store, 20, queues=1)
        worker = subprocess.run([sys.executable, str(WORKER), str(root), GROUP, TOPIC, "--no-ack-after", "5"],
                                stdout=subprocess.PIPE, timeout=120, check=True)
        lines = worker.stdout.decode().splitlines()
        assert len(lines) == 20 and sum(line.startswith("HELD") for line in lines) == 15
        with open_lease_consumer(store, GROUP, TOPIC) as consumer:
            assert consumer.receive(max_count=20, visibility_ms=1000) == []  # 15 leases live for 60 s
            assert consumer.prefixes() == {0: 5} and consumer.leased_count() == 15
