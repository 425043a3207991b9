"""A waiting receive is woken, not polled: by an expiry it knows of, a dispatch, a ManualClock's move, a nack.

Each test sets the look-again slice to an hour, so that a receive that returns did so because it was woken.
The waits are bounded by `timeout_ms` and a thread join (a hang guard), never asserted on.
"""

from __future__ import annotations

import threading

import pytest

from mqstore import Message, MessageStore
from mqstore.lease import consumer as lease_consumer
from mqstore.lease import open_lease_consumer
from mqstore.store.clock import ManualClock
from tests.conftest import small_config

TOPIC = "jobs"
GROUP = "workers"
HANG_GUARD_MS = 60_000


@pytest.fixture(autouse=True)
def no_polling(monkeypatch):
    monkeypatch.setattr(lease_consumer, "RECEIVE_WAIT_SLICE_S", 3600.0)


def put(store, count: int) -> None:
    store.put_batch([Message(TOPIC, b"m%d" % i, tags="t", keys=[f"k{i}"]) for i in range(count)])
    assert store.wait_dispatched(10)


def in_thread(function) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    return thread, result


def joined(thread: threading.Thread, result: list):
    thread.join(HANG_GUARD_MS / 1000)
    assert not thread.is_alive(), "the waiting receive was not woken"
    return result[0]


def test_a_waiting_receive_wakes_at_the_earliest_deadline_on_the_wall_clock(tmp_path):
    with MessageStore.open(tmp_path / "store", small_config()) as store:
        put(store, 1)
        with open_lease_consumer(store, GROUP, TOPIC) as consumer:
            (first,) = consumer.receive(max_count=1, visibility_ms=20)
            (again,) = consumer.receive(max_count=1, visibility_ms=1000, timeout_ms=HANG_GUARD_MS)
            assert again.message.body == b"m0" and again.lease.delivery_count == 2
            assert again.lease.deadline_ms >= first.lease.deadline_ms


def test_a_waiting_receive_wakes_when_a_manual_clock_moves_past_a_deadline(tmp_path):
    clock = ManualClock(1_700_000_000_000)
    with MessageStore.open(tmp_path / "store", small_config(), clock=clock) as store:
        put(store, 1)
        with open_lease_consumer(store, GROUP, TOPIC) as consumer:
            consumer.receive(max_count=1, visibility_ms=1000)
            thread, result = in_thread(lambda: consumer.receive(max_count=1, visibility_ms=1000,
                                                                timeout_ms=HANG_GUARD_MS))
            clock.advance(1000)
            (again,) = joined(thread, result)
            assert again.lease.delivery_count == 2


def test_a_waiting_receive_wakes_when_new_messages_are_dispatched(tmp_path):
    with MessageStore.open(tmp_path / "store", small_config()) as store:
        put(store, 0)
        with open_lease_consumer(store, GROUP, TOPIC) as consumer:
            thread, result = in_thread(lambda: consumer.receive(max_count=4, visibility_ms=1000,
                                                                timeout_ms=HANG_GUARD_MS))
            store.put(Message(TOPIC, b"new", tags="t", keys=["n"]))
            received = joined(thread, result)
            assert [leased.message.body for leased in received] == [b"new"]


def test_a_waiting_receive_wakes_when_another_consumer_of_the_group_nacks(tmp_path):
    clock = ManualClock(1_700_000_000_000)
    with MessageStore.open(tmp_path / "store", small_config(), clock=clock) as store:
        put(store, 1)
        with open_lease_consumer(store, GROUP, TOPIC) as holder, open_lease_consumer(store, GROUP, TOPIC) as waiter:
            (leased,) = holder.receive(max_count=1, visibility_ms=60_000)
            thread, result = in_thread(lambda: waiter.receive(max_count=1, visibility_ms=1000,
                                                              timeout_ms=HANG_GUARD_MS))
            holder.nack(leased.lease)
            (again,) = joined(thread, result)
            assert again.message.body == b"m0" and again.lease.delivery_count == 2


def test_a_closed_consumer_is_no_longer_woken(tmp_path):
    clock = ManualClock(1_700_000_000_000)
    with MessageStore.open(tmp_path / "store", small_config(), clock=clock) as store:
        consumer = open_lease_consumer(store, GROUP, TOPIC)
        assert consumer._wake in clock._watchers
        consumer.close()
        assert consumer._wake not in clock._watchers
        assert not lease_consumer._group_wakes.get(consumer._journal.path)  # other tests' may linger until GC


def test_only_a_store_that_dispatches_in_this_process_can_be_watched(tmp_path):
    event = threading.Event()
    with MessageStore.open(tmp_path / "store", small_config()) as store:
        put(store, 1)
        assert store.watch_dispatch(event)
        store.put(Message(TOPIC, b"more", tags="t", keys=["m"]))
        assert store.wait_dispatched(10) and event.is_set()
        store.unwatch_dispatch(event)
        with MessageStore.open(tmp_path / "store", read_only=True) as reader:
            assert not reader.watch_dispatch(event)
