"""The compiled single-message put (commitlog/csrc/put.c, CommitLog.compiled_put) against the Python path: the same
puts give byte-identical segment files and the same PutResults, in ASYNC and SYNC (write-through) stores, across
rolls and a reopen; the same invalid messages give the same errors; the CommitLog's numbers (end, queue offsets,
store time, written_records, end_word) come out the same; and it never writes where the Python path would not
(closed, truncated, parked behind other threads)."""

from __future__ import annotations

import collections
import os
import random
import threading

import mqstore.commitlog.commitlog as commitlog_module
import numpy as np
import pytest
from mqstore.commitlog import _native, native
from mqstore.commitlog.commitlog import CommitLog

from mqstore import FlushMode, InvalidMessageError, Message, MessageStore, PutStatus, StoreClosedError
from tests.conftest import wait_until
from tests.unit.commitlog.test_native_codec import FixedClock
from tests.unit.mqstore.conftest import config

SEGMENT_BYTES = 64 * 1024
MAX_BODY_BYTES = 8192
HOST = bytes.fromhex("0A00000700002A9F")
PATHS = ("python", "native-without-compiled-put", "compiled-put")


class Counting:
    """Wraps a store's compiled put, counting the puts it did (not None) and the ones it left to Python."""

    def __init__(self, put):
        self.put, self.done, self.left = put, 0, 0

    def __call__(self, message):
        result = self.put(message)
        if result is None:
            self.left += 1
        else:
            self.done += 1
        return result


def _messages(seed: int, count: int = 400) -> list[Message]:
    """Mostly the common shape (4 topics x 4 queues, sizes up to the maximum, born times, flags), some others."""
    rng = random.Random(seed)
    messages = []
    for i in range(count):
        body = rng.randbytes(rng.choice([0, 1, 100, 1000, 3000, MAX_BODY_BYTES]))
        if i % 7 == 3:
            messages.append(Message(f"topic{i % 4}", body, queue_id=i % 4, tags="TagA", properties={"p": "é"}))
        elif i % 11 == 5:
            messages.append(Message(f"fresh{i}", body))  # a topic not seen yet: the Python path checks it
        else:
            messages.append(Message(f"topic{i % 4}", body, queue_id=(i >> 2) % 4, flag=rng.choice([0, -1, 2**31 - 1]),
                                    born_timestamp_ms=rng.choice([None, 0, 1_600_000_000_000 + i])))
    return messages


def _open(root, path: str, **overrides) -> tuple[MessageStore, Counting | None]:
    store = MessageStore.open(root, config(max_message_size_bytes=MAX_BODY_BYTES, **overrides))
    assert (store._commitlog.codec is None) == (path == "python")
    counting = None
    if path == "compiled-put":
        assert store._put_common is not None
        counting = store._put_common = Counting(store._put_common)
    else:
        store._put_common = None
    return store, counting


def _write(root, path: str, monkeypatch, seed: int, **overrides):
    """The messages put one by one in two sittings (a reopen between); the PutResults and the compiled counts."""
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    messages = _messages(seed)
    results, done, left = [], 0, 0
    for sitting in (messages[:250], messages[250:]):
        store, counting = _open(root, path, **overrides)
        with store:
            results += [store.put(message) for message in sitting]
            assert store.wait_dispatched(30)
        if counting is not None:
            done, left = done + counting.done, left + counting.left
    return results, done, left


def _segment_files(root):
    directory = root / "commitlog"
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def test_the_compiled_put_writes_the_python_bytes_and_results(tmp_path, monkeypatch, record_crc, mode):
    seed = random.randrange(2**32)
    print("seed", seed)
    written = {}
    for path in PATHS:
        results, done, left = _write(tmp_path / path, path, monkeypatch, seed, record_crc=record_crc, flush_mode=mode)
        written[path] = (results, _segment_files(tmp_path / path))
    assert done > 250 and left > 40  # most puts took the compiled path; rolls, new topics, tags took Python's
    reference_results, reference_files = written["python"]
    assert len(reference_files) >= 4  # rolls at segment ends, with blanks
    assert all(r.status is PutStatus.PUT_OK for r in reference_results)
    for path in PATHS[1:]:
        results, files = written[path]
        assert results == reference_results, path  # statuses, offsets, queue offsets, sizes, store times, msg ids
        assert list(files) == list(reference_files)
        for name in reference_files:
            assert files[name] == reference_files[name], (path, name)


INVALID = [
    Message("topic0", b"x", queue_id=8),
    Message("topic0", b"x", queue_id=-1),
    Message("topic0", b"x", flag=2**31),
    Message("topic0", b"x", flag=-(2**31) - 1),
    Message("topic0", b"x", born_timestamp_ms=-5),
    Message("topic0", b"x" * (MAX_BODY_BYTES + 1)),
    Message("topic0", "text"),
    Message("topic0", b"x", queue_id=True),
    Message("topic0", b"x", flag=1.0),
    Message("bad topic", b"x"),
    Message("topic0", b"x", properties={"UNIQ": "a\x01b"}),
]


def _errors(root, path: str, monkeypatch) -> list:
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    store, counting = _open(root, path)
    with store:
        store.put(Message("topic0", b"first"))  # the topic is known: invalid messages of it reach the compiled check
        end = store._commitlog.readable_end()
        outcomes = []
        for message in INVALID:
            with pytest.raises(InvalidMessageError) as raised:
                store.put(message)
            outcomes.append(str(raised.value))
        assert store._commitlog.readable_end() == end  # nothing written
        assert store._commitlog.queue_offsets == {("topic0", 0): 1}
    return outcomes


def test_invalid_messages_give_the_python_errors(tmp_path, monkeypatch):
    outcomes = {path: _errors(tmp_path / path, path, monkeypatch) for path in PATHS}
    assert outcomes["compiled-put"] == outcomes["python"] == outcomes["native-without-compiled-put"]
    assert len(set(outcomes["python"])) >= 8


# --- the CommitLog's numbers -----------------------------------------------------------------------------------

def _log(directory, codec) -> CommitLog:
    log = CommitLog(str(directory), SEGMENT_BYTES, writable=True, max_message_size_bytes=MAX_BODY_BYTES,
                    max_queues_per_topic=8, born_host_raw=HOST, store_host_raw=HOST, preallocate=False,
                    record_crc=True)
    log.codec = codec
    log.written_records = collections.deque()
    log.end_word = np.zeros(1, dtype=np.int64)
    return log


def _state(log: CommitLog) -> tuple:
    return (log.readable_end(), dict(log.queue_offsets), log.last_store_timestamp_ms, list(log.written_records),
            int(log.end_word[0]))


def _append_all(log: CommitLog, messages, put) -> list:
    """Each message through `put` (the compiled put, or None: the Python path) or, when it declines, prepare and
    append; the log's numbers after each."""
    states = []
    for message in messages:
        with log.lock:
            result = put(message) if put is not None else None
            if result is None:
                log.append_holding_lock(log.prepare(message))
        states.append(_state(log))
    return states


def test_the_compiled_put_moves_the_logs_numbers_as_append_does(tmp_path, monkeypatch):
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    messages = [m for m in _messages(7, 300) if m.tags is None]
    python = _append_all(_log(tmp_path / "python", None), messages, None)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    log = _log(tmp_path / "native", _native)
    put = log.compiled_put()
    compiled = _append_all(log, messages, put)
    assert compiled == python
    assert python[-1][0] > 3 * SEGMENT_BYTES and len(python[-1][3]) == len(messages)


def test_a_closed_or_truncated_log_is_never_written_by_the_compiled_put(tmp_path):
    log = _log(tmp_path / "log", _native)
    put = log.compiled_put()
    with log.lock:
        assert put(Message("t", b"a")) is None  # no topic seen, no segment yet: the Python path
        log.append_holding_lock(log.prepare(Message("t", b"a")))
        first = put(Message("t", b"b"))
    assert first is not None and first.queue_offset == 1
    end = log.readable_end()
    log.truncate(first.commitlog_offset)  # the segment is let go: the next append must take the slow path
    with log.lock:
        assert put(Message("t", b"c")) is None
        log.append_holding_lock(log.prepare(Message("t", b"c")))
        assert put(Message("t", b"d")).commitlog_offset == end
    log.close()
    segment = (tmp_path / "log" / os.listdir(tmp_path / "log")[0]).read_bytes()
    with log.lock:
        assert put(Message("t", b"e")) is None  # closed: the Python path raises StoreClosedError
    assert (tmp_path / "log" / os.listdir(tmp_path / "log")[0]).read_bytes() == segment


# --- threads ---------------------------------------------------------------------------------------------------

THREADS = 8
PUTS_PER_THREAD = 300


def test_puts_from_many_threads_are_all_stored_once_in_dense_queues(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        counting = store._put_common = Counting(store._put_common)
        for topic in range(4):
            store.put(Message(f"topic{topic}", b"first"))
        results: dict[int, list] = {}

        def produce(number):
            results[number] = [store.put(Message(f"topic{number % 4}", b"%d-%d" % (number, i), queue_id=i % 2))
                               for i in range(PUTS_PER_THREAD)]

        threads = [threading.Thread(target=produce, args=(number,)) for number in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert store.wait_dispatched(30)
        every = [r for rs in results.values() for r in rs]
        assert len(every) == THREADS * PUTS_PER_THREAD and all(r.status is PutStatus.PUT_OK for r in every)
        assert counting.done >= THREADS * PUTS_PER_THREAD - 10  # a few rolls took the Python path
        spans = sorted((r.commitlog_offset, r.size_bytes) for r in every)
        assert all(a + size <= b for (a, size), (b, _) in zip(spans, spans[1:]))  # no two records overlap
        for topic in range(4):
            for queue_id in range(2):
                got = store.get(f"topic{topic}", queue_id, 0, max_count=10_000)
                offsets = [m.queue_offset for m in got.messages]
                assert offsets == list(range(len(offsets)))
                bodies = [m.body for m in got.messages]
                writers = [b.split(b"-")[0] for b in bodies if b != b"first"]
                for writer in set(writers):  # each thread's puts in its own order
                    mine = [int(b.split(b"-")[1]) for b in bodies if b.startswith(writer + b"-")]
                    assert mine == sorted(mine)
        assert sum(len(store.get(f"topic{t}", q, 0, max_count=10_000).messages)
                   for t in range(4) for q in range(2)) == THREADS * PUTS_PER_THREAD + 4


def test_a_close_during_puts_stores_every_put_that_returned(tmp_path):
    store = MessageStore.open(tmp_path, config())
    store.put(Message("t", b"first"))
    stored, refused, started = [], [], threading.Barrier(THREADS + 1)

    def produce(number):
        started.wait(10)
        for i in range(100_000):
            try:
                result = store.put(Message("t", b"%d-%d" % (number, i), queue_id=number % 4))
            except StoreClosedError:
                refused.append(number)
                return
            stored.append((number % 4, result.queue_offset, b"%d-%d" % (number, i)))

    threads = [threading.Thread(target=produce, args=(number,)) for number in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait(10)
    assert wait_until(lambda: len(stored) >= 2000 or len(refused) > 0, 60)
    store.close()
    for thread in threads:
        thread.join(30)
    assert sorted(refused) == list(range(THREADS))  # every producer saw the close as StoreClosedError
    with MessageStore.open(tmp_path, config()) as reopened:
        assert reopened.recovery_report.dropped_bytes == 0
        for queue_id, queue_offset, body in stored:
            got = reopened.get("t", queue_id, queue_offset, max_count=1)
            assert got.messages[0].body == body


class SlowDispatch:
    """A dispatcher that takes a millisecond per batch: dispatch falls behind the puts."""

    def dispatch(self, batch):
        threading.Event().wait(0.001)


def test_compiled_puts_keep_to_the_dispatch_lag_bound(tmp_path):
    limit = 16 * 1024
    with MessageStore.open(tmp_path, config(max_dispatch_lag_bytes=limit)) as store:
        counting = store._put_common = Counting(store._put_common)
        store._dispatch._dispatchers.append(SlowDispatch())
        lags = []
        for _ in range(200):
            result = store.put(Message("t", b"b" * 1000))
            lags.append(result.commitlog_offset + result.size_bytes - store.dispatched_offset)
        assert counting.done >= 190
        assert max(lags) <= limit  # a put past the bound waited until dispatch was within three quarters of it
        assert max(lags) > limit // 2  # dispatch did fall behind
