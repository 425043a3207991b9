"""SegmentAllocator: segments made ahead of need, warmed without ever writing over a record."""

from __future__ import annotations

import mmap
import os

import mqstore.flush.allocator as allocator_module
import pytest
from mqstore.commitlog import format as fmt
from mqstore.flush.allocator import SegmentAllocator

from tests.conftest import wait_until

SEGMENT_BYTES = 4 * 1024 * 1024


@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "pwrite-zeros"])
def test_a_requested_segment_is_handed_over_and_warming_never_writes_over_records(tmp_path, monkeypatch, populate):
    if not populate:
        monkeypatch.setattr(allocator_module, "_madvise", None)  # a kernel without MADV_POPULATE_WRITE
    allocator = SegmentAllocator(str(tmp_path), SEGMENT_BYTES, preallocate=True, warm=True)
    try:
        allocator.request(SEGMENT_BYTES)
        allocator.request(SEGMENT_BYTES)  # asked twice: made once
        segment = allocator.take(SEGMENT_BYTES)
        assert segment is not None and segment.base_offset == SEGMENT_BYTES
        assert os.path.getsize(tmp_path / fmt.segment_name(SEGMENT_BYTES)) == SEGMENT_BYTES
        records = [(position, os.urandom(1000)) for position in range(0, SEGMENT_BYTES, SEGMENT_BYTES // 64)]
        for position, record in records:  # written while warming may still run
            segment.view[position:position + len(record)] = record
        allocator.close()
        for position, record in records:
            assert bytes(segment.view[position:position + len(record)]) == record
        assert allocator.created_in_background == 1
        if populate:  # its first chunk is pre-faulted before the hand-over; zeros may have been stopped at once
            assert allocator.warmed_bytes > 0
        assert allocator.take(SEGMENT_BYTES) is None  # handed over already
        segment.close()
    finally:
        allocator.close()


def test_take_without_a_request_or_for_an_existing_file_returns_none(tmp_path):
    allocator = SegmentAllocator(str(tmp_path), SEGMENT_BYTES, preallocate=False, warm=False)
    try:
        assert allocator.take(0) is None
        (tmp_path / fmt.segment_name(SEGMENT_BYTES)).write_bytes(b"")
        allocator.request(SEGMENT_BYTES)
        assert allocator.take(SEGMENT_BYTES) is None  # the CommitLog maps what is there
        assert allocator.created_in_background == 0
    finally:
        allocator.close()


def test_close_leaves_segments_made_but_not_taken_on_disk(tmp_path):
    allocator = SegmentAllocator(str(tmp_path), SEGMENT_BYTES, preallocate=False, warm=False)
    allocator.request(0)
    allocator.close()
    path = tmp_path / fmt.segment_name(0)
    assert path.exists() and os.path.getsize(path) == SEGMENT_BYTES
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".creating")]


def _resident(array, start: int, end: int) -> list[bool]:
    """Whether each page of array[start:end] is in memory (mincore)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start -= start % page
    pages = (end - start + page - 1) // page
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(array.ctypes.data + start), ctypes.c_size_t(end - start), vector) == 0
    return [bool(byte & 1) for byte in vector]


def _wait_for(condition, what: str) -> None:
    assert wait_until(condition), what


@pytest.mark.skipif(allocator_module._madvise is None, reason="needs madvise")
def test_the_segment_being_written_is_pre_faulted_ahead_of_the_writer(tmp_path, monkeypatch):
    from mqstore.commitlog.mapped_file import MappedFile

    window = 1024 * 1024
    monkeypatch.setattr(allocator_module, "AHEAD_WINDOW_BYTES", window)
    segment = MappedFile.create(str(tmp_path / fmt.segment_name(0)), 0, SEGMENT_BYTES)
    written = os.urandom(100_000)
    segment.view[: len(written)] = written
    position = [segment.array, 0, len(written)]
    allocator = SegmentAllocator(str(tmp_path), SEGMENT_BYTES, preallocate=True, warm=True,
                                 writer_position=lambda: tuple(position))
    try:
        page = mmap.PAGESIZE
        ahead = -(-(len(written) + window) // page) * page  # the window, to a page boundary
        _wait_for(lambda: allocator._ahead_until >= ahead, "pre-faulting ahead of the writer")
        assert allocator._ahead_until == ahead  # not more (mincore cannot tell: page-cache read-ahead comes
        assert all(_resident(segment.array, 0, ahead))  # with the faults)
        assert allocator.warmed_ahead_bytes == ahead - (len(written) - len(written) % page)
        position[2] += 5000  # the writer moves on: the next chunk starts where the last ended
        further = -(-(position[2] + window) // page) * page
        _wait_for(lambda: allocator._ahead_until >= further, "pre-faulting further ahead")
        assert allocator._ahead_until == further > ahead
        assert allocator.warmed_ahead_bytes == allocator._ahead_until - (len(written) - len(written) % page)
        position[2] = SEGMENT_BYTES - 10_000  # the writer near the segment's end: warming stops at the end
        _wait_for(lambda: allocator._ahead_until == SEGMENT_BYTES, "pre-faulting up to the segment's end")
        assert bytes(segment.view[: len(written)]) == written  # pre-faulting wrote nothing
        assert not any(segment.array[len(written):])
    finally:
        allocator.close()
        segment.close()


def test_without_a_writer_position_nothing_is_pre_faulted_ahead(tmp_path):
    allocator = SegmentAllocator(str(tmp_path), SEGMENT_BYTES, preallocate=True, warm=True)
    try:
        allocator.request(SEGMENT_BYTES)
        assert allocator.take(SEGMENT_BYTES) is not None
    finally:
        allocator.close()
    assert allocator.warmed_ahead_bytes == 0
