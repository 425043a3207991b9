"""SegmentList: contiguous segments named by base offset, O(1) lookup, foreign files ignored."""

from __future__ import annotations

import pytest
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.segments import SegmentList

SIZE = 4096


def _touch(directory, base: int, size: int = SIZE) -> None:
    (directory / f"{base:020d}").write_bytes(bytes(size))


def test_create_and_lookup_by_offset(tmp_path):
    segments = SegmentList(str(tmp_path), SIZE, writable=True, preallocate=False)
    assert segments.segment_at(0) is None and segments.last() is None and segments.first_base_offset == 0
    first, second = segments.create(0), segments.create(SIZE)
    assert segments.segment_at(0) is first and segments.segment_at(SIZE - 1) is first
    assert segments.segment_at(SIZE) is second and segments.segment_at(2 * SIZE - 1) is second
    assert segments.segment_at(2 * SIZE) is None and segments.segment_at(-1) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000000", "00000000000000004096"]
    segments.close()
    assert first.closed and segments.segments == []


def test_load_maps_existing_segments_in_order_and_skips_foreign_files(tmp_path):
    for base in (2 * SIZE, SIZE, 3 * SIZE):
        _touch(tmp_path, base)
    (tmp_path / "00000000000000008192.tmp").write_bytes(b"x")
    (tmp_path / "notes.txt").write_bytes(b"x")
    segments = SegmentList(str(tmp_path), SIZE, writable=False)
    assert [s.base_offset for s in segments.segments] == [SIZE, 2 * SIZE, 3 * SIZE]
    assert segments.first_base_offset == SIZE and segments.segment_at(SIZE + 5).base_offset == SIZE
    assert segments.segment_at(0) is None


def test_load_again_picks_up_new_segments(tmp_path):
    _touch(tmp_path, 0)
    segments = SegmentList(str(tmp_path), SIZE, writable=False)
    _touch(tmp_path, SIZE)
    assert segments.segment_at(SIZE) is None
    segments.load()
    assert segments.segment_at(SIZE).base_offset == SIZE


def test_a_gap_between_segments_is_corruption(tmp_path):
    _touch(tmp_path, 0)
    _touch(tmp_path, 2 * SIZE)
    with pytest.raises(CorruptionError):
        SegmentList(str(tmp_path), SIZE, writable=False)


def test_a_base_offset_off_the_segment_grid_is_corruption(tmp_path):
    _touch(tmp_path, 100)
    with pytest.raises(CorruptionError) as raised:
        SegmentList(str(tmp_path), SIZE, writable=False)
    assert raised.value.path.endswith("00000000000000000100")


def test_a_segment_of_the_wrong_size_is_corruption(tmp_path):
    _touch(tmp_path, 0, SIZE - 1)
    with pytest.raises(CorruptionError):
        SegmentList(str(tmp_path), SIZE, writable=False)


def test_an_empty_last_segment_is_removed_by_a_writer_and_skipped_by_a_reader(tmp_path):
    """What RocketMQ's writer leaves when killed between creating its next segment file and sizing it."""
    _touch(tmp_path, 0)
    _touch(tmp_path, SIZE, 0)
    reader = SegmentList(str(tmp_path), SIZE, writable=False)
    assert [s.base_offset for s in reader.segments] == [0]
    reader.close()
    writer = SegmentList(str(tmp_path), SIZE, writable=True, preallocate=False)
    assert [s.base_offset for s in writer.segments] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000000"]
    assert writer.create(SIZE).size_bytes == SIZE
    writer.close()


def test_an_empty_segment_before_the_last_is_corruption(tmp_path):
    _touch(tmp_path, 0, 0)
    _touch(tmp_path, SIZE)
    with pytest.raises(CorruptionError):
        SegmentList(str(tmp_path), SIZE, writable=True, preallocate=False)


def _age(directory, seconds: float) -> None:
    """Set the directory's mtime `seconds` into the past (as if nothing had changed in it since)."""
    import os
    import time

    then = time.time_ns() - int(seconds * 1e9)
    os.utime(directory, ns=(then, then))


def test_load_if_changed_lists_only_a_directory_that_changed(tmp_path, monkeypatch):
    import os

    import mqstore.commitlog.segments as segments_module

    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(segments_module.os, "listdir", lambda path: listings.append(path) or real_listdir(path))
    _touch(tmp_path, 0)
    reader = SegmentList(str(tmp_path), SIZE, writable=False)
    assert len(listings) == 1
    reader.load_if_changed()  # changed a moment ago: listed (a second change may not move the mtime)
    assert len(listings) == 2
    _age(tmp_path, 10)
    reader.load_if_changed()  # listed: the mtime is not the one of the last listing
    reader.load_if_changed()  # unchanged and old: not listed
    reader.load_if_changed()
    assert len(listings) == 3
    _touch(tmp_path, SIZE)  # a new segment moves the mtime
    reader.load_if_changed()
    assert len(listings) == 4 and [s.base_offset for s in reader.segments] == [0, SIZE]
    _age(tmp_path, 10)
    reader.load_if_changed()
    (tmp_path / f"{0:020d}").unlink()  # retention removes the first
    reader.load_if_changed()
    assert [s.base_offset for s in reader.segments] == [SIZE]
    _age(tmp_path, 10)
    reader.load_if_changed()
    count = len(listings)
    _touch(tmp_path, 2 * SIZE, size=0)  # a writer still making its last file: the listing is incomplete
    _age(tmp_path, 10)
    reader.load_if_changed()
    reader.load_if_changed()  # so it is listed again though nothing moved
    assert len(listings) == count + 2 and [s.base_offset for s in reader.segments] == [SIZE]
    (tmp_path / f"{2 * SIZE:020d}").write_bytes(bytes(SIZE))
    _age(tmp_path, 10)
    reader.load_if_changed()
    assert [s.base_offset for s in reader.segments] == [SIZE, 2 * SIZE]
    reader.close()
