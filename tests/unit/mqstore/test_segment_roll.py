"""Small segments: each ends in a blank covering exactly the bytes left, no record straddles, reads cross them."""

from __future__ import annotations

import os
import struct

import pytest

from mqstore import GetStatus, Message, MessageStore
from tests.conftest import wait_until
from tests.unit.commitlog import handmade
from tests.unit.mqstore.conftest import config

pytestmark = pytest.mark.usefixtures("codec")  # each test with the Python and the compiled codec

SEGMENT_SIZE = config().segment_size_bytes


def _walk_segment(data: bytes, base: int):
    """(record offsets, blank offset or None) of one segment, following TOTALSIZE by hand."""
    offsets, pos = [], 0
    while pos + 8 <= len(data):
        size, magic = struct.unpack_from(">iI", data, pos)
        if magic == handmade.MAGIC_BLANK:
            return offsets, base + pos
        if size == 0 and magic == 0:
            return offsets, None
        assert magic == handmade.MAGIC_V1 and pos + size <= len(data)
        assert struct.unpack_from(">q", data, pos + handmade.AT_PHYSICAL_OFFSET)[0] == base + pos
        offsets.append(base + pos)
        pos += size
    return offsets, None


def test_segments_end_in_blanks_and_records_never_straddle(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        results = [store.put(Message("roll", bytes([i % 256]) * (i * 97 % 5000), queue_id=i % 2))
                   for i in range(300)]
        assert store.wait_dispatched(30)
    names = sorted(path.name for path in (store_dir / "commitlog").iterdir())
    assert len(names) > 5
    assert names == [f"{i * SEGMENT_SIZE:020d}" for i in range(len(names))]
    data_by_name = {name: (store_dir / "commitlog" / name).read_bytes() for name in names}
    assert all(len(data) == SEGMENT_SIZE for data in data_by_name.values())
    # at most one segment made ahead of need, after the data, holding nothing yet
    with_data = [name for name in names if data_by_name[name][:8] != bytes(8)]
    ahead = names[len(with_data):]
    assert names[: len(with_data)] == with_data and len(ahead) <= 1
    assert all(data_by_name[name] == bytes(SEGMENT_SIZE) for name in ahead)
    walked = []
    for index, name in enumerate(with_data):
        data, base = data_by_name[name], int(name)
        offsets, blank_at = _walk_segment(data, base)
        walked += offsets
        if index < len(with_data) - 1:
            assert blank_at is not None
            pos = blank_at - base
            assert struct.unpack_from(">iI", data, pos) == (SEGMENT_SIZE - pos, 0xCBD43194)
            assert data[pos + 8 :] == bytes(SEGMENT_SIZE - pos - 8)
        else:
            assert blank_at is None
    assert walked == [r.commitlog_offset for r in results]
    for result in results:
        assert result.commitlog_offset // SEGMENT_SIZE == (result.commitlog_offset + result.size_bytes - 1) \
            // SEGMENT_SIZE


def test_gets_cross_segment_boundaries(store):
    results = [store.put(Message("cross", b"%05d" % i + b"x" * 3000)) for i in range(100)]
    assert store.wait_dispatched(30)
    assert len({r.commitlog_offset // SEGMENT_SIZE for r in results}) > 3
    got = store.get("cross", 0, 0, max_count=100)
    assert got.status is GetStatus.FOUND and got.next_offset == 100
    assert [m.body[:5] for m in got.messages] == [b"%05d" % i for i in range(100)]
    assert [m.commitlog_offset for m in got.messages] == [r.commitlog_offset for r in results]


def test_reopen_continues_in_the_last_segment_and_rolls_from_there(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        for _ in range(30):
            store.put(Message("t", b"a" * 3000))
        end = store.stats()["commitlog"]["max_offset"]
    with MessageStore.open(store_dir, config()) as store:
        results = [store.put(Message("t", b"b" * 3000)) for _ in range(30)]
        assert results[0].commitlog_offset == end
        assert store.wait_dispatched(30)
        assert [m.body[:1] for m in store.get("t", 0, 0, max_count=60).messages] == [b"a"] * 30 + [b"b"] * 30


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads the kernel's mapping flags")
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_without_write_fault_readahead_only_the_segment_being_written_is_advised_for_random_access(store_dir, warm):
    """write_fault_readahead=False: MADV_RANDOM on the segment appends go to (no 8 MiB read-around in a put's
    page fault), and readahead back on every segment the writer left; made ahead of need, advised at once."""
    from tests.conftest import mapping_vm_flags

    def random_access() -> list[bool]:
        return ["rr" in mapping_vm_flags(segment.array) for segment in store._commitlog.segments.segments]

    def wait_for(expected: list[bool]) -> None:  # segments left are advised back by the allocator's thread
        assert wait_until(lambda: random_access() == expected), (random_access(), expected)

    with MessageStore.open(store_dir, config(warm_segments=warm)) as store:  # the default: never advised
        for _ in range(200):
            store.put(Message("advice", bytes(1000)))
        assert len(store._commitlog.segments.segments) > 3 and not any(random_access())
    settings = config(warm_segments=warm, write_fault_readahead=False)
    with MessageStore.open(store_dir / "random", settings) as store:
        store.put(Message("advice", b"first"))
        assert random_access()[0]
        for _ in range(200):
            store.put(Message("advice", bytes(1000)))
        segments = store._commitlog.segments.segments
        current = store._commitlog.segment_at(store._commitlog.readable_end()).base_offset
        assert len(segments) > 3
        wait_for([segment.base_offset >= current for segment in segments])  # and the one made ahead
    with MessageStore.open(store_dir / "random", settings) as store:  # reopened: the last segment takes them
        assert not any(random_access())
        store.put(Message("advice", b"again"))
        current = store._commitlog.segment_at(store._commitlog.readable_end()).base_offset
        assert random_access() == [segment.base_offset == current for segment in store._commitlog.segments.segments]
    with MessageStore.open(store_dir / "random", settings, read_only=True) as reader:
        store = reader
        assert not any(random_access())
