"""The two codecs of the per-record byte work, the compiled one (mqstore.commitlog._native) and the pure-Python
reference: the same puts give byte-identical segment files, the same files give identical messages and identical
CorruptionErrors on damaged bytes, and the compiled code's layout constants are format.py's."""

from __future__ import annotations

import os
import random
import shutil

import mqstore.commitlog.commitlog as commitlog_module
import numpy as np
import pytest
from mqstore.commitlog import (
    _native,  # built by the package's install; MQSTORE_NATIVE=0 only changes the default
    native,
)
from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.commitlog.message import StoredMessage

from mqstore import Message, MessageStore
from tests.conftest import rocketmq_config
from tests.unit.commitlog import handmade
from tests.unit.mqstore.conftest import config

CODECS = {"python": None, "native": _native}
SEGMENT_BYTES = 64 * 1024
MAX_BODY_BYTES = 8192


def test_the_compiled_layout_is_format_py():
    constants = _native.layout()
    for name, value in constants.items():
        assert getattr(fmt, name) == value, name
    assert len(constants) >= 30


class FixedClock:
    """mqstore.commitlog.commitlog._time_ns advancing 1 ms a call, so that two runs stamp the same times."""

    def __init__(self):
        self.now_ns = 1_700_000_000_000 * 1_000_000

    def __call__(self):
        self.now_ns += 1_000_000
        return self.now_ns


def _messages(seed: int) -> list[Message]:
    """Messages of every shape: empty and max-size bodies, tags, keys, unicode properties, born times."""
    rng = random.Random(seed)
    shapes = []
    for i in range(260):
        length = rng.choice([0, 1, 100, 1000, 4000, MAX_BODY_BYTES])
        body = rng.randbytes(length)
        kind = i % 5
        if kind == 0:
            shapes.append(Message(f"topic{i % 3}", body, queue_id=i % 4))
        elif kind == 1:
            shapes.append(Message("tagged", body, queue_id=i % 2, tags=rng.choice(["TagA", "TagB", "Täg-ü"])))
        elif kind == 2:
            shapes.append(Message("keyed", body, keys=[f"key-{i}", "k2"], flag=-(i * 1000)))
        elif kind == 3:
            shapes.append(Message("props", body, properties={"naïve": "välue ☃", "n": str(i)},
                                  born_timestamp_ms=1_600_000_000_000 + i))
        else:
            shapes.append(Message("b", body, queue_id=3, tags="x", properties={"a": "b"}, flag=2**31 - 1))
    return shapes


def _write_store(root, codec, monkeypatch, *, record_crc: bool, batch: bool, seed: int):
    monkeypatch.setattr(native, "NATIVE", codec)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    messages = _messages(seed)
    with MessageStore.open(root, config(record_crc=record_crc, max_message_size_bytes=MAX_BODY_BYTES)) as store:
        assert store._commitlog.codec is codec
        if batch:
            results = []
            for at in range(0, len(messages), 37):
                results += store.put_batch(messages[at : at + 37])
            plain = [m for m in messages if m.tags is None and not m.keys and not m.properties]
            for at in range(0, len(plain), 20):  # batches of the shape the compiled prepare_batch takes
                results += store.put_batch(plain[at : at + 20])
        else:
            results = [store.put(message) for message in messages]
        assert store.wait_dispatched(30)
    return results


def _segment_files(root):
    directory = root / "commitlog"
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
@pytest.mark.parametrize("batch", [False, True], ids=["put", "put_batch"])
def test_the_same_puts_give_byte_identical_segments(tmp_path, monkeypatch, record_crc, batch):
    seed = random.randrange(2**32)
    print("seed", seed)
    written = {}
    for name, codec in CODECS.items():
        results = _write_store(tmp_path / name, codec, monkeypatch, record_crc=record_crc, batch=batch, seed=seed)
        written[name] = ([r[:5] for r in results], _segment_files(tmp_path / name))
    python_results, python_files = written["python"]
    native_results, native_files = written["native"]
    assert native_results == python_results
    assert len(python_files) >= 3  # the puts rolled segments, leaving blanks
    assert list(native_files) == list(python_files)
    for name in python_files:
        assert native_files[name] == python_files[name], name
    first = python_files[sorted(python_files)[0]]
    assert first[4:8] == bytes.fromhex("DAA320A7") and bytes.fromhex("CBD43194") in first  # records, then a blank


def _read_everything(root, codec, monkeypatch, cfg):
    """Every message of every queue through get (32 a call) and read_at, with `codec`."""
    monkeypatch.setattr(native, "NATIVE", codec)
    found = []
    with MessageStore.open(root, cfg) as store:
        assert store._commitlog.codec is codec
        for topic, queue_ids in sorted(store.topics().items()):
            for queue_id in queue_ids:
                offset = store.min_offset(topic, queue_id)
                while offset < store.max_offset(topic, queue_id):
                    result = store.get(topic, queue_id, offset, max_count=32)
                    found += [(type(m), tuple(m)) for m in result.messages]
                    offset = result.next_offset
                tagged = store.get(topic, queue_id, store.min_offset(topic, queue_id), max_count=32, tags="TagA")
                found += [("tagged", tuple(m)) for m in tagged.messages]
        for _kind, message in list(found):
            again = store.read_at(message[6])
            found.append((type(again), tuple(again)))
    return found


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
def test_the_same_files_give_identical_messages(tmp_path, monkeypatch, record_crc):
    seed = random.randrange(2**32)
    print("seed", seed)
    _write_store(tmp_path / "store", None, monkeypatch, record_crc=record_crc, batch=False, seed=seed)
    cfg = config(record_crc=record_crc, max_message_size_bytes=MAX_BODY_BYTES)
    python = _read_everything(tmp_path / "store", None, monkeypatch, cfg)
    assert len(python) > 2 * 260
    assert all(kind in (StoredMessage, "tagged") for kind, _ in python)
    assert _read_everything(tmp_path / "store", _native, monkeypatch, cfg) == python


def test_rocketmq_files_give_identical_messages(rocketmq_store_copy, tmp_path, monkeypatch):
    copies = {}
    for name in CODECS:
        copies[name] = tmp_path / f"copy-{name}"
        shutil.copytree(rocketmq_store_copy, copies[name])
    python = _read_everything(copies["python"], None, monkeypatch, rocketmq_config())
    assert len(python) > 100
    assert _read_everything(copies["native"], _native, monkeypatch, rocketmq_config()) == python


# --- damaged bytes ---------------------------------------------------------------------------------------------

def _outcome(call):
    try:
        value = call()
    except CorruptionError as exc:
        return ("CorruptionError", str(exc), exc.path, exc.offset, exc.rule)
    except InvalidMessageError as exc:
        return ("InvalidMessageError", str(exc))
    return ("ok", [tuple(m) for m in value] if isinstance(value, list) else tuple(value))


def _logs(root, record_crc_from):
    """The written log opened read-only once per codec."""
    logs = {}
    for name, codec in CODECS.items():
        log = CommitLog(str(root / "commitlog"), SEGMENT_BYTES, writable=False, max_message_size_bytes=MAX_BODY_BYTES,
                        max_queues_per_topic=8, born_host_raw=bytes(8), store_host_raw=bytes(8),
                        record_crc_from=record_crc_from)
        log.codec = codec
        log.set_end(len(os.listdir(root / "commitlog")) * SEGMENT_BYTES)
        logs[name] = log
    return logs


@pytest.mark.parametrize("record_crc", [False, True], ids=["no-record-crc", "record-crc"])
def test_damaged_bytes_give_identical_errors(tmp_path, monkeypatch, record_crc):
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    monkeypatch.setattr(native, "NATIVE", None)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    with MessageStore.open(tmp_path, config(record_crc=record_crc)) as store:
        results = [store.put(Message("t", rng.randbytes(rng.choice([0, 5, 300])), tags="TagA" if i % 2 else None,
                                     properties={"p": "é"} if i % 3 == 0 else {})) for i in range(12)]
    logs = _logs(tmp_path, 0 if record_crc else None)
    segment = np.memmap(tmp_path / "commitlog" / fmt.segment_name(0), dtype=np.uint8, mode="r+")
    offsets = [r.commitlog_offset for r in results]
    sizes = [r.size_bytes for r in results]
    entries = [r.queue_offset for r in results]
    compared = 0
    for index in range(len(results)):
        start, size = offsets[index], sizes[index]
        positions = list(range(start, start + size))
        positions = positions if index < 3 else rng.sample(positions, min(40, size))
        for position in positions:
            for change in (0xFF, 1 << rng.randrange(8), rng.randrange(1, 256)):
                segment[position] ^= change
                seen = {
                    name: (_outcome(lambda: log.read(start)),
                           _outcome(lambda: log.read(start, check_crc=False)),
                           _outcome(lambda: log.read_many(offsets, sizes)),
                           _outcome(lambda: log.read_many(offsets[index:], sizes[index:],
                                                          ("t", 0, range(entries[index], entries[-1] + 1)))),
                           _outcome(lambda: log.read_many(offsets, sizes, ("t", 0, entries))))
                    for name, log in logs.items()}
                segment[position] ^= change
                assert seen["native"] == seen["python"], (position - start, change)
                compared += 1
    assert compared > 3 * 100
    for log in logs.values():
        log.close()


def test_records_of_other_shapes_go_to_the_reference(tmp_path):
    """v2 records and IPv6 hosts are decoded by the Python reference for both codecs, alike."""
    log_dir = tmp_path / "commitlog"
    segment = handmade.SegmentWriter(log_dir, SEGMENT_BYTES)
    at = [segment.add("v2topic", b"two", v2=True), segment.add("six", b"v6", born_host="::1", store_host="::2"),
          segment.add("plain", b"one", properties=b"TAGS\x01x\x02")]
    segment.write()
    logs = _logs(tmp_path, None)
    for offset in at:
        assert _outcome(lambda: logs["native"].read(offset)) == _outcome(lambda: logs["python"].read(offset))
        assert _outcome(lambda: logs["native"].read(offset))[0] == "ok"
    sizes = [logs["python"].read(offset).size_bytes for offset in at]
    assert (_outcome(lambda: logs["native"].read_many(at, sizes))
            == _outcome(lambda: logs["python"].read_many(at, sizes)))


# --- the compiled functions refuse what does not fit -----------------------------------------------------------

def test_encode_checks_every_bound():
    target = bytearray(200)
    host = bytes(8)
    tail = b"\x01t\x00\x00"
    arguments = [target, 0, 88 + 3 + 4, 0, 0, 0, 0, 0, 0, host, 0, host, b"abc", tail, False]
    _native.encode_record(*arguments)
    assert fmt.HEADER_V1.unpack_from(target)[0] == 95 and target[88:91] == b"abc"
    for index, bad in [(1, 150), (1, -1), (2, 96), (3, -1), (4, 2**31), (9, b"1234"), (6, -5), (14, True)]:
        wrong = list(arguments)
        wrong[index] = bad
        before = bytes(target)
        with pytest.raises(ValueError):
            _native.encode_record(*wrong)
        assert bytes(target) == before
    with pytest.raises(BufferError):
        _native.encode_record(bytes(200), *arguments[1:])  # not writable
    with pytest.raises(ValueError):
        _native.encode_blank(target, 195, 8)
    _native.encode_blank(target, 192, 8)
    assert fmt.BLANK.unpack_from(target, 192) == (8, fmt.BLANK_MAGIC_CODE)


def test_decode_never_reads_outside_the_buffer():
    record = handmade.record(0, "t", b"body", properties=b"TAGS\x01x\x02")
    for cut in range(len(record)):
        assert _native.decode_record(record[:cut], 0, len(record), 0, True, -1, StoredMessage) is None
        assert _native.decode_record(record, cut + 1, len(record), 0, True, -1, StoredMessage) is None
    assert tuple(_native.decode_record(record, 0, len(record), 0, True, -1, StoredMessage))[15:] == (
        b"body", "t", b"TAGS\x01x\x02")


# --- the compiled Message and prepare --------------------------------------------------------------------------

def _message_cases(cls):
    return [cls("t", b"x"), cls("t", b"", 3), cls(topic="t", body=b"b", queue_id=1, tags="a", keys=["k"],
                                                   properties={"p": "v"}, flag=-1, born_timestamp_ms=5),
            cls("t", b"x", 1, None, (), {}, 2, None)]


def test_the_compiled_message_is_the_dataclass(monkeypatch):
    import dataclasses
    import pickle

    from mqstore.commitlog.message import ReferenceMessage

    compiled = _native.Message
    for name in ("__dataclass_fields__", "__dataclass_params__"):  # as commitlog.message sets them when it uses it
        monkeypatch.setattr(compiled, name, getattr(ReferenceMessage, name), raising=False)
    for reference, made in zip(_message_cases(ReferenceMessage), _message_cases(compiled)):
        assert repr(made) == repr(reference)
        assert [getattr(made, f.name) for f in dataclasses.fields(reference)] == [
            getattr(reference, f.name) for f in dataclasses.fields(reference)]
        assert made == pickle.loads(pickle.dumps(made)) and made != reference
        assert dataclasses.replace(made, flag=9).flag == 9
    first, second = compiled("t", b""), compiled("t", b"")
    first.properties["a"] = "b"
    assert first.properties == {"a": "b"} and second.properties == {} and first != second
    with pytest.raises(TypeError):
        hash(first)
    for bad in [lambda: compiled("t"), lambda: compiled("t", b"", nope=1), lambda: compiled("t", b"", topic="u"),
                lambda: compiled(*range(9))]:
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(TypeError):
        ReferenceMessage("t")
    first.tags = "x"
    assert first.tags == "x"


def test_the_compiled_prepare_gives_the_python_prepare_or_leaves_it(tmp_path, monkeypatch):
    monkeypatch.setattr(commitlog_module, "Message", _native.Message)  # the store's Message, also with MQSTORE_NATIVE=0
    log = CommitLog(str(tmp_path / "commitlog"), SEGMENT_BYTES, writable=True, max_message_size_bytes=1000,
                    max_queues_per_topic=4, born_host_raw=bytes(8), store_host_raw=bytes(8), record_crc=True)
    log.codec = _native
    prepare = log.compiled_prepare()
    assert prepare is not None
    message = _native.Message
    cases = [message("known", b"x" * n) for n in (0, 1, 1000)] + [
        message("known", b"y", queue_id=3, flag=-(2**31), born_timestamp_ms=0), message("known", b"", keys=[]),
        message("unknown", b"x"), message("known", b"x", tags="t"), message("known", b"x", keys=["k"]),
        message("known", b"x", properties={"a": "b"}), message("known", b"x" * 1001),
        message("known", b"x", queue_id=4),
        message("known", b"x", queue_id=-1), message("known", b"x", queue_id=True), message("known", bytearray(b"x")),
        message("known", b"x", flag=2**31), message("known", b"x", born_timestamp_ms=-1), message(b"known", b"x"),
        message("known", "text"), message("known", b"x", keys=None), message("known", b"x", born_timestamp_ms=1.0)]
    log.prepare(message("known", b""))  # the topic is checked and cached
    accepted = 0
    for case in cases:
        compiled = prepare(case)
        try:
            expected = log.prepare(case)
        except InvalidMessageError:
            assert compiled is None, case
            continue
        if compiled is not None:
            assert compiled == expected, case
            accepted += 1
    assert accepted == 5
    log.close()


def test_the_compiled_batch_prepare_gives_the_python_columns_or_leaves_them(tmp_path, monkeypatch):
    from mqstore.commitlog import write_batch

    monkeypatch.setattr(commitlog_module, "Message", _native.Message)
    monkeypatch.setattr(write_batch, "Message", _native.Message)
    log = CommitLog(str(tmp_path / "commitlog"), SEGMENT_BYTES, writable=True, max_message_size_bytes=1000,
                    max_queues_per_topic=4, born_host_raw=bytes(8), store_host_raw=bytes(8), record_crc=True)
    log.codec = _native
    message = _native.Message
    for topic in ("a", "b"):
        log.prepare(message(topic, b""))
    rng = random.Random(7)
    good = [message(rng.choice("ab"), rng.randbytes(rng.choice([0, 10, 1000])), queue_id=rng.randrange(4),
                    flag=rng.randrange(-5, 5), born_timestamp_ms=rng.choice([None, 5])) for _ in range(300)]
    compiled = write_batch._prepare_compiled(log, good)
    reference = write_batch._prepare_common(log, good)
    assert compiled is not None and reference is not None
    for name in ("queue_keys", "bodies", "tails"):
        assert getattr(compiled, name) == getattr(reference, name), name
    for name in ("key_ids", "queue_ids", "flags", "born_ms", "body_lengths", "body_crcs", "sizes"):
        assert np.array_equal(getattr(compiled, name), getattr(reference, name)), name
    for odd in (message("a", b"x", tags=""), message("c", b"x"), message("a", b"x" * 1001), message("a", b"x", 4),
                message("a", b"x", keys=["k k"]), message("a", bytearray(b"x")), message("a", b"x", flag=2**31),
                message("a", b"x", keys="k"), message("a", b"x", properties={"TAGS": "t"})):
        assert write_batch._prepare_compiled(log, good[:5] + [odd] + good[5:9]) is None, odd
    log.close()


def test_the_compiled_batch_prepare_numbers_many_queues_as_the_python_one(tmp_path, monkeypatch):
    """Over 64 distinct (topic, queue_id) in one batch (the compiled key table's search gives way to a dict), and
    topics equal in value but distinct str objects: the same queue_keys and key_ids as the Python columns."""
    from mqstore.commitlog import write_batch

    monkeypatch.setattr(commitlog_module, "Message", _native.Message)
    monkeypatch.setattr(write_batch, "Message", _native.Message)
    log = CommitLog(str(tmp_path / "commitlog"), SEGMENT_BYTES, writable=True, max_message_size_bytes=1000,
                    max_queues_per_topic=8, born_host_raw=bytes(8), store_host_raw=bytes(8), record_crc=False)
    log.codec = _native
    topics = [f"topic-{number}" for number in range(40)]
    for topic in topics:
        log.prepare(_native.Message(topic, b""))
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    batch = [_native.Message("".join(rng.choice(topics)), b"x" * rng.randrange(3), queue_id=rng.randrange(8))
             for _ in range(2000)]
    compiled = write_batch._prepare_compiled(log, batch)
    reference = write_batch._prepare_common(log, batch)
    assert compiled is not None and reference is not None
    assert len(reference.queue_keys) > 64
    assert compiled.queue_keys == reference.queue_keys
    assert np.array_equal(compiled.key_ids, reference.key_ids)
    assert compiled.tails == reference.tails
    log.close()


def test_the_compiled_put_results_are_the_python_ones(tmp_path, monkeypatch):
    """put_batch's PutResults from the compiled codec (one call) equal the pure-Python ones, message ids included,
    also when a batch is stored in part; they are PutResults, untracked by the cyclic GC (ints and strs only)."""
    import gc

    from mqstore.commitlog.message import PutResult, PutStatus

    results = {}
    for name, codec in CODECS.items():
        monkeypatch.setattr(native, "NATIVE", codec)
        monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
        with MessageStore.open(tmp_path / name, config(segment_size_bytes=SEGMENT_BYTES)) as store:
            assert store._commitlog.codec is codec
            made = []
            for size in (0, 100, 1000, 5000):  # rolls segments: offsets and sizes of every kind
                made += store.put_batch([Message(f"t{i % 3}", os.urandom(size), queue_id=i % 4) for i in range(40)])
            offsets = np.array([result.commitlog_offset for result in made], dtype=np.int64)
            sizes = np.array([result.size_bytes for result in made], dtype=np.int64)
            part = store._batch_results(PutStatus.FLUSH_DISK_TIMEOUT, offsets, offsets // 7, sizes, 7, 123)
            results[name] = (made, part)
    python_made, python_part = results["python"]
    native_made, native_part = results["native"]
    assert native_made == python_made
    assert native_part == python_part and len(native_part) == 7
    assert all(type(result) is PutResult for result in native_made + native_part)
    assert native_made[-1].msg_id == python_made[-1].msg_id
    assert int(native_made[-1].msg_id[16:], 16) == native_made[-1].commitlog_offset
    assert not any(gc.is_tracked(result) for result in native_made)
    assert native_part[3].status is PutStatus.FLUSH_DISK_TIMEOUT and native_part[3].store_timestamp_ms == 123


def test_compiled_put_results_start_no_collection_and_keep_the_collectors_state():
    """put_results makes a batch's PutResults with the cyclic collector held off (its collection runs at the
    caller's next allocation, once put_batch let go of the batch's Messages) and leaves it on or off as it was."""
    import gc

    from mqstore.commitlog.message import PutResult, PutStatus

    values = np.arange(1000, dtype=np.int64)
    arguments = (PutResult, PutStatus.PUT_OK, values, values, values, 1000, 1, "0A000001000004D2")
    started = []

    def note(phase, info):
        if phase == "start":
            started.append(info["generation"])

    threshold = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.callbacks.append(note)
    try:
        gc.enable()
        gc.set_threshold(10)  # a collection every few allocations, were the collector let run
        results = _native.put_results(*arguments)
        assert started == [] and gc.isenabled() and len(results) == 1000
        gc.disable()
        _native.put_results(*arguments)
        assert started == [] and not gc.isenabled()
        gc.enable()
        [[] for _ in range(20)]  # the next allocations collect as usual
        assert started
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
        (gc.enable if was_enabled else gc.disable)()


def test_compiled_put_results_check_their_arguments():
    from mqstore.commitlog.message import PutResult, PutStatus

    values = np.arange(4, dtype=np.int64)
    good = (PutResult, PutStatus.PUT_OK, values, values, values, 4, 1, "0A000001000004D2")
    assert len(_native.put_results(*good)) == 4
    for position, bad in ((0, dict), (2, values.astype(np.int32)), (5, 5), (5, -1), (7, "0A"), (7, "é" * 16)):
        arguments = list(good)
        arguments[position] = bad
        with pytest.raises((TypeError, ValueError)):
            _native.put_results(*arguments)
    with pytest.raises(ValueError):
        _native.put_results(PutResult, PutStatus.PUT_OK, -values, values, values, 4, 1, "0A000001000004D2")
