"""What a filling disk does to a store: by default nothing unexpired is deleted and put() says DISK_FULL; deleting
unexpired messages is a setting, and each time it happens it is logged at WARNING and counted in stats().

The disk's usage is injected through retention's probe (mqstore.store.retention.disk_usage_probe), standing for another
program filling the disk the store shares."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from mqstore.commitlog import mapped_file as mapped_file_module
from mqstore.commitlog.format import parse_segment_name

import mqstore.store.retention as retention_module
from mqstore import GetStatus, Message, MessageStore, PutStatus
from tests.conftest import small_config

FILLING = dict(file_reserved_hours=1000, disk_max_used_space_ratio=0.75, disk_clean_forcibly_ratio=0.85,
               disk_full_ratio=0.90)


def _fill(store, count=120):
    for i in range(count):
        assert store.put(Message("t", b"%05d" % i + b"." * 2000)).status is PutStatus.PUT_OK
    assert store.wait_dispatched(10)
    store.flush()


def _segment_names(root):
    return sorted(n for n in os.listdir(root / "commitlog") if parse_segment_name(n) is not None)


@pytest.fixture
def disk_usage(monkeypatch):
    """The disk usage retention sees: set `usage[0]`."""
    usage = [0.10]
    monkeypatch.setattr(retention_module, "disk_usage_probe", lambda path: usage[0])
    return usage


def test_a_disk_filled_by_someone_else_keeps_every_unexpired_message_and_refuses_puts(tmp_path, disk_usage, caplog):
    with MessageStore.open(tmp_path, small_config(**FILLING)) as store:
        _fill(store)
        before = _segment_names(tmp_path)
        assert len(before) >= 3
        disk_usage[0] = 0.95  # over every ratio
        with caplog.at_level(logging.WARNING, logger="mqstore.store.retention"):
            report = store.clean_expired()
            store._retention.run_once(manual=False)  # a background round as well
        assert report["segments_removed"] == [] and _segment_names(tmp_path) == before
        got = store.get("t", 0, 0)
        assert got.status is GetStatus.FOUND and got.messages[0].body.startswith(b"00000")
        assert store.stats()["commitlog"]["min_offset"] == 0
        refused = store.put(Message("t", b"no room"))
        assert refused.status is PutStatus.DISK_FULL and refused.commitlog_offset == -1
        disk = store.stats()["disk"]
        assert disk["full"] is True and disk["unexpired_segments_removed"] == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("DISK_FULL" in w and "unexpired messages are kept" in w for w in warnings), warnings
        disk_usage[0] = 0.50
        store.clean_expired()
        assert store.put(Message("t", b"room again")).status is PutStatus.PUT_OK


def test_deleting_unexpired_messages_is_a_setting_that_warns_and_is_counted(tmp_path, disk_usage, caplog):
    with MessageStore.open(tmp_path, small_config(delete_unexpired_on_disk_pressure=True, **FILLING)) as store:
        _fill(store)
        before = _segment_names(tmp_path)
        disk_usage[0] = 0.87  # over disk_clean_forcibly_ratio, under disk_full_ratio
        with caplog.at_level(logging.WARNING, logger="mqstore.store.retention"):
            report = store._retention.run_once(manual=False)
        removed = report.unexpired_segments_removed
        assert removed and removed == report.segments_removed == before[: len(removed)]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "UNEXPIRED" in warnings[0] and removed[0] in warnings[0] and "87%" in warnings[0]
        assert "delete_unexpired_on_disk_pressure=True" in warnings[0]
        disk = store.stats()["disk"]
        assert disk["unexpired_segments_removed"] == len(removed)
        assert disk["unexpired_bytes_removed"] == len(removed) * store.config.segment_size_bytes
        assert store.get("t", 0, 0).status is GetStatus.OFFSET_TOO_SMALL


def test_expired_segments_go_under_disk_pressure_without_a_warning_or_a_count(tmp_path, disk_usage, caplog):
    with MessageStore.open(tmp_path, small_config(**{**FILLING, "file_reserved_hours": 0})) as store:
        _fill(store)
        disk_usage[0] = 0.80  # over disk_max_used_space_ratio: expired segments go at once
        with caplog.at_level(logging.WARNING, logger="mqstore.store.retention"):
            report = store._retention.run_once(manual=False)
        assert report.reason == "disk" and report.segments_removed and report.unexpired_segments_removed == []
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert store.stats()["disk"]["unexpired_segments_removed"] == 0


def test_a_put_that_finds_no_disk_for_its_reservation_is_refused_as_disk_full(tmp_path, monkeypatch):
    with MessageStore.open(tmp_path, small_config(preallocate_segments=True)) as store:
        first = store.put(Message("t", b"first"))
        assert store.wait_dispatched(10)  # its queue file is made (a queue file is reserved whole at creation)

        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(mapped_file_module.os, "posix_fallocate", no_space)
        results = [store.put(Message("t", b"x" * 3000)) for _ in range(40)]  # 120 KB: past the reserved part
        statuses = [r.status for r in results]
        assert PutStatus.DISK_FULL in statuses
        assert set(statuses[statuses.index(PutStatus.DISK_FULL):]) == {PutStatus.DISK_FULL}
        assert [r.status for r in store.put_batch([Message("t", b"y" * 3000)] * 30)][-1] is PutStatus.DISK_FULL
        monkeypatch.undo()
        again = store.put(Message("t", b"room again"))
        assert again.status is PutStatus.PUT_OK
        stored = statuses.count(PutStatus.PUT_OK)
        assert store.wait_dispatched(10)
        got = store.get("t", 0, 0, max_count=1000).messages
        assert got[0].commitlog_offset == first.commitlog_offset
        assert got[-1].body == b"room again" and len(got) >= 2 + stored
