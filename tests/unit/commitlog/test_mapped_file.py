"""MappedFile: created whole and zeroed, never over an existing file, size checked on open, closed is closed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, StoreClosedError, StoreIOError
from mqstore.commitlog.mapped_file import MappedFile, create_unnamed, link_into_place


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


_READ_AFTER_CLOSE = r"""
import sys
import numpy as np
from mqstore.commitlog.mapped_file import MappedFile
path, hold = sys.argv[1], sys.argv[2]
mapped = MappedFile.create(path, 0, 1 << 16)
mapped.view[100:105] = b"hello"
held = {"memoryview": lambda: mapped.view, "array": lambda: mapped.array,
        "numpy view": lambda: mapped.array.view(np.ndarray)[96:112].view(">u4")}[hold]()
mapped.close()
data = bytes(memoryview(held)[100:105]) if hold != "numpy view" else held.tobytes()[4:9]
print(data.decode())
"""


@pytest.mark.parametrize("hold", ["memoryview", "array", "numpy view"])
def test_a_view_held_across_close_stays_readable(tmp_path, hold):
    # The mapping must outlive close() while a view of it exists (a reader in another thread, a batch that looks
    # up properties later): numpy holds no buffer export of the mmap, so closing it under a view would leave the
    # view over unmapped memory and the next read would crash the process. Run apart so a crash fails the test.
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", _READ_AFTER_CLOSE, str(tmp_path / "f"), hold], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello"


def test_close_unmaps_at_once_when_nothing_else_refers_to_the_mapping(tmp_path):
    mapped = MappedFile.create(str(tmp_path / "f"), 0, 1 << 16)
    mapping = mapped.array._mmap
    del mapping  # only the MappedFile refers to it now
    before = len(os.listdir("/proc/self/fd"))
    mapped.close()
    assert len(os.listdir("/proc/self/fd")) == before - 2  # the file's descriptor and the mapping's own


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads the kernel's mapping flags")
def test_advise_appending_switches_the_mapping_between_random_and_normal_access(tmp_path):
    from tests.conftest import mapping_vm_flags

    mapped = MappedFile.create(str(tmp_path / "f"), 0, 1 << 20)
    try:
        assert "rr" not in mapping_vm_flags(mapped.array) and not mapped.appending
        mapped.advise_appending(True)
        assert "rr" in mapping_vm_flags(mapped.array) and mapped.appending
        mapped.view[:5] = b"hello"  # the mapping works as before
        mapped.advise_appending(False)
        assert "rr" not in mapping_vm_flags(mapped.array) and not mapped.appending
        assert bytes(mapped.view[:5]) == b"hello"
    finally:
        mapped.close()
    mapped.advise_appending(True)  # closed: nothing to advise, no error
    assert not mapped.appending


def test_reserve_takes_disk_blocks_up_to_its_end_and_only_once(tmp_path):
    path = str(tmp_path / "f")
    size = 8 * 1024 * 1024
    mapped = MappedFile.create(path, 0, size, reserve_bytes=1024 * 1024)
    try:
        assert os.path.getsize(path) == size and mapped.reserved_bytes == 1024 * 1024
        assert os.stat(path).st_blocks * 512 < 2 * 1024 * 1024  # the rest is a hole
        mapped.reserve(4 * 1024 * 1024)
        assert mapped.reserved_bytes == 4 * 1024 * 1024
        assert 4 * 1024 * 1024 <= os.stat(path).st_blocks * 512 < 5 * 1024 * 1024
        mapped.reserve(2 * 1024 * 1024)  # already reserved: nothing changes
        assert mapped.reserved_bytes == 4 * 1024 * 1024
        mapped.reserve(size * 2)  # capped at the file's end
        assert mapped.reserved_bytes == size
    finally:
        mapped.close()


def test_reserve_on_a_full_disk_raises_store_io_error_from_the_os_error(tmp_path, monkeypatch):
    import errno

    from mqstore.commitlog import mapped_file as module

    mapped = MappedFile.create(str(tmp_path / "f"), 0, 1 << 20, reserve_bytes=0)
    try:
        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(module.os, "posix_fallocate", no_space)
        with pytest.raises(StoreIOError) as raised:
            mapped.reserve(4096)
        assert raised.value.__cause__.errno == errno.ENOSPC and mapped.reserved_bytes == 0
    finally:
        mapped.close()


def test_a_file_being_made_has_no_name_until_it_is_linked(tmp_path):
    """RocketMQ parses every name in its CommitLog and ConsumeQueue directories as a number: a file being made
    is unnamed (O_TMPFILE) where the filesystem allows, so a writer killed meanwhile leaves no foreign name."""
    path = str(tmp_path / fmt.segment_name(0))
    fd, temporary = create_unnamed(path)
    try:
        assert os.listdir(tmp_path) == ([] if temporary is None else [os.path.basename(temporary)])
        os.ftruncate(fd, 4096)
        link_into_place(fd, temporary, path)
        with pytest.raises(FileExistsError):
            link_into_place(fd, temporary, path)
    finally:
        os.close(fd)
    if temporary is not None:
        os.unlink(temporary)
    assert os.listdir(tmp_path) == [fmt.segment_name(0)] and os.path.getsize(path) == 4096


def test_a_writer_killed_while_making_a_file_leaves_no_name_where_o_tmpfile_exists(tmp_path):
    code = ("import os, sys; from mqstore.commitlog.mapped_file import create_unnamed; "
            "fd, temporary = create_unnamed(sys.argv[1]); os.ftruncate(fd, 1 << 20); "
            "print(temporary is None, flush=True); os._exit(9)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / fmt.segment_name(0))], capture_output=True,
                          text=True, timeout=60)
    unnamed = done.stdout.strip() == "True"
    assert done.returncode == 9 and (os.listdir(tmp_path) == [] if unnamed else len(os.listdir(tmp_path)) == 1)
