"""Differential fuzzing of the put path: the same puts and batches, built from the input, go to a store with the
compiled codec (its put entry, Appender, prepare_message and prepare_batch) and to one with the pure-Python codec;
both must give the same results (or the same exception class) and byte-identical segment files.

Messages carry every field, valid values near every limit, invalid values and odd types (fuzz/messages.py). Both
stores get the `Message` users import (the compiled one, with the compiled core built: the pure-Python store's
`prepare` accepts that type; fuzz/message_type.py holds it to the dataclass). The
stores stay open for STORE_REUSE_INPUTS inputs (opening two stores costs far more than a put); set
MQSTORE_FUZZ_FRESH=1 to open new ones for every input when replaying a finding. The timer and schedule services
share one ManualClock that never moves, so the delayed messages' rewrites (compiled in put_rewrite.c, Python in
the services) see the same time and nothing comes due while the files are compared.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import mqstore.commitlog.commitlog as commitlog_module
from mqstore.commitlog import native
from mqstore.commitlog.message import Message

from fuzz import messages
from fuzz.provider import Input
from mqstore import MessageStore, StoreConfig
from mqstore.store.clock import ManualClock

COMPILED = native.NATIVE
STORE_REUSE_INPUTS = 200
SEGMENT_BYTES = 64 * 1024
SEGMENTS_COMPARED = 2
OPERATIONS_MAX = 6
BATCH_MESSAGES_MAX = 5
CLOCK_START_MS = 1_700_000_000_000
CONFIG = StoreConfig(segment_size_bytes=SEGMENT_BYTES, consume_queue_entries_per_file=64,
                     max_message_size_bytes=messages.BODY_LENGTH_MAX, max_queues_per_topic=8, dispatch_process=False,
                     store_host="10.0.0.7", store_port=10911, preallocate_segments=False, index_enabled=False,
                     disk_max_used_space_ratio=1.0, disk_clean_forcibly_ratio=1.0, disk_full_ratio=1.0,
                     flush_interval_ms=60_000, flush_consume_queue_interval_ms=60_000)


class StoreClock:
    """The store clock (commitlog's `_time_ns`): one millisecond per input, the same for both stores."""

    def __init__(self):
        self.now_ms = CLOCK_START_MS

    def __call__(self) -> int:
        return self.now_ms * 1_000_000


class Pair:
    """A store with each codec, in a temporary directory."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="mqstore-fuzz-put-")
        self.clock = StoreClock()
        self.real_clock = commitlog_module._time_ns  # given back at close: later stores of the process get real times
        commitlog_module._time_ns = self.clock
        self.stores = {}
        for name, codec in (("python", None), ("compiled", COMPILED)):
            native.NATIVE = codec
            try:
                self.stores[name] = MessageStore.open(os.path.join(self.directory, name), CONFIG,
                                                      clock=ManualClock(CLOCK_START_MS))
            finally:
                native.NATIVE = COMPILED
            assert self.stores[name]._commitlog.codec is codec
        self.inputs: list[bytes] = []  # since the stores were opened: a finding may need all of them to replay

    def close(self):
        try:
            for store in self.stores.values():
                store.close()
        finally:
            commitlog_module._time_ns = self.real_clock
            shutil.rmtree(self.directory, ignore_errors=True)


_pair: Pair | None = None


def _outcome(call):
    """What a put gave: its results, or its exception's class (the codecs' messages may be worded apart)."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the class is the outcome compared
        return ("raised", type(exc).__name__)
    if isinstance(result, list):
        return ("results", [(r[0].value, *r[1:]) for r in result])
    return ("result", (result[0].value, *result[1:]))


def _build(arguments, message_type):
    positional, keywords = arguments
    try:
        return message_type(*positional, **keywords)
    except Exception as exc:  # noqa: BLE001
        return exc


def _segment_files(store) -> dict[str, bytes | None]:
    """The segments the log has reached (the allocator makes the next one ahead, in its own thread, so whether that
    one exists yet is timing), and the bytes of the last SEGMENTS_COMPARED (the earlier ones were compared while
    they were the last)."""
    directory = os.path.join(store.root_dir, "commitlog")
    end = store._commitlog._end
    names = [name for name in sorted(os.listdir(directory)) if int(name) < max(end, 1)]
    files: dict[str, bytes | None] = dict.fromkeys(names)
    for name in names[-SEGMENTS_COMPARED:]:
        with open(os.path.join(directory, name), "rb") as handle:
            files[name] = handle.read()
    return files


def _operations(source: Input) -> list[tuple[str, list]]:
    operations = []
    for _ in range(source.below(OPERATIONS_MAX) + 1):
        batch = source.below(4) == 0
        count = source.below(BATCH_MESSAGES_MAX + 1) if batch else 1
        operations.append(("put_batch" if batch else "put", [messages.arguments(source) for _ in range(count)]))
    return operations


def _run(store, operations, message_type) -> list:
    outcomes = []
    for kind, argument_list in operations:
        built = [_build(arguments, message_type) for arguments in argument_list]
        if any(isinstance(message, Exception) for message in built):
            outcomes.append(("not built", [type(m).__name__ for m in built if isinstance(m, Exception)]))
            continue
        if kind == "put":
            outcomes.append(_outcome(lambda built=built: store.put(built[0])))
        else:
            outcomes.append(_outcome(lambda built=built: store.put_batch(built)))
    return outcomes


def one_input(data: bytes) -> None:
    global _pair
    fresh = os.environ.get("MQSTORE_FUZZ_FRESH") == "1"
    if _pair is None or fresh or len(_pair.inputs) >= STORE_REUSE_INPUTS:
        if _pair is not None:
            _pair.close()
        _pair = Pair()
    pair = _pair
    pair.inputs.append(data)
    pair.clock.now_ms += 1
    commitlog_module._time_ns = pair.clock
    operations = _operations(Input(data))
    expected = _run(pair.stores["python"], operations, Message)
    got = _run(pair.stores["compiled"], operations, Message)
    for index, (want, have) in enumerate(zip(expected, got)):
        assert want == have, f"operation {index} ({operations[index][0]}): python {want!r}, compiled {have!r}"
    python_log, compiled_log = pair.stores["python"]._commitlog, pair.stores["compiled"]._commitlog
    assert python_log._end == compiled_log._end, f"log ends: python {python_log._end}, compiled {compiled_log._end}"
    python_files = _segment_files(pair.stores["python"])
    compiled_files = _segment_files(pair.stores["compiled"])
    assert list(python_files) == list(compiled_files), (list(python_files), list(compiled_files))
    for name, content in python_files.items():
        if content != compiled_files[name]:
            at = next(i for i, (a, b) in enumerate(zip(content, compiled_files[name])) if a != b)
            raise AssertionError(f"segment {name} differs first at byte {at}")


def close() -> None:
    global _pair
    if _pair is not None:
        _pair.close()
        _pair = None
