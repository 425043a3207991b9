"""The get path's compiled helpers (commitlog/csrc/read_path.c) against their pure-Python references: a
StoredMessage's TAGS and KEYS from any raw properties, a ConsumeQueue's units as lists, and the stat of the log's
directory a reader makes on every get."""

from __future__ import annotations

import errno
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqstore.commitlog import _native  # built by the package's install; MQSTORE_NATIVE=0 only changes the default
from mqstore.commitlog import format as fmt
from mqstore.commitlog import message as message_module
from mqstore.commitlog import segments as segments_module
from mqstore.commitlog.message import StoredMessage, decode_message
from mqstore.consumequeue import format as cqf

from tests.native import hostile

# Pieces that make property bytes interesting: names, both separators, spaces, UTF-8 and broken UTF-8.
_PIECES = st.sampled_from([b"TAGS", b"KEYS", b"\x01", b"\x02", b" ", b"  ", b"a", b"key-1", b"TAG", b"S\x01",
                           b"KEYS\x01", b"TAGS\x01", b"\xc3\xa4", b"\xe2\x98", b"\xff", b"\x80", b"\xe2 \x82",
                           b"UNIQ_KEY\x01ABC", b"\x00"])
_RAW = st.one_of(st.binary(max_size=40), st.lists(_PIECES, max_size=14).map(b"".join))


def _message(raw: bytes) -> StoredMessage:
    return tuple.__new__(StoredMessage, (0,) * 15 + (b"", "t", raw))


@settings(max_examples=3000, deadline=None)
@given(_RAW)
def test_tags_and_keys_are_the_python_references_for_any_bytes(raw):
    message = _message(raw)
    assert _native.stored_tags(message) == message_module.stored_tags(message)
    assert _native.stored_keys(message) == message_module.stored_keys(message)


@pytest.mark.parametrize("raw, tags, keys", [
    (b"", None, ()),
    (b"TAGS\x01a\x02KEYS\x01k1 k2\x02", "a", ("k1", "k2")),
    (b"XTAGS\x01no\x02TAGS\x01yes", "yes", ()),  # a name must start an item
    (b"KEYS\x01\x02TAGS\x01", "", ()),  # empty values
    (b"KEYS\x01 a  b \x02KEYS\x01c", None, ("a", "b")),  # the first one counts; empty words are left out
    (b"TAGS\x01\xff\xc3", "\ufffd\ufffd", ()),  # UTF-8 errors replaced
    (b"TAGS", None, ()),
    (b"KEYS\x01\xe2 \x82\x02", None, ("\ufffd", "\ufffd")),
])
def test_tags_and_keys_of_chosen_properties(raw, tags, keys):
    message = _message(raw)
    for read_tags, read_keys in ((_native.stored_tags, _native.stored_keys),
                                 (message_module.stored_tags, message_module.stored_keys)):
        assert read_tags(message) == tags
        assert read_keys(message) == keys
    assert message.tags == tags and message.keys == keys


def test_tags_and_keys_refuse_what_is_not_a_stored_message():
    for bad in ((), (0,) * 17, (0,) * 17 + ("text",), None):
        with pytest.raises(TypeError):
            _native.stored_tags(bad)
        with pytest.raises(TypeError):
            _native.stored_keys(bad)


def test_stored_fields_are_read_only_descriptors_of_the_stored_message():
    """StoredMessage.tags and .keys as compiled descriptors (StoredField): read through the instance as the
    functions read; the class gets the descriptor with its doc; no set, no delete; hostile instances refused."""
    field = _native.StoredField("tags", "the doc")
    assert field.__doc__ == "the doc" and field.name == "tags"

    class Holder(tuple):
        __slots__ = ()
        tags = _native.StoredField("tags")
        keys = _native.StoredField("keys")

    holder = tuple.__new__(Holder, (0,) * 15 + (b"", "t", b"TAGS\x01a\x02KEYS\x01k1 \xff\x02"))
    assert (holder.tags, holder.keys) == ("a", ("k1", "\ufffd"))
    assert isinstance(Holder.tags, _native.StoredField)
    with pytest.raises(AttributeError):
        holder.tags = "b"
    with pytest.raises(AttributeError):
        del holder.keys
    for bad in (tuple.__new__(Holder, ()), tuple.__new__(Holder, (0,) * 17 + ("text",))):
        with pytest.raises(TypeError):
            getattr(bad, "tags")  # noqa: B009
        with pytest.raises(TypeError):
            getattr(bad, "keys")  # noqa: B009
    for name, error in (("body", ValueError), ("", ValueError), (5, TypeError), (b"tags", TypeError)):
        with pytest.raises(error):
            _native.StoredField(name)


def test_stored_message_fields_read_the_tuple_items():
    """The fields StoredMessage reads by position (collections' C descriptor, or a property of itemgetter)."""
    message = tuple.__new__(StoredMessage, tuple(range(15)) + (b"body", "topic", b"TAGS\x01t"))
    assert (message.size_bytes, message.queue_id, message.queue_offset, message.commitlog_offset) == (0, 3, 5, 6)
    assert (message.body, message.topic, message.properties_raw, message.tags) == (b"body", "topic", b"TAGS\x01t", "t")
    with pytest.raises(AttributeError):
        message.body = b"other"
    with pytest.raises(IndexError):
        getattr(tuple.__new__(StoredMessage, (1, 2)), "body")  # noqa: B009


def _units(offsets, sizes) -> bytearray:
    units = cqf.make_units(offsets, sizes, np.zeros(len(offsets), dtype=np.int64))
    return bytearray(units.tobytes())


def test_queue_lists_gives_the_units_as_lists_with_their_least_and_greatest_offset():
    rng = np.random.default_rng(7)
    offsets = rng.integers(0, 2**62, 50)
    sizes = rng.integers(1, 2**31 - 1, 50)
    buffer = _units(offsets, sizes)
    for first, count in ((0, 1), (0, 50), (3, 7), (49, 1)):
        expected = offsets[first : first + count].tolist()
        assert _native.queue_lists(buffer, first, count) == (
            expected, sizes[first : first + count].tolist(), min(expected), max(expected))


@pytest.mark.parametrize("offset, size", [(-1, 10), (0, 0), (5, -1), (-(2**63), 2**31 - 1)])
def test_queue_lists_hands_back_a_run_with_an_invalid_unit(offset, size):
    buffer = _units([100, offset, 300], [10, size, 10])
    assert _native.queue_lists(buffer, 0, 3) is None
    assert _native.queue_lists(buffer, 1, 1) is None
    assert _native.queue_lists(buffer, 2, 1) == ([300], [10], 300, 300)


@pytest.mark.parametrize("first, count", [(-1, 1), (0, 0), (0, 4), (3, 1), (2, 2), (2**62, 2**62)])
def test_queue_lists_refuses_units_outside_the_buffer(first, count):
    with pytest.raises(ValueError):
        _native.queue_lists(_units([1, 2, 3], [1, 1, 1]), first, count)


@pytest.mark.parametrize("mtime_ns", [None, 0, 1_795_853_922_955_754_395, 11_000_000_000_000_000_000,
                                      -2_147_483_648_000_000_000, 2**63 - 1])
def test_directory_stamp_is_os_stats_mtime_and_inode(tmp_path, mtime_ns):
    """A read-only store's get stats the log's directory every time (segments.load_if_changed); the compiled stat
    gives os.stat's st_mtime_ns and st_ino, times beyond int64 nanoseconds included."""
    if mtime_ns is not None:
        os.utime(tmp_path, ns=(mtime_ns, mtime_ns))
    path = os.fsencode(tmp_path)
    assert _native.directory_stamp(path) == segments_module._stat_stamp(path)
    (tmp_path / "00000000000000000000").write_bytes(b"")  # a new file moves the directory's mtime
    assert _native.directory_stamp(path) == segments_module._stat_stamp(path)


def test_directory_stamp_raises_as_os_stat_does(tmp_path):
    missing = os.fsencode(tmp_path / "gone")
    with pytest.raises(FileNotFoundError) as raised:
        _native.directory_stamp(missing)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOENT, missing)
    with pytest.raises(TypeError):
        _native.directory_stamp(str(tmp_path))  # bytes only: the caller encodes its path once
    with pytest.raises(ValueError):
        _native.directory_stamp(os.fsencode(tmp_path) + b"\0x")


def test_decode_run_gives_each_message_its_own_timestamps_when_they_repeat_and_change():
    """decode_run keeps the last timestamp's int for the next message (a batch is mostly born in one millisecond):
    each message still has its own record's born and store times, as decode_message reads them."""
    times = [(5, 5), (5, 5), (5, 6), (6, 5), (7, 7), (7, 9), (9, 9), (2**62, 2**62), (2**62, 5), (-1, -1), (0, 0),
             (0, 2**63 - 1)]
    data = bytearray()
    positions = []
    for number, (born, stored) in enumerate(times):
        positions.append(len(data))
        record = bytearray(hostile.valid_record(len(data), bytes([number]) * 3))
        struct.pack_into(">q", record, fmt.OFFSET_BORN_TIMESTAMP, born)
        struct.pack_into(">q", record, fmt.OFFSET_STORE_TIMESTAMP, stored)
        data += record
    sizes = [int.from_bytes(data[position : position + 4], "big") for position in positions]
    messages: list = []
    done = _native.decode_run(bytes(data), 0, list(positions), sizes, 0, -1, None, None, 0, None, messages,
                              StoredMessage)
    assert done == len(times)
    expected = [decode_message(data, position, len(data) - position, position, check_crc=True)
                for position in positions]
    assert messages == expected
    assert [(m.born_timestamp_ms, m.store_timestamp_ms) for m in messages] == times
