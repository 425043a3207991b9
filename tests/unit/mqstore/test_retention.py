"""Retention: expired segments go (or are archived), queues and index follow, disk-full puts are refused."""

from __future__ import annotations

import os

from mqstore.commitlog.format import parse_segment_name
from mqstore.commitlog.segments import SegmentList

from mqstore import GetStatus, Message, MessageStore, PutStatus
from mqstore.store import reads
from mqstore.store.retention import Retention, restore_from_archive
from tests.conftest import small_config

SEGMENT = small_config().segment_size_bytes


def _fill(store, count=120, size=2000):
    results = [store.put(Message("t", b"%05d" % i + b"." * size, queue_id=i % 2, keys=(f"k{i}",)))
               for i in range(count)]
    assert store.wait_dispatched(10)
    store.flush()
    return results


def _segments(root):
    """Segment file names (not files being created by the allocator)."""
    return sorted(n for n in os.listdir(root / "commitlog") if parse_segment_name(n) is not None)


def _age(root, hours):
    """Make every segment file look `hours` old."""
    for name in _segments(root):
        path = root / "commitlog" / name
        stamp = os.path.getmtime(path) - hours * 3600
        os.utime(path, (stamp, stamp))


def test_clean_expired_removes_old_segments_and_moves_the_queues_minimum(tmp_path):
    config = small_config(file_reserved_hours=1, consume_queue_entries_per_file=8, index_enabled=True,
                          index_slot_count=16, index_entry_count_max=64)
    with MessageStore.open(tmp_path, config) as store:
        results = _fill(store)
        segments_before = _segments(tmp_path)
        assert store.clean_expired()["segments_removed"] == []  # nothing is old yet
        _age(tmp_path, 2)
        report = store.clean_expired()
        end = store.stats()["commitlog"]["max_offset"]
        below_end = [name for name in segments_before if int(name) + SEGMENT <= end]
        assert report["segments_removed"] == below_end  # the segment holding the end (and any after) stays
        log_min = store.stats()["commitlog"]["min_offset"]
        assert log_min == int(below_end[-1]) + SEGMENT == report["log_min_offset"]
        assert report["queue_files_removed"] > 0 and report["index_files_removed"] > 0
        survivors = [r for r in results if r.commitlog_offset >= log_min]
        for queue_id in (0, 1):
            mine = [r for i, r in enumerate(results) if i % 2 == queue_id and r.commitlog_offset >= log_min]
            low = store.min_offset("t", queue_id)
            assert low == mine[0].queue_offset
            assert store.get("t", queue_id, 0).status is GetStatus.OFFSET_TOO_SMALL
            got = store.get("t", queue_id, low, max_count=1000).messages
            assert [m.commitlog_offset for m in got] == [r.commitlog_offset for r in mine]
        assert store.query("t", "k0") == []
        assert [m.commitlog_offset for m in store.query("t", f"k{len(results) - 1}")] == \
            [survivors[-1].commitlog_offset]
        assert store.put(Message("t", b"after")).status is PutStatus.PUT_OK
    with MessageStore.open(tmp_path, config) as store:  # the new minimum survives a reopen
        assert store.get("t", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
        assert store.min_offset("t", 0) > 0


def test_archived_segments_rebuild_the_whole_store(tmp_path):
    archive = tmp_path / "archive"
    config = small_config(file_reserved_hours=1, archive_dir=str(archive))
    with MessageStore.open(tmp_path / "store", config) as store:
        results = _fill(store)
        _age(tmp_path / "store", 2)
        removed = store.clean_expired()["segments_removed"]
        assert removed and report_archived(archive, removed)
    restored = restore_from_archive(str(archive), str(tmp_path / "store"))
    assert restored == removed
    with MessageStore.open(tmp_path / "store", small_config()) as store:
        assert store.wait_dispatched(10)
        got = store.get("t", 0, 0, max_count=1000).messages
        assert [m.body for m in got] == [b"%05d" % i + b"." * 2000 for i in range(0, len(results), 2)]


def report_archived(archive, names):
    return sorted(os.listdir(archive / "commitlog")) == sorted(names)


def test_retention_waits_for_its_hour_unless_the_disk_is_filling(tmp_path):
    config = small_config(file_reserved_hours=1, delete_when_hour=4, disk_max_used_space_ratio=0.75)
    with MessageStore.open(tmp_path, config) as store:
        _fill(store)
        _age(tmp_path, 2)
        usage = [0.10]
        hour = [3]
        retention = Retention(store, usage=lambda path: usage[0], local_hour=lambda: hour[0])
        assert retention.run_once(manual=False).segments_removed == []  # 03:00, disk fine: wait
        hour[0] = 4
        report = retention.run_once(manual=False)
        assert report.reason == "time" and len(report.segments_removed) >= 1
        _fill(store)
        _age(tmp_path, 2)
        hour[0] = 5
        usage[0] = 0.80  # over disk_max_used_space_ratio: expired segments go whatever the hour
        report = retention.run_once(manual=False)
        assert report.reason == "disk" and len(report.segments_removed) >= 1


def test_disk_pressure_removes_unexpired_segments_only_when_told_and_a_full_disk_refuses_puts(tmp_path):
    config = small_config(file_reserved_hours=1000, disk_max_used_space_ratio=0.75, disk_clean_forcibly_ratio=0.85,
                          disk_full_ratio=0.9, delete_unexpired_on_disk_pressure=True)
    with MessageStore.open(tmp_path, config) as store:
        _fill(store)
        end = store.stats()["commitlog"]["max_offset"]
        below_end = [n for n in _segments(tmp_path) if int(n) + SEGMENT <= end]
        usage = [0.95]
        retention = Retention(store, usage=lambda path: usage[0], local_hour=lambda: 12)
        report = retention.run_once(manual=False)
        assert report.reason == "disk" and report.segments_removed == below_end  # all but the end's
        assert store._disk_full
        refused = store.put(Message("t", b"no room"))
        assert refused.status is PutStatus.DISK_FULL and refused.commitlog_offset == -1
        assert [r.status for r in store.put_batch([Message("t", b"x")] * 2)] == [PutStatus.DISK_FULL] * 2
        assert store.stats()["disk"]["full"] is True
        usage[0] = 0.5
        retention.run_once(manual=False)
        assert store.put(Message("t", b"room again")).status is PutStatus.PUT_OK


def test_disk_usage_is_measured_as_df_reports_it(tmp_path):
    import shutil

    from mqstore.store.retention import disk_used_ratio

    usage = shutil.disk_usage(tmp_path)  # used and free-to-users, reserved blocks in neither
    expected = usage.used / (usage.used + usage.free)
    assert 0.0 <= disk_used_ratio(str(tmp_path)) <= 1.0
    assert abs(disk_used_ratio(str(tmp_path)) - expected) < 0.01


def test_a_read_only_store_follows_the_writers_retention(tmp_path):
    config = small_config(file_reserved_hours=1, consume_queue_entries_per_file=8)
    with MessageStore.open(tmp_path, config) as store:
        _fill(store)
        with MessageStore.open(tmp_path, config, read_only=True) as reader:
            assert reader.get("t", 0, 0, max_count=4).status is GetStatus.FOUND  # it holds the first files
            _age(tmp_path, 2)
            assert store.clean_expired()["queue_files_removed"] > 0
            more = [store.put(Message("t", b"after %d" % i + b"." * 2000, queue_id=i % 2)) for i in range(40)]
            assert store.wait_dispatched(10)
            for queue_id in (0, 1):
                low = store.min_offset("t", queue_id)
                assert reader.min_offset("t", queue_id) == low > 0
                assert reader.max_offset("t", queue_id) == store.max_offset("t", queue_id)
                assert reader.get("t", queue_id, 0).status is GetStatus.OFFSET_TOO_SMALL
                expected = store.get("t", queue_id, low, max_count=1000).messages
                got = reader.get("t", queue_id, low, max_count=1000).messages
                assert [m.commitlog_offset for m in got] == [m.commitlog_offset for m in expected]
                assert got[-1].commitlog_offset == more[-2 + queue_id].commitlog_offset
            # the reader let go of the deleted segments (mapped, they would keep their disk space)
            assert reader.stats()["commitlog"]["min_offset"] == store.stats()["commitlog"]["min_offset"]
            assert all(not segment.closed for segment in reader._commitlog.segments.segments)
            assert reader._commitlog.segments.segments[0].base_offset == store.stats()["commitlog"]["min_offset"]


def test_a_read_only_get_follows_a_deletion_within_its_bound_and_stats_the_log_no_more(tmp_path, monkeypatch):
    """A get of a read_only store looks at the log's directory at most every GET_LOG_FOLLOW_INTERVAL_NS (decision
    0048): until then a deleted segment's records come from its mapping, which outlives the unlink; after it, the
    deletion shows, and min_offset() sees it at once."""
    clock = [10**12]
    monkeypatch.setattr(reads.time, "monotonic_ns", lambda: clock[0])
    looks = []
    follow = SegmentList.load_if_changed
    monkeypatch.setattr(SegmentList, "load_if_changed", lambda self: (looks.append(1), follow(self))[1])
    config = small_config(file_reserved_hours=1, consume_queue_entries_per_file=8)
    with MessageStore.open(tmp_path, config) as store:
        _fill(store)
        expected = store.get("t", 0, 0, max_count=4).messages
        with MessageStore.open(tmp_path, config, read_only=True) as reader:
            assert reader.get("t", 0, 0, max_count=4).messages == expected
            looks.clear()
            for _ in range(50):  # within the bound: the directory is not looked at again
                assert reader.get("t", 0, 0, max_count=4).status is GetStatus.FOUND
            assert looks == []
            _age(tmp_path, 2)
            assert store.clean_expired()["queue_files_removed"] > 0
            low = store.min_offset("t", 0)
            assert low > 0
            stale = reader.get("t", 0, 0, max_count=4)  # the deleted records, from the mapping that outlives them
            assert stale.messages == expected
            clock[0] += reads.GET_LOG_FOLLOW_INTERVAL_NS
            after = reader.get("t", 0, 0, max_count=4)
            assert after.status is GetStatus.OFFSET_TOO_SMALL and after.next_offset == low == after.min_offset
            assert reader.get("t", 0, low).messages == store.get("t", 0, low).messages
            assert reader._commitlog.segments.segments[0].base_offset == store.stats()["commitlog"]["min_offset"]


def test_a_read_only_min_offset_sees_a_deletion_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(reads.time, "monotonic_ns", lambda: 10**12)  # a frozen clock: no get bound ever passes
    config = small_config(file_reserved_hours=1, consume_queue_entries_per_file=8)
    with MessageStore.open(tmp_path, config) as store:
        _fill(store)
        with MessageStore.open(tmp_path, config, read_only=True) as reader:
            assert reader.get("t", 1, 0).status is GetStatus.FOUND
            _age(tmp_path, 2)
            store.clean_expired()
            low = store.min_offset("t", 1)
            assert reader.min_offset("t", 1) == low > 0
            assert reader.get("t", 1, 0).status is GetStatus.OFFSET_TOO_SMALL
