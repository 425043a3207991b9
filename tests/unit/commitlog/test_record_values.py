"""Two property values of a queue's records (commitlog/record_values.py), read by the compiled pass
(scan_core.c's mq_record_values) and by the Python reference: the same rows for every value shape, the same
CorruptionError for damage, and the binding's arguments checked."""

from __future__ import annotations

import numpy as np
import pytest
from mqstore.commitlog import native
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.record_values import (
    COLUMNS,
    NUMBER,
    NUMBER_OK,
    TEXT_ABSENT,
    TEXT_HASH,
    TEXT_HASHED,
    TEXT_NOT_ASCII,
    TEXT_STATE,
    read_values,
    values_of,
)

from mqstore import Message, MessageStore, StoreConfig
from mqstore.timer.format import java_string_hash

OUT, REAL = b"TIMER_OUT_MS", b"REAL_TOPIC"
TOPIC = "values"
ROUNDS = 40  # of every shape: about 140 KB of records, three 64 KiB segments
compiled = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")

# (TIMER_OUT_MS value or None, REAL_TOPIC value or None, other properties first)
SHAPES = [
    ("1700000000000", "orders", {}),
    ("0", "", {}),
    ("000000000000000000000000042", "a", {}),  # leading zeros: int() takes any number of them
    ("9223372036854775807", "b", {}),  # INT64_MAX
    ("9223372036854775808", "c", {}),  # one past: not a value the wheel can hold
    ("99999999999999999999999", "d", {}),
    ("", "e", {}),
    ("+5", "f", {}),
    ("-5", "g", {}),
    ("12a", "h", {}),
    ("１２", "i", {}),  # full-width digits: str.isdigit() says yes, bytes.isdigit() no
    (None, "only-topic", {}),
    ("77", None, {}),
    (None, None, {}),
    ("88", "caf\u00e9", {}),  # not ASCII: left to the caller
    ("99", "topic", {"XTIMER_OUT_MS": "1", "AREAL_TOPIC": "decoy"}),  # names inside other names are not pairs
    ("123", "z" * 200, {"k": "v" * 300}),
]


def _message(index: int, out, real, others) -> Message:
    properties = dict(others)
    if out is not None:
        properties["TIMER_OUT_MS"] = out
    if real is not None:
        properties["REAL_TOPIC"] = real
    return Message(TOPIC, b"body%d" % index, tags="t", keys=("k%d" % index,), properties=properties)


@pytest.fixture
def store(tmp_path):
    config = StoreConfig(segment_size_bytes=64 * 1024)  # several segments: runs stop at each end
    with MessageStore.open(str(tmp_path / "store"), config) as opened:
        for round_ in range(ROUNDS):
            for index, (out, real, others) in enumerate(SHAPES):
                opened.put(_message(round_ * 100 + index, out, real, others))
        opened.wait_dispatched(30)
        yield opened


def _units(store, first: int = 0, count: int = 10_000):
    units = store.queue_units(TOPIC, 0, first, count)
    return units["commitlog_offset"].copy(), units["size"].copy()


def _read(store, codec, offsets, sizes, first: int = 0, queue=True):
    log_ = store._commitlog
    return read_values(codec, log_.segment_at, offsets, sizes, OUT, REAL, record_crc_from=log_.record_crc_from,
                       queue=(TOPIC, 0, first) if queue else None)


def test_the_reference_row_of_each_shape():
    for out, real, others in SHAPES:
        pairs = [*others.items()] + ([("TIMER_OUT_MS", out)] if out is not None else []) + (
            [("REAL_TOPIC", real)] if real is not None else [])
        raw = b"\x02".join(f"{name}\x01{value}".encode() for name, value in pairs)
        number, ok, state, text_hash = values_of(raw, OUT, REAL)
        fits = out is not None and out.isascii() and out.isdigit() and int(out) < 1 << 63
        assert (ok, number) == ((1, int(out)) if fits else (0, 0)), out
        if real is None:
            assert (state, text_hash) == (TEXT_ABSENT, 0)
        elif real.isascii():
            assert (state, text_hash) == (TEXT_HASHED, java_string_hash(real))
        else:
            assert (state, text_hash) == (TEXT_NOT_ASCII, 0)


def test_the_python_path_gives_each_records_values(store):
    offsets, sizes = _units(store)
    rows = _read(store, None, offsets, sizes)
    assert rows.shape == (len(SHAPES) * ROUNDS, COLUMNS)
    for row, message in zip(rows.tolist(), store.get(TOPIC, 0, 0, len(rows)).messages, strict=True):
        assert tuple(row) == values_of(message.properties_raw, OUT, REAL)
    fitting = sum(out is not None and out.isascii() and out.isdigit() and int(out) < 1 << 63 for out, _, _ in SHAPES)
    assert 0 < fitting < len(SHAPES) and rows[:, NUMBER_OK].sum() == ROUNDS * fitting
    assert set(rows[:, TEXT_STATE].tolist()) == {TEXT_ABSENT, TEXT_HASHED, TEXT_NOT_ASCII}


@compiled
def test_the_compiled_pass_gives_the_references_rows_across_segments(store):
    offsets, sizes = _units(store)
    segments = {store._commitlog.segment_at(int(offset)).base_offset for offset in offsets}
    assert len(segments) > 2
    expected = _read(store, None, offsets, sizes)
    assert np.array_equal(_read(store, native.NATIVE, offsets, sizes), expected)
    for first in (1, 17, 200):  # a run that starts past the queue's first entry
        assert np.array_equal(_read(store, native.NATIVE, offsets[first:], sizes[first:], first), expected[first:])


def test_the_store_reads_a_queues_values_from_an_entry(store):
    offsets, sizes = _units(store)
    expected = _read(store, None, offsets, sizes)
    got_offsets, got_sizes, rows = store.queue_values(TOPIC, 0, 5, 50, OUT, REAL)
    assert got_offsets.tolist() == offsets[5:55].tolist() and got_sizes.tolist() == sizes[5:55].tolist()
    assert np.array_equal(rows, expected[5:55])
    assert store.queue_values(TOPIC, 0, len(offsets), 50, OUT, REAL) is None  # past the end: get() tells
    assert store.queue_values("nothing-here", 0, 0, 50, OUT, REAL) is None
    assert rows[:, NUMBER].dtype == np.int64 and rows[:, TEXT_HASH].dtype == np.int64


@pytest.fixture(params=["python", "compiled"])
def codec(request):
    """The codec read_values is given: None (the Python path) or the compiled core."""
    if request.param == "compiled" and native.NATIVE is None:
        pytest.skip("MQSTORE_NATIVE=0: only the pure-Python codec is there")
    return native.NATIVE if request.param == "compiled" else None


def test_a_damaged_record_raises_the_same_corruption_error(store, codec):
    offsets, sizes = _units(store)
    target = int(offsets[30])
    segment = store._commitlog.segment_at(target)
    position = target - segment.base_offset + 90  # inside the body
    segment.array[position] ^= 0xFF
    with pytest.raises(CorruptionError) as raised:
        _read(store, codec, offsets, sizes)
    with pytest.raises(CorruptionError) as reference:
        store._commitlog.read_many(offsets.tolist(), sizes.tolist(), (TOPIC, 0, range(len(offsets))))
    assert str(raised.value) == str(reference.value)
    assert raised.value.path == segment.path


def test_a_record_that_is_not_its_entry_or_not_its_size_is_refused(store, codec):
    offsets, sizes = _units(store)
    with pytest.raises(CorruptionError):
        _read(store, codec, offsets[3:6], sizes[3:6], first=4)  # the entries are 3..5
    bad_sizes = sizes.copy()
    bad_sizes[2] += 1
    with pytest.raises(CorruptionError):
        _read(store, codec, offsets[:5], bad_sizes[:5])
    rows = _read(store, codec, offsets[3:6], sizes[3:6], first=4, queue=False)  # no queue: only the records
    assert rows.shape == (3, COLUMNS)


@compiled
def test_the_binding_checks_its_arguments_and_stops_at_what_is_outside_its_buffer():
    codec = native.NATIVE
    buffer = bytes(4096)
    offsets = np.array([0, 100, -1, 1 << 62], dtype=np.int64)
    sizes = np.array([200, 200, 200, 200], dtype=np.int64)
    out = np.zeros((4, COLUMNS), dtype=np.int64)
    # zero bytes are no record: the pass stops at the first, having written nothing
    assert codec.record_values(buffer, 0, offsets, sizes, 0, -1, None, 0, 0, OUT, REAL, out) == 0
    for offset in (-(1 << 63), 4096, 1 << 62, (1 << 63) - 1):  # outside the segment, or no subtraction fits
        one = np.array([offset], dtype=np.int64)
        assert codec.record_values(buffer, 1 << 62, one, sizes[:1], 0, -1, None, 0, 0, OUT, REAL, out) == 0
        assert codec.record_values(buffer, -(1 << 62), one, sizes[:1], 0, -1, None, 0, 0, OUT, REAL, out) == 0
    huge = np.array([0x7FFFFFFF], dtype=np.int64)
    assert codec.record_values(buffer, 0, offsets[:1], huge, 0, -1, None, 0, 0, OUT, REAL, out) == 0
    assert not out.any()
    with pytest.raises(TypeError):
        codec.record_values(buffer, 0, offsets.astype(np.int32), sizes, 0, -1, None, 0, 0, OUT, REAL, out)
    with pytest.raises(ValueError):
        codec.record_values(buffer, 0, offsets, sizes, 0, -1, None, 0, 0, OUT, REAL, out[:3])
    with pytest.raises(ValueError):
        codec.record_values(buffer, 0, offsets, sizes, 5, -1, None, 0, 0, OUT, REAL, out)
    with pytest.raises(ValueError):
        codec.record_values(buffer, 0, offsets, sizes[:3], 0, -1, None, 0, 0, OUT, REAL, out)
    with pytest.raises(TypeError):
        codec.record_values(buffer, 0, offsets, sizes, 0, -1, "topic", 0, 0, OUT, REAL, out)
    with pytest.raises(BufferError):  # a read-only out
        codec.record_values(buffer, 0, offsets, sizes, 0, -1, None, 0, 0, OUT, REAL, bytes(1024))
