"""MappedFile: created whole and zeroed, never over an existing file, size checked on open, closed is closed."""

from __future__ import annotations

import os

import pytest

from commitlog.errors import CorruptionError, StoreClosedError, StoreIOError
from commitlog.mapped_file import MappedFile


@pytest.mark.parametrize("preallocate", [True, False])
def test_create_makes_a_zeroed_file_of_the_full_size(tmp_path, preallocate):
    path = str(tmp_path / "f")
    mapped = MappedFile.create(path, 4096, 8192, preallocate=preallocate)
    assert os.path.getsize(path) == 8192 and mapped.base_offset == 4096 and mapped.writable
    assert bytes(mapped.view[:16]) == bytes(16)
    mapped.view[10:15] = b"hello"
    mapped.flush(0, 20)
    mapped.close()
    with open(path, "rb") as handle:
        assert handle.read()[10:15] == b"hello"


def test_create_refuses_an_existing_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"keep me")
    with pytest.raises(StoreIOError):
        MappedFile.create(str(path), 0, 4096)
    assert path.read_bytes() == b"keep me"


def test_open_checks_the_size(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(100))
    with pytest.raises(CorruptionError) as raised:
        MappedFile.open(str(path), 0, 4096, writable=False)
    assert raised.value.path == str(path)


def test_open_of_a_missing_file_is_an_io_error(tmp_path):
    with pytest.raises(StoreIOError):
        MappedFile.open(str(tmp_path / "missing"), 0, 4096, writable=False)


def test_read_only_mapping_refuses_writes_and_flush_is_a_no_op(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc" + bytes(4093))
    mapped = MappedFile.open(str(path), 0, 4096, writable=False)
    assert bytes(mapped.view[:3]) == b"abc"
    with pytest.raises(TypeError):
        mapped.view[0:1] = b"x"
    mapped.flush()
    mapped.close()


def test_closed_file_refuses_flush_and_close_is_idempotent(tmp_path):
    mapped = MappedFile.create(str(tmp_path / "f"), 0, 4096)
    mapped.close()
    mapped.close()
    assert mapped.closed and mapped.view is None
    with pytest.raises(StoreClosedError):
        mapped.flush()


def test_delete_removes_the_file(tmp_path):
    mapped = MappedFile.create(str(tmp_path / "f"), 0, 4096)
    mapped.delete()
    assert not (tmp_path / "f").exists() and mapped.closed
