"""The compiled core's FlushGate and write_at (commitlog/csrc/flushwait.c): the SYNC producers' wait."""

from __future__ import annotations

import os
import threading

import pytest
from mqstore.commitlog.native import NATIVE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="the compiled core is not built or MQSTORE_NATIVE=0")

DURABLE, LEAD, TIMEOUT, CLOSED, IDLE = 0, 1, 2, 3, 4


def _waiter(gate, position, timeout_s, lead, results, key):
    thread = threading.Thread(target=lambda: results.__setitem__(key, gate.wait(position, timeout_s, lead)))
    thread.start()
    return thread


def _until(condition, tries=1000):
    for _ in range(tries):
        if condition():
            return True
        threading.Event().wait(0.005)
    return condition()


def test_a_durable_position_returns_at_once_and_a_free_lead_is_taken_by_one_caller():
    gate = NATIVE.flush_gate(100)
    assert gate.durable == 100 and not gate.leading
    assert gate.wait(100, 5, True) == DURABLE
    assert gate.wait(101, 5, True) == LEAD and gate.leading
    assert gate.wait(101, 0.01, True) == TIMEOUT  # the lead is taken: this one waits, and times out
    assert gate.advance(150, False) == 0 and not gate.leading
    assert gate.durable == 150 and gate.wait(150, 0, False) == DURABLE
    assert gate.advance(120, False) == 0 and gate.durable == 150  # the durable position never goes back


def test_advance_wakes_the_waiters_it_covers_and_keeps_the_lead_for_the_rest():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(10, 5, True) == LEAD
    results = {}
    threads = [_waiter(gate, position, 10, True, results, position) for position in (20, 30)]
    assert _until(lambda: gate.waiting == 2)
    assert gate.advance(20, True) == 30  # 30 still waits: the leader keeps the lead and is told how far to go
    threads[0].join(10)
    assert results == {20: DURABLE} and gate.leading and gate.waiting == 1
    assert gate.advance(30, True) == 0 and not gate.leading  # nobody left: the lead is let go
    threads[1].join(10)
    assert results == {20: DURABLE, 30: DURABLE}


def test_letting_go_of_the_lead_hands_it_to_a_waiter_that_may_lead():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(5, 5, True) == LEAD
    results = {}
    leading = _waiter(gate, 50, 10, True, results, "may lead")
    assert _until(lambda: gate.waiting == 1)
    assert gate.advance(5, False) == 0
    leading.join(10)
    assert results == {"may lead": LEAD} and gate.leading


def test_a_waiter_that_may_not_lead_is_told_when_the_lead_is_let_go_and_nobody_took_it():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(5, 5, True) == LEAD
    results = {}
    idle = _waiter(gate, 60, 10, False, results, "may not lead")
    assert _until(lambda: gate.waiting == 1)
    assert gate.advance(5, False) == 0
    idle.join(10)
    assert results == {"may not lead": IDLE} and not gate.leading  # its caller asks the flush thread again
    assert gate.wait(60, 0, False) == TIMEOUT  # a new wait starts from the present: no stale hand-over


def test_close_wakes_every_waiter_and_durable_positions_stay_durable():
    gate = NATIVE.flush_gate(10)
    results = {}
    threads = [_waiter(gate, 20 + index, None, index % 2 == 0, results, index) for index in range(4)]
    assert _until(lambda: gate.waiting + sum(1 for value in results.values() if value == LEAD) == 4)
    gate.close()
    for thread in threads:
        thread.join(10)
    assert sorted(results.values()) in ([CLOSED] * 4, [LEAD] + [CLOSED] * 3)
    assert gate.wait(10, None, True) == DURABLE and gate.wait(11, None, True) == CLOSED


def test_a_flush_wakes_only_the_waiters_it_covers():
    """Six waiters (arriving out of order); a flush to 30 wakes the three at or below 30 and no other thread, and
    the next flush the rest (decision 0043: no waiter is woken to find its position still not durable)."""
    gate = NATIVE.flush_gate(0)
    assert gate.wait(1, 5, True) == LEAD
    results = {}
    threads = [_waiter(gate, position, 10, False, results, position) for position in (50, 10, 60, 30, 20, 40)]
    assert _until(lambda: gate.waiting == 6)
    assert gate.advance(30, True) == 60 and gate.leading  # the others still wait: the lead is kept
    assert _until(lambda: len(results) == 3)
    assert results == {10: DURABLE, 20: DURABLE, 30: DURABLE}
    assert gate.waiting == 3 and gate.wakeups == (3, 0)
    assert gate.advance(60, True) == 0 and not gate.leading
    for thread in threads:
        thread.join(10)
    assert results == {position: DURABLE for position in (10, 20, 30, 40, 50, 60)}
    assert gate.wakeups == (6, 0)


def test_letting_go_of_the_lead_wakes_one_waiter_that_may_lead_and_no_other():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(5, 5, True) == LEAD
    results = {}
    threads = [_waiter(gate, position, 10, True, results, position) for position in (30, 20, 40)]
    assert _until(lambda: gate.waiting == 3)
    assert gate.advance(5, False) == 0
    assert gate.wakeups[0] == 1  # one signalled: the lowest (a waiter not yet asleep may take the lead first)
    assert _until(lambda: len(results) == 1)
    (leader, outcome), = results.items()
    assert outcome == LEAD and gate.leading and gate.waiting == 2
    assert gate.advance(40, False) == 0 and not gate.leading  # the new leader's flush covers the other two
    for thread in threads:
        thread.join(10)
    assert results == {position: LEAD if position == leader else DURABLE for position in (20, 30, 40)}
    assert gate.wakeups[0] == 3


def test_a_waiter_woken_for_the_lead_that_finds_it_taken_waits_on():
    """The lead let go is not kept for the waiter woken to take it: a thread that comes first takes it, and the
    woken one waits on until a flush covers it."""
    gate = NATIVE.flush_gate(0)
    assert gate.wait(5, 5, True) == LEAD
    results = {}
    thread = _waiter(gate, 30, 10, True, results, "woken")
    assert _until(lambda: gate.waiting == 1)
    assert gate.advance(5, False) == 0 and gate.wakeups[0] == 1  # one waiter signalled, to take the lead
    outcome = gate.wait(30, 0, True)  # this thread is running: it may take the lead before the woken one does
    if outcome == LEAD:
        assert _until(lambda: gate.waiting == 1) and results == {}  # the woken one found it taken: waits on
        assert gate.advance(30, False) == 0
        thread.join(10)
        assert results == {"woken": DURABLE} and gate.wakeups[0] == 2
    else:  # the woken thread was first
        assert outcome == TIMEOUT and _until(lambda: results == {"woken": LEAD})
        gate.advance(30, False)
        thread.join(10)


def test_a_waiter_that_times_out_leaves_the_list_and_the_rest_are_still_woken():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(1, 5, True) == LEAD
    results = {}
    threads = [_waiter(gate, 10, 10, False, results, "patient"), _waiter(gate, 5, 0.05, False, results, "hasty")]
    threads[1].join(10)
    assert results == {"hasty": TIMEOUT} and _until(lambda: gate.waiting == 1)
    assert gate.advance(10, False) == 0
    threads[0].join(10)
    assert results == {"hasty": TIMEOUT, "patient": DURABLE} and gate.waiting == 0


def test_close_wakes_the_waiters_a_flush_did_not_cover_and_never_takes_back_a_durable_one():
    """As after a failed fdatasync: the leader closes the gate; every waiter at or past the failed range gets
    CLOSED (its caller: FLUSH_DISK_FAILED), the ones made durable before keep DURABLE."""
    gate = NATIVE.flush_gate(0)
    assert gate.wait(1, 5, True) == LEAD
    results = {}
    threads = [_waiter(gate, position, None, position % 20 == 0, results, position) for position in (10, 20, 30, 40)]
    assert _until(lambda: gate.waiting == 4)
    assert gate.advance(20, True) == 40
    assert _until(lambda: len(results) == 2) and results == {10: DURABLE, 20: DURABLE}
    gate.close()  # the next flush failed
    for thread in threads:
        thread.join(10)
    assert results == {10: DURABLE, 20: DURABLE, 30: CLOSED, 40: CLOSED}
    assert gate.waiting == 0 and not gate.leading and gate.wakeups == (4, 0)


def test_a_waiting_thread_lets_other_python_threads_run():
    gate = NATIVE.flush_gate(0)
    assert gate.wait(1, 5, True) == LEAD
    counted = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        before = counted[0]
        assert gate.wait(2, 0.3, False) == TIMEOUT  # blocked: the counter thread holds the GIL meanwhile
        assert counted[0] > before
    finally:
        stop.set()
        counter.join(10)


def test_many_threads_each_return_once_their_position_is_durable():
    gate = NATIVE.flush_gate(0)
    written = [0]
    lock = threading.Lock()
    returned = []

    def produce():
        for _ in range(200):
            with lock:
                written[0] += 1
                position = written[0]
            while True:
                outcome = gate.wait(position, 10, True)
                if outcome == LEAD:
                    with lock:
                        flushed = written[0]
                    while gate.advance(flushed, True):
                        with lock:
                            flushed = written[0]
                    continue
                break
            returned.append(outcome == DURABLE and gate.durable >= position)

    threads = [threading.Thread(target=produce) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert returned == [True] * 16 * 200 and gate.durable == written[0] and not gate.leading


def test_wrong_arguments_are_type_errors():
    gate = NATIVE.flush_gate(0)
    with pytest.raises(TypeError):
        gate.wait("1", 1, True)
    with pytest.raises(TypeError):
        gate.wait(1, "soon", True)
    with pytest.raises(TypeError):
        NATIVE.flush_gate(None)


def test_write_at_writes_all_of_the_buffer_at_the_offset(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(bytes(64))
    fd = os.open(path, os.O_RDWR)
    try:
        assert NATIVE.write_at(fd, memoryview(b"abcdef")[1:5], 10) == 4
        assert NATIVE.write_at(fd, b"", 3) == 0
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(10) + b"bcde" + bytes(50)


def test_write_at_reports_a_failed_write_as_oserror(tmp_path):
    path = tmp_path / "read-only"
    path.write_bytes(bytes(8))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            NATIVE.write_at(fd, b"x", 0)
    finally:
        os.close(fd)
