"""The compiled single-message put (commitlog/csrc/put.c, CommitLog.compiled_put) against the Python path: the same
puts (tags, keys, user properties, with and without the index's UNIQ_KEYs) give byte-identical segment and index
files and the same PutResults, in ASYNC and SYNC (write-through) stores, across rolls and a reopen; the same
invalid messages give the same errors with nothing written; the CommitLog's numbers (end, queue offsets, store
time, written_records, end_word) come out the same; it never writes where the Python path would not (closed,
truncated, parked behind other threads); and UNIQ_KEYs stay unique across puts and put_batch in many threads."""

from __future__ import annotations

import collections
import functools
import os
import random
import threading

import mqstore.commitlog.commitlog as commitlog_module
import mqstore.commitlog.unique_key as unique_key_module
import numpy as np
import pytest
from mqstore.commitlog import _native, native
from mqstore.commitlog.commitlog import CommitLog

import mqstore.store.engine as engine_module
from mqstore import FlushMode, InvalidMessageError, Message, MessageStore, PutStatus, StoreClosedError
from tests.conftest import wait_until
from tests.unit.commitlog.test_native_codec import FixedClock
from tests.unit.mqstore.conftest import config

SEGMENT_BYTES = 64 * 1024
MAX_BODY_BYTES = 8192
HOST = bytes.fromhex("0A00000700002A9F")
PATHS = ("python", "native-without-compiled-put", "compiled-put")
INSTANCE = bytes.fromhex("C0FFEE01")  # the UNIQ_KEY generator's instance id in every store of a comparison

pytestmark = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")


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


def _properties_shape(rng: random.Random, i: int) -> dict:
    """Tags, keys (tuple or list), user properties (unicode, empty values, a caller's UNIQ_KEY), alone or mixed."""
    shape = {}
    if rng.random() < 0.6:
        shape["tags"] = rng.choice(["TagA", "tag%d" % (i % 7), "é-ü", "x" * 300])
    if rng.random() < 0.5:
        keys = [rng.choice(["k%d" % i, "order-%d" % (i % 13), "ключ"]) for _ in range(rng.randint(1, 3))]
        shape["keys"] = tuple(keys) if rng.random() < 0.5 else keys
    if rng.random() < 0.4:
        shape["properties"] = {rng.choice(["p", "trace", "名"]): rng.choice(["v", "", "é" * 20]),
                               "a%d" % (i % 3): str(i)}
        if rng.random() < 0.1:
            shape["properties"]["UNIQ_KEY"] = "own-%d" % i
        if rng.random() < 0.15:  # more texts than the compiled plan keeps (24): its tail reads them again
            shape["properties"].update(_many_properties(rng, rng.randint(10, 16)))
    return shape


def _many_properties(rng: random.Random, count: int) -> dict:
    """`count` properties whose names and values are 1 to 20 characters (around the compiled check's 4- and 8-byte
    words), some with a \x00 (allowed) or a character of several UTF-8 bytes."""
    alphabet = "abcXYZ09_-.\x00é名"
    return {f"n{j}" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 18))):
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for j in range(count)}


def _messages(seed: int, count: int = 400) -> list[Message]:
    """Mostly the common shape (4 topics x 4 queues, sizes up to the maximum, born times, flags), a third with
    tags, keys or properties, some of topics not seen yet."""
    rng = random.Random(seed)
    messages = []
    for i in range(count):
        body = rng.randbytes(rng.choice([0, 1, 100, 1000, 3000, MAX_BODY_BYTES]))
        if i % 3 == 1:
            messages.append(Message(f"topic{i % 4}", body, queue_id=i % 4, **_properties_shape(rng, i)))
        elif i % 11 == 5:
            messages.append(Message(f"fresh{i}", body))  # a topic not seen yet: the Python path checks it
        else:
            messages.append(Message(f"topic{i % 4}", body, queue_id=(i >> 2) % 4, flag=rng.choice([0, -1, 2**31 - 1]),
                                    born_timestamp_ms=rng.choice([None, 0, 1_600_000_000_000 + i])))
    return messages


def _same_unique_keys(monkeypatch) -> None:
    """Every store opened after this makes the same UNIQ_KEYs: one instance id, a clock of its own per store."""
    monkeypatch.setattr(engine_module, "UniqueKeyGenerator",
                        functools.partial(unique_key_module.UniqueKeyGenerator, instance_id=INSTANCE))
    monkeypatch.setattr(unique_key_module, "_time_ns", FixedClock())


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
    _same_unique_keys(monkeypatch)
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


def _segment_files(root, folder: str = "commitlog"):
    directory = root / folder
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
@pytest.mark.parametrize("index", [False, True], ids=["no-index", "index"])
def test_the_compiled_put_writes_the_python_bytes_and_results(tmp_path, monkeypatch, record_crc, mode, index):
    seed = random.randrange(2**32)
    print("seed", seed)
    written = {}
    for path in PATHS:
        results, done, left = _write(tmp_path / path, path, monkeypatch, seed, record_crc=record_crc, flush_mode=mode,
                                     index_enabled=index)
        written[path] = (results, _segment_files(tmp_path / path))
        if index:
            written[path] += (list(_segment_files(tmp_path / path, "index").values()),)  # named by the wall clock
    assert done > 330 and left > 20  # most puts took the compiled path (tags, keys, properties, UNIQ_KEYs too)
    reference_results, reference_files = written["python"][:2]
    assert len(reference_files) >= 4  # rolls at segment ends, with blanks
    assert all(r.status is PutStatus.PUT_OK for r in reference_results)
    for path in PATHS[1:]:
        results, files = written[path][:2]
        assert results == reference_results, path  # statuses, offsets, queue offsets, sizes, store times, msg ids
        assert list(files) == list(reference_files)
        for name in reference_files:
            assert files[name] == reference_files[name], (path, name)
        if index:
            assert written[path][2] == written["python"][2], path  # the index files, built from those records


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
    Message("topic0", b"x", tags=""),
    Message("topic0", b"x", tags="a\x02"),
    Message("topic0", b"x", tags=5),
    Message("topic0", b"x", tags="\ud800"),  # not UTF-8: InvalidMessageError on every path
    Message("topic0", b"x", keys="single"),
    Message("topic0", b"x", keys=("a b",)),
    Message("topic0", b"x", keys=["ok", ""]),
    Message("topic0", b"x", keys=(1,)),
    Message("topic0", b"x", keys=("k\x01",)),
    Message("topic0", b"x", properties={"TAGS": "t"}),
    Message("topic0", b"x", properties={"KEYS": "k"}),
    Message("topic0", b"x", properties={"__CRC32#": "1"}),
    Message("topic0", b"x", properties={"": "v"}),
    Message("topic0", b"x", properties={"n": 5}),
    Message("topic0", b"x", properties={1: "v"}),
    Message("topic0", b"x", properties={"n": "v\x02"}),
    Message("topic0", b"x", properties=[("n", "v")]),
    Message("topic0", b"x", tags="t", properties={"big": "x" * 32_760}),  # PROPERTIES over 32767 bytes
    Message("topic0", b"x", tags="abcdefghijk\x01"),  # separators in the compiled check's last, overlapping word
    Message("topic0", b"x", tags="abcdefgh\x02ijklmnop"),
    Message("topic0", b"x", properties={"n": "ab\x01cd"}),  # in the 4-7 byte case
    Message("topic0", b"x", properties={"nam\x02": "v"}),
    Message("topic0", b"x", keys=("abcdefghi jk",)),
    Message("topic0", b"x", keys=("ab cd",)),
    Message("topic0", b"x", properties={f"p{j}": "v" for j in range(14)} | {"last": "\x01"}),  # past the plan's 24
]


def _errors(root, path: str, monkeypatch, index: bool) -> list:
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    _same_unique_keys(monkeypatch)
    store, counting = _open(root, path, index_enabled=index)
    with store:
        store.put(Message("topic0", b"first"))  # the topic is known: invalid messages of it reach the compiled check
        end = store._commitlog.readable_end()
        outcomes = []
        for message in INVALID:
            with pytest.raises(Exception) as raised:
                store.put(message)
            outcomes.append((type(raised.value).__name__, str(raised.value)))
        assert store._commitlog.readable_end() == end  # nothing written
        assert store._commitlog.queue_offsets == {("topic0", 0): 1}
        # The UNIQ_KEYs the refused messages took (the Python path takes one before its last checks) are taken
        # alike: the next message gets the same key through every path.
        last = store.put(Message("topic0", b"last", tags="t"))
        outcomes.append(store.read_at(last.commitlog_offset).properties)
    return outcomes


@pytest.mark.parametrize("index", [False, True], ids=["no-index", "index"])
def test_invalid_messages_give_the_python_errors(tmp_path, monkeypatch, index):
    outcomes = {path: _errors(tmp_path / path, path, monkeypatch, index) for path in PATHS}
    assert outcomes["compiled-put"] == outcomes["python"] == outcomes["native-without-compiled-put"]
    assert len(set(outcomes["python"][:-1])) >= 25
    assert {kind for kind, _ in outcomes["python"][:-1]} == {"InvalidMessageError"}  # lone surrogates too
    assert ("UNIQ_KEY" in outcomes["python"][-1]) == index


def test_a_separator_anywhere_in_a_text_is_refused_and_a_nul_kept(tmp_path, monkeypatch):
    """The compiled put checks a text eight bytes at a time: a \x01 or \x02 (a space in a key) at any position
    of texts of 1 to 40 bytes is refused with nothing written; a \x00 at any position is stored as it was given."""
    store, counting = _open(tmp_path, "compiled-put")
    with store:
        store.put(Message("topic0", b"first"))
        for length in range(1, 41):
            for at in range(length):
                def text(character):
                    return "x" * at + character + "y" * (length - at - 1)
                end = store._commitlog.readable_end()
                for bad in (Message("topic0", b"x", tags=text("\x01")), Message("topic0", b"x", tags=text("\x02")),
                            Message("topic0", b"x", keys=("k", text(" "))),
                            Message("topic0", b"x", properties={text("\x02"): "v"}),
                            Message("topic0", b"x", properties={"n": text("\x01")})):
                    with pytest.raises(InvalidMessageError):
                        store.put(bad)
                assert store._commitlog.readable_end() == end
                kept = store.put(Message("topic0", b"x", tags=text("\x00"), keys=(text("\x00"),),
                                         properties={text("\x00"): text("\x00")}))
                stored = store.read_at(kept.commitlog_offset)
                assert (stored.tags, stored.keys, stored.properties[text("\x00")]) == (
                    text("\x00"), (text("\x00"),), text("\x00"))
    # the compiled put checked them all (it leaves a refused text, and a put that rolls the segment, to Python)
    assert counting.done >= 40 * 41 // 2 - 20 and counting.left >= 5 * 40 * 41 // 2


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


@pytest.mark.parametrize("unique_keys", [False, True], ids=["no-uniq-key", "uniq-key"])
def test_the_compiled_put_moves_the_logs_numbers_as_append_does(tmp_path, monkeypatch, unique_keys):
    messages = _messages(7, 300)
    states = {}
    for path, codec in (("python", None), ("native", _native)):
        monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
        monkeypatch.setattr(unique_key_module, "_time_ns", FixedClock())
        monkeypatch.setattr(native, "NATIVE", codec)
        log = _log(tmp_path / path, codec)
        if unique_keys:
            log.unique_keys = unique_key_module.UniqueKeyGenerator(HOST[:4], instance_id=INSTANCE)
        put = Counting(log.compiled_put()) if codec is not None else None
        states[path] = _append_all(log, messages, put)
    assert states["native"] == states["python"]  # the described tails hold the UNIQ_KEYs, tags, keys, properties
    assert put.done > 250
    python = states["python"]
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


def test_uniq_keys_stay_unique_across_puts_and_batches_in_many_threads(tmp_path):
    """Compiled puts (tags, keys, properties) and put_batch draw UNIQ_KEYs from one generator state: no two
    messages share one, and the index finds every message by its UNIQ_KEY and by its KEYS."""
    with MessageStore.open(tmp_path, config(index_enabled=True, index_slot_count=512,
                                            index_entry_count_max=8192)) as store:
        counting = store._put_common = Counting(store._put_common)
        for topic in range(2):
            store.put(Message(f"topic{topic}", b"first"))
        results: dict[str, list] = {}

        def produce(number):
            shapes = [{}, {"tags": "TagA"}, {"keys": (f"key-{number}",)}, {"properties": {"p": "v"}, "tags": "t"}]
            results[f"put{number}"] = [
                (f"topic{number % 2}", f"{number}-{i}", store.put(Message(
                    f"topic{number % 2}", b"%d-%d" % (number, i), queue_id=i % 2, **shapes[i % 4])))
                for i in range(200)]

        def batches(number):
            made = []
            for batch in range(5):
                messages = [Message("topic1", b"b%d-%d-%d" % (number, batch, i), keys=(f"batch-{number}",))
                            for i in range(20)]
                made += [("topic1", None, result) for result in store.put_batch(messages)]
            results[f"batch{number}"] = made

        threads = [threading.Thread(target=produce, args=(number,)) for number in range(4)]
        threads += [threading.Thread(target=batches, args=(number,)) for number in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert store.wait_dispatched(30)
        every = [entry for entries in results.values() for entry in entries]
        assert len(every) == 4 * 200 + 4 * 5 * 20 and all(r.status is PutStatus.PUT_OK for _, _, r in every)
        assert counting.done >= 4 * 200 - 10  # a few rolls took the Python path
        unique_keys = {}
        for topic, _, result in every:
            message = store.get_by_msg_id(result.msg_id)
            unique_keys[message.properties["UNIQ_KEY"]] = (topic, result.commitlog_offset)
        assert len(unique_keys) == len(every)  # no two messages share a UNIQ_KEY
        for key, (topic, offset) in unique_keys.items():
            assert store.get_by_unique_key(topic, key).commitlog_offset == offset
        for number in range(4):
            found = {m.commitlog_offset for m in store.query(f"topic{number % 2}", f"key-{number}", max_count=64)}
            assert found == {r.commitlog_offset for _, body, r in results[f"put{number}"]
                             if int(body.split("-")[1]) % 4 == 2}
            found = {m.commitlog_offset for m in store.query("topic1", f"batch-{number}", max_count=200)}
            assert found == {r.commitlog_offset for _, _, r in results[f"batch{number}"]}


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
def test_batches_with_uniq_keys_are_prepared_in_c_and_write_the_python_bytes(tmp_path, monkeypatch, record_crc):
    """put_batch in a store with the index (a UNIQ_KEY added to every message): batches of the common shape are
    prepared by the compiled prepare_batch, UNIQ_KEYs included, and give the pure-Python codec's files."""
    from mqstore.commitlog import write_batch

    seed = random.randrange(2**32)
    print("seed", seed)
    written = {}
    for path in ("python", "native"):
        monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
        monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
        _same_unique_keys(monkeypatch)
        common = collections.Counter()
        reference_prepare = write_batch._prepare_common

        def counted(log, messages, reference_prepare=reference_prepare, common=common):
            common["python"] += 1
            return reference_prepare(log, messages)

        monkeypatch.setattr(write_batch, "_prepare_common", counted)
        messages = _messages(seed)
        plain = [m for m in messages if m.tags is None and not m.keys and not m.properties]
        root = tmp_path / path
        with MessageStore.open(root, config(max_message_size_bytes=MAX_BODY_BYTES, index_enabled=True,
                                            record_crc=record_crc)) as store:
            results = store.put_batch(messages)  # every topic known: the next batches are of the common shape
            before = common["python"]
            for at in range(0, len(plain), 25):
                results += store.put_batch(plain[at : at + 25])
            python_prepares = common["python"] - before
            assert store.wait_dispatched(30)
        written[path] = (results, _segment_files(root), python_prepares,
                         list(_segment_files(root, "index").values()))
    assert written["native"][2] == 0 < written["python"][2]  # compiled: no batch went through _prepare_common
    assert written["native"][0] == written["python"][0]
    assert written["native"][1] == written["python"][1]
    assert written["native"][3] == written["python"][3]
    assert all(result.status is PutStatus.PUT_OK for result in written["native"][0])


class StoppedClock:
    """A clock that stays at one instant: the Python path's one-by-one UNIQ_KEYs (a reading each) and the compiled
    batch's (one reading a batch) then have the same time digits."""

    def __call__(self):
        return 1_700_000_000_000 * 1_000_000


def _batches_of_every_shape(root, path: str, monkeypatch, seed: int, index: bool):
    """put_batch of tags, keys, user properties (a caller's UNIQ_KEY too), in batches of 23, topics known; the
    PutResults, the files, and how many batches the compiled prepare_batch left to Python."""
    from mqstore.commitlog import write_batch

    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    _same_unique_keys(monkeypatch)
    monkeypatch.setattr(unique_key_module, "_time_ns", StoppedClock())
    left = collections.Counter()
    reference = write_batch.columns_from_records

    def counted(records, reference=reference, left=left):
        left["one by one"] += 1
        return reference(records)

    monkeypatch.setattr(write_batch, "columns_from_records", counted)
    messages = [m for m in _messages(seed) if not m.topic.startswith("fresh")]
    with MessageStore.open(root, config(max_message_size_bytes=MAX_BODY_BYTES, index_enabled=index)) as store:
        results = store.put_batch([Message(f"topic{t}", b"") for t in range(4)])  # every topic known from here on
        for at in range(0, len(messages), 23):
            results += store.put_batch(messages[at : at + 23])
        errors = []
        end = store._commitlog.readable_end()
        for bad in INVALID:
            with pytest.raises(Exception) as raised:
                store.put_batch([messages[0], bad, messages[1]])
            errors.append((type(raised.value).__name__, str(raised.value)))
        assert store._commitlog.readable_end() == end  # a bad message in a batch writes none of it
        assert store.wait_dispatched(30)
    files = _segment_files(root), list(_segment_files(root, "index").values()) if index else []
    return results, files, errors, left["one by one"]


@pytest.mark.parametrize("index", [False, True], ids=["no-index", "index"])
def test_batches_with_tags_keys_and_properties_are_prepared_in_c_and_write_the_python_bytes(tmp_path, monkeypatch,
                                                                                           index):
    """put_batch of messages with tags, keys and user properties: the compiled prepare_batch takes every batch
    (before, any key or property sent the batch message by message through the Python prepare) and writes the
    pure-Python codec's bytes, with and without the index's UNIQ_KEYs; invalid messages give the same errors."""
    seed = random.randrange(2**32)
    print("seed", seed)
    python = _batches_of_every_shape(tmp_path / "python", "python", monkeypatch, seed, index)
    compiled = _batches_of_every_shape(tmp_path / "native", "native", monkeypatch, seed, index)
    assert compiled[0] == python[0]
    assert compiled[1] == python[1]
    assert compiled[2] == python[2] and {kind for kind, _ in python[2]} == {"InvalidMessageError"}
    assert python[3] >= 10  # the Python codec prepares keyed batches one by one
    assert compiled[3] == 0  # compiled: none (a batch holding an invalid message raises in the Python prepare)


def _topic_slot_messages(seed: int, count: int = 1500) -> list[Message]:
    """Topics the compiled put's (topic, queue id) slots must tell apart or find again: each topic str made anew
    for every message (as an f-string makes it), topics alike in their first 16 bytes and in their length, short
    ones, more (topic, queue) pairs than slots (evictions), and topics
    first seen midway (the topic table changes under the slots' cached tails)."""
    rng = random.Random(seed)
    alike = ["x" * 16 + "-a", "x" * 16 + "-b", "x" * 17 + "a"]
    short = ["a", "b", "%|_-", "%|_a"]
    messages = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.3:
            topic = "".join(list(rng.choice(alike)))  # a new str object of the same text
        elif kind < 0.5:
            topic = "".join(list(rng.choice(short)))
        elif kind < 0.9:
            topic = f"many{rng.randrange(40)}"
        else:
            topic = f"late{i // 300}"  # a few topics that appear only later
        messages.append(Message(topic, rng.randbytes(rng.choice([0, 10, 100])), queue_id=rng.randrange(8),
                                tags=rng.choice([None, "t"]), keys=rng.choice([(), (f"k{i}",)])))
    return messages


@pytest.mark.parametrize("unique_keys", [False, True], ids=["no-uniq-key", "uniq-key"])
def test_topics_found_by_their_text_get_the_python_queue_offsets(tmp_path, monkeypatch, unique_keys):
    seed = random.randrange(2**32)
    print("seed", seed)
    messages = _topic_slot_messages(seed)
    states, files = {}, {}
    for path, codec in (("python", None), ("native", _native)):
        monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
        monkeypatch.setattr(unique_key_module, "_time_ns", FixedClock())
        monkeypatch.setattr(native, "NATIVE", codec)
        log = _log(tmp_path / path, codec)
        if unique_keys:
            log.unique_keys = unique_key_module.UniqueKeyGenerator(HOST[:4], instance_id=INSTANCE)
        put = Counting(log.compiled_put()) if codec is not None else None
        states[path] = _append_all(log, messages, put)
        log.close()
        files[path] = _segment_files(tmp_path, path)
    assert states["native"] == states["python"]  # queue offsets after every put, one key per (topic, queue id)
    assert files["native"] == files["python"]
    assert put.done > 1200
    pairs = {(message.topic, message.queue_id) for message in messages}
    assert len(pairs) > 256 and set(states["python"][-1][1]) == pairs


def _key_time_digits(store: MessageStore, result) -> tuple[int, int]:
    """The UNIQ_KEY's time digits (ms since the month's start) and the store time's, of a put's record."""
    record = store.read_at(result.commitlog_offset)
    key = record.properties["UNIQ_KEY"]
    month_start, _ = unique_key_module._month_bounds_ms(record.store_timestamp_ms)
    return int(key[20:28], 16), (record.store_timestamp_ms - month_start) & 0xFFFFFFFF


def test_the_uniq_key_of_a_compiled_put_is_made_at_the_store_time(tmp_path, monkeypatch):
    """With the real clocks, the compiled put reads the clock once: the UNIQ_KEY's time is the record's store
    time. With the generator's clock replaced (a test's), the key still takes its time from that clock."""
    store, counting = _open(tmp_path / "real", "compiled-put", index_enabled=True)
    with store:
        for i in range(4):
            store.put(Message(f"topic{i}", b"first"))  # the Python path makes a topic known
        compiled = []
        for i in range(3000):
            done = counting.done
            result = store.put(Message(f"topic{i % 4}", b"x" * 100, queue_id=i % 4, tags="t", keys=(f"k{i}",)))
            if counting.done > done:  # not a roll's put (the Python path, which reads the clocks apart)
                compiled.append(result)
        times = [_key_time_digits(store, result) for result in compiled]
    assert len(compiled) > 2900
    assert all(key == stored for key, stored in times)

    then_ms = 1_579_046_400_123  # 2020-01-15: far from the store time
    monkeypatch.setattr(unique_key_module, "_time_ns", lambda: then_ms * 1_000_000)
    store, counting = _open(tmp_path / "fixed", "compiled-put", index_enabled=True)
    with store:
        results = [store.put(Message("topic0", b"x", tags="t")) for _ in range(6)]  # the first: Python's
        key_times = [_key_time_digits(store, result)[0] for result in results]
    assert counting.done == 5
    assert key_times == [then_ms - unique_key_module._month_bounds_ms(then_ms)[0]] * 6
