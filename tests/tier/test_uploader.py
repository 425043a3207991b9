"""The tier uploader: sealed segments and the queue and index files they complete reach the tier, byte for byte,
listed by the manifest; never the segment being written; resumed after a reopen; retried through an outage; and
retention removes from local disk only what the manifest lists."""

from __future__ import annotations

import logging
import os
import random
import shutil
import threading

import numpy as np
import pytest
from mqstore.consumequeue import format as queue_fmt

from mqstore import FlushMode, Message, MessageStore
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation, crc32
from mqstore.tier.verify import verify_tier
from tests.conftest import small_config, wait_until
from tests.rocketmq import assert_same_messages, require_rmq, store_entries

SEGMENT = 64 * 1024
TOPICS = ("orders", "%RETRY%group", "audit")


def tier_config(uri: str, **overrides):
    settings = dict(tier_uri=uri, tier_upload_interval_ms=20, tier_backoff_max_ms=200, index_enabled=True,
                    consume_queue_entries_per_file=40, index_entry_count_max=100, tier_queue_refresh_bytes=0)
    settings.update(overrides)
    return small_config(**settings)


def put_messages(store, rng: random.Random, count: int, first: int = 0) -> None:
    for number in range(first, first + count):
        store.put(Message(rng.choice(TOPICS), rng.randbytes(rng.randint(0, 600)), queue_id=number % 3,
                          tags=f"tag-{number % 5}", keys=[f"key-{number}"]))


def sealed_end(store) -> int:
    """The end of the last segment the uploader may take: the one before the segment holding the log's end."""
    end = store.stats()["commitlog"]["max_offset"]
    return end - end % SEGMENT


def wait_uploaded(store, end: int) -> dict:
    assert wait_until(lambda: (store.stats()["tier"]["uploaded_end"] or 0) >= end), store.stats()["tier"]
    return store.stats()["tier"]


def test_sealed_segments_and_the_files_they_complete_reach_the_tier(tmp_path, tier_uri):
    rng = random.Random(31)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, 900)
        end = sealed_end(store)
        stats = wait_uploaded(store, end)
        written_end = store.stats()["commitlog"]["max_offset"]
    assert end >= 4 * SEGMENT and stats["uploaded_end"] == end and stats["failures"] == 0
    location = TierLocation.open(tier_uri)
    manifest = manifest_module.load(location)
    assert manifest.start == 0 and manifest.end == end
    for segment in manifest.segments:  # every sealed segment, byte for byte; the one being written is not there
        local = (root / "commitlog" / f"{segment.base_offset:020d}").read_bytes()
        key = manifest_module.segment_key(segment.base_offset)
        assert location.read_range(key, SEGMENT, 0, SEGMENT) == local and crc32(local) == segment.crc32
    assert location.size(manifest_module.segment_key(end)) is None and written_end > end
    for (topic, queue_id), files in manifest.queues.items():
        for queue_file in files:  # each image: the local file's entries below the tier's end, then zeros
            local = (root / "consumequeue" / topic / str(queue_id) / queue_file.name).read_bytes()
            remote = location.read_range(manifest_module.queue_key(topic, queue_id, queue_file.name), len(local), 0,
                                         len(local))
            kept = queue_file.entries * queue_fmt.UNIT_SIZE_BYTES
            assert remote[:kept] == local[:kept] and not remote[kept:].strip(b"\0")
            units = np.frombuffer(local, dtype=queue_fmt.CONSUME_QUEUE_UNIT)
            below = (units["size"] != 0) & (units["commitlog_offset"] < end)
            assert queue_file.entries == int(np.count_nonzero(below)) and crc32(local[:kept]) == queue_file.crc32
    assert {topic for topic, _ in manifest.queues} == set(TOPICS)
    index_names = sorted(os.listdir(root / "index"))
    assert [f.name for f in manifest.index] == [n for n in index_names[:-1]
                                                if any(f.name == n for f in manifest.index)]
    assert manifest.index and all(f.end_commitlog_offset < end for f in manifest.index)


def test_a_reopened_store_goes_on_after_the_manifest(tmp_path, tier_uri):
    rng = random.Random(32)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, 400)
        first_end = sealed_end(store)
        wait_uploaded(store, first_end)
    generation = manifest_module.load(TierLocation.open(tier_uri)).generation
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, 400, first=400)
        second_end = sealed_end(store)
        stats = wait_uploaded(store, second_end)
    manifest = manifest_module.load(TierLocation.open(tier_uri))
    assert second_end > first_end and manifest.end == second_end and manifest.generation > generation
    assert [s.base_offset for s in manifest.segments] == list(range(0, second_end, SEGMENT))
    assert stats["objects_uploaded"] < manifest.object_count()  # the first open's objects were not sent again


def _retention_while_uploads_fail(tmp_path, failing_uri: str, rng) -> dict:
    """Put into a store whose tier cannot be written, then run retention: its tier stats."""
    config = tier_config(failing_uri, file_reserved_hours=0, tier_backoff_max_ms=50)
    with MessageStore.open(tmp_path / "store", config) as store:
        put_messages(store, rng, 600)
        assert wait_until(lambda: store.stats()["tier"]["failures"] >= 2)
        report = store.clean_expired()
        stats = store.stats()
    assert report["segments_removed"] == [] and stats["commitlog"]["min_offset"] == 0
    assert stats["tier"]["uploaded_end"] is None and stats["tier"]["retrying"]
    assert stats["tier"]["lag_bytes"] == stats["commitlog"]["max_offset"]
    return stats["tier"]


def test_retention_removes_from_disk_only_what_the_manifest_lists(tmp_path):
    rng = random.Random(33)
    (tmp_path / "blocked").write_bytes(b"a file where the tier's directory should be")
    _retention_while_uploads_fail(tmp_path, (tmp_path / "blocked" / "tier").as_uri(), rng)
    tier = (tmp_path / "tier").as_uri()
    with MessageStore.open(tmp_path / "store", tier_config(tier, file_reserved_hours=0)) as store:
        end = sealed_end(store)
        wait_uploaded(store, end)
        put_messages(store, rng, 300, first=600)  # seals more segments, not uploaded before the clean below
        report = store.clean_expired()
        listed_end = manifest_module.load(TierLocation.open(tier)).end
        assert store.stats()["commitlog"]["min_offset"] <= listed_end
    assert report["segments_removed"] and report["log_min_offset"] <= listed_end
    for name in report["segments_removed"]:
        assert int(name) + SEGMENT <= listed_end
        assert (tmp_path / "tier" / "commitlog" / name).stat().st_size == SEGMENT


@pytest.mark.long  # the S3 client retries a refused connection for about 6 s a call
def test_an_unreachable_object_store_keeps_everything_local_and_no_secret_shows(tmp_path):
    unreachable = "s3://k:k@bucket/prefix?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    tier = _retention_while_uploads_fail(tmp_path, unreachable, random.Random(33))
    assert "k:k" not in str(tier) and "127.0.0.1:9" in tier["uri"]


@pytest.mark.long
def test_an_outage_is_retried_and_the_tier_catches_up(tmp_path):
    from tests.tier.conftest import S3_BUCKET, S3Server

    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = S3Server()  # a server of this test's own: it is stopped and started again
    try:
        server.filesystem().create_dir(S3_BUCKET)
        rng = random.Random(34)
        with MessageStore.open(tmp_path / "store", tier_config(server.uri("outage"))) as store:
            put_messages(store, rng, 300)
            before = wait_uploaded(store, sealed_end(store))
            server.stop()
            put_messages(store, rng, 600, first=300)
            assert wait_until(lambda: store.stats()["tier"]["consecutive_failures"] >= 2), store.stats()["tier"]
            down = store.stats()["tier"]
            assert down["uploaded_end"] == before["uploaded_end"] and down["lag_bytes"] > SEGMENT
            assert down["sealed_segments_waiting"] >= 1 and down["last_error"]
            server.start()
            after = wait_uploaded(store, sealed_end(store))
        assert after["failures"] >= 2 and not after["retrying"] and after["last_error"] == down["last_error"]
        manifest = manifest_module.load(TierLocation.open(server.uri("outage")))
        assert manifest.end == after["uploaded_end"] > before["uploaded_end"]
    finally:
        server.close()


def test_a_tier_holding_another_stores_log_is_refused(tmp_path, tier_uri):
    rng = random.Random(35)
    with MessageStore.open(tmp_path / "first", tier_config(tier_uri)) as store:
        put_messages(store, rng, 300)
        wait_uploaded(store, sealed_end(store))
    listed = manifest_module.load(TierLocation.open(tier_uri))
    for count in (100, 900):  # a log shorter than the tier's, and one as long with other bytes
        with MessageStore.open(tmp_path / f"second-{count}", tier_config(tier_uri)) as store:
            put_messages(store, rng, count)
            assert wait_until(lambda: store.stats()["tier"]["refused"] is not None)
            assert "another store" in store.stats()["tier"]["refused"]
    assert manifest_module.load(TierLocation.open(tier_uri)) == listed  # nothing of the second store was listed


@pytest.mark.long
@pytest.mark.parametrize("refresh_segments", [0, 3])
def test_rocketmq_reads_a_copy_of_the_tier(tmp_path, refresh_segments):
    """With the queue files refreshed each round, and with them behind the log (RocketMQ's start re-dispatches
    the rest, for every queue alike)."""
    rmq = require_rmq()
    rng = random.Random(36)
    tier_dir = tmp_path / "tier"
    config = tier_config(tier_dir.as_uri(), tier_queue_refresh_bytes=refresh_segments * SEGMENT)
    with MessageStore.open(tmp_path / "store", config) as store:
        for step in range(8):  # rounds of about a segment each: the queue files fall behind when they may
            put_messages(store, rng, 100, first=100 * step)
            end = sealed_end(store)
            wait_uploaded(store, end)
    manifest = manifest_module.load(TierLocation.open(tier_dir.as_uri()))
    assert manifest.end == end and (manifest.queues_end < end) == (refresh_segments > 0)
    copy = tmp_path / "copy"
    shutil.copytree(tier_dir, copy)  # what a download of the bucket gives
    theirs = rmq.read(copy, config, tmp_path / "work").entries
    with MessageStore.open(tmp_path / "store", config, read_only=True) as store:
        ours = [entry for entry in store_entries(store) if entry["commitlog_offset"] < end]
    assert len(ours) > 100
    for entry in theirs + ours:
        entry["properties"].pop("__CRC32#", None)
    assert_same_messages(ours, theirs, "RocketMQ 4.4.0 reading a copy of the tier")


def test_a_torn_manifest_slot_falls_back_to_the_other_and_is_written_again(tmp_path, tier_uri):
    rng = random.Random(38)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, 300)
        wait_uploaded(store, sealed_end(store))
        put_messages(store, rng, 300, first=300)
        wait_uploaded(store, sealed_end(store))
    location = TierLocation.open(tier_uri)
    newest = manifest_module.load(location)
    assert newest.generation >= 2
    newest_key = manifest_module.MANIFEST_KEYS[newest.generation % 2]
    whole = location.read_all(newest_key)
    location.put_bytes(newest_key, whole[: len(whole) // 2])  # what a crash in the middle of the PUT may leave
    older = manifest_module.load(location)
    assert older.generation == newest.generation - 1 and older.end < newest.end
    report = verify_tier(tier_uri)
    assert report.ok and len(report.spoiled_slots) == 1 and report.spoiled_slots[0]["object"].endswith(newest_key)
    with MessageStore.open(root, tier_config(tier_uri)) as store:  # the objects of the torn generation are sent again
        put_messages(store, rng, 100, first=600)
        stats = wait_uploaded(store, newest.end)
    assert stats["failures"] == 0 and verify_tier(tier_uri).spoiled_slots == []
    again = manifest_module.load(location)
    assert again.generation >= newest.generation and again.end >= newest.end
    assert again.segments[:len(newest.segments)] == newest.segments  # the same bytes, sent again


def test_a_torn_queue_image_is_written_again_when_the_store_opens(tmp_path, tier_uri):
    rng = random.Random(39)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, 500)
        wait_uploaded(store, sealed_end(store))
    location = TierLocation.open(tier_uri)
    manifest = manifest_module.load(location)
    (topic, queue_id), files = sorted(manifest.queues.items())[0]
    key = manifest_module.queue_key(topic, queue_id, files[-1].name)
    location.put_bytes(key, b"\0" * 7)
    assert not verify_tier(tier_uri).ok
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        assert wait_until(lambda: store.stats()["tier"]["rounds"] >= 1)
    assert verify_tier(tier_uri).ok


def test_queue_files_are_sent_again_only_every_refresh_bytes(tmp_path):
    rng = random.Random(40)
    uri = (tmp_path / "tier").as_uri()
    with MessageStore.open(tmp_path / "store", tier_config(uri, tier_queue_refresh_bytes=4 * SEGMENT)) as store:
        for round_number in range(6):
            put_messages(store, rng, 150, first=150 * round_number)
            wait_uploaded(store, sealed_end(store))
            manifest = manifest_module.load(TierLocation.open(uri))
            assert manifest.end - manifest.queues_end < 4 * SEGMENT + SEGMENT * 64, manifest.queues_end
            for (topic, queue_id), files in manifest.queues.items():  # each queue covers exactly [.., queues_end)
                local = (tmp_path / "store" / "consumequeue" / topic / str(queue_id) / files[-1].name).read_bytes()
                units = np.frombuffer(local, dtype=queue_fmt.CONSUME_QUEUE_UNIT)
                below = (units["size"] != 0) & (units["commitlog_offset"] < manifest.queues_end)
                assert files[-1].entries == int(np.count_nonzero(below)), (topic, queue_id)
    assert manifest.queues_end < manifest.end


@pytest.mark.parametrize("dispatch_process, flush_mode", [(False, FlushMode.ASYNC), (True, FlushMode.ASYNC),
                                                         (False, FlushMode.SYNC)])
def test_a_sealed_segment_puts_every_message_in_the_tier(tmp_path, dispatch_process, flush_mode):
    """seal_segment() has the segment it ends flushed now: the interval flush here would not run for an hour, and
    in SYNC mode nothing but a next put would flush the blank that ends the segment."""
    rng = random.Random(42)
    root = tmp_path / "store"
    uri = (tmp_path / "tier").as_uri()
    hour_ms = 3_600_000
    config = tier_config(uri, dispatch_process=dispatch_process, flush_mode=flush_mode, flush_interval_ms=hour_ms,
                         flush_thorough_interval_ms=hour_ms)
    with MessageStore.open(root, config) as store:
        put_messages(store, rng, 250)
        written_end = store.stats()["commitlog"]["max_offset"]
        end = store.seal_segment()
        assert end % SEGMENT == 0 and end > written_end and store.seal_segment() == end  # nothing more to seal
        assert store.wait_tiered(end, 30)
        put_messages(store, rng, 50, first=250)  # the next messages go to the next segment
        assert store.wait_dispatched(30)
        offsets = sorted(entry["commitlog_offset"] for entry in store_entries(store))
    assert len(offsets) == 300 and offsets[249] < written_end <= end <= offsets[250]
    manifest = manifest_module.load(TierLocation.open(uri))
    assert manifest.end == end
    with MessageStore.open(root, tier_config(uri), read_only=True) as store:
        assert len(store_entries(store)) == 300  # the blank is read past, as after a roll


def test_an_object_that_reads_back_wrong_is_never_listed(tmp_path, monkeypatch):
    """The read-back runs beside the next upload; a mismatch fails the round before its manifest is written."""
    original = TierLocation.checksum

    def lying(self, key, size, length=None):
        read, checksum = original(self, key, size, length)
        return (read, checksum ^ 1) if key.startswith("commitlog/") else (read, checksum)

    monkeypatch.setattr(TierLocation, "checksum", lying)
    uri = (tmp_path / "tier").as_uri()
    # the uploader's thread: the patched location is this process's
    with MessageStore.open(tmp_path / "store", tier_config(uri, file_reserved_hours=0,
                                                           tier_upload_process=False)) as store:
        put_messages(store, random.Random(43), 300)
        assert wait_until(lambda: store.stats()["tier"]["failures"] >= 2)
        stats = store.stats()["tier"]
        removed = store.clean_expired()["segments_removed"]
    assert "tier.verify" in stats["last_error"] or "read back differs" in stats["last_error"]
    assert stats["uploaded_end"] is None and removed == []
    assert manifest_module.load(TierLocation.open(uri)) is None


def test_a_store_closed_during_an_upload_counts_no_failure(tmp_path, monkeypatch, caplog):
    """close() stops the read-back thread while the uploader may still be sending an object: the round ends
    without a failure or a warning, nothing of it is listed, and the next open uploads the segment."""
    original = TierLocation.put_chunks
    sending, closing = threading.Event(), threading.Event()

    def slow(self, key, chunks):
        if key.startswith("commitlog/") and not closing.is_set():
            sending.set()
            assert closing.wait(10)  # the store is closing: the read-back thread is shut down by now
        return original(self, key, chunks)

    monkeypatch.setattr(TierLocation, "put_chunks", slow)
    uri = (tmp_path / "tier").as_uri()
    store = MessageStore.open(tmp_path / "store", tier_config(uri, tier_upload_process=False))  # patched here
    put_messages(store, random.Random(44), 300)
    assert sending.wait(10)
    uploader = store._tier_uploader
    stopping = threading.Thread(target=store.close)
    stopping.start()
    assert wait_until(uploader._stopping.is_set)
    closing.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert uploader.failures == 0 and uploader.last_error is None
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.records
    assert manifest_module.load(TierLocation.open(uri)) is None  # the interrupted round listed nothing
    monkeypatch.setattr(TierLocation, "put_chunks", original)
    with MessageStore.open(tmp_path / "store", tier_config(uri)) as reopened:
        wait_uploaded(reopened, sealed_end(reopened))
