"""Recovery of a store whose history is in its tier: one test per row the tier adds or changes in the recovery table
(mqstore/store/recovery.py): QUEUE_REBUILT's last entry below the local log checked in the tier, TIER_REPLAYED,
TIER_UNREADABLE, and retention's rule that makes them rare (a segment leaves local disk only once the queue and index
entries of its records are on disk).

Each store holds a quiet topic ("early": 20 messages, then never again) and 600 messages of "orders"; every segment
but the one being written is uploaded and removed from local disk, so the quiet queue's entries all name records
that only the tier holds.
"""

from __future__ import annotations

import random
import shutil
import struct

import pytest
from mqstore.flush.checkpoint import Checkpoint

from mqstore import CorruptionError, GetStatus, Message, MessageStore, StoreIOError
from mqstore.store import tier_history
from mqstore.store.markers import ABORT_FILE_NAME
from mqstore.store.recovery import RecoveryCase
from mqstore.tier import manifest as manifest_module
from tests.tier.conftest import s3_server, tier_uri  # noqa: F401 - the tier fixtures, for this module too
from tests.tier.test_reads import put_orders
from tests.tier.test_uploader import SEGMENT, sealed_end, tier_config, wait_uploaded

QUIET = ("early", 0)
QUIET_COUNT = 20
ORDERS_COUNT = 600


def offloaded(root, config, seed: int, orders: int = ORDERS_COUNT) -> dict:
    """Fill the store (module docstring), remove every uploaded segment, close it; each queue's messages."""
    with MessageStore.open(root, config) as store:
        store.put_batch([Message(QUIET[0], b"e%d" % n + b"." * 200, queue_id=QUIET[1], keys=[f"early-{n}"])
                         for n in range(QUIET_COUNT)])
        put_orders(store, random.Random(seed), orders)
        assert store.wait_dispatched(10)
        wait_uploaded(store, sealed_end(store))
        report = store.clean_expired()
        assert report["segments_removed"] and store.stats()["commitlog"]["min_offset"] >= sealed_end(store)
        return queue_messages(store)


def queue_messages(store) -> dict:
    found = {}
    for topic, queue_ids in store.topics().items():
        for queue_id in queue_ids:
            result = store.get(topic, queue_id, 0, max_count=ORDERS_COUNT)
            assert result.status is GetStatus.FOUND and result.next_offset == result.max_offset
            found[(topic, queue_id)] = result.messages
    return found


def assert_reads_all(store, expected: dict) -> None:
    """Every queue's messages from entry 0 through get(), and every quiet message and every 25th order by key."""
    assert queue_messages(store) == expected
    for message in expected[QUIET] + [m for key, queue in expected.items() if key != QUIET for m in queue[::25]]:
        assert store.query(message.topic, message.keys[0]) == [message]


def crash_after_close(root) -> None:
    (root / ABORT_FILE_NAME).touch()  # a crash after the close's last flush: recovery runs, nothing is lost


def quiet_queue_file(root):
    return root / "consumequeue" / QUIET[0] / str(QUIET[1]) / f"{0:020d}"


def cut_off(tier_dir) -> None:
    """Make the file:// tier fail every read of its manifest (each slot's name a directory: an I/O error, as an
    outage gives, not an empty tier) until `reconnect`."""
    for key in manifest_module.MANIFEST_KEYS:
        path = tier_dir / key
        if path.exists():
            path.rename(path.with_name(path.name + ".away"))
        path.mkdir()


def reconnect(tier_dir) -> None:
    for key in manifest_module.MANIFEST_KEYS:
        path = tier_dir / key
        path.rmdir()
        away = path.with_name(path.name + ".away")
        if away.exists():
            away.rename(path)


def test_a_crash_checks_a_quiet_queues_last_entry_in_the_tier_and_keeps_it(tmp_path):
    """QUEUE_REBUILT (changed): a last entry below the local log is read back from the tier, and kept."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 51)
    crash_after_close(root)
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.crashed and RecoveryCase.QUEUE_REBUILT not in report.cases()
        assert report.tier_case is None and report.index_entries_dropped == 0
        assert store.stats()["tier"]["reads"]["range_reads"] >= 1  # the quiet queue's last record
        assert_reads_all(store, expected)


def test_a_last_entry_below_the_local_log_naming_another_record_is_rebuilt_from_the_tier(tmp_path):
    """QUEUE_REBUILT and TIER_REPLAYED: the tier's record is another queue's, so the queue is rebuilt, from the
    tier's history."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 52)
    first_order = min((queue[0] for key, queue in expected.items() if key != QUIET),
                      key=lambda message: message.commitlog_offset)
    path = quiet_queue_file(root)
    data = bytearray(path.read_bytes())  # the last entry names the first order: offsets still rise, sizes sound
    struct.pack_into(">qi", data, (QUIET_COUNT - 1) * 20, first_order.commitlog_offset, first_order.size_bytes)
    path.write_bytes(bytes(data))
    crash_after_close(root)
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.queue_cases == {"early/0": RecoveryCase.QUEUE_REBUILT}
        assert report.tier_case is RecoveryCase.TIER_REPLAYED and report.tier_replayed_from == 0
        assert report.tier_messages_redispatched == QUIET_COUNT + ORDERS_COUNT - len(
            [m for queue in expected.values() for m in queue if m.commitlog_offset >= store._commitlog.min_offset()])
        assert_reads_all(store, expected)
    with MessageStore.open(root, config) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]


def test_a_corrupt_queue_of_the_tiers_history_is_rebuilt_from_the_tier(tmp_path, tier_uri, monkeypatch):  # noqa: F811
    """TIER_REPLAYED after a clean stop: a queue file that breaks its format rule; the tier's segments are read in
    windows far smaller than a segment, so records straddle them."""
    monkeypatch.setattr(tier_history, "TIER_REDISPATCH_WINDOW_BYTES_FIRST", 3000)
    monkeypatch.setattr(tier_history, "TIER_REDISPATCH_WINDOW_BYTES_MAX", 12_000)
    root = tmp_path / "store"
    config = tier_config(tier_uri, file_reserved_hours=0)
    expected = offloaded(root, config, 53)
    path = root / "consumequeue" / "orders" / "1" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[20 * 3 : 20 * 3 + 8] = struct.pack(">q", 10**12)  # entry 3 jumps far ahead: offsets no longer increase
    path.write_bytes(bytes(data))
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CLEAN and report.queue_cases == {"orders/1": RecoveryCase.QUEUE_REBUILT}
        assert report.tier_case is RecoveryCase.TIER_REPLAYED and report.tier_replayed_from == 0
        assert store._tier_history.range_reads > store._commitlog.min_offset() // SEGMENT  # windows, not segments
        assert_reads_all(store, expected)


def test_a_rebuilt_index_is_replayed_from_the_tier(tmp_path):
    """INDEX_REBUILT and TIER_REPLAYED: the new index holds the keys of the records only the tier holds."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 54)
    index_file = sorted((root / "index").iterdir())[0]
    data = bytearray(index_file.read_bytes())
    data[36:40] = (10**6).to_bytes(4, "big")  # indexCount past the file's entries
    index_file.write_bytes(bytes(data))
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.index_case is RecoveryCase.INDEX_REBUILT and report.tier_case is RecoveryCase.TIER_REPLAYED
        assert report.tier_replayed_from == 0 and not report.queues_rebuilt
        assert_reads_all(store, expected)


def test_an_index_directory_deleted_is_rebuilt_from_the_tier(tmp_path):
    """TIER_REPLAYED: the way to add index keys an outage kept recovery from re-dispatching (docs/recovery.md)."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 63)
    shutil.rmtree(root / "index")
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.tier_case is RecoveryCase.TIER_REPLAYED and report.tier_replayed_from == 0
        assert_reads_all(store, expected)


def test_a_crash_with_a_replaced_checkpoint_replays_the_index_from_the_tier(tmp_path):
    """CHECKPOINT_REPLACED and TIER_REPLAYED: nothing says how far the index was flushed, so the crash cuts all of
    it, and the tier gives back the keys below the local log."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 55)
    crash_after_close(root)
    (root / "checkpoint").write_bytes(b"\xff" * 4096)
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.checkpoint_case is RecoveryCase.CHECKPOINT_REPLACED
        assert report.index_case is RecoveryCase.INDEX_CUT
        assert report.index_entries_dropped > 2 * ORDERS_COUNT and not report.queues_rebuilt
        assert report.tier_case is RecoveryCase.TIER_REPLAYED and report.tier_replayed_from == 0
        assert_reads_all(store, expected)


@pytest.mark.parametrize("dispatch_process", [False, True])
def test_retention_flushes_the_entries_before_a_segment_leaves_so_a_crash_needs_no_tier(tmp_path, dispatch_process):
    """Retention's rule (mqstore/store/retention.py): with queue and index flushes that never run on their own, a
    kill right after segments left local disk still finds every entry below the local log on disk."""
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0, dispatch_process=dispatch_process,
                         flush_consume_queue_interval_ms=3_600_000)
    with MessageStore.open(tmp_path / "live", config) as store:
        store.put_batch([Message(QUIET[0], b"e%d" % n, queue_id=QUIET[1], keys=[f"early-{n}"])
                         for n in range(QUIET_COUNT)])
        put_orders(store, random.Random(56), ORDERS_COUNT)
        assert store.wait_dispatched(10)
        wait_uploaded(store, sealed_end(store))
        assert store.clean_expired()["segments_removed"]
        expected = queue_messages(store)
        local_min = store.stats()["commitlog"]["min_offset"]
        # the live store's files as a crash would leave them, less the ones being made or replaced meanwhile
        shutil.copytree(store.root_dir, tmp_path / "crashed", ignore=shutil.ignore_patterns("*.creating", "*.tmp"))
    checkpoint = Checkpoint.open(tmp_path / "crashed", writable=False)
    assert checkpoint.index_flushed_end >= local_min > 0
    checkpoint.close()
    with MessageStore.open(tmp_path / "crashed", config) as store:
        report = store.recovery_report
        assert report.crashed and report.tier_case is None and report.tier_messages_redispatched == 0
        assert not report.queues_rebuilt
        assert_reads_all(store, expected)


def test_an_unreadable_tier_keeps_a_quiet_queue_unchecked_and_says_so(tmp_path):
    """TIER_UNREADABLE: the last entry it cannot check is kept (its segment left only once it was on disk)."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 57)
    crash_after_close(root)
    cut_off(tmp_path / "tier")
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.tier_case is RecoveryCase.TIER_UNREADABLE and "StoreIOError" in report.tier_problem
        unchecked, not_looked_for = report.tier_not_checked
        assert "early/0" in unchecked and "kept unchecked" in unchecked and "not looked for" in not_looked_for
        assert not report.queues_rebuilt and store.max_offset(*QUIET) == QUIET_COUNT
    reconnect(tmp_path / "tier")
    with MessageStore.open(root, config) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]
        assert_reads_all(store, expected)


def test_a_rebuild_that_needs_an_unreadable_tier_is_refused_and_changes_nothing(tmp_path):
    """TIER_UNREADABLE: a queue rebuilt from the local log alone would lose its history for good, so the open
    raises StoreIOError before anything changes; once the tier answers, the next open rebuilds it from there."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 58)
    path = quiet_queue_file(root)
    data = bytearray(path.read_bytes())
    data[20 * 3 : 20 * 3 + 8] = struct.pack(">q", 10**12)
    path.write_bytes(bytes(data))
    damaged = path.read_bytes()
    cut_off(tmp_path / "tier")
    with pytest.raises(StoreIOError, match="rebuild consume queue early/0"):
        MessageStore.open(root, config)
    assert path.read_bytes() == damaged
    reconnect(tmp_path / "tier")
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.queue_cases == {"early/0": RecoveryCase.QUEUE_REBUILT}
        assert report.tier_case is RecoveryCase.TIER_REPLAYED
        assert_reads_all(store, expected)


def test_a_queue_file_the_tier_lists_and_local_disk_lacks_is_rebuilt_from_the_tier(tmp_path):
    """QUEUE_REBUILT: with a tier, retention deletes no queue file, so a first file (or a whole queue) that local
    disk lacks while the tier's manifest lists it was lost to damage, though its records are only in the tier."""
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 62)
    files = sorted((root / "consumequeue" / "orders" / "2").iterdir())
    assert len(files) > 1
    files[0].unlink()  # the queue now starts at its second file, at an entry whose record only the tier holds
    shutil.rmtree(quiet_queue_file(root).parent)
    with MessageStore.open(root, config) as store:
        report = store.recovery_report
        assert report.queue_cases == {"orders/2": RecoveryCase.QUEUE_REBUILT, "early/0": RecoveryCase.QUEUE_REBUILT}
        assert report.tier_case is RecoveryCase.TIER_REPLAYED
        assert_reads_all(store, expected)


def test_a_damaged_tier_segment_stops_the_replay_with_an_error_naming_the_object(tmp_path):
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(root, config, 59)
    victim = expected[QUIET][5]
    segment = tmp_path / "tier" / manifest_module.segment_key(0)
    data = bytearray(segment.read_bytes())
    data[victim.commitlog_offset + 100] ^= 0x40  # inside the body: only its CRC sees it
    segment.write_bytes(bytes(data))
    (root / "checkpoint").write_bytes(b"\xff" * 4096)  # the index must come back from the tier
    crash_after_close(root)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(root, config)
    assert raised.value.path.endswith(manifest_module.segment_key(0))
    assert raised.value.offset == victim.commitlog_offset and raised.value.rule == "commitlog.5"


def test_another_stores_tier_is_not_taken_for_the_history(tmp_path):
    """TIER_UNREADABLE: a tier_uri naming another store's tier of the same format (one with the same first messages,
    whose segments reach past this log's) is not read as this store's history: nothing is checked or rebuilt from
    it."""
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    other = tier_config((tmp_path / "other-tier").as_uri(), file_reserved_hours=0)
    expected = offloaded(tmp_path / "store", config, 60)
    offloaded(tmp_path / "other", other, 61, orders=2 * ORDERS_COUNT)
    crash_after_close(tmp_path / "store")
    with MessageStore.open(tmp_path / "store", other) as store:
        report = store.recovery_report
        assert report.tier_case is RecoveryCase.TIER_UNREADABLE and "not this store's" in report.tier_problem
        assert not report.queues_rebuilt and store.max_offset(*QUIET) == QUIET_COUNT
    with MessageStore.open(tmp_path / "store", config) as store:
        assert_reads_all(store, expected)
