"""consumequeue.mark: the dispatched mark the writer publishes and readers in other processes read."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from mqstore.commitlog.errors import StoreIOError
from mqstore.consumequeue.mark import DispatchedMark, read_mark


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


_WRITER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from mqstore.consumequeue.mark import DispatchedMark
mark = DispatchedMark(sys.argv[1])
values = (0x00FF00FF00FF00FF, 0x7F007F007F007F00)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[3])
i = 0
while time.monotonic() < end:
    mark.publish(values[i & 1])
    i += 1
mark.close()
"""


def test_a_reader_never_sees_half_an_update_from_a_writer_in_another_process(tmp_path):
    """Published in one 8-byte store, read with one 8-byte load: a reader racing the writer gets an old or a new
    value, never a mix of their bytes (which could claim more dispatched than is)."""
    path = str(tmp_path / "dispatched_offset")
    DispatchedMark(path).close()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, root, "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        seen = collections.Counter(read_mark(path) for _ in range(20_000))
    finally:
        writer.wait(timeout=30)
    assert writer.returncode == 0
    assert set(seen) <= {0, 0x00FF00FF00FF00FF, 0x7F007F007F007F00}, seen
    assert seen[0x00FF00FF00FF00FF] and seen[0x7F007F007F007F00]  # the reads did race the writer
