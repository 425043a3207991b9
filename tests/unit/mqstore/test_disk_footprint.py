"""A store takes the disk its data needs: segments keep RocketMQ's layout (full-length files named by offset, `ls -l`
shows segment_size_bytes) but are sparse, with disk reserved only a step ahead of the writer; the next segment is
made when the writer nears the end of the current one, not at open or at the first put."""

from __future__ import annotations

import errno
import os
import time

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog import mapped_file as mapped_file_module
from mqstore.commitlog.commitlog import SPACE_RESERVE_STEP_BYTES
from mqstore.consumequeue import format as cqf

from mqstore import GetStatus, Message, MessageStore, PutStatus, StoreConfig
from tests.conftest import small_config
from tests.rocketmq import require_rmq

MIB = 1 << 20
SLACK_BYTES = 1 * MIB  # checkpoint, settings, the pages of the index file that were written, directories


def _disk_used(root) -> int:
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, files in os.walk(root) for f in files)


def _segment_names(root):
    return sorted(n for n in os.listdir(root / "commitlog") if fmt.parse_segment_name(n) is not None)


@pytest.mark.parametrize("preallocate", [True, False], ids=["reserved-in-steps", "sparse"])
def test_a_fresh_store_with_a_few_messages_takes_a_few_mib_not_its_segment_size(tmp_path, preallocate):
    config = StoreConfig(store_host="10.0.0.7", preallocate_segments=preallocate)  # 1 GiB segments, index on
    with MessageStore.open(tmp_path, config) as store:
        for word in (b"hello", b"world", b"again"):
            store.put(Message("greetings", word, keys=("k",)))
        assert store.wait_dispatched(10)
    queue_file_bytes = config.consume_queue_entries_per_file * cqf.UNIT_SIZE_BYTES  # reserved whole, one queue
    bound = SPACE_RESERVE_STEP_BYTES + queue_file_bytes + SLACK_BYTES  # about 10.7 MiB by the defaults
    assert _disk_used(tmp_path) <= bound
    assert _disk_used(tmp_path / "commitlog") <= SPACE_RESERVE_STEP_BYTES
    assert _segment_names(tmp_path) == [fmt.segment_name(0)]  # no second segment made ahead of need
    assert os.path.getsize(tmp_path / "commitlog" / fmt.segment_name(0)) == config.segment_size_bytes
    with MessageStore.open(tmp_path, config, read_only=True) as reader:
        assert [m.body for m in reader.get("greetings", 0, 0).messages] == [b"hello", b"world", b"again"]


def test_disk_is_reserved_a_step_ahead_of_the_writer_and_segments_keep_rocketmq_s_layout(tmp_path):
    segment_bytes = 4 * SPACE_RESERVE_STEP_BYTES
    config = small_config(segment_size_bytes=segment_bytes, max_message_size_bytes=1 * MIB,
                          preallocate_segments=True)
    body = os.urandom(512 * 1024)
    with MessageStore.open(tmp_path, config) as store:
        for _ in range(12):  # 6 MiB: into the second step of the first segment
            store.put(Message("t", body))
        used = (tmp_path / "commitlog" / fmt.segment_name(0)).stat().st_blocks * 512
        assert 6 * MIB <= used <= 2 * SPACE_RESERVE_STEP_BYTES  # written, plus what is reserved ahead
        for _ in range(28):  # 20 MiB in all: into the second segment
            store.put(Message("t", body))
        assert store.wait_dispatched(10)
    names = _segment_names(tmp_path)
    assert names == [fmt.segment_name(0), fmt.segment_name(segment_bytes)]
    for name in names:  # full length, as RocketMQ's MappedFileQueue expects
        assert os.path.getsize(tmp_path / "commitlog" / name) == segment_bytes
    second = (tmp_path / "commitlog" / names[1]).stat().st_blocks * 512
    assert second <= 2 * SPACE_RESERVE_STEP_BYTES  # 4 MiB written in it
    with MessageStore.open(tmp_path, config, read_only=True) as reader:
        got = reader.get("t", 0, 0, max_count=100)
        assert got.status is GetStatus.FOUND and len(got.messages) == 40
        assert all(m.body == body for m in got.messages)
        assert got.messages[-1].commitlog_offset >= segment_bytes


def test_the_next_segment_is_made_when_the_writer_nears_the_end_of_its_segment(tmp_path):
    config = small_config(segment_size_bytes=256 * 1024)  # the lead is a quarter: 64 KiB
    with MessageStore.open(tmp_path, config) as store:
        lead = store._commitlog.next_segment_lead_bytes
        assert lead == 64 * 1024
        while store.put(Message("t", b"." * 1000)).commitlog_offset + 2 * 1100 < 256 * 1024 - lead:
            pass
        assert _segment_names(tmp_path) == [fmt.segment_name(0)]  # not at the first put
        while store.put(Message("t", b"." * 1000)).commitlog_offset < 256 * 1024 - lead:
            pass
        deadline = time.monotonic() + 10
        while len(_segment_names(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # made by the allocator's thread
        assert _segment_names(tmp_path) == [fmt.segment_name(0), fmt.segment_name(256 * 1024)]
        assert store._allocator.created_in_background == 1


def test_rocketmq_reads_a_store_whose_segments_are_sparse(tmp_path):
    rmq = require_rmq()  # RocketMQ 4.4.0's own store, or a skip with the reason it cannot run here
    config = small_config(preallocate_segments=True, index_enabled=True)
    root = tmp_path / "store"
    bodies = [os.urandom(100 + (i * 37) % 2900) for i in range(90)]  # about 140 KB: three 64 KiB segments
    with MessageStore.open(root, config) as store:
        for i, body in enumerate(bodies):
            store.put(Message("orders", body, queue_id=i % 2, keys=(f"key-{i % 7}",)))
    assert len(_segment_names(root)) >= 3
    assert all(os.path.getsize(root / "commitlog" / name) == config.segment_size_bytes
               for name in _segment_names(root))
    read = rmq.read(root, config, tmp_path / "rocketmq").entries  # RocketMQ's load() runs on a copy
    got = {(m["queue_id"], m["queue_offset"]): m["body_hex"] for m in read if m["topic"] == "orders"}
    assert got == {(i % 2, i // 2): body.hex() for i, body in enumerate(bodies)}


def _count_reservations(monkeypatch, limit_bytes: int | None = None) -> list[tuple[int, int]]:
    """Record every posix_fallocate of a CommitLog segment as (start, end); past `limit_bytes` it fails with ENOSPC
    (a disk that has only that much room for the segment). Other files' reservations pass untouched."""
    calls: list[tuple[int, int]] = []
    real = mapped_file_module.os.posix_fallocate

    def recorded(fd, offset, length):
        if f"{os.sep}commitlog{os.sep}" not in os.readlink(f"/proc/self/fd/{fd}"):
            return real(fd, offset, length)
        if limit_bytes is not None and offset + length > limit_bytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        calls.append((offset, offset + length))
        real(fd, offset, length)

    monkeypatch.setattr(mapped_file_module.os, "posix_fallocate", recorded)
    return calls


def test_a_writer_that_goes_on_reserves_further_ahead_in_fewer_calls(tmp_path, monkeypatch):
    """Each posix_fallocate can wait on the file system's journal under the writer lock (decision 0045): a writer
    going on into a segment reserves as much again as it has reserved, 4 MiB at first, at most 64 MiB ahead."""
    calls = _count_reservations(monkeypatch)
    config = small_config(segment_size_bytes=512 * MIB, preallocate_segments=True)
    body = os.urandom(1000)
    with MessageStore.open(tmp_path, config) as store:
        for _ in range(150):  # 150 MB of records, in batches
            assert {r.status for r in store.put_batch([Message("t", body)] * 1000)} == {PutStatus.PUT_OK}
        written = store._commitlog.readable_end()
        reserved = store._commitlog._segment.reserved_bytes
    ends = [end for _, end in calls]
    assert ends == [4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB, 196 * MIB]  # one call each 4 MiB before
    assert written <= reserved <= written + 64 * MIB
    used = (tmp_path / "commitlog" / fmt.segment_name(0)).stat().st_blocks * 512
    assert reserved <= used <= reserved + MIB


def test_a_nearly_full_disk_reserves_only_what_the_put_needs(tmp_path, monkeypatch):
    """When the blocks ahead cannot be had, the writer asks for the step its put needs: DISK_FULL comes when the
    disk has no room for the put, not 64 MiB earlier."""
    calls = _count_reservations(monkeypatch, limit_bytes=20 * MIB)
    config = small_config(segment_size_bytes=256 * MIB, preallocate_segments=True)
    body = os.urandom(1000)
    with MessageStore.open(tmp_path, config) as store:
        statuses = [r.status for _ in range(30) for r in store.put_batch([Message("t", body)] * 1000)]
        written = store._commitlog.readable_end()
    assert [end for _, end in calls] == [4 * MIB, 8 * MIB, 16 * MIB, 20 * MIB]  # 32 MiB refused, then 20 MiB
    stored = statuses.count(PutStatus.PUT_OK)
    assert set(statuses[stored:]) == {PutStatus.DISK_FULL} and stored > 0
    assert 19 * MIB < written <= 20 * MIB  # every reserved block was used before DISK_FULL
