"""Open, close, reopen: everything persists, offsets continue densely, one writer at a time."""

from __future__ import annotations

import os
import threading

import pytest

from mqstore import CorruptionError, GetStatus, Message, MessageStore, StoreIOError, StoreLockedError
from tests.unit.mqstore.conftest import config


def _everything(store, topics: dict[str, list[int]]):
    result = {}
    for topic, queue_ids in topics.items():
        for queue_id in queue_ids:
            got = store.get(topic, queue_id, 0, max_count=10_000)
            assert got.status is GetStatus.FOUND
            result[(topic, queue_id)] = got.messages
    return result


def test_close_then_reopen_sees_everything_and_offsets_continue(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        results = [store.put(Message(f"topic{i % 3}", bytes([i % 256]) * (i * 31 % 3000), queue_id=i % 4,
                                     tags=f"T{i % 5}", keys=[f"k{i}"])) for i in range(400)]
        assert store.wait_dispatched(30)
        topics = store.topics()
        before = _everything(store, topics)
        end = store.stats()["commitlog"]["max_offset"]
        segments = store.stats()["commitlog"]["segments"]
    assert segments > 3
    with MessageStore.open(store_dir, config()) as store:
        assert store.topics() == topics
        assert _everything(store, topics) == before
        assert store.stats()["commitlog"]["max_offset"] == end
        for result in results[::50]:
            assert store.read_at(result.commitlog_offset).msg_id == result.msg_id
        next_results = store.put_batch([Message("topic1", b"after", queue_id=q) for q in range(4)])
        assert next_results[0].commitlog_offset == end
        for (topic, queue_id), messages in before.items():
            if topic == "topic1":
                assert next_results[queue_id].queue_offset == len(messages)
        single = store.put(Message("topic2", b"single", queue_id=3))
        assert single.queue_offset == len(before[("topic2", 3)])
    with MessageStore.open(store_dir, config()) as store:
        got = store.get("topic2", 3, single.queue_offset)
        assert [m.body for m in got.messages] == [b"single"]


def _files(store_dir) -> dict:
    return {p.relative_to(store_dir): p.read_bytes() for p in store_dir.rglob("*") if p.is_file()}


def test_reopen_without_puts_changes_no_stored_byte(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        store.put(Message("t", b"x"))
    before = _files(store_dir)
    for _ in range(3):
        MessageStore.open(store_dir, config()).close()
    after = _files(store_dir)
    assert {name: after[name] for name in before} == before
    assert all(data == bytes(len(data)) for name, data in after.items() if name not in before)


def test_reopening_does_not_pile_up_empty_segments(store_dir):
    """A segment made ahead of need is reused by the next open, not followed by one more each time."""
    with MessageStore.open(store_dir, config()) as store:
        store.put(Message("t", b"x"))
    segments = sorted(path.name for path in (store_dir / "commitlog").iterdir())
    for _ in range(3):
        MessageStore.open(store_dir, config()).close()
    assert sorted(path.name for path in (store_dir / "commitlog").iterdir()) == segments


def test_an_empty_store_reopens_empty(store_dir):
    MessageStore.open(store_dir, config()).close()
    with MessageStore.open(store_dir, config()) as store:
        assert store.topics() == {} and store.stats()["commitlog"]["max_offset"] == 0
        assert store.put(Message("t", b"first")).commitlog_offset == 0


def test_a_second_writer_is_locked_out_until_the_first_closes(store_dir):
    first = MessageStore.open(store_dir, config())
    with pytest.raises(StoreLockedError):
        MessageStore.open(store_dir, config())
    with MessageStore.open(store_dir, config(), read_only=True) as reader:  # readers take no lock
        assert reader.topics() == {}
    first.put(Message("t", b"x"))
    first.close()
    with MessageStore.open(store_dir, config()) as second:
        assert second.max_offset("t", 0) == 1


def test_the_context_manager_releases_the_lock_after_an_error(store_dir):
    with pytest.raises(RuntimeError):
        with MessageStore.open(store_dir, config()) as store:
            store.put(Message("t", b"x"))
            raise RuntimeError("user code failed")
    with MessageStore.open(store_dir, config()) as store:
        assert store.max_offset("t", 0) == 1


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(StoreIOError):
        MessageStore.open(tmp_path / "missing", config(), read_only=True)
    assert not (tmp_path / "missing").exists()


def test_a_failed_open_stops_every_thread_it_started_and_releases_the_store(store_dir, monkeypatch):
    from mqstore.store import retention

    with MessageStore.open(store_dir, config()) as store:
        store.put(Message("t", b"kept"))
    before = {thread for thread in threading.enumerate() if thread.name.startswith("mqstore")}

    def failing(self, manual):
        raise OSError("injected: retention cannot read the disk")

    monkeypatch.setattr(retention.Retention, "run_once", failing)
    with pytest.raises(OSError, match="injected"):
        MessageStore.open(store_dir, config())
    left = {thread for thread in threading.enumerate() if thread.name.startswith("mqstore")} - before
    assert not {thread for thread in left if thread.is_alive()}
    monkeypatch.undo()
    with MessageStore.open(store_dir, config()) as store:  # the lock was released, the abort marker removed
        assert store.recovery_report.case == "CLEAN"
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"kept"]


def _open_descriptors() -> set[tuple[str, str]]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            found.add((name, os.readlink(f"/proc/self/fd/{name}")))
        except OSError:
            pass  # the descriptor listdir itself used
    return found


def test_opens_that_rebuild_or_fail_leave_no_descriptor_open(store_dir):
    small = config(consume_queue_entries_per_file=64)
    with MessageStore.open(store_dir, small) as store:
        store.put_batch([Message("t", b"x" * 300, queue_id=0) for _ in range(200)])  # four queue files
        assert store.wait_dispatched(30)
    before = _open_descriptors()
    queue_dir = store_dir / "consumequeue" / "t" / "0"
    third = sorted(queue_dir.iterdir())[2]
    data = bytearray(third.read_bytes())
    data[0:8] = (0).to_bytes(8, "big")  # its first entry now points backwards: the queue is rebuilt at open
    third.write_bytes(bytes(data))
    with MessageStore.open(store_dir, small) as store:
        assert store.recovery_report.queues_rebuilt == ["t/0"]
    with pytest.raises(CorruptionError):  # a read_only open refuses a queue that breaks its rule
        third.write_bytes(bytes(data))
        MessageStore.open(store_dir, small, read_only=True)
    segment = sorted((store_dir / "commitlog").iterdir())[-1]
    os.truncate(segment, 1000)  # the last segment cut short: the open fails
    with pytest.raises(CorruptionError):
        MessageStore.open(store_dir, small)
    assert _open_descriptors() == before
