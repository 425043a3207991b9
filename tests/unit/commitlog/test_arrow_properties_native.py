"""The compiled Arrow decoder's properties pass (commitlog/csrc/arrow_core.c: read_properties and the pair copy
of mq_arrow_fill, eight bytes a step) against the Python decoder: for any property bytes, the same rows, or the
same answer that the record is not the common kind (then the Python decoder gives its rows or its error)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqstore.commitlog import _native, arrow_decode  # _native is built by the install, whatever MQSTORE_NATIVE says
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError

from mqstore.store.scan import SCAN_SCHEMA, row_filter
from tests.spark.storegen import encode_record

# Pieces that move separators across the 8-byte words the compiled search reads: names, both separators, zeros
# (text, not separators), bytes just above them, non-ASCII, runs longer than a word.
_PIECES = st.sampled_from([b"TAGS", b"KEYS", b"\x01", b"\x02", b"\x00", b"\x03", b" ", b"a", b"k1 k2", b"TAGS\x01",
                           b"KEYS\x01", b"\x02KEYS\x01", b"0123456789abcdef", b"\x80", b"\xc3\xa4", b"\x7f"])
_RAW = st.one_of(st.binary(max_size=48), st.lists(_PIECES, max_size=16).map(b"".join),
                 st.lists(st.tuples(st.lists(_PIECES.filter(lambda p: not set(p) & {1, 2}), max_size=3),
                                    st.lists(_PIECES.filter(lambda p: not set(p) & {1, 2}), max_size=4)), max_size=6)
                 .map(lambda pairs: b"".join(b"".join(n) + b"\x01" + b"".join(v) + b"\x02" for n, v in pairs)))


def _segment(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """A buffer of one record a property string (padded as a scan's buffers are) and the records' positions."""
    parts, positions, at = [], [], 0
    for index, raw in enumerate(raws):
        record = encode_record(commitlog_offset=at, topic="t", body=bytes([index]) * 3, queue_id=0,
                               queue_offset=index, properties={}, born_timestamp_ms=1, store_timestamp_ms=2)
        record = record[:-2] + fmt.I16.pack(len(raw)) + raw  # no properties, then these bytes
        record = fmt.I32.pack(len(record)) + record[4:]
        parts.append(record)
        positions.append(at)
        at += len(record)
    buf = np.frombuffer(b"".join(parts) + bytes(arrow_decode.BUFFER_PAD_BYTES), dtype=np.uint8)
    return buf, np.array(positions, dtype=np.int64)


def _outcome(monkeypatch, native, buf, positions, expect_sizes=None):
    monkeypatch.setattr(arrow_decode, "NATIVE", native)
    decoder = arrow_decode.Decoder(SCAN_SCHEMA, row_filter(), None)
    try:
        batches = list(decoder.decode(buf, positions, positions, np.full(len(positions), 1 << 30), "segment",
                                      expect_topic=None if expect_sizes is None else "t", expect_sizes=expect_sizes))
    except CorruptionError as exc:
        return (str(exc), exc.offset, exc.rule)
    return [batch.to_pylist() for batch in batches]


@settings(max_examples=400, deadline=None)
@given(st.lists(_RAW, min_size=1, max_size=4))
def test_any_property_bytes_give_the_python_decoders_rows(raws):
    buf, positions = _segment(raws)
    with pytest.MonkeyPatch.context() as patch:
        expected = _outcome(patch, None, buf, positions)
    with pytest.MonkeyPatch.context() as patch:
        assert _outcome(patch, _native, buf, positions) == expected


@pytest.mark.parametrize("raw", [
    b"", b"a\x01b\x02", b"TAGS\x01A\x02KEYS\x01k1 k2\x02UNIQ_KEY\x010123456789ABCDEF0123456789ABCDEF\x02",
    b"n\x00\x00\x00\x00\x00\x00\x00\x01v\x00\x02", b"\x01\x02\x01\x02", b"0123456789abcdefghij\x0101234567\x02",
])
def test_common_properties_are_decoded_in_c(raw):
    """The cases above are the compiled decoder's: it answers with buffers, not with 'use the Python decoder'."""
    buf, positions = _segment([raw, raw])
    found = _native.arrow_columns(buf, positions, positions, None, None, None, None, None, None, None, None, None)
    assert found is not None and found[0] == 2
    assert found[3] == 2 * raw.count(b"\x02")  # the pairs, each copied


# The passes prefetch the record 6 on (arrow_core.c's PREFETCH_RECORDS), by the size its ConsumeQueue unit gives on
# a topic scan: runs longer than that, with hostile sizes among them, still give the Python decoder's rows or error.
_HOSTILE_SIZES = st.sampled_from([-1, 0, 1, 0x7FFFFFFF, -0x80000000, 1 << 20, 300, 4096])


@settings(max_examples=150, deadline=None)
@given(st.lists(_RAW, min_size=13, max_size=24), st.dictionaries(st.integers(0, 23), _HOSTILE_SIZES, max_size=3),
       st.booleans())
def test_hostile_sizes_ahead_of_the_decoded_record(raws, sizes, in_units):
    """The sizes in the records' TOTALSIZE, or in the ConsumeQueue units (which the measure pass prefetches by)."""
    buf, positions = _segment(raws)
    data = bytearray(buf.tobytes())
    units = arrow_decode.big_endian_ints(buf, positions, 4, ">i4")
    for index, size in sizes.items():
        if index < len(positions) and in_units:
            units[index] = size
        elif index < len(positions):
            fmt.I32.pack_into(data, int(positions[index]), size)
    buf = np.frombuffer(bytes(data), dtype=np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        expected = _outcome(patch, None, buf, positions, units if in_units else None)
    with pytest.MonkeyPatch.context() as patch:
        assert _outcome(patch, _native, buf, positions, units if in_units else None) == expected


def test_positions_past_the_buffer_are_left_to_python():
    """A ConsumeQueue unit may name any place: positions near or past the buffer's end, or negative, some of them
    only read ahead for prefetching, give 'use the Python decoder' or rows, never a read outside the buffer."""
    buf, positions = _segment([b"a\x01b\x02"] * 16)
    for bad in (len(buf) - 3, len(buf), len(buf) + 10_000, -1, -(1 << 40)):
        for at in (6, 12, 15):
            moved = positions.copy()
            moved[at] = bad
            assert _native.arrow_columns(buf, moved, moved, None, None, None, None, None, None, None, None,
                                         None) is None
    found = _native.arrow_columns(buf, positions, positions, None, None, None, None, None, None, None, None, None)
    assert found is not None and found[0] == 16
