"""The compiled put entry (commitlog/csrc/put_entry.c): `store.put` without a Python frame, and its writer lock.

The entry runs MessageStore.put's common case and calls the Python method, or its helpers, for every other one;
these tests go through each of those edges with the entry in place (docs/decisions/0028-put-entry-in-c.md).
"""

from __future__ import annotations

import errno
import threading

import mqstore.commitlog.commitlog as commitlog_module
import mqstore.commitlog.handoff as handoff
import pytest
from mqstore.commitlog import native

from mqstore import FlushMode, GetStatus, Message, MessageStore, PutStatus, StoreClosedError, StoreIOError
from tests.conftest import small_config, wait_until

pytestmark = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: the store keeps the Python put")


def _entry_of(store):
    put = store.__dict__.get("put")
    assert put is not None and type(put.__self__).__name__ == "PutEntry", "the compiled entry expected"
    return put


def _bodies(store, topic, queue_id=0):
    assert store.wait_dispatched(30)
    got = store.get(topic, queue_id, 0, 10_000)
    return [m.body for m in got.messages] if got.status is GetStatus.FOUND else []


def test_put_is_the_compiled_entry_and_writes_what_the_python_method_writes(tmp_path):
    with MessageStore.open(tmp_path / "entry", small_config(index_enabled=True)) as store:
        put = _entry_of(store)
        entry = [put(Message("t", b"body%d" % i, tags="a", keys=("k%d" % i,))) for i in range(5)]
    with MessageStore.open(tmp_path / "method", small_config(index_enabled=True)) as store:
        method = [MessageStore.put(store, Message("t", b"body%d" % i, tags="a", keys=("k%d" % i,)))
                  for i in range(5)]
    assert [r.status for r in entry] == [PutStatus.PUT_OK] * 5
    assert [(r.commitlog_offset, r.queue_offset, r.size_bytes) for r in entry] == \
        [(r.commitlog_offset, r.queue_offset, r.size_bytes) for r in method]


def test_a_put_after_close_through_the_entry_raises_store_closed(tmp_path):
    store = MessageStore.open(tmp_path, small_config())
    put = _entry_of(store)
    assert put(Message("t", b"x")).status is PutStatus.PUT_OK
    store.close()
    assert "put" not in store.__dict__  # the method again, and no cycle through the entry
    with pytest.raises(StoreClosedError):
        put(Message("t", b"y"))  # a reference taken before the close
    with pytest.raises(StoreClosedError):
        store.put(Message("t", b"y"))


def test_a_full_disk_set_after_puts_is_seen_by_the_next_put(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)
        assert put(Message("t", b"a")).status is PutStatus.PUT_OK
        store._disk_full = True  # what retention sets
        assert put(Message("t", b"b")).status is PutStatus.DISK_FULL
        store._disk_full = False
        assert put(Message("t", b"c")).status is PutStatus.PUT_OK
        assert _bodies(store, "t") == [b"a", b"c"]


def test_a_store_io_error_of_the_python_path_under_the_entry_is_a_refusal(tmp_path, monkeypatch):
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)

        def failing(message):
            raise StoreIOError("no room for the segment") from OSError(errno.ENOSPC, "No space left on device")

        # A topic not seen yet: the compiled put leaves it to the Python path, which fails here
        monkeypatch.setattr(store, "_append_message_holding_lock", failing)
        result = put(Message("new-topic", b"x"))
        assert result.status is PutStatus.DISK_FULL
        assert not store._writer.locked()
        monkeypatch.undo()
        assert put(Message("new-topic", b"y")).status is PutStatus.PUT_OK
        assert _bodies(store, "new-topic") == [b"y"]


def test_an_error_of_the_python_path_under_the_entry_is_raised_and_the_lock_let_go(tmp_path, monkeypatch):
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)

        def broken(message):
            raise KeyError("a bug")

        monkeypatch.setattr(store, "_append_message_holding_lock", broken)
        with pytest.raises(KeyError):
            put(Message("another-topic", b"x"))
        assert not store._writer.locked()


def test_the_entry_holder_appends_the_puts_parked_while_it_held_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "HAND_IN_POLL_S", 60.0)  # only the holder's release can append the parked put
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)
        put(Message("w", b"first"))  # the topic known: the compiled put takes the next ones
        inside, go_on = threading.Event(), threading.Event()
        clock = commitlog_module._time_ns
        calls = []

        def slow_clock():  # the compiled put reads a test's clock while the entry holds the writer lock
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                inside.set()
                go_on.wait(10)
            return clock()

        monkeypatch.setattr(commitlog_module, "_time_ns", slow_clock)
        results = {}
        holder = threading.Thread(target=lambda: results.__setitem__("holder", put(Message("w", b"h"))),
                                  name="holder")
        holder.start()
        assert inside.wait(10)
        parked = threading.Thread(target=lambda: results.__setitem__("parked", put(Message("w", b"p"))),
                                  name="parked")
        parked.start()
        assert wait_until(lambda: len(store._handoff.pending) == 1, interval_s=0.001)
        go_on.set()
        holder.join(10)
        parked.join(10)
        assert calls == ["holder", "holder"]  # the holder appended the parked put after its release
        assert results["holder"].queue_offset == 1 and results["parked"].queue_offset == 2
        assert store._handoff.handed_in == 1 and not store._handoff.pending
        assert _bodies(store, "w") == [b"first", b"h", b"p"]


def test_puts_racing_batches_in_other_threads_keep_their_order_and_lose_nothing(tmp_path):
    rounds = 400
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)
        put(Message("r", b"start"))
        failures = []

        def putter():
            for i in range(rounds):
                if put(Message("r", b"p%d" % i)).status is not PutStatus.PUT_OK:
                    failures.append(("put", i))

        def batcher():
            for i in range(rounds // 4):
                results = store.put_batch([Message("r", b"b%d.%d" % (i, j)) for j in range(4)])
                if any(r.status is not PutStatus.PUT_OK for r in results):
                    failures.append(("batch", i))

        threads = [threading.Thread(target=putter), threading.Thread(target=batcher)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == []
        bodies = _bodies(store, "r")
        assert len(bodies) == 1 + 2 * rounds
        assert [b for b in bodies if b.startswith(b"p")] == [b"p%d" % i for i in range(rounds)]
        batches = [b for b in bodies if b.startswith(b"b")]
        assert batches == [b"b%d.%d" % (i, j) for i in range(rounds // 4) for j in range(4)]
        for i in range(rounds // 4):  # each batch is whole: no put between its messages
            first = bodies.index(b"b%d.0" % i)
            assert bodies[first:first + 4] == [b"b%d.%d" % (i, j) for j in range(4)]


def test_a_replaced_put_common_sends_puts_through_the_python_method(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:
        put = _entry_of(store)
        original = store._put_common
        seen = []

        def counting(message):
            seen.append(message.body)
            return original(message)

        store._put_common = counting
        put(Message("t", b"a"))
        store._put_common = original
        put(Message("t", b"b"))
        assert seen == [b"a"]
        assert _bodies(store, "t") == [b"a", b"b"]


def test_sync_puts_through_the_entry_wait_for_their_flush(tmp_path):
    with MessageStore.open(tmp_path, small_config(flush_mode=FlushMode.SYNC)) as store:
        put = _entry_of(store)
        for i in range(20):
            result = put(Message("s", b"%d" % i))
            assert result.status is PutStatus.PUT_OK
            assert store._commitlog.flushed_position >= result.commitlog_offset + result.size_bytes


class _Counted(MessageStore):
    calls = 0

    def put(self, message):
        type(self).calls += 1
        return super().put(message)


def test_a_subclass_that_overrides_put_keeps_its_put(tmp_path):
    with _Counted.open(tmp_path, small_config()) as store:
        assert "put" not in store.__dict__
        assert store.put(Message("t", b"x")).status is PutStatus.PUT_OK
        assert _Counted.calls == 1


# --- the writer lock ---------------------------------------------------------------------------------------

def _writer_lock():
    lock = native.NATIVE.WriterLock()
    assert not lock.locked()
    return lock


def test_the_writer_lock_behaves_as_threading_lock():
    lock = _writer_lock()
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(False) is False
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError):
        lock.acquire(False, 1)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    with pytest.raises(TypeError):
        lock.acquire(nonsense=1)


def test_a_blocked_acquire_returns_when_another_thread_releases():
    lock = _writer_lock()
    lock.acquire()
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(lock.acquire(timeout=10)))
    waiter.start()
    assert wait_until(lambda: waiter.is_alive(), interval_s=0.001)
    lock.release()  # a lock, not an RLock: another thread may release it
    waiter.join(10)
    assert taken == [True] and lock.locked()
    lock.release()


def test_the_log_state_the_compiled_put_reuses_follows_writes_made_in_python(tmp_path, monkeypatch):
    """The compiled put reads `_end` and `queue_offsets` again, and writes `last_store_timestamp_ms` again, after
    anyone else wrote the CommitLog's attributes (put_batch, the Python path of a new topic, a test)."""
    now = [1_700_000_000_000 * 1_000_000]

    def clock():
        return now[0]

    monkeypatch.setattr(commitlog_module, "_time_ns", clock)
    with MessageStore.open(tmp_path, small_config()) as store:
        log = store._commitlog
        put = _entry_of(store)
        put(Message("a", b"0"))
        steps = [lambda: put(Message("a", b"x")), lambda: put(Message("a", b"y")),
                 lambda: store.put_batch([Message("a", b"b")])[-1], lambda: put(Message("a", b"z")),
                 lambda: put(Message("new", b"n")), lambda: put(Message("a", b"w"))]
        for number, step in enumerate(steps):
            if number % 2:
                now[0] += 5_000_000  # 5 ms: a new store time
            result = step()
            assert result.status is PutStatus.PUT_OK
            assert log.readable_end() == result.commitlog_offset + result.size_bytes
            assert log.last_store_timestamp_ms == result.store_timestamp_ms == now[0] // 1_000_000
        log.last_store_timestamp_ms = 0  # written in Python between two puts of the same millisecond
        result = put(Message("a", b"v"))
        assert log.last_store_timestamp_ms == result.store_timestamp_ms
        assert result.queue_offset == 6 and log.queue_offsets[("a", 0)] == 7
        assert _bodies(store, "a") == [b"0", b"x", b"y", b"b", b"z", b"w", b"v"]


def test_queue_offsets_stay_dense_whatever_topic_objects_and_queues_the_puts_name(tmp_path):
    """The compiled put keeps the (topic, queue id) keys it made in 64 slots, by the topic object: equal topics
    in other objects, and more queues than slots, must still count one queue each."""
    topics = [f"t{i}" for i in range(40)]
    with MessageStore.open(tmp_path, small_config(max_queues_per_topic=8)) as store:
        put = _entry_of(store)
        for topic in topics:
            put(Message(topic, b"first"))  # the Python path, for a topic not seen yet
        counts: dict[tuple[str, int], int] = {}
        for i in range(2000):
            topic = topics[i % 40] if i % 3 else "".join(["t", str(i % 40)])  # an equal str, another object
            queue_id = (i // 40) % 8
            result = put(Message(topic, b"%d" % i, queue_id=queue_id))
            key = (topic, queue_id)
            expected = counts.get(key, 1 if queue_id == 0 else 0)
            assert result.queue_offset == expected, (i, key)
            counts[key] = expected + 1
        assert store.wait_dispatched(30)
        assert all(store.max_offset(topic, queue_id) == count for (topic, queue_id), count in counts.items())
