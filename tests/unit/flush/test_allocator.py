"""SegmentAllocator: segments made ahead of need, warmed without ever writing over a record."""

from __future__ import annotations

import os

import pytest

import flush.allocator as allocator_module
from commitlog import format as fmt
from flush.allocator import SegmentAllocator

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
