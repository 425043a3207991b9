"""HandOff: work parked while the lock is held runs on the holder's release, in order, with each result (or
exception) delivered to the thread that parked it; holders that do not run the FIFO are covered by the poll."""

from __future__ import annotations

import threading

import mqstore.commitlog.handoff as handoff_module
import pytest
from mqstore.commitlog.handoff import HandOff

from tests.conftest import wait_until


def _park(handoff: HandOff, function, argument, outcomes: dict, key) -> threading.Thread:
    def run():
        try:
            outcomes[key] = ("result", handoff.hand_in(function, argument))
        except BaseException as exc:  # noqa: BLE001 - the test looks at which exception arrived
            outcomes[key] = ("raised", exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _park_in_order(handoff: HandOff, function, count: int, outcomes: dict) -> list[threading.Thread]:
    """Threads parking function(0), function(1), ... one after the other: a known arrival order."""
    threads = []
    for n in range(count):
        threads.append(_park(handoff, function, n, outcomes, n))
        _wait_parked(handoff, n + 1)
    return threads


def _wait_parked(handoff: HandOff, count: int) -> None:
    assert wait_until(lambda: len(handoff.pending) >= count, interval_s=0.001), \
        f"{count} parkers expected, {len(handoff.pending)} parked"


def test_parked_work_runs_on_the_holders_release_in_arrival_order(monkeypatch):
    monkeypatch.setattr(handoff_module, "HAND_IN_POLL_S", 60.0)  # only the holder's release can run them
    handoff = HandOff(threading.Lock())
    handoff.lock.acquire()
    ran_by: list[tuple[int, str]] = []

    def work(n):
        assert handoff.lock.locked()  # always under the lock
        ran_by.append((n, threading.current_thread().name))
        return n * 10

    outcomes: dict = {}
    threads = _park_in_order(handoff, work, 5, outcomes)
    assert ran_by == [] and outcomes == {}
    handoff.release()
    for thread in threads:
        thread.join(10)
    assert [n for n, _ in ran_by] == [0, 1, 2, 3, 4]
    assert {name for _, name in ran_by} == {threading.current_thread().name}  # the holder ran them all
    assert outcomes == {n: ("result", n * 10) for n in range(5)}
    assert handoff.handed_in == 5 and not handoff.lock.locked() and not handoff.pending


def test_an_exception_of_parked_work_is_raised_in_the_thread_that_parked_it(monkeypatch):
    monkeypatch.setattr(handoff_module, "HAND_IN_POLL_S", 60.0)
    handoff = HandOff(threading.Lock())
    handoff.lock.acquire()

    def work(n):
        if n == 1:
            raise OSError("no space left")
        return n

    outcomes: dict = {}
    threads = _park_in_order(handoff, work, 3, outcomes)
    handoff.release()
    for thread in threads:
        thread.join(10)
    assert outcomes[0] == ("result", 0) and outcomes[2] == ("result", 2)  # the others are not disturbed
    kind, exc = outcomes[1]
    assert kind == "raised" and isinstance(exc, OSError) and str(exc) == "no space left"
    assert not handoff.lock.locked()


def test_parked_work_runs_after_a_holder_that_lets_go_of_the_plain_lock(monkeypatch):
    monkeypatch.setattr(handoff_module, "HAND_IN_POLL_S", 0.01)
    handoff = HandOff(threading.Lock())
    handoff.lock.acquire()  # a holder such as close(): it does not run the FIFO
    outcomes: dict = {}
    thread = _park(handoff, lambda n: n + 1, 41, outcomes, "x")
    _wait_parked(handoff, 1)
    handoff.lock.release()
    thread.join(10)
    assert outcomes == {"x": ("result", 42)} and not handoff.pending and not handoff.lock.locked()


def test_hand_in_with_the_lock_free_runs_the_work_at_once_on_the_calling_thread():
    handoff = HandOff(threading.Lock())
    seen = []
    assert handoff.hand_in(lambda n: seen.append(threading.current_thread().name) or n, 7) == 7
    assert seen == [threading.current_thread().name] and not handoff.lock.locked()
    with pytest.raises(KeyError):
        handoff.hand_in(lambda n: {}[n], "missing")
    assert not handoff.lock.locked() and not handoff.pending


def test_many_threads_through_one_handoff_each_get_their_own_result_and_nothing_runs_twice():
    handoff = HandOff(threading.Lock())
    counter = [0]

    def work(tag):
        counter[0] += 1  # unguarded increment: only correct if every call runs under the lock
        return tag

    results: dict = {}

    def producer(index):
        for seq in range(300):
            got = handoff.lock.acquire(False)
            if got:
                try:
                    value = work((index, seq))
                finally:
                    handoff.release()
            else:
                value = handoff.hand_in(work, (index, seq))
            results[index, seq] = value

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counter[0] == 8 * 300
    assert all(key == value for key, value in results.items()) and len(results) == 8 * 300


def test_a_holder_stopped_by_a_base_exception_tells_that_parker_and_leaves_the_rest_parked(monkeypatch):
    monkeypatch.setattr(handoff_module, "HAND_IN_POLL_S", 0.01)
    handoff = HandOff(threading.Lock())
    handoff.lock.acquire()

    class Stop(BaseException):
        pass

    def work(n):
        if n == 0 and threading.current_thread() is threading.main_thread():
            raise Stop()
        return n

    outcomes: dict = {}
    threads = _park_in_order(handoff, work, 2, outcomes)
    with pytest.raises(Stop):
        handoff._run_parked()  # the holder's run (it holds the lock), stopped at the first parked call
    assert len(handoff.pending) == 1  # the second is still parked
    handoff.lock.release()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert outcomes[0][0] == "raised" and isinstance(outcomes[0][1], Stop)
    assert outcomes[1] == ("result", 1)  # run later, by its own thread's look at the free lock
