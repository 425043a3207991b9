"""The clock the store's timed services read (mqstore/store/clock.py): a ManualClock moves only when told."""

import threading
import time

import pytest

from mqstore.store.clock import SYSTEM_CLOCK, ManualClock


def test_manual_clock_moves_only_when_told():
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    assert clock.set(2_000) == 2_000
    assert clock.now_ms() == 2_000


def test_manual_clock_refuses_to_go_back():
    clock = ManualClock(5_000)
    with pytest.raises(ValueError):
        clock.set(4_999)
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.now_ms() == 5_000


def test_a_wait_ends_when_the_clock_passes_its_deadline():
    clock = ManualClock(0)
    event = threading.Event()
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(clock.wait(event, 1_000)))
    waiter.start()
    clock.advance(999)
    waiter.join(0.2)
    assert waiter.is_alive()  # 1 ms of the clock is still to pass
    clock.advance(1)
    waiter.join(10)
    assert not waiter.is_alive() and outcome == [False]


def test_a_wait_ends_when_its_event_is_set():
    clock = ManualClock(0)
    event = threading.Event()
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(clock.wait(event, 60_000)))
    waiter.start()
    event.set()
    waiter.join(10)
    assert outcome == [True] and clock.now_ms() == 0


def test_the_system_clock_reads_wall_time_in_milliseconds():

    before = time.time_ns() // 1_000_000
    now = SYSTEM_CLOCK.now_ms()
    assert before <= now <= time.time_ns() // 1_000_000
    assert SYSTEM_CLOCK.wait(threading.Event(), 1) is False


def test_a_watched_event_is_set_when_a_manual_clock_moves_and_not_after_unwatch():
    clock = ManualClock(1000)
    event = threading.Event()
    clock.watch(event)
    clock.advance(0)
    assert event.is_set()
    event.clear()
    clock.unwatch(event)
    clock.advance(5)
    assert not event.is_set()
    SYSTEM_CLOCK.watch(event)  # the wall clock never jumps: nothing to set
    SYSTEM_CLOCK.unwatch(event)
