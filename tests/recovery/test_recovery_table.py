"""One test per row of the recovery decision table (mqstore/store/recovery.py).

A crash is simulated by copying a store directory while its writer still has it open: the copy holds what
the page cache held (an `abort` marker included), as after a process kill; damaging the copy's unflushed
tail then stands for a power loss.
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from mqstore import CorruptionError, GetStatus, Message, MessageStore
from mqstore.store.recovery import RecoveryCase
from mqstore.store.verify import verify_store
from tests.conftest import rocketmq_config, rocketmq_manifest, small_config


def config(**overrides):
    return small_config(**overrides)


def _bodies(store, topic="t", queue_id=0):
    result = store.get(topic, queue_id, 0, max_count=10_000)
    return [m.body for m in result.messages]


def _crash_copy(store, destination):
    """The store's files as a crash would leave them (the writer is still running). A segment the allocator is
    making (`*.creating`, renamed when done) may vanish while it is copied; recovery removes one anyway."""
    assert store.wait_dispatched(10)
    shutil.copytree(store.root_dir, destination, ignore=shutil.ignore_patterns("*.creating"))
    assert (destination / "abort").exists()
    return destination


def _put(store, count, start=0, size=500, queue_ids=1):
    return [store.put(Message("t", b"%05d" % i + b"." * size, queue_id=i % queue_ids))
            for i in range(start, start + count)]


def test_clean_stop_keeps_everything(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        _put(store, 300)
        assert store.recovery_report.case == "NEW_STORE"
    assert not (tmp_path / "abort").exists()
    with MessageStore.open(tmp_path, config()) as store:
        report = store.recovery_report
        assert report.cases() == [RecoveryCase.CLEAN] and not report.crashed and report.dropped_bytes == 0
        assert report.messages_redispatched == 0
        assert len(_bodies(store)) == 300


def test_clean_stop_with_a_damaged_record_raises_or_is_repaired(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        results = _put(store, 100)
    damaged = results[90]
    segment = damaged.commitlog_offset - damaged.commitlog_offset % config().segment_size_bytes
    path = tmp_path / "commitlog" / f"{segment:020d}"
    with open(path, "r+b") as handle:
        handle.seek(damaged.commitlog_offset - segment + 100)  # inside the body: only the CRC sees it
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, config())
    assert raised.value.path == str(path) and raised.value.offset == damaged.commitlog_offset - segment
    assert raised.value.rule == "commitlog.5"
    with MessageStore.open(tmp_path, config(), repair=True) as store:
        report = store.recovery_report
        assert report.case == "CLEAN_CORRUPT" and report.log_end == damaged.commitlog_offset
        assert report.dropped_bytes > 0 and report.queue_entries_dropped == 10
        assert _bodies(store) == [b"%05d" % i + b"." * 500 for i in range(90)]
        assert store.put(Message("t", b"after repair")).queue_offset == 90
    with MessageStore.open(tmp_path, config()) as store:
        assert store.recovery_report.case == "CLEAN"
        assert _bodies(store)[-1] == b"after repair"


def test_a_record_whose_topic_is_not_ascii_is_cut_with_everything_after_it(tmp_path):
    """Without record CRCs (RocketMQ 4.x's bytes) only rule 3's topic check sees such damage: verify names it, and
    the log ends before the record, not after the batch it was read in (which kept it and listed it under another
    record's topic)."""
    cfg = config(record_crc=False)
    with MessageStore.open(tmp_path, cfg) as store:
        results = [store.put(Message("tt", b"m%d" % i)) for i in range(8)]
    damaged = results[5]
    path = tmp_path / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as handle:
        handle.seek(damaged.commitlog_offset)
        record = bytearray(handle.read(damaged.size_bytes))
        at = record.index(b"tt", 88)  # the topic: after the 88-byte header and the body
        record[at : at + 2] = "é".encode()
        handle.seek(damaged.commitlog_offset)
        handle.write(record)
    problem = verify_store(tmp_path, cfg).problems[0]
    assert (problem.rule, problem.path, problem.offset) == ("commitlog.3", str(path), damaged.commitlog_offset)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, cfg)
    assert raised.value.rule == "commitlog.3" and raised.value.offset == damaged.commitlog_offset
    with MessageStore.open(tmp_path, cfg, repair=True) as store:
        assert store.recovery_report.log_end == damaged.commitlog_offset
        assert _bodies(store, "tt") == [b"m%d" % i for i in range(5)]


def test_crash_with_an_intact_log_re_dispatches_what_the_queues_missed(tmp_path):
    with MessageStore.open(tmp_path / "live", config()) as store:
        _put(store, 200, queue_ids=2)
        crashed = _crash_copy(store, tmp_path / "crashed")
    # The queue files lost their last entries (their pages never reached the disk).
    queue_file = crashed / "consumequeue" / "t" / "0" / f"{64 * 20:020d}"
    data = bytearray(queue_file.read_bytes())
    data[20 * 10:] = bytes(len(data) - 20 * 10)
    queue_file.write_bytes(bytes(data))
    with MessageStore.open(crashed, config()) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_CLEAN_TAIL and report.crashed and report.dropped_bytes == 0
        assert report.queue_cases == {"t/0": RecoveryCase.QUEUE_REPLAYED}
        assert report.messages_redispatched >= 100 - (64 + 10)
        assert [len(_bodies(store, queue_id=q)) for q in (0, 1)] == [100, 100]
        assert store.put(Message("t", b"next", queue_id=0)).queue_offset == 100


def test_crash_with_a_torn_tail_cuts_the_log_and_the_queues(tmp_path):
    with MessageStore.open(tmp_path / "live", config()) as store:
        results = _put(store, 120)
        store.flush()
        crashed = _crash_copy(store, tmp_path / "crashed")
    torn = results[100]  # pretend messages 100.. never reached the disk: one torn page, then garbage
    segment_size = config().segment_size_bytes
    base = torn.commitlog_offset - torn.commitlog_offset % segment_size
    path = crashed / "commitlog" / f"{base:020d}"
    data = bytearray(path.read_bytes())
    position = torn.commitlog_offset - base
    data[position + 4 : position + 8] = b"\x13\x37\x13\x37"
    path.write_bytes(bytes(data))
    checkpoint = crashed / "checkpoint"  # the checkpoint says nothing after message 99 was flushed
    raw = bytearray(checkpoint.read_bytes())
    raw[0:8] = struct.pack(">q", results[99].store_timestamp_ms)
    raw[24:32] = struct.pack(">q", torn.commitlog_offset)
    checkpoint.write_bytes(bytes(raw))
    with MessageStore.open(crashed, config()) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_TORN_TAIL and report.log_end == torn.commitlog_offset
        assert report.queue_entries_dropped == 20 and report.dropped_bytes > 0
        assert report.queue_cases == {"t/0": RecoveryCase.QUEUE_TRUNCATED}
        assert report.dropped_messages == 19 and report.dropped_offset_last == results[-1].commitlog_offset
        assert _bodies(store) == [b"%05d" % i + b"." * 500 for i in range(100)]
        assert store.get("t", 0, 100).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert store.put(Message("t", b"new")).queue_offset == 100
    with MessageStore.open(crashed, config()) as store:
        assert store.recovery_report.case == "CLEAN" and _bodies(store)[-1] == b"new"


def test_a_stale_record_after_a_lost_page_is_not_taken_back(tmp_path):
    with MessageStore.open(tmp_path / "live", config()) as store:
        results = _put(store, 40, size=1000)
        crashed = _crash_copy(store, tmp_path / "crashed")
    lost = results[20]  # this record's page was lost (zeros); the pages after it survived
    path = crashed / "commitlog" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[lost.commitlog_offset : lost.commitlog_offset + lost.size_bytes] = bytes(lost.size_bytes)
    path.write_bytes(bytes(data))
    with MessageStore.open(crashed, config()) as store:
        report = store.recovery_report
        assert report.log_end == lost.commitlog_offset and report.dropped_bytes > 0
        assert len(_bodies(store)) == 20
        store.put(Message("t", b"z"))  # shorter than the old records: old bytes after it must be gone
    with MessageStore.open(crashed, config()) as store:
        assert [b[:5] for b in _bodies(store)] == [b"%05d" % i for i in range(20)] + [b"z"]
        assert store.recovery_report.case == "CLEAN"


def test_crash_with_damaged_flushed_data_raises_or_is_repaired(tmp_path):
    with MessageStore.open(tmp_path / "live", config()) as store:
        results = _put(store, 100)
        store.flush()
        crashed = _crash_copy(store, tmp_path / "crashed")
    checkpoint = (crashed / "checkpoint").read_bytes()
    end = results[-1].commitlog_offset + results[-1].size_bytes
    assert struct.unpack_from(">qqqq", checkpoint)[0::3] == (results[-1].store_timestamp_ms, end)
    damaged = results[10]
    path = crashed / "commitlog" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[damaged.commitlog_offset + 200] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(crashed, config())
    assert raised.value.offset == damaged.commitlog_offset and raised.value.rule == "commitlog.5"
    with MessageStore.open(crashed, config(), repair=True) as store:
        assert store.recovery_report.case == "CRASH_CORRUPT"
        assert len(_bodies(store)) == 10


def test_a_corrupt_consume_queue_is_rebuilt_from_the_log(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        _put(store, 150, queue_ids=3)
        assert store.wait_dispatched(10)
        before = [_bodies(store, queue_id=q) for q in range(3)]
        assert [len(bodies) for bodies in before] == [50, 50, 50]
    queue_file = tmp_path / "consumequeue" / "t" / "1" / f"{0:020d}"
    data = bytearray(queue_file.read_bytes())
    data[20 * 3 : 20 * 3 + 8] = struct.pack(">q", 10**12)  # entry 3 jumps far ahead: offsets no longer increase
    queue_file.write_bytes(bytes(data))
    with MessageStore.open(tmp_path, config()) as store:
        assert store.recovery_report.queues_rebuilt == ["t/1"]
        assert store.recovery_report.queue_cases == {"t/1": RecoveryCase.QUEUE_REBUILT}
        assert [_bodies(store, queue_id=q) for q in range(3)] == before


def test_a_corrupt_checkpoint_is_replaced_and_the_whole_log_scanned(tmp_path):
    with MessageStore.open(tmp_path / "live", config()) as store:
        _put(store, 200)
        crashed = _crash_copy(store, tmp_path / "crashed")
    (crashed / "checkpoint").write_bytes(b"\xff" * 4096)
    with MessageStore.open(crashed, config()) as store:
        report = store.recovery_report
        assert report.case == "CRASH_CLEAN_TAIL" and report.scan_start == 0
        assert report.checkpoint_case is RecoveryCase.CHECKPOINT_REPLACED
        assert len(_bodies(store)) == 200


def test_the_index_is_cut_with_the_log(tmp_path):
    index_config = config(index_enabled=True, index_slot_count=16, index_entry_count_max=4096)
    with MessageStore.open(tmp_path / "live", index_config) as store:
        results = [store.put(Message("t", b"%d" % i + b"." * 300, keys=("k",))) for i in range(60)]
        crashed = _crash_copy(store, tmp_path / "crashed")
    cut = results[50]
    path = crashed / "commitlog" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[cut.commitlog_offset + 4] ^= 0xFF
    path.write_bytes(bytes(data))
    with MessageStore.open(crashed, index_config) as store:
        assert store.recovery_report.log_end == cut.commitlog_offset
        assert store.recovery_report.index_entries_dropped >= 10
        assert len(store.query("t", "k", max_count=1000)) == 50


def _quiet_index_config():
    """An index of 64-entry files (they roll every 63 keys: 31.5 messages, each has its key and a UNIQ_KEY) and
    flush services that never run on their own."""
    return config(index_enabled=True, index_slot_count=16, index_entry_count_max=64, flush_interval_ms=3_600_000,
                  flush_thorough_interval_ms=86_400_000, flush_consume_queue_interval_ms=3_600_000)


def _keyed(store, start, count):
    return [store.put(Message("t", b"%d" % i + b"." * 200, keys=(f"k{i}",))) for i in range(start, start + count)]


def _index_files(root):
    return sorted((root / "index").iterdir())


def _zero_entries_from(path, entry_number, slot_count=16):
    data = bytearray(path.read_bytes())
    start = 40 + 4 * slot_count + 20 * entry_number
    data[start:] = bytes(len(data) - start)
    path.write_bytes(bytes(data))


def test_a_crash_cuts_lost_index_pages_in_an_older_file_not_only_the_newest(tmp_path):
    """INDEX_CUT: the index was flushed while its second file was being filled; then it filled that file and
    rolled to a third, and power was lost: the second file's header page reached the disk, the page of its
    last entries did not. The cut must look at the second file too, not only at the newest."""
    index_config = _quiet_index_config()
    with MessageStore.open(tmp_path / "live", index_config) as store:
        _keyed(store, 0, 40)  # 80 keys: 63 in file 1, 17 in file 2
        assert store.wait_dispatched(10)
        store.flush()
        _keyed(store, 40, 40)  # file 2 fills, file 3 holds the last 34 keys
        crashed = _crash_copy(store, tmp_path / "crashed")
    files = _index_files(crashed)
    assert len(files) == 3
    _zero_entries_from(files[1], 40)  # entries 40..63 of file 2 were never written back
    files[2].write_bytes(bytes(files[2].stat().st_size))  # nor was the new file
    with MessageStore.open(crashed, index_config) as store:
        report = store.recovery_report
        assert report.index_case is RecoveryCase.INDEX_CUT and report.index_entries_dropped > 0
        assert all(len(store.query("t", f"k{i}")) == 1 for i in range(80))


def test_an_index_file_whose_tail_was_zeroed_is_cut_and_re_dispatched(tmp_path):
    """INDEX_INCONSISTENT: after a clean stop, an older index file keeps its header (indexCount says full) but
    its last entries read as zeros. Its header no longer agrees with its last entry (rule 7): the file is cut at
    its first bad entry, the later files are deleted, and what they held is re-dispatched."""
    index_config = _quiet_index_config()
    with MessageStore.open(tmp_path, index_config) as store:
        _keyed(store, 0, 80)
    files = _index_files(tmp_path)
    assert len(files) == 3
    _zero_entries_from(files[0], 50)
    with MessageStore.open(tmp_path, index_config) as store:
        report = store.recovery_report
        assert report.case == "CLEAN" and report.index_case is RecoveryCase.INDEX_INCONSISTENT
        assert "rule 7" in report.index_damage[0] and report.index_entries_dropped > 0
        assert all(len(store.query("t", f"k{i}")) == 1 for i in range(80))
        store.put(Message("t", b"after", keys=("k-after",)))
        assert store.wait_dispatched(10)
    with MessageStore.open(tmp_path, index_config) as store:  # the cut index was left consistent
        assert store.recovery_report.index_case is None and not store.recovery_report.index_damage
        assert len(store.query("t", "k-after")) == 1 and len(store.query("t", "k0")) == 1


def test_an_older_index_file_left_empty_is_cut_there(tmp_path):
    """INDEX_INCONSISTENT (rule 8): an older index file whose header was zeroed reads as empty; the files after
    it are deleted and everything from the file before it on is re-dispatched."""
    index_config = _quiet_index_config()
    with MessageStore.open(tmp_path, index_config) as store:
        _keyed(store, 0, 80)
    files = _index_files(tmp_path)
    files[1].write_bytes(bytes(files[1].stat().st_size))
    with MessageStore.open(tmp_path, index_config) as store:
        report = store.recovery_report
        assert report.index_case == "INDEX_INCONSISTENT" and "rule 8" in report.index_damage[0]
        assert all(len(store.query("t", f"k{i}")) == 1 for i in range(80))


def test_an_index_that_ends_where_no_message_starts_is_cut_there(tmp_path):
    """INDEX_INCONSISTENT: damage moved the last entry's phyOffset (and the header's endPhyOffset with it, so
    rule 7 holds) a few bytes into its message. Re-dispatch would resume off a record: the index is cut there."""
    index_config = _quiet_index_config()
    with MessageStore.open(tmp_path, index_config) as store:
        results = _keyed(store, 0, 20)
    newest = _index_files(tmp_path)[-1]
    data = bytearray(newest.read_bytes())
    count = struct.unpack_from(">i", data, 36)[0]
    last_at = 40 + 4 * 16 + 20 * (count - 1)
    assert struct.unpack_from(">q", data, last_at + 4)[0] == results[-1].commitlog_offset
    struct.pack_into(">q", data, last_at + 4, results[-1].commitlog_offset + 3)
    struct.pack_into(">q", data, 24, results[-1].commitlog_offset + 3)
    newest.write_bytes(bytes(data))
    with MessageStore.open(tmp_path, index_config) as store:
        report = store.recovery_report
        assert report.index_case == "INDEX_INCONSISTENT" and "where no message starts" in report.index_damage[0]
        assert all(len(store.query("t", f"k{i}")) == 1 for i in range(20))


@pytest.mark.parametrize("crashed", [False, True])
def test_rocketmqs_store_goes_through_recovery_unchanged(rocketmq_store_copy, crashed):
    if crashed:
        (rocketmq_store_copy / "abort").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in (rocketmq_store_copy / "commitlog").iterdir()}
    with MessageStore.open(rocketmq_store_copy, rocketmq_config()) as store:
        report = store.recovery_report
        assert report.case == ("CRASH_CLEAN_TAIL" if crashed else "CLEAN")
        assert report.dropped_bytes == 0 and report.queue_entries_dropped == 0 and not report.queues_rebuilt
        total = sum(store.max_offset(t, q) for t, queues in store.topics().items() for q in queues)
        assert total == len(rocketmq_manifest())
    after = {p.name: p.read_bytes() for p in (rocketmq_store_copy / "commitlog").iterdir()}
    assert after == before


def test_a_rocketmq_4_checkpoint_without_a_flushed_offset_decides_by_time(tmp_path, step_clock):
    with MessageStore.open(tmp_path / "live", config()) as store:  # the step clock: later puts, later store times
        early = _put(store, 50)
        late = _put(store, 50, start=50)
        crashed = _crash_copy(store, tmp_path / "crashed")
    raw = bytearray((crashed / "checkpoint").read_bytes())
    raw[0:8] = struct.pack(">q", early[-1].store_timestamp_ms)  # 4.x: only times, no flushed offset
    raw[24:32] = bytes(8)
    (crashed / "checkpoint").write_bytes(bytes(raw))
    path = crashed / "commitlog" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[late[10].commitlog_offset + 4] ^= 0xFF  # after the checkpointed message: a torn tail
    path.write_bytes(bytes(data))
    with MessageStore.open(crashed, config()) as store:
        assert store.recovery_report.case == "CRASH_TORN_TAIL"
        assert len(_bodies(store)) == 60


def test_a_segment_left_half_made_by_a_crash_is_removed(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        _put(store, 10)
    leftover = tmp_path / "commitlog" / f"{config().segment_size_bytes:020d}.4242.creating"
    leftover.write_bytes(b"\0" * 100)
    with MessageStore.open(tmp_path, config()) as store:
        assert not leftover.exists()
        assert len(_bodies(store)) == 10
