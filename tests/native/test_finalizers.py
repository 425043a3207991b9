"""Python code run by a garbage collection inside a compiled call of the put path (commitlog/csrc/: message_type.c,
put.c, put_entry.c): the call raises a clean error, leaves the message to the Python path, or stores one consistent
message, and the bytes it stores are the bytes the pure-Python codec writes for that message.

Any allocation of a GC-tracked object (a tuple, a list, a dict) may start a collection, and a collection runs the
finalizers of the garbage it finds: arbitrary Python code, here code that changes the message being put (its
body, topic, tags, keys, properties or queue id) or shrinks the batch. The collector's threshold is set so that
the first collection inside the call starts at its k-th allocation of a tracked object (CPython's free lists
emptied first: what they hand out is not counted), where a gc callback leaves an object with `__del__` in a
reference cycle, which that collection finds and finalizes; k sweeps 1, 2, ... until the call ends before a
collection. The finalizer also allocates objects of the sizes it let go of, so that memory a call still used
after it was freed holds other bytes in a normal build (an ASan build with PYTHONMALLOC=malloc reports the use
itself).

From CPython 3.12 on, a collection starts only at the interpreter's eval-breaker checks, never inside an
allocation made by C code, so no finalizer can run at these points there: the tests are skipped on 3.12+.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading

import mqstore.commitlog.commitlog as commitlog_module
import pytest
from mqstore.commitlog import _native, native
from mqstore.commitlog.write_batch import columns_from_records

from mqstore import FlushMode, Message, MessageStore, PutStatus
from tests.conftest import small_config

pytestmark = [
    pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: the compiled core is not loaded"),
    pytest.mark.skipif(sys.version_info >= (3, 12),
                       reason="CPython 3.12+ collects only at eval-breaker checks, never inside a C allocation"),
]

SPACERS = 3  # tracked objects made at the end of _arm (see there)
ALLOCATIONS_MAX = 400  # allocations of tracked objects in one call, at most (a bound of the sweep)
FIRST_TRIES = 3  # empty calls at the first position before it counts as running no collection (see _sweep)
EMPTY_TRIES = 2  # ...at a later position
EXACT_TRIES = 8  # calls at a position, at most
TUPLE_FREE_SIZES = 20  # CPython 3.11 keeps free lists of tuples of 1 to 19 items...
FREE_LIST_MAX = 2000  # ...of up to 2000 each (80 lists, 80 dicts)
BORN_MS = 1_600_000_000_000  # every message names its born time: the replay need not match the clock for it


class _Finalizer:
    """Garbage in a reference cycle whose __del__ runs `action` (inside the collection that finds it)."""

    def __init__(self, action):
        self.action, self.cycle = action, self

    def __del__(self):
        self.action()


class _Armed:
    """A gc callback: counts the collections that start while `on`, those the arming thread starts (`count`) apart
    from those another thread starts (`foreign`: a store's thread, which allocates too); the arming thread's first
    leaves a _Finalizer running `action`. It keeps what `_arm` set up, for `_disarm`."""

    def __init__(self, action):
        self.action, self.on, self.count, self.foreign, self.exact = action, False, 0, 0, False
        self.thread = threading.get_ident()
        self.threshold = self.drained = self.spacer = None

    def __call__(self, phase, info):
        if phase == "start" and self.on:
            if threading.get_ident() != self.thread:
                self.foreign += 1
                return
            self.count += 1
            if self.count == 1:
                self.exact = not self.foreign  # the first collection came where _arm set it
                if self.action is not None:
                    _Finalizer(self.action)


def _arm(allocations: int, action=None) -> _Armed:
    """Until _disarm: the first collection starts at about the `allocations`-th allocation of a tracked object after
    the return, and runs `action` in a finalizer. The collector counts allocations less frees since the last
    collection and starts one when the count passes its threshold; tuples, lists and dicts taken from CPython's
    free lists are not counted, so the free lists are emptied (the objects stay alive till _disarm). Call the
    function under test right after: a `with` statement would allocate and free its bound __enter__ between."""
    armed = _Armed(action)
    armed.threshold = gc.get_threshold()
    gc.collect()
    drained = [tuple(range(size)) for size in range(1, TUPLE_FREE_SIZES) for _ in range(FREE_LIST_MAX)]
    drained += [[] for _ in range(FREE_LIST_MAX)] + [{} for _ in range(FREE_LIST_MAX)]
    armed.drained = drained
    gc.collect(0)  # the count at 0; the free lists stay empty (no callback ran: its arguments' tuple is freed)
    # The count over 1 when the call starts (a free or two on the way out of here may lower it): its first
    # allocations pass the threshold at the lowest `allocations`, later ones at higher ones.
    armed.spacer = [[] for _ in range(SPACERS)]
    gc.set_threshold(allocations)
    gc.callbacks.append(armed)
    armed.on = True
    return armed


def _disarm(armed: _Armed) -> None:
    """Undo _arm (its counts stay in `armed`)."""
    armed.on = False
    gc.set_threshold(*armed.threshold)
    gc.callbacks.remove(armed)
    armed.drained = armed.spacer = None


def _positions():
    """1, 2, ... for _arm: the caller stops once a call ran no collection (every allocation point passed)."""
    yield from range(1, ALLOCATIONS_MAX)
    raise AssertionError(f"a call made over {ALLOCATIONS_MAX} allocations: the sweep would not end")


def _sweep(call_at, mutation) -> int:
    """The first position whose call ran no collection: `call_at(allocations, mutation)` for allocations = 1, 2, ...
    (each call returns its _Armed).

    A store's own threads allocate and free tracked objects too, and may run during the call (while it waits for a
    lock or the disk): a collection one of them starts resets the count, so the calling thread's first collection
    comes later than set, or not at all. A position is therefore tried again until a call's first collection is
    its own and came before any other (exact), or a call ran no collection in any thread (empty), at most
    EXACT_TRIES times; the sweep ends at a position whose calls were empty EMPTY_TRIES times (FIRST_TRIES at
    position 1: a store thread's frees between _arm and the call lower the count below what the call's first
    allocation needs, and leave no trace), or none of whose calls collected in the calling thread."""
    for allocations in _positions():
        needed = FIRST_TRIES if allocations == 1 else EMPTY_TRIES
        empty = reached = 0
        for _ in range(EXACT_TRIES):
            armed = call_at(allocations, mutation)
            reached += armed.count > 0
            if armed.count and armed.exact:
                break
            if not armed.count and not armed.foreign:
                empty += 1
                if empty == needed:
                    return allocations
        else:
            if not reached:
                return allocations
    raise AssertionError("unreachable: _positions raises at its end")


def _fresh(text: str) -> str:
    return text.encode().decode()  # a new str object: only the message holds it


def _copy(message) -> Message:
    """An equal message of new objects (the original's stay referenced by it alone)."""
    keys = message.keys
    return Message(_fresh(message.topic), bytes(bytearray(message.body)), message.queue_id,
                   None if message.tags is None else _fresh(message.tags),
                   tuple(keys) if isinstance(keys, tuple) else list(keys), dict(message.properties), message.flag,
                   message.born_timestamp_ms)


def _message(i: int, shape: str) -> Message:
    body = bytes(bytearray(b"%06d" % i * 20))  # 120 bytes: a pymalloc size class, reused at once when freed
    extra = {"tags": _fresh("TagA"), "keys": (_fresh("k1"), _fresh("k2")), "properties": {"p": _fresh("v")}} \
        if shape == "tagged" else {}
    return Message(_fresh("topic0"), body, queue_id=i % 4, born_timestamp_ms=BORN_MS + i, **extra)


def _filler(kind, size: int):
    """An object of a type and size holding other bytes (it takes the memory of one of that size, once freed)."""
    return bytes(bytearray(b"\xee" * size)) if kind is bytes else _fresh("Z" * size)


MUTATIONS = {
    "body": lambda m, i: setattr(m, "body", b"B" * (130 + i % 7)),
    "topic": lambda m, i: setattr(m, "topic", "unseen%d" % i),
    "tags": lambda m, i: setattr(m, "tags", _fresh("TagZ")),
    "keys": lambda m, i: setattr(m, "keys", (_fresh("z%d" % i),)),
    "properties": lambda m, i: setattr(m, "properties", {"q": _fresh("w%d" % i)}),
    "queue_id": lambda m, i: setattr(m, "queue_id", (m.queue_id + 1) % 4),
}


def _mutator(message, mutation: str, i: int, kept: list):
    """The finalizer's action: change `message` by `mutation`, then reuse the memory of what it let go of."""
    def action():
        old = getattr(message, mutation)
        spec = (type(old), len(old)) if isinstance(old, (bytes, str)) else None
        del old
        MUTATIONS[mutation](message, i)
        if spec is not None:
            kept.append(_filler(*spec))
    return action


def _same(stored, expected) -> bool:
    """A record read back holds `expected` (its properties with TAGS and KEYS as they are given)."""
    properties = {name: value for name, value in stored.properties.items() if name not in ("TAGS", "KEYS")}
    return (stored.topic == expected.topic and bytes(stored.body) == expected.body
            and stored.queue_id == expected.queue_id and stored.tags == expected.tags
            and tuple(stored.keys) == tuple(expected.keys) and properties == dict(expected.properties)
            and stored.flag == expected.flag and stored.born_timestamp_ms == expected.born_timestamp_ms)


def _config(mode=FlushMode.ASYNC):
    return small_config(max_queues_per_topic=8, flush_mode=mode)


class _Replay:
    """What a store kept, to be put again into a pure-Python store with the same store times."""

    def __init__(self):
        self.operations = []  # ("put", message, store_ts) or ("batch", [messages], store_ts)

    def check(self, root, written, monkeypatch, mode) -> None:
        monkeypatch.setattr(native, "NATIVE", None)
        clock = _SetClock()
        monkeypatch.setattr(commitlog_module, "_time_ns", clock)
        with MessageStore.open(root, _config(mode)) as store:
            assert store._commitlog.codec is None
            for kind, messages, store_ts in self.operations:
                clock.ns = store_ts * 1_000_000
                if kind == "put":
                    assert store.put(messages).store_timestamp_ms == store_ts
                else:
                    assert {r.store_timestamp_ms for r in store.put_batch(messages)} == {store_ts}
        assert _files(root) == written


class _SetClock:
    def __init__(self):
        self.ns = 1_700_000_000_000 * 1_000_000

    def __call__(self):
        return self.ns


def _files(root):
    directory = root / "commitlog"
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def _open_compiled(root, mode, replay: _Replay | None = None):
    store = MessageStore.open(root, _config(mode))
    assert store._commitlog.codec is _native and store._put_common is not None
    warm = Message("topic0", b"warm", born_timestamp_ms=BORN_MS)
    result = store.put(warm)  # the topic is known: the compiled path
    if replay is not None:
        replay.operations.append(("put", warm, result.store_timestamp_ms))
    return store


# --- the compiled single-message put: PutEntry (store.put) and the Appender under the writer lock ------------------


@contextlib.contextmanager
def _put_function(store, target: str):
    """The put to call: the store's (PutEntry), or the Appender's with the writer lock held around it (taken here,
    so that no Python code runs between the start of the sweep's count and the compiled call)."""
    if target == "entry":
        yield store.put
        return
    log = store._commitlog
    with log.lock:
        yield log._appender.put


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, pytest.param(FlushMode.SYNC, marks=pytest.mark.slow)],
                         ids=["async", "sync"])  # SYNC: the gate's wait allocates, a longer sweep
@pytest.mark.parametrize("shape", ["common", "tagged"])
@pytest.mark.parametrize("target", ["entry", "appender"])
def test_a_finalizer_during_a_compiled_put_stores_one_consistent_message(tmp_path, monkeypatch, mode, shape, target):
    monkeypatch.setattr(native, "NATIVE", _native)
    replay = _Replay()
    store = _open_compiled(tmp_path / "compiled", mode, replay)
    outcomes = {"stored-original": 0, "stored-changed": 0, "left": 0, "raised": 0}
    i = 0

    def put_at(allocations: int, mutation: str) -> int:
        nonlocal i
        i += 1
        message, kept = _message(i, shape), []
        original = _copy(message)
        end = store._commitlog.readable_end()
        action = _mutator(message, mutation, i, kept)
        with _put_function(store, target) as put:
            armed = _arm(allocations, action)
            try:
                result = put(message)
            except Exception:  # a clean error: nothing written
                result = "raised"
            finally:
                _disarm(armed)
        changed = _copy(message)
        if result is None or result == "raised":
            outcomes["left" if result is None else "raised"] += 1
            assert store._commitlog.readable_end() == end, (mutation, allocations)
            return armed
        assert result.status is PutStatus.PUT_OK
        stored = store.read_at(result.commitlog_offset)
        same_as_original = _same(stored, original)
        assert same_as_original or _same(stored, changed), (mutation, allocations, stored)
        outcomes["stored-original" if same_as_original else "stored-changed"] += 1
        replay.operations.append(("put", original if same_as_original else changed, result.store_timestamp_ms))
        return armed

    with store:
        for mutation in MUTATIONS:
            swept = _sweep(put_at, mutation)
            assert swept > 1, "no collection ran inside the put: the test would test nothing"
    print(outcomes)
    assert outcomes["stored-original"] > 0
    replay.check(tmp_path / "python", _files(tmp_path / "compiled"), monkeypatch, mode)


# --- the compiled prepare (CommitLog.compiled_prepare: prepare_message) -------------------------------------------


def test_a_finalizer_during_the_compiled_prepare_gives_the_python_record_of_one_message(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "NATIVE", _native)
    with _open_compiled(tmp_path / "compiled", FlushMode.ASYNC) as store:
        log = store._commitlog
        prepare = log.compiled_prepare()
        prepared = 0

        def prepare_at(allocations: int, mutation: str) -> int:
            nonlocal prepared
            message, kept = _message(allocations, "common"), []
            original = _copy(message)
            action = _mutator(message, mutation, allocations, kept)
            armed = _arm(allocations, action)
            try:
                record = prepare(message)
            except Exception:
                record = None
            finally:
                _disarm(armed)
            if record is not None:
                prepared += 1
                changed = _copy(message)
                expected = [log.prepare(original)]
                if changed != original and not changed.tags and not changed.keys and not changed.properties:
                    expected.append(log.prepare(changed))
                assert record in expected, (mutation, allocations)
            return armed

        for mutation in MUTATIONS:
            swept = _sweep(prepare_at, mutation)
            assert swept > 1
        assert prepared > 0


# --- the compiled batch: prepare_batch, and put_batch through it --------------------------------------------------

BATCH = 4


def _batch(start: int) -> list:
    return [_message(start + n, "common") for n in range(BATCH)]


def _batch_mutator(batch: list, mutation: str, i: int, kept: list):
    if mutation == "shrink":
        def action():
            sizes = [len(m.body) for m in batch[1:]]
            del batch[1:]
            kept.extend(_filler(bytes, size) for size in sizes)
        return action
    return _mutator(batch[-1], mutation, i, kept)


BATCH_MUTATIONS = ("body", "topic", "queue_id", "tags", "shrink")


def _columns(columns) -> list:
    """A batch's Columns as one tuple per message (its queue key, flag, born time, body, CRC, tail, size)."""
    return [(columns.queue_keys[columns.key_ids[n]], int(columns.flags[n]), int(columns.born_ms[n]),
             bytes(columns.bodies[n]), int(columns.body_crcs[n]), bytes(columns.tails[n]), int(columns.sizes[n]))
            for n in range(len(columns.bodies))]


def test_a_finalizer_during_prepare_batch_gives_the_python_columns_of_one_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "NATIVE", _native)
    with _open_compiled(tmp_path / "compiled", FlushMode.ASYNC) as store:
        log = store._commitlog

        def prepare_at(allocations: int, mutation: str) -> int:
            batch, kept = _batch(allocations), []
            originals = [_copy(m) for m in batch]
            action = _batch_mutator(batch, mutation, allocations, kept)
            armed = _arm(allocations, action)
            try:
                columns = log.prepare_batch(batch)
            except Exception:
                return armed
            finally:
                _disarm(armed)
            changed = [_copy(m) for m in batch]
            got = _columns(columns)
            reference = [_columns(columns_from_records([log.prepare(m) for m in version]))
                         for version in (originals, changed)]
            if mutation != "shrink":  # one message changed: each is the original or the changed one
                assert len(got) == BATCH, (mutation, allocations)
                for n in range(BATCH):
                    assert got[n] in (reference[0][n], reference[1][n]), (mutation, allocations, n)
            else:
                assert got in reference, (mutation, allocations)
            return armed

        for mutation in BATCH_MUTATIONS:
            swept = _sweep(prepare_at, mutation)
            assert swept > 1


def test_a_finalizer_during_put_batch_stores_consistent_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "NATIVE", _native)
    replay = _Replay()
    store = _open_compiled(tmp_path / "compiled", FlushMode.ASYNC, replay)
    i = 0

    def put_at(allocations: int, mutation: str) -> int:
        nonlocal i
        i += BATCH
        batch, kept = _batch(i), []
        originals = [_copy(m) for m in batch]
        end = store._commitlog.readable_end()
        action = _batch_mutator(batch, mutation, i, kept)
        armed = _arm(allocations, action)
        try:
            results = store.put_batch(batch)
        except Exception:
            results = None
        finally:
            _disarm(armed)
        if results is None:  # a clean error: nothing written
            assert store._commitlog.readable_end() == end
            return armed
        changed = [_copy(m) for m in batch]
        assert len(results) == BATCH and all(r.status is PutStatus.PUT_OK for r in results)
        kept_versions = []
        for n, result in enumerate(results):
            stored = store.read_at(result.commitlog_offset)
            version = originals[n] if _same(stored, originals[n]) else changed[n]
            assert _same(stored, version), (mutation, allocations, n, stored)
            kept_versions.append(version)
        replay.operations.append(("batch", kept_versions, results[0].store_timestamp_ms))
        return armed

    with store:
        for mutation in BATCH_MUTATIONS[:-1]:  # put_batch copies the caller's list first: no shrink reaches it
            swept = _sweep(put_at, mutation)
            assert swept > 1
    replay.check(tmp_path / "python", _files(tmp_path / "compiled"), monkeypatch, FlushMode.ASYNC)
