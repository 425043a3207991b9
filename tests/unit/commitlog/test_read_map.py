"""MappedFile.open(keep_lock=True): a read-only file mapped by the compiled core (commitlog/csrc/read_map.c) gives
what np.memmap (the reference) gives, bytes and errors alike, keeps the interpreter lock while it maps, and its
memory lives exactly as long as something refers to it. ConsumeQueue readers map their files so."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mqstore.commitlog import mapped_file
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.native import NATIVE

from mqstore import Message, MessageStore, StoreConfig
from tests.lock_held import turns_of_another_thread

compiled_only = pytest.mark.skipif(NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")


def _mapped_paths() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}


@pytest.fixture(params=["compiled", "memmap"])
def keep_lock(request, monkeypatch):
    """True through the compiled map; the reference (np.memmap) by removing it."""
    if request.param == "compiled":
        if NATIVE is None:
            pytest.skip("the compiled core is not built (or MQSTORE_NATIVE=0)")
    else:
        monkeypatch.setattr(mapped_file, "_map_read", None)
    return True


def test_both_maps_read_the_same_bytes_and_refuse_writes(tmp_path, keep_lock):
    path = tmp_path / "f"
    data = os.urandom(3 * 4096 + 17)
    path.write_bytes(data)
    mapped = MappedFile.open(str(path), 4096, len(data), writable=False, keep_lock=keep_lock)
    assert bytes(mapped.view) == data and mapped.array.tobytes() == data and mapped.base_offset == 4096
    assert not mapped.writable and mapped.fileno() is None
    with pytest.raises(TypeError):
        mapped.view[0:1] = b"x"
    with pytest.raises(ValueError):
        mapped.array[0] = 1
    mapped.flush()  # a no-op on a read-only file
    mapped.close()
    assert mapped.closed and mapped.view is None


@pytest.mark.parametrize("size", [100, 8192])
def test_both_maps_report_a_file_of_another_size_as_corruption(tmp_path, keep_lock, size):
    path = tmp_path / "f"
    path.write_bytes(bytes(4096))
    with pytest.raises(CorruptionError) as raised:
        MappedFile.open(str(path), 0, size, writable=False, format_name="consumequeue", keep_lock=keep_lock)
    error = raised.value
    assert error.path == str(path) and error.rule == "consumequeue.file-size" and error.offset == min(4096, size)
    assert "file is 4096 bytes" in str(error)


def test_both_maps_report_a_missing_file_or_a_directory_as_an_io_error(tmp_path, keep_lock):
    with pytest.raises(StoreIOError) as missing:
        MappedFile.open(str(tmp_path / "missing"), 0, 4096, writable=False, keep_lock=keep_lock)
    assert str(tmp_path / "missing") in str(missing.value)
    with pytest.raises((StoreIOError, CorruptionError)):
        MappedFile.open(str(tmp_path), 0, 4096, writable=False, keep_lock=keep_lock)


@compiled_only
def test_the_compiled_map_lives_as_long_as_a_reference_to_it(tmp_path):
    path = tmp_path / "held"
    path.write_bytes(b"hello" + bytes(4091))
    mapped = MappedFile.open(str(path), 0, 4096, writable=False, keep_lock=True)
    assert type(mapped.array) is np.ndarray  # not a memmap: nothing else keeps the mapping
    held = mapped.array.view(np.ndarray)[:8].view(">u1")
    view = mapped.view[1:3]
    mapped.close()
    assert str(path) in _mapped_paths()  # the views still read it
    assert held.tobytes()[:5] == b"hello" and bytes(view) == b"el"
    del held, view
    assert str(path) not in _mapped_paths()  # unmapped with its last reference


@compiled_only
def test_the_compiled_map_checks_its_arguments():
    with pytest.raises(ValueError):
        NATIVE.map_read_keep_lock("/", 0)
    with pytest.raises(ValueError):
        NATIVE.map_read_keep_lock("/", -1)
    with pytest.raises(ValueError):
        NATIVE.map_read_keep_lock("/", (1 << 62) + 1)
    with pytest.raises(IsADirectoryError):
        NATIVE.map_read_keep_lock(b"/", 4096)
    with pytest.raises(TypeError):
        NATIVE.ReadMapping()


@compiled_only
def test_the_compiled_map_keeps_the_interpreter_lock(tmp_path):
    """tests/lock_held.py's test (np.memmap lets go at each of its system calls)."""
    path = tmp_path / "f"
    path.write_bytes(bytes(1 << 20))
    mapped, during = turns_of_another_thread(
        lambda: [MappedFile.open(str(path), 0, 1 << 20, writable=False, keep_lock=True) for _ in range(20)])
    assert during == 0 and all(one.array.size == 1 << 20 for one in mapped)


def test_a_reader_maps_the_next_queue_file_as_the_writer_rolls(tmp_path):
    """The writer's dispatch process writes the ConsumeQueue: the writer reads it as a reader, through a roll to its
    next file, with the compiled map where there is one."""
    config = StoreConfig(consume_queue_entries_per_file=64)
    with MessageStore.open(str(tmp_path), config) as store:
        for index in range(200):
            store.put(Message("t", b"%d" % index, queue_id=0))
        assert store.wait_dispatched(30)
        got = store.get("t", 0, 0, 300)
        assert [m.body for m in got.messages] == [b"%d" % index for index in range(200)]
        queue = store._queues.get("t", 0)
        assert len(queue.files) == 4
        kinds = {type(one.array) for one in queue.files}
        assert kinds == ({np.ndarray} if NATIVE is not None else {np.memmap})


@compiled_only
def test_the_compiled_listing_names_what_os_listdir_names(tmp_path):
    names = ["0", "17", "a b", "caf\u00e9", "x" * 200]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    os.mkdir(tmp_path / "sub")
    with open(os.path.join(os.fsencode(tmp_path), b"bad-\xff"), "wb"):  # not UTF-8: surrogate-escaped, as os.listdir
        pass
    assert sorted(NATIVE.listdir_keep_lock(str(tmp_path))) == sorted(os.listdir(tmp_path))
    assert sorted(NATIVE.listdir_keep_lock(os.fsencode(tmp_path))) == sorted(os.listdir(tmp_path))
    assert NATIVE.listdir_keep_lock(str(tmp_path / "sub")) == []
    with pytest.raises(FileNotFoundError) as missing:
        NATIVE.listdir_keep_lock(str(tmp_path / "missing"))
    assert missing.value.filename == str(tmp_path / "missing")
    with pytest.raises(NotADirectoryError):
        NATIVE.listdir_keep_lock(str(tmp_path / "0"))
    with pytest.raises(TypeError):
        NATIVE.listdir_keep_lock(5)


@compiled_only
def test_the_compiled_listing_keeps_the_interpreter_lock(tmp_path):
    for index in range(30):
        (tmp_path / str(index)).write_bytes(b"")
    listed, during = turns_of_another_thread(lambda: [NATIVE.listdir_keep_lock(str(tmp_path)) for _ in range(20)])
    assert during == 0 and all(len(names) == 30 for names in listed)
