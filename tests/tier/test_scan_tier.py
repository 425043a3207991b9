"""scan() of a tier: `scan_store(<tier URI>)` reads a store from its tier alone, with the rows, filters and checks of
a local scan; `MessageStore.scan()` of a store whose history left local disk reads it from the tier, each row once."""

from __future__ import annotations

import random
import shutil

import pyarrow as pa
import pytest

from mqstore import CorruptionError, MessageStore, StoreIOError
from mqstore.store.scan import scan_store
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from tests.tier.test_uploader import SEGMENT, TOPICS, put_messages, sealed_end, tier_config, wait_uploaded


@pytest.fixture
def uploaded(tmp_path, tier_uri):
    """A closed store whose sealed segments are in the tier: (store directory, tier URI, tier end)."""
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, random.Random(51), 700)
        end = sealed_end(store)
        wait_uploaded(store, end)
    return root, tier_uri, end


def test_a_tier_scans_as_the_local_store_does(uploaded):
    root, uri, end = uploaded
    assert scan_store(uri).read_all() == scan_store(root, end_offset=end).read_all()
    some = scan_store(root, end_offset=end, columns=["commitlog_offset", "store_timestamp"]).read_all()
    middle = some.column("commitlog_offset")[len(some) // 2].as_py()
    moment = some.column("store_timestamp")[len(some) // 3].as_py()
    for filters in (dict(topic="orders"), dict(topic=list(TOPICS[1:]), queue_ids=[0, 2]),
                    dict(start_offset=middle), dict(start_offset=SEGMENT + 7, end_offset=middle),
                    dict(start_time=moment), dict(end_time=moment, topic="audit")):
        ours = scan_store(uri, columns=["commitlog_offset", "topic", "body", "keys"], **filters).read_all()
        local = scan_store(root, columns=["commitlog_offset", "topic", "body", "keys"],
                           **{"end_offset": end, **filters} if "end_offset" not in filters else filters).read_all()
        # a local topic scan reads through the queues, queue by queue: compare in log order
        assert ours == local.sort_by("commitlog_offset") and len(ours) > 0, filters


def test_a_store_whose_history_left_local_disk_scans_every_row_once(tmp_path, tier_uri):
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        put_messages(store, random.Random(52), 900)
        assert store.wait_dispatched(30)
        before = store.scan().read_all()
        wait_uploaded(store, sealed_end(store))
        assert store.clean_expired()["segments_removed"]
        assert store.stats()["commitlog"]["min_offset"] > 0
        after = store.scan().read_all()
        topic = store.scan(topic="audit", start_offset=SEGMENT).read_all().sort_by("commitlog_offset")
    assert after == before
    offsets = after.column("commitlog_offset").to_pylist()
    assert offsets == sorted(set(offsets))
    expected = before.filter(pa.compute.and_(pa.compute.equal(before.column("topic"), "audit"),
                                             pa.compute.greater_equal(before.column("commitlog_offset"), SEGMENT)))
    assert topic == expected


def test_a_damaged_tier_segment_is_reported_as_the_local_scan_reports_it(uploaded, tmp_path):
    root, uri, _ = uploaded
    location = TierLocation.open(uri)
    manifest = manifest_module.load(location)
    key = manifest_module.segment_key(manifest.segments[1].base_offset)
    damaged = bytearray(location.read_range(key, SEGMENT, 0, SEGMENT))
    damaged[4] ^= 0xFF  # the first record's magic code
    location.put_bytes(key, bytes(damaged))
    local_copy = tmp_path / "copy"
    shutil.copytree(root, local_copy)
    (local_copy / "commitlog" / key.split("/")[1]).write_bytes(bytes(damaged))
    with pytest.raises(CorruptionError) as tier_error:
        scan_store(uri).read_all()
    with pytest.raises(CorruptionError) as local_error:
        scan_store(local_copy).read_all()
    assert tier_error.value.path.endswith(key) and tier_error.value.rule == local_error.value.rule
    assert tier_error.value.offset == local_error.value.offset


def test_a_short_tier_object_and_a_missing_manifest_are_errors(uploaded, tmp_path):
    _, uri, _ = uploaded
    location = TierLocation.open(uri)
    manifest = manifest_module.load(location)
    key = manifest_module.segment_key(manifest.segments[-1].base_offset)
    location.put_bytes(key, location.read_range(key, SEGMENT, 0, 1000))
    with pytest.raises(CorruptionError) as caught:
        scan_store(uri).read_all()
    assert caught.value.rule == "tier.object-size" and caught.value.path.endswith(key)
    with pytest.raises(StoreIOError):
        scan_store((tmp_path / "no-tier-here").as_uri())
