"""consumequeue.mark: the dispatched mark the writer publishes and readers in other processes read."""

from __future__ import annotations

import os

import pytest

from commitlog.errors import StoreIOError
from consumequeue.mark import DispatchedMark, read_mark


def test_a_published_offset_is_what_a_reader_reads_at_once(tmp_path):
    path = str(tmp_path / "dispatched_offset")
    mark = DispatchedMark(path)
    try:
        assert read_mark(path) == 0  # a new mark says "nothing known"
        for offset in (1, 4096, 2**40 + 7):
            mark.publish(offset)
            assert read_mark(path) == offset  # no flush, no close: the reader sees the page cache
    finally:
        mark.close()
    assert os.path.getsize(path) == 8


def test_an_old_mark_is_overwritten_in_place_and_removed_at_a_clean_close(tmp_path):
    path = tmp_path / "dispatched_offset"
    path.write_bytes(b"\x00" * 7 + b"\x09" + b"trailing")
    mark = DispatchedMark(str(path))
    assert read_mark(str(path)) == 9
    mark.publish(12)
    assert path.read_bytes() == (12).to_bytes(8, "big") + b"trailing"
    mark.remove()
    assert not path.exists() and read_mark(str(path)) is None


def test_a_mark_that_cannot_be_opened_is_a_store_io_error(tmp_path):
    with pytest.raises(StoreIOError, match="cannot open the dispatched mark"):
        DispatchedMark(str(tmp_path / "missing-directory" / "dispatched_offset"))
