"""The SYNC leader's flush: in C once the group commit's FlushGate is bound to the CommitLog (flushwait.c's `lead`),
in Python otherwise (MQSTORE_NATIVE=0, a test's stand-in for a flush, a flush across a roll).

Both must leave the same state behind: the log flushed to its end, the checkpoint's physic time and flushed
offset raised, the flushes counted, and a failed fdatasync reported to every SYNC put from then on
(docs/decisions/0030-sync-lead-in-c.md).
"""

from __future__ import annotations

import os
import struct

import mqstore.commitlog.mapped_file as mapped_file
import pytest
from mqstore.commitlog import native

from mqstore import FlushFailedError, FlushMode, Message, MessageStore, PutStatus
from tests.conftest import small_config

NATIVE_ONLY = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: the leader flushes in Python")


def _sync_config(**overrides):
    return small_config(flush_mode=FlushMode.SYNC, **overrides)


def _checkpoint_fields(store) -> tuple[int, int]:
    """The checkpoint's physic_msg_timestamp and physic_flushed_offset as its mapping holds them now."""
    view = store._checkpoint.mapped.view
    return struct.unpack_from(">q", view, 0)[0], struct.unpack_from(">q", view, 24)[0]


def _put_many(store, count, body=b"x" * 100):
    results = [store.put(Message("t%d" % (i % 3), body, queue_id=i % 2)) for i in range(count)]
    assert [r.status for r in results] == [PutStatus.PUT_OK] * count
    return results


@pytest.mark.parametrize("count", [200, 800], ids=["in one segment", "across rolls"])
def test_every_sync_put_is_flushed_and_the_checkpoint_follows_the_log(tmp_path, count):
    with MessageStore.open(tmp_path, _sync_config()) as store:  # 64 KiB segments: 800 puts roll twice
        results = _put_many(store, count)
        log_ = store._commitlog
        end = results[-1].commitlog_offset + results[-1].size_bytes
        service = store._group_commit
        assert log_.flushed_position == end and service.durable_position == end
        assert log_.flushed_timestamp_ms == log_.last_store_timestamp_ms == results[-1].store_timestamp_ms
        assert _checkpoint_fields(store) == (log_.flushed_timestamp_ms, end)
        stats = store.stats()["flush"]["commitlog_flusher"]
        # one flush a put at most, and each put after the first timed flush led its own (one producer)
        assert count - 10 <= stats["flushes"] <= count + 1 and stats["error"] is None
        assert service.leader_flush_count >= count - 10
        assert results[-1].commitlog_offset >= 64 * 1024 * (count // 400)
        assert 0 < len(service.stats.recent_durations_ms) <= 64 and service.stats.max_duration_ms > 0


@NATIVE_ONLY
def test_the_leader_flushes_in_c_when_bound_and_counts_there(tmp_path):
    with MessageStore.open(tmp_path, _sync_config()) as store:
        gate = store._group_commit.gate
        assert gate.bound
        _put_many(store, 50)
        assert gate.leads >= 45 and gate.flushes >= 45  # led and counted in C: no Python frame counted them
        assert store._group_commit.leader_flush_count == gate.leads  # nothing led through Python
    assert not gate.bound  # unbound at stop: the last flushes went through Python, which knows about stopping


def test_a_stand_in_for_the_segments_flush_is_called_for_every_sync_flush(tmp_path, monkeypatch):
    """A recorder of flushes (the crash simulator's) replaces MappedFile.flush: the C leader leaves the flush to it."""
    calls = []
    real = mapped_file.MappedFile.flush

    def recording(self, start=0, end=None):
        calls.append((self.base_offset, start, end))
        return real(self, start, end)

    with MessageStore.open(tmp_path, _sync_config()) as store:
        _put_many(store, 5)
        monkeypatch.setattr(mapped_file.MappedFile, "flush", recording)
        results = _put_many(store, 20)
        log_ = store._commitlog
        end = results[-1].commitlog_offset + results[-1].size_bytes
        segment_calls = [call for call in calls if call[2] is not None and call[1] < call[2]]
        assert len(segment_calls) >= 20 and segment_calls[-1][0] + segment_calls[-1][2] == end
        assert log_.flushed_position == end and _checkpoint_fields(store)[1] == end


def test_a_failed_fdatasync_fails_that_put_and_every_sync_put_after_it(tmp_path):
    read_end, write_end = os.pipe()  # fdatasync of a pipe fails (EINVAL): the segment's descriptor swapped for it
    try:
        store = MessageStore.open(tmp_path, _sync_config())
        try:
            _put_many(store, 5)
            segment = store._commitlog._segment
            real_fd, segment._fd = segment._fd, read_end
            try:
                failed = store.put(Message("t", b"lost?"))
                with pytest.raises(FlushFailedError):
                    store.put(Message("t", b"after"))
            finally:
                segment._fd = real_fd
            assert failed.status is PutStatus.FLUSH_DISK_FAILED
            error = store._group_commit.stats.error
            assert isinstance(error, FlushFailedError) and "fdatasync of" in str(error) and segment.path in str(error)
            assert "fdatasync" in store.stats()["flush"]["commitlog_flusher"]["error"]
            # nothing was claimed durable past the failed flush: not the log, not the checkpoint, not even with the
            # real descriptor back (whose fdatasync would now succeed)
            with pytest.raises(FlushFailedError):
                store.flush()
            flushed = store._commitlog.flushed_position
            assert flushed == failed.commitlog_offset and _checkpoint_fields(store)[1] == flushed
        finally:
            with pytest.raises(FlushFailedError):
                store.close()
    finally:
        os.close(read_end)
        os.close(write_end)
