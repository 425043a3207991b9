"""mqstore.consumer: positions from committed offsets, long-poll woken by dispatch, tag filtering, at-least-once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from mqstore import InvalidMessageError, Message, MessageStore, StoreClosedError
from mqstore.consumer.group import _wait_dispatched_past, open_consumer
from tests.conftest import FIXTURES_DIR, rocketmq_config, rocketmq_manifest
from tests.unit.mqstore.conftest import config

POLL_TIMEOUT_MS = 60_000  # long enough never to expire in a passing test; results, not timings, are asserted


def put(store, topic: str, queue_id: int, count: int, tags=None, start: int = 0):
    results = store.put_batch([Message(topic, b"%s-%d-%d" % (topic.encode(), queue_id, i), queue_id=queue_id,
                                       tags=tags(i) if callable(tags) else tags)
                               for i in range(start, start + count)])
    assert store.wait_dispatched(30)
    return results


def ids(messages) -> list[tuple[int, int]]:
    return [(m.queue_id, m.queue_offset) for m in messages]


class CountingStore:
    """A store whose get() calls are counted (a consumer that spins would call it without end)."""

    def __init__(self, store):
        self._store = store
        self.gets = 0

    def get(self, *args, **kwargs):
        self.gets += 1
        return self._store.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


# --- reading and committing -------------------------------------------------------------------------------------
def test_iterates_every_queue_from_the_start_and_polls_in_batches(store):
    for queue_id in range(3):
        put(store, "t", queue_id, 50)
    consumer = open_consumer(store, "g", "t")
    assert consumer.queue_ids == [0, 1, 2] and consumer.positions() == {0: 0, 1: 0, 2: 0}
    first = consumer.poll(max_count=20)
    assert len(first) == 20
    rest = list(consumer)
    assert sorted(ids(first + rest)) == [(q, i) for q in range(3) for i in range(50)]
    assert consumer.positions() == {0: 50, 1: 50, 2: 50}
    assert consumer.poll(10, 0) == [] and list(consumer) == []
    assert consumer.lag() == {0: 0, 1: 0, 2: 0}


def test_round_robin_reaches_every_queue(store):
    for queue_id in range(4):
        put(store, "t", queue_id, 100)
    consumer = open_consumer(store, "g", "t")
    seen = {m.queue_id for _ in range(4) for m in consumer.poll(max_count=100)}
    assert seen == {0, 1, 2, 3}


def test_a_restarted_consumer_resumes_at_the_commit_and_gets_the_rest_again(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        put(store, "t", 0, 10)
        consumer = open_consumer(store, "g", "t")
        assert ids(consumer.poll(4)) == [(0, i) for i in range(4)]
        assert consumer.commit() == {0: 4}
        assert ids(consumer.poll(3)) == [(0, 4), (0, 5), (0, 6)]  # returned, never committed
    with MessageStore.open(store_dir, config()) as store:
        consumer = open_consumer(store, "g", "t")
        assert consumer.committed() == {0: 4} and consumer.positions() == {0: 4}
        assert ids(consumer.poll(100)) == [(0, i) for i in range(4, 10)]
        assert open_consumer(store, "other-group", "t").positions() == {0: 0}


CRASHING_CONSUMER = textwrap.dedent("""
    import os, sys
    from mqstore import Message, MessageStore, StoreConfig
    from mqstore.consumer.group import open_consumer

    config = StoreConfig(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64,
                         max_message_size_bytes=8192, max_queues_per_topic=8, store_host="10.0.0.7",
                         preallocate_segments=False)
    store = MessageStore.open(sys.argv[1], config)
    store.put_batch([Message("t", b"%d" % i, queue_id=i % 2) for i in range(20)])
    store.wait_dispatched(30)
    consumer = open_consumer(store, "g", "t")
    consumer.poll(6)
    consumer.commit()
    consumer.poll(6)
    os._exit(0)  # a crash: no close, no commit of the second poll
""")


def test_after_a_crash_consumption_resumes_from_the_last_commit(store_dir):
    done = subprocess.run([sys.executable, "-c", CRASHING_CONSUMER, str(store_dir)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with MessageStore.open(store_dir, config()) as store:
        consumer = open_consumer(store, "g", "t")
        committed = consumer.committed()
        assert sum(committed.values()) == 6
        remaining = list(consumer)
    assert sorted(ids(remaining)) == sorted((q, i) for q in (0, 1) for i in range(committed[q], 10))


def test_commit_never_moves_an_offset_back(store):
    put(store, "t", 0, 10)
    consumer = open_consumer(store, "g", "t")
    consumer.poll(8)
    consumer.commit()
    consumer.seek(0, 2)
    assert ids(consumer.poll(1)) == [(0, 2)]
    assert consumer.commit() == {0: 8}


def test_breaking_out_of_iteration_commits_exactly_what_was_seen(store):
    put(store, "t", 0, 10)
    consumer = open_consumer(store, "g", "t")
    for message in consumer:
        if message.queue_offset == 3:
            break
    assert consumer.commit() == {0: 4}


def test_consume_from_last_and_queues_that_appear_later(store):
    put(store, "t", 0, 5)
    consumer = open_consumer(store, "g", "t", consume_from="last")
    assert consumer.positions() == {0: 5} and consumer.poll(10) == []
    put(store, "t", 0, 1, start=5)
    put(store, "t", 6, 2)  # a new queue is read from its start
    assert sorted(ids(consumer.poll(10))) == [(0, 5), (6, 0), (6, 1)]


def test_fixed_queues_and_a_consumer_without_group(store):
    put(store, "t", 0, 3)
    put(store, "t", 1, 3)
    consumer = open_consumer(store, None, "t", queue_ids=[1])
    assert ids(list(consumer)) == [(1, 0), (1, 1), (1, 2)]
    assert consumer.commit() == {1: 3}  # nothing is stored without a group
    assert not (Path(store.root_dir) / "config" / "consumerOffset.json").exists()


# --- long polling ----------------------------------------------------------------------------------------------
def test_a_put_from_another_thread_wakes_a_blocked_poll(store):
    put(store, "t", 0, 1)
    counting = CountingStore(store)
    consumer = open_consumer(counting, "g", "t")
    assert ids(consumer.poll(10)) == [(0, 0)]
    result = {}
    polling = threading.Event()

    def poll() -> None:
        polling.set()
        result["messages"] = consumer.poll(10, POLL_TIMEOUT_MS)

    thread = threading.Thread(target=poll)
    thread.start()
    polling.wait()
    # Whether the put lands before the poll blocks or while it waits, the poll must return the new message.
    store.put(Message("t", b"wake up", queue_id=0))
    thread.join(POLL_TIMEOUT_MS / 1000)
    assert not thread.is_alive()
    assert [(m.queue_offset, m.body) for m in result["messages"]] == [(1, b"wake up")]
    assert counting.gets < 20  # woken by dispatch, not spinning over get()


def test_a_poll_with_nothing_new_returns_empty_after_its_timeout(store):
    put(store, "t", 0, 1)
    counting = CountingStore(store)
    consumer = open_consumer(counting, "g", "t")
    consumer.poll(10)
    gets = counting.gets
    assert consumer.poll(10, 50) == []
    assert counting.gets - gets < 20


def test_wait_for_dispatch_returns_once_past_the_offset(store):
    now = _wait_dispatched_past(store, -1, 0)
    assert now == 0
    thread = threading.Thread(target=lambda: store.put(Message("t", b"x")))
    thread.start()
    assert _wait_dispatched_past(store, now, POLL_TIMEOUT_MS / 1000) > now
    thread.join()


def test_a_read_only_consumer_sees_what_a_writer_dispatches(store, store_dir):
    put(store, "t", 0, 2)
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        consumer = open_consumer(reader, "g", "t")
        assert ids(consumer.poll(10)) == [(0, 0), (0, 1)]
        thread = threading.Thread(target=lambda: put(store, "t", 0, 1, start=2))
        thread.start()
        got = consumer.poll(10, POLL_TIMEOUT_MS)
        thread.join()
        assert ids(got) == [(0, 2)]


# --- tags ------------------------------------------------------------------------------------------------------
def test_tag_filtering_by_hash_then_exact_tag(store):
    # "Aa" and "BB" have the same Java hashCode: the ConsumeQueue hash lets both through, the exact check not.
    put(store, "t", 0, 300, tags=lambda i: ("Aa", "BB", "C")[i % 3])
    consumer = open_consumer(store, "g", "t", tags="Aa")
    got = list(consumer)
    assert [m.queue_offset for m in got] == list(range(0, 300, 3)) and {m.tags for m in got} == {"Aa"}
    assert consumer.commit() == {0: 300}  # the filtered-out messages are consumed too
    either = open_consumer(store, "g2", "t", tags="BB || C")
    assert len(either.poll(1000)) == 200


def test_a_filtered_poll_pages_through_a_backlog_without_matches(store):
    put(store, "t", 0, 3000, tags="other")
    put(store, "t", 0, 1, tags="wanted", start=3000)
    consumer = open_consumer(store, "g", "t", tags="wanted")
    assert ids(consumer.poll(10)) == [(0, 3000)]


# --- RocketMQ's files ------------------------------------------------------------------------------------------
def test_offsets_rocketmq_wrote_position_a_consumer(rocketmq_store_copy):
    offsets_file = FIXTURES_DIR / "consumerOffset.json"
    if not offsets_file.is_file():
        pytest.fail(f"the RocketMQ offsets fixture is missing: {offsets_file}")
    (rocketmq_store_copy / "config").mkdir()
    shutil.copy(offsets_file, rocketmq_store_copy / "config" / "consumerOffset.json")
    manifest = rocketmq_manifest()
    with MessageStore.open(rocketmq_store_copy, rocketmq_config(), read_only=True) as store:
        consumer = open_consumer(store, "audit", "TopicTest")
        assert consumer.committed() == consumer.positions() == {0: 3, 1: 3, 2: 3, 3: 3}
        got = sorted((m.queue_id, m.queue_offset, m.body.hex()) for m in consumer)
        assert got == sorted((m["queue_id"], m["queue_offset"], m["body_hex"]) for m in manifest
                             if m["topic"] == "TopicTest" and m["queue_offset"] >= 3)
        consumer.commit()
        # orders@group_a committed 120 for queue 0, which holds fewer entries: RocketMQ's correction restarts it
        orders = open_consumer(store, "group_a", "orders", queue_ids=[0])
        assert orders.positions() == {0: 120}
        assert orders.poll(1)[0].queue_offset == 0
    table = json.loads((rocketmq_store_copy / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert table["TopicTest@audit"] == {str(q): store_max for q, store_max in consumer.positions().items()}
    assert table["%RETRY%group_a@group_a"] == {"0": 0}


# --- arguments -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(group="bad group"), dict(group="a@b"), dict(topic="bad topic"), dict(queue_ids=[]), dict(queue_ids=[-1]),
    dict(queue_ids=["0"]), dict(consume_from="middle"), dict(tags=5),
])
def test_bad_arguments(store, kwargs):
    arguments = dict(group="g", topic="t") | kwargs
    with pytest.raises(InvalidMessageError):
        open_consumer(store, **arguments)


def test_bad_poll_and_seek_arguments_and_close(store):
    consumer = open_consumer(store, "g", "t", queue_ids=[0])
    for max_count, timeout_ms in ((0, 0), (70_000, 0), (1, -1), (1, 1.5)):
        with pytest.raises(InvalidMessageError):
            consumer.poll(max_count, timeout_ms)
    with pytest.raises(InvalidMessageError):
        consumer.seek(3, 0)
    with pytest.raises(InvalidMessageError):
        consumer.seek(0, -1)
    with consumer:
        pass
    with pytest.raises(StoreClosedError):
        consumer.poll()
    with pytest.raises(StoreClosedError):
        consumer.commit()
