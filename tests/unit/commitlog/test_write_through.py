"""CommitLog.write_through (SYNC stores): single appends encoded in a buffer and written with pwrite must leave
exactly the bytes an append into the mapping leaves, and be read back through the mapping at once."""

from __future__ import annotations

import os
import random

import pytest
from mqstore.commitlog import commitlog as commitlog_module
from mqstore.commitlog.commitlog import WRITE_THROUGH_RECORD_BYTES_MAX, CommitLog
from mqstore.commitlog.errors import StoreIOError
from mqstore.commitlog.message import Message

BORN_HOST = bytes([10, 0, 0, 1]) + (4321).to_bytes(4, "big")
STORE_HOST = bytes([10, 0, 0, 2]) + (10911).to_bytes(4, "big")
SEGMENT = 128 * 1024


def _log(directory, *, write_through: bool) -> CommitLog:
    log = CommitLog(str(directory), SEGMENT, writable=True,
                    max_message_size_bytes=WRITE_THROUGH_RECORD_BYTES_MAX + 4096, max_queues_per_topic=4,
                    born_host_raw=BORN_HOST, store_host_raw=STORE_HOST, preallocate=False, record_crc=True)
    log.write_through = write_through
    return log


def _patch_pwrite(monkeypatch, writer: str, replacement) -> None:
    """Put `replacement(fd, data, position)` where the write-through append writes: the compiled write_at (which
    lets go of the GIL, as os.pwrite does) or os.pwrite (the pure-Python path, also when the core is not built)."""
    if writer == "write_at":
        if commitlog_module.NATIVE is None:
            pytest.skip("the compiled core is not built or MQSTORE_NATIVE=0")
        monkeypatch.setattr(commitlog_module, "_write_at", replacement)
    else:
        monkeypatch.setattr(commitlog_module, "_write_at", None)
        monkeypatch.setattr(commitlog_module.os, "pwrite", replacement)


def _real_pwrite(writer: str):
    if writer == "write_at":
        if commitlog_module.NATIVE is None:
            pytest.skip("the compiled core is not built or MQSTORE_NATIVE=0")
        return commitlog_module.NATIVE.write_at
    return os.pwrite


def _segments(directory) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("writer", ["write_at", "os.pwrite"])
def test_appends_written_through_equal_appends_into_the_mapping_byte_for_byte(tmp_path, monkeypatch, writer):
    _patch_pwrite(monkeypatch, writer, _real_pwrite(writer))
    clock = iter(range(1_700_000_000_000_000_000, 1 << 62, 1_000_000))
    times = [next(clock) for _ in range(400)]
    rng = random.Random(7)
    sizes = [rng.choice([0, 10, 100, 1000, 5000]) for _ in range(190)]
    sizes[50] = sizes[120] = WRITE_THROUGH_RECORD_BYTES_MAX + 1000  # too large: encoded in the mapping
    messages = [Message("t", rng.randbytes(size), queue_id=index % 4, tags=rng.choice([None, "A"]),
                        keys=rng.choice([(), (f"k{index}",)]), properties=rng.choice([{}, {"p": "v"}]))
                for index, size in enumerate(sizes)]
    results = {}
    for write_through in (True, False):
        directory = tmp_path / str(write_through)
        stamps = iter(times)
        monkeypatch.setattr(commitlog_module, "_time_ns", stamps.__next__)
        log = _log(directory, write_through=write_through)
        placed = [log.append(log.prepare(message)) for message in messages]
        assert log.segments.last().base_offset >= 2 * SEGMENT  # the appends rolled segments
        for message, (offset, queue_offset, _) in zip(messages, placed):
            stored = log.read(offset)  # through the mapping, at once
            assert (stored.body, stored.queue_offset, stored.tags) == (message.body, queue_offset, message.tags)
        log.close()
        results[write_through] = (placed, _segments(directory))
    assert results[True] == results[False]


@pytest.mark.parametrize("writer", ["write_at", "os.pwrite"])
def test_a_failed_pwrite_is_a_store_io_error_and_publishes_nothing(tmp_path, monkeypatch, writer):
    log = _log(tmp_path, write_through=True)
    first = log.append(log.prepare(Message("t", b"first")))
    end = log.readable_end()

    def failing(fd, data, position):
        raise OSError(5, "Input/output error")

    _patch_pwrite(monkeypatch, writer, failing)
    with pytest.raises(StoreIOError, match="Input/output error"):
        log.append(log.prepare(Message("t", b"second")))
    assert log.readable_end() == end and log.queue_offsets[("t", 0)] == 1
    monkeypatch.undo()
    second = log.append(log.prepare(Message("t", b"second")))
    assert second[0] == end and second[1] == 1 and first[1] == 0
    assert log.read(second[0]).body == b"second"
    log.close()


@pytest.mark.parametrize("writer", ["write_at", "os.pwrite"])
def test_appends_during_a_flush_go_to_the_mapping(tmp_path, monkeypatch, writer):
    # A pwrite waits while another thread's fdatasync of the file runs: with 64 SYNC producers, puts written
    # through during flushes made 2.8k puts/s against 21k through the mapping. So appends made while a flush
    # holds the log's flush lock are encoded in the mapping.
    log = _log(tmp_path, write_through=True)
    calls = []
    real = _real_pwrite(writer)

    def counting(fd, data, position):
        calls.append(position)
        return real(fd, data, position)

    _patch_pwrite(monkeypatch, writer, counting)
    first = log.append(log.prepare(Message("t", b"first")))
    assert calls == [first[0]]
    with log._flush_lock:  # as CommitLog.flush holds it around the fdatasync
        during = log.append(log.prepare(Message("t", b"during")))
    assert calls == [first[0]]
    after = log.append(log.prepare(Message("t", b"after")))
    assert calls == [first[0], after[0]]
    assert [log.read(offset).body for offset, _, _ in (first, during, after)] == [b"first", b"during", b"after"]
    log.close()
