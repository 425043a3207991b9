"""Flush services: group commit, the interval flusher, and their use by the store in SYNC and ASYNC mode."""

from __future__ import annotations

import struct
import threading

import mqstore.flush.services
import pytest
from mqstore.flush.services import PAGE_SIZE_BYTES, GroupCommitService, IntervalFlusher

from mqstore import FlushMode, GetStatus, Message, MessageStore, PutStatus
from tests.conftest import small_config, wait_until


@pytest.fixture(autouse=True, params=["native", "python"])
def group_commit_kind(request, monkeypatch):
    """Every test runs twice: callers waiting in the compiled core's FlushGate, and in the Python version."""
    if request.param == "native" and mqstore.flush.services.NATIVE is None:
        pytest.skip("the compiled core is not built or MQSTORE_NATIVE=0 selects the pure-Python path")
    if request.param == "python":
        monkeypatch.setattr(mqstore.flush.services, "NATIVE", None)
    return request.param


class SpyFlushable:
    """Counts flushes; `gate` (when set) holds each flush until released, like a slow disk."""

    def __init__(self, dirty=0):
        self.written = 0
        self.durable = 0
        self.flushes = []
        self.dirty = dirty
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.threads = []  # name of the thread each flush ran in
        self.error: Exception | None = None
        self.covers_written_at_start = False

    def dirty_bytes(self):
        return self.dirty

    def flush(self):
        self.threads.append(threading.current_thread().name)
        if self.error is not None:
            raise self.error
        entry_target = self.written  # what a real flush covers: what was written when it started ...
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        target = entry_target if self.covers_written_at_start else self.written  # ... or a generous one
        self.flushes.append(target)
        self.durable = target
        self.dirty = 0
        return target


def test_group_commit_returns_once_the_position_is_durable():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0)
    service.start()
    try:
        spy.written = 100
        assert service.wait_durable(100, 5) is True
        assert spy.flushes and spy.flushes[-1] >= 100
        assert service.wait_durable(50, 5) is True  # already durable: no new flush needed
        assert len(spy.flushes) == 1
    finally:
        service.stop()


def test_concurrent_waiters_share_one_flush():
    spy = SpyFlushable()
    spy.gate = threading.Event()
    service = GroupCommitService(spy, 0)
    service.start()
    results = []
    try:
        spy.written = 10
        first = threading.Thread(target=lambda: results.append(service.wait_durable(10, 10)))
        first.start()
        assert spy.entered.wait(5)  # the first flush is running and held
        spy.written = 80
        waiters = [threading.Thread(target=lambda i=i: results.append(service.wait_durable(20 + i * 10, 10)))
                   for i in range(7)]
        for waiter in waiters:
            waiter.start()
        spy.gate.set()
        for thread in [first, *waiters]:
            thread.join(10)
        assert results == [True] * 8
        assert len(spy.flushes) <= 2  # eight waiters, at most two flushes: the held one and one for the rest
    finally:
        service.stop()


def test_wait_durable_times_out_when_the_flush_hangs():
    spy = SpyFlushable()
    spy.gate = threading.Event()
    service = GroupCommitService(spy, 0)
    service.start()
    try:
        spy.written = 10
        assert service.wait_durable(10, 0.05) is False
        spy.gate.set()
        assert service.wait_durable(10, 5) is True
    finally:
        spy.gate.set()
        service.stop()


def test_after_a_first_timed_flush_a_lone_caller_flushes_in_its_own_thread():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0, name="group-commit-thread")
    service.start()
    try:
        for position in range(1, 6):
            spy.written = position
            assert service.wait_durable(position, 5) is True
            assert spy.durable >= position
        # the first flush is timed in the service's thread; a caller leads only once one was quick
        assert spy.threads[0] == "group-commit-thread"
        assert spy.threads[1:] == [threading.current_thread().name] * 4
        assert service.leader_flush_count == 4 and service.stats.flush_count == 5
    finally:
        service.stop()


def test_a_follower_times_out_on_time_behind_a_leader_stuck_in_a_slow_flush():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0, name="group-commit-thread")
    service.start()
    try:
        spy.written = 1
        assert service.wait_durable(1, 5) is True  # timed: later callers lead
        spy.gate = threading.Event()
        spy.entered.clear()
        spy.written = 2
        leader_result = []
        leader = threading.Thread(target=lambda: leader_result.append(service.wait_durable(2, 5)), name="leader")
        leader.start()
        assert spy.entered.wait(5)  # the leader is in its flush, held like a slow disk
        spy.written = 3
        assert service.wait_durable(3, 0.05) is False  # parked behind it: times out on time
        assert leader_result == []
        spy.gate.set()
        leader.join(10)
        assert leader_result == [True] and spy.threads[1] == "leader"
        # that flush took longer than a tenth of the timeout: the next caller leaves it to the thread
        spy.written = 4
        assert service.wait_durable(4, 0.5) is True
        assert spy.threads[-1] == "group-commit-thread"
    finally:
        spy.gate.set()
        service.stop()


def test_a_leader_flushes_again_for_the_callers_that_parked_during_its_flush():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0, name="group-commit-thread")
    service.start()
    results = {}
    try:
        spy.written = 1
        assert service.wait_durable(1, 5) is True  # timed: later callers lead
        spy.covers_written_at_start = True
        spy.gate = threading.Event()
        spy.entered.clear()
        spy.written = 2
        leader = threading.Thread(target=lambda: results.update(leader=service.wait_durable(2, 5)), name="leader")
        leader.start()
        assert spy.entered.wait(5)
        spy.written = 4  # two more records, whose callers park behind the running flush
        followers = [threading.Thread(target=lambda p=p: results.update({p: service.wait_durable(p, 5)}),
                                      name=f"follower-{p}") for p in (3, 4)]
        for follower in followers:
            follower.start()
        assert wait_until(lambda: service.parked_count() == 2)
        spy.gate.set()
        for thread in [leader, *followers]:
            thread.join(10)
        assert results == {"leader": True, 3: True, 4: True}
        assert spy.threads[1:] == ["leader", "leader"]  # one more flush, by the leader, for both followers
    finally:
        spy.gate.set()
        service.stop()


def test_many_callers_share_flushes_and_all_return_durable():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0)
    service.start()
    lock = threading.Lock()
    results = []

    def produce(index):
        for _ in range(50):
            with lock:
                spy.written += 1
                position = spy.written
            ok = service.wait_durable(position, 10)
            results.append(ok and spy.durable >= position)

    try:
        spy.written = 1
        assert service.wait_durable(1, 5)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert results == [True] * 16 * 50
        assert service.stats.flush_count <= 1 + 16 * 50
        assert service.durable_position == spy.written
    finally:
        service.stop()


def test_a_failed_flush_is_reported_to_the_caller_and_every_later_one():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0)
    service.start()
    try:
        spy.written = 1
        assert service.wait_durable(1, 5) is True
        spy.error = OSError(5, "EIO")
        spy.written = 2
        assert service.wait_durable(2, 5) is False  # the caller led the failed flush itself
        assert service.stats.error is spy.error
        assert service.stats.as_dict()["error"] == repr(spy.error)
        assert service.wait_durable(2, 5) is False
        assert service.wait_durable(1, 5) is True  # what was durable stays durable
    finally:
        service.stop()


def test_a_failed_flush_in_the_thread_wakes_the_parked_callers():
    spy = SpyFlushable()
    spy.gate = threading.Event()
    spy.error = OSError(28, "ENOSPC")
    service = GroupCommitService(spy, 0)
    service.start()
    results = []
    try:
        spy.written = 5
        callers = [threading.Thread(target=lambda: results.append(service.wait_durable(5, 10))) for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(10)
        assert results == [False] * 4 and service.stats.error is spy.error
    finally:
        service.stop()


def test_stop_wakes_parked_callers():
    spy = SpyFlushable()
    spy.gate = threading.Event()
    service = GroupCommitService(spy, 0)
    service.start()
    results = []
    try:
        spy.written = 5
        caller = threading.Thread(target=lambda: results.append(service.wait_durable(5, 30)))
        caller.start()
        assert spy.entered.wait(5)  # the thread's first flush is held
        stopper = threading.Thread(target=service.stop)
        stopper.start()
        spy.gate.set()
        stopper.join(10)
        caller.join(10)
        assert not caller.is_alive() and not stopper.is_alive()
        assert results == [True]  # the held flush covered it before the thread stopped
        assert service.wait_durable(6, 5) is False  # stopped: nothing more is flushed
    finally:
        spy.gate.set()


def test_interval_flusher_honours_least_pages_and_the_thorough_interval():
    now = [0.0]
    spy = SpyFlushable(dirty=PAGE_SIZE_BYTES * 4 - 1)
    flusher = IntervalFlusher([spy], interval_ms=500, least_pages=4, thorough_interval_ms=10_000,
                              clock=lambda: now[0])
    assert flusher.run_once() == 0  # under four pages: wait
    spy.dirty = PAGE_SIZE_BYTES * 4
    assert flusher.run_once() == 1 and spy.dirty == 0
    spy.dirty = 1
    now[0] = 9.9
    assert flusher.run_once() == 0
    now[0] = 10.0  # the thorough interval has passed: anything dirty is flushed
    assert flusher.run_once() == 1
    assert flusher.run_once() == 0  # nothing dirty
    assert flusher.stats.flush_count == 2


def test_a_request_flushes_now_whatever_the_interval_and_the_dirty_pages():
    spy = SpyFlushable(dirty=1)
    flusher = IntervalFlusher([spy], interval_ms=3_600_000, least_pages=4, thorough_interval_ms=3_600_000)
    flusher.start()
    try:
        flusher.request(1)
        assert wait_until(lambda: spy.flushes) and spy.dirty == 0
        spy.dirty = 1
        flusher.request(2)  # each request is a round of its own
        assert wait_until(lambda: len(spy.flushes) == 2)
    finally:
        flusher.stop()
    assert flusher.stats.flush_count == 2


def test_a_group_commit_request_flushes_in_its_thread_with_no_caller_waiting():
    spy = SpyFlushable()
    service = GroupCommitService(spy, 0)
    service.start()
    try:
        spy.written = 100
        service.request(100)
        assert wait_until(lambda: service.durable_position >= 100)
        assert spy.threads == ["mqstore-group-commit"]
    finally:
        service.stop()


def _spy_on_log_flush(store):
    """Record the durable position each CommitLog flush returns."""
    log = store._commitlog
    original = log.flush
    returned = []

    def spy():
        position = original()
        returned.append(position)
        return position

    log.flush = spy
    return returned


def test_sync_put_returns_only_after_its_bytes_are_flushed(tmp_path):
    with MessageStore.open(tmp_path, small_config(flush_mode=FlushMode.SYNC)) as store:
        returned = _spy_on_log_flush(store)
        for i in range(20):
            result = store.put(Message("t", b"m%d" % i))
            assert result.status is PutStatus.PUT_OK
            assert returned and max(returned) >= result.commitlog_offset + result.size_bytes
        results = store.put_batch([Message("t", b"b%d" % i) for i in range(10)])
        assert max(returned) >= results[-1].commitlog_offset + results[-1].size_bytes


def test_sync_put_reports_flush_disk_timeout_and_keeps_the_message(tmp_path):
    config = small_config(flush_mode=FlushMode.SYNC, sync_flush_timeout_ms=50)
    with MessageStore.open(tmp_path, config) as store:
        log = store._commitlog
        original = log.flush
        gate = threading.Event()

        def slow_flush():
            gate.wait(10)
            return original()

        log.flush = slow_flush
        result = store.put(Message("t", b"slow disk"))
        assert result.status is PutStatus.FLUSH_DISK_TIMEOUT
        gate.set()
        assert store.wait_dispatched(10)
        got = store.get("t", 0, result.queue_offset)
        assert got.status is GetStatus.FOUND and got.messages[0].body == b"slow disk"
    with MessageStore.open(tmp_path, small_config()) as store:
        assert store.get("t", 0, 0).messages[0].body == b"slow disk"


def test_async_mode_leaves_flushing_to_the_flusher_and_close_flushes_everything(tmp_path):
    config = small_config(flush_interval_ms=3_600_000, flush_thorough_interval_ms=3_600_000)
    store = MessageStore.open(tmp_path, config)
    returned = _spy_on_log_flush(store)
    results = store.put_batch([Message("t", b"x" * 500, queue_id=i % 3) for i in range(300)])
    end = results[-1].commitlog_offset + results[-1].size_bytes
    assert returned == []  # the flusher's interval has not come: nothing flushed yet
    assert store.stats()["flush"]["flush_lag_bytes"] == end
    log = store._commitlog
    store.close()
    assert returned and returned[-1] == end
    assert log.flushed_position == end


def test_async_flusher_flushes_on_its_interval(tmp_path):
    config = small_config(flush_interval_ms=10, flush_least_pages=0)
    with MessageStore.open(tmp_path, config) as store:
        result = store.put(Message("t", b"y" * 100))
        end = result.commitlog_offset + result.size_bytes
        flusher = store._log_flusher
        assert wait_until(lambda: store.stats()["flush"]["flushed_offset"] == end)  # the flusher runs every 10 ms
        assert flusher.stats.flush_count >= 1


def test_checkpoint_holds_the_store_times_of_the_last_flushed_messages(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:
        results = store.put_batch([Message("t", b"z") for _ in range(5)])
        assert store.wait_dispatched(10)
        store.flush()
        last_ts = results[-1].store_timestamp_ms
        raw = (tmp_path / "checkpoint").read_bytes()
        assert len(raw) == 4096
        physic, logics, index = struct.unpack_from(">qqq", raw, 0)
        assert physic == last_ts and logics == last_ts and index == 0
        assert raw[48:] == bytes(4096 - 48)
        checkpoint = store.stats()["flush"]["checkpoint"]
        assert checkpoint["physic_msg_timestamp_ms"] == last_ts


def test_a_roll_makes_the_next_segment_ahead_of_need(tmp_path):
    config = small_config(warm_segments=True)
    with MessageStore.open(tmp_path, config) as store:
        bodies = [bytes([i % 251]) * 3000 for i in range(100)]  # about 300 KB: several 64 KiB segments
        for body in bodies:
            store.put(Message("t", body))
        assert store.wait_dispatched(10)
        assert store.stats()["flush"]["segments_created_ahead"] >= 1
        got = store.get("t", 0, 0, max_count=100)
        assert [m.body for m in got.messages] == bodies  # warming never wrote over a record
