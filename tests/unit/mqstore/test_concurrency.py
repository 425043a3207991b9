"""Producers on many threads: queue offsets stay dense, unique and in each producer's order."""

from __future__ import annotations

import threading
from collections import defaultdict

from mqstore import GetStatus, Message

THREADS = 8
PER_THREAD = 250
QUEUES = 3


def _run(threads_count: int, work) -> None:
    """Run work(thread_index) on threads_count threads started together; re-raise the first failure."""
    barrier = threading.Barrier(threads_count)
    failures: list[BaseException] = []

    def body(index):
        try:
            barrier.wait(30)
            work(index)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    if failures:
        raise failures[0]


def _read_queue(store, topic, queue_id):
    messages, offset = [], 0
    while True:
        got = store.get(topic, queue_id, offset, max_count=500)
        if got.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return messages
        assert got.status is GetStatus.FOUND
        messages += got.messages
        offset = got.next_offset


def test_eight_producer_threads_get_dense_unique_ordered_queue_offsets(store):
    results: dict[int, list] = defaultdict(list)

    def produce(thread):
        for seq in range(PER_THREAD):
            queue_id = (thread + seq) % QUEUES
            result = store.put(Message("t", b"%d:%d" % (thread, seq) + b"." * (seq % 200), queue_id=queue_id))
            results[thread].append((queue_id, seq, result))

    _run(THREADS, produce)
    assert store.wait_dispatched(60)
    by_queue: dict[int, list[int]] = defaultdict(list)
    for rows in results.values():
        last_offset: dict[int, int] = {}
        for queue_id, _, result in rows:
            by_queue[queue_id].append(result.queue_offset)
            assert result.queue_offset > last_offset.get(queue_id, -1)  # a thread's own puts keep their order
            last_offset[queue_id] = result.queue_offset
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))  # each offset exactly once, no gaps
    all_results = [result for rows in results.values() for _, _, result in rows]
    assert len({r.commitlog_offset for r in all_results}) == THREADS * PER_THREAD
    assert store.stats()["commitlog"]["segments"] > 1
    # what a consumer reads is what each put said
    expected = {(queue_id, r.queue_offset): (thread, seq) for thread, rows in results.items()
                for queue_id, seq, r in rows}
    for queue_id in range(QUEUES):
        messages = _read_queue(store, "t", queue_id)
        assert [m.queue_offset for m in messages] == list(range(len(by_queue[queue_id])))
        for message in messages:
            thread, seq = expected[(queue_id, message.queue_offset)]
            assert message.body.split(b".")[0] == b"%d:%d" % (thread, seq)


def test_concurrent_batches_keep_each_batch_contiguous(store):
    results: dict[int, list] = defaultdict(list)

    def produce(thread):
        for round_ in range(20):
            batch = [Message("b", b"%d:%d:%d" % (thread, round_, i), queue_id=i % 2) for i in range(10)]
            results[thread].append(store.put_batch(batch))

    _run(THREADS, produce)
    assert store.wait_dispatched(60)
    for batches in results.values():
        for batch in batches:
            for queue_id in (0, 1):
                offsets = [r.queue_offset for i, r in enumerate(batch) if i % 2 == queue_id]
                assert offsets == list(range(offsets[0], offsets[0] + 5))
    for queue_id in (0, 1):
        assert store.max_offset("b", queue_id) == THREADS * 20 * 5
        assert len({m.body for m in _read_queue(store, "b", queue_id)}) == THREADS * 20 * 5


def test_readers_see_a_consistent_prefix_while_producers_write(store):
    total = 4 * 300
    seen: list[bytes] = []
    writers_done = threading.Event()

    def work(index):
        if index < 4:
            for seq in range(300):
                store.put(Message("r", b"%d:%d" % (index, seq)))
            return
        offset = 0
        while offset < total:
            got = store.get("r", 0, offset, max_count=64)
            if got.status is GetStatus.FOUND:
                assert [m.queue_offset for m in got.messages] == list(range(offset, got.next_offset))
                seen.extend(m.body for m in got.messages)
                offset = got.next_offset
            else:
                assert got.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MATCHED_LOGIC_QUEUE)
                if writers_done.is_set():
                    assert store.wait_dispatched(30)
                else:
                    store.wait_dispatched(0.05)

    def run(index):
        try:
            work(index)
        finally:
            if index < 4:
                finished.append(index)
                if len(finished) == 4:
                    writers_done.set()

    finished: list[int] = []
    _run(5, run)
    assert len(seen) == total and len(set(seen)) == total
