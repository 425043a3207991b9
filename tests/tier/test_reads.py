"""Reads fall through to the tier: once retention removed local segments that the tier holds, every read (get,
read_at, consumers, query, offset_for_time, the queues' offsets, the command line) returns the same messages,
byte for byte, for the writer and for a read_only open that finds the tier in the store; below the tier's start the
statuses stay RocketMQ's; damaged tier bytes raise CorruptionError naming the object; the cache keeps its bound;
a cold get costs one range read."""

from __future__ import annotations

import concurrent.futures
import json
import random
import urllib.parse

import pytest

from mqstore import CorruptionError, GetStatus, InvalidMessageError, Message, MessageStore
from mqstore.store import retention as retention_module
from mqstore.store.tiering import tier_file_path
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from tests.cli.conftest import mqstore  # noqa: F401 - the fixture that runs the command line in-process
from tests.conftest import wait_until
from tests.tier.conftest import S3_KEY
from tests.tier.test_uploader import SEGMENT, sealed_end, tier_config, wait_uploaded

TOPIC = "orders"
QUEUES = 3


def credentials_from_environment(uri: str, monkeypatch) -> str:
    """`uri` without its user info, the test S3 server's dummy keys in AWS_* variables instead (as a deployment
    gives them): such a URI is saved in the store."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_KEY)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def put_orders(store, rng: random.Random, count: int, first: int = 0) -> None:
    """`count` messages over QUEUES queues, each with its key; every 40th is longer than a read_at's first window
    (mqstore/tier/reader.py TIER_READ_AT_FIRST_BYTES)."""
    store.put_batch([Message(TOPIC, rng.randbytes(6000 if number % 40 == 7 else rng.randint(100, 500)),
                             queue_id=number % QUEUES, tags=f"tag-{number % 4}", keys=[f"key-{number}"])
                     for number in range(first, first + count)])


def every_message(store) -> dict[int, list]:
    """Each queue's messages, from its first entry, through get()."""
    found = {}
    for queue_id in range(QUEUES):
        messages, offset = [], store.min_offset(TOPIC, queue_id)
        while offset < store.max_offset(TOPIC, queue_id):
            result = store.get(TOPIC, queue_id, offset, max_count=64)
            assert result.status is GetStatus.FOUND, (queue_id, offset, result.status)
            messages += result.messages
            offset = result.next_offset
        found[queue_id] = messages
    return found


def offload(store, rng: random.Random, count: int, first: int = 0) -> dict:
    """Put `count` messages, wait for the tier to hold the sealed segments, remove them from local disk."""
    put_orders(store, rng, count, first)
    assert store.wait_dispatched(10)
    wait_uploaded(store, sealed_end(store))
    report = store.clean_expired()
    assert report["segments_removed"] and report["queue_files_removed"] == report["index_files_removed"] == 0
    return report


def assert_reads_everything(store, expected: dict[int, list]) -> None:
    """Every message of `expected` (queue id -> messages from offset 0) through each kind of read."""
    assert every_message(store) == expected
    messages = [message for queue in expected.values() for message in queue]
    for message in messages:
        assert store.read_at(message.commitlog_offset) == message
    for queue_id, queue in expected.items():
        assert (store.min_offset(TOPIC, queue_id), store.max_offset(TOPIC, queue_id)) == (0, len(queue))
        for message in queue[:: max(1, len(queue) // 7)]:  # the first offset stored at or after its time
            first = next(m.queue_offset for m in queue if m.store_timestamp_ms >= message.store_timestamp_ms)
            assert store.offset_for_time(TOPIC, queue_id, message.store_timestamp_ms) == first
    for message in messages[:: max(1, len(messages) // 25)]:
        assert store.query(TOPIC, message.keys[0]) == [message]
    consumer = store.consumer(None, TOPIC)
    consumed = {queue_id: [] for queue_id in expected}
    for message in consumer:
        consumed[message.queue_id].append(message)
    assert consumed == expected


def test_the_writer_reads_what_left_local_disk_from_the_tier(tmp_path, tier_uri):
    rng = random.Random(41)
    with MessageStore.open(tmp_path / "store", tier_config(tier_uri, file_reserved_hours=0)) as store:
        put_orders(store, rng, 900)
        assert store.wait_dispatched(10)
        expected = every_message(store)
        wait_uploaded(store, sealed_end(store))
        report = store.clean_expired()
        stats = store.stats()
        assert len(report["segments_removed"]) >= 4 and stats["commitlog"]["min_offset"] >= 4 * SEGMENT
        assert report["queue_files_removed"] == report["index_files_removed"] == 0
        assert stats["tier"]["read_min_offset"] == 0
        assert_reads_everything(store, expected)
        group = store.consumer("billing", TOPIC)  # a group's positions start at the tier's start and commit
        assert len(group.poll(max_count=100)) == 100
        group.commit()
    reads = stats["tier"]["reads"]
    assert reads["range_reads"] == 0 and reads["cache_bytes"] == 0  # nothing read from the tier before the clean


def test_a_read_only_open_and_the_command_line_find_the_tier_in_the_store(tmp_path, tier_uri, monkeypatch,
                                                                          mqstore):  # noqa: F811
    uri = credentials_from_environment(tier_uri, monkeypatch)
    rng = random.Random(42)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(uri, file_reserved_hours=0)) as writer:
        offload(writer, rng, 500)
        with MessageStore.open(root, read_only=True) as reader:  # no tier_uri: config/tier.json names it
            assert reader.config.tier_uri == TierLocation.open(uri).uri
            assert_reads_everything(reader, every_message(writer))
            loads = reader._tier_reader.manifest_loads
            offload(writer, rng, 500, first=500)  # more leaves the writer's disk: the reader follows
            assert every_message(reader) == every_message(writer)
            assert reader._tier_reader.manifest_loads > loads
        expected = every_message(writer)
        oldest = expected[1][0]
    with MessageStore.open(root, read_only=True) as reader:
        assert_reads_everything(reader, expected)
    with MessageStore.open(root, tier_config(None)) as writer:  # a writer reopened without tier_uri: the saved one
        assert writer.stats()["tier"]["uri"] == TierLocation.open(uri).uri
        assert every_message(writer) == expected
    assert json.loads(open(tier_file_path(root)).read())["uri"] == TierLocation.open(uri).uri
    got = mqstore("get", root, "--topic", TOPIC, "--queue", 1, "--offset", 0, "--count", 5, "--json").json()
    assert got["status"] == "FOUND" and [m["body_hex"] for m in got["messages"]] == \
        [m.body.hex() for m in expected[1][:5]]
    dumped = mqstore("dump", root, "--offset", oldest.commitlog_offset, "--json").json()
    assert dumped["body_hex"] == oldest.body.hex() and dumped["crc_ok"]
    queried = mqstore("query", root, "--topic", TOPIC, "--key", oldest.keys[0], "--json").json_lines()
    assert [m["commitlog_offset"] for m in queried] == [oldest.commitlog_offset]
    tailed = mqstore("tail", root, "--topic", TOPIC, "--queue", 1, "--json").json_lines()
    assert [m["body_hex"] for m in tailed] == [m.body.hex() for m in expected[1]]
    stats = mqstore("stats", root, "--json").json()
    assert stats["tier"]["read_min_offset"] == 0 and stats["tier"]["start_offset"] == 0
    assert stats["topics"][TOPIC]["1"]["min_offset"] == 0


def test_below_the_tiers_start_reads_are_rocketmqs(tmp_path, tier_uri):
    rng = random.Random(43)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(None, file_reserved_hours=0)) as store:  # no tier yet
        put_orders(store, rng, 400)
        assert store.wait_dispatched(10)
        before = every_message(store)
        store.flush()
        store.clean_expired()  # retention without a tier: those segments are gone
        local_min = store.stats()["commitlog"]["min_offset"]
    assert local_min >= 2 * SEGMENT
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        offload(store, rng, 600, first=400)
        tier_start = store.stats()["tier"]["start_offset"]
        assert tier_start == local_min < store.stats()["commitlog"]["min_offset"]
        for queue_id in range(QUEUES):
            first_kept = next(m.queue_offset for m in before[queue_id] if m.commitlog_offset >= tier_start)
            assert store.min_offset(TOPIC, queue_id) == first_kept > 0
            result = store.get(TOPIC, queue_id, first_kept - 1)
            assert result.status is GetStatus.OFFSET_TOO_SMALL and result.next_offset == first_kept
            assert store.get(TOPIC, queue_id, first_kept, max_count=1).messages[0].commitlog_offset >= tier_start
        with pytest.raises(InvalidMessageError):
            store.read_at(before[0][0].commitlog_offset)  # below the tier's start: not in the log any more
        assert store.query(TOPIC, before[0][0].keys[0]) == []


def overwrite(tier_uri: str, key: str, position: int, data: bytes) -> None:
    """Change bytes of an object in the tier behind the store's back (a damaged object store)."""
    location = TierLocation.open(tier_uri)
    size = location.size(key)
    content = bytearray(location.read_range(key, size, 0, size))
    content[position : position + len(data)] = data
    location.put_bytes(key, bytes(content))


def test_a_damaged_tier_object_raises_corruption_naming_it(tmp_path, tier_uri):
    rng = random.Random(44)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        put_orders(store, rng, 600)
        assert store.wait_dispatched(10)
        expected = every_message(store)
        wait_uploaded(store, sealed_end(store))
        store.clean_expired()
    victim = expected[2][3]  # a message of the tier's first segment
    key = manifest_module.segment_key(0)
    overwrite(tier_uri, key, victim.commitlog_offset + victim.size_bytes - 30, b"\xff" * 8)
    where = TierLocation.open(tier_uri).display(key)
    with MessageStore.open(root, tier_config(tier_uri), read_only=True) as store:
        with pytest.raises(CorruptionError) as raised:
            store.get(TOPIC, 2, 0, max_count=10)
        assert raised.value.path == where and raised.value.offset == victim.commitlog_offset
        assert f"commitlog offset {victim.commitlog_offset}" in str(raised.value)
        with pytest.raises(CorruptionError) as raised:
            store.read_at(victim.commitlog_offset)
        assert raised.value.path == where and raised.value.offset == victim.commitlog_offset
        assert store.get(TOPIC, 2, 4, max_count=10).messages == expected[2][4:14]  # the others read on


def test_the_cache_keeps_its_bound_and_a_cold_get_is_one_range_read(tmp_path, tier_uri):
    rng = random.Random(45)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        offload(store, rng, 900)
        expected = every_message(store)
    bound = SEGMENT * 5 // 2  # two of the tier's 64 KiB objects (each one block)
    with MessageStore.open(root, tier_config(tier_uri, tier_cache_bytes=bound), read_only=True) as store:
        reader = store._tier_reader
        result = store.get(TOPIC, 0, 0, max_count=8)
        assert result.messages == expected[0][:8]
        assert reader.stats()["range_reads"] == 1 and reader.stats()["objects_opened"] == 1
        assert store.get(TOPIC, 0, 0, max_count=8).messages == expected[0][:8]
        assert reader.stats()["range_reads"] == 1  # from the cache
        for _ in range(2):
            assert every_message(store) == expected
            held = sum(len(block) for block in reader._blocks.values())
            stats = reader.stats()
            assert held == stats["cache_bytes"] <= bound and stats["cache_bytes_peak"] <= bound
        assert stats["range_reads"] > len(manifest_module.load(TierLocation.open(tier_uri)).segments)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # threads share the cache
            assert all(found == expected for found in pool.map(lambda _: every_message(store), range(3)))
        assert reader.stats()["cache_bytes_peak"] <= bound
    with MessageStore.open(root, tier_config(tier_uri, tier_cache_bytes=20_000), read_only=True) as store:
        store._tier_reader.block_bytes = 4096  # records across blocks, windows of many blocks, a cache of four
        assert every_message(store) == expected
        for message in [m for queue in expected.values() for m in queue]:
            assert store.read_at(message.commitlog_offset) == message
        stats = store._tier_reader.stats()
        assert stats["cache_bytes_peak"] <= 20_000 and stats["cache_blocks"] <= 4


def test_tier_local_retention_bytes_and_disk_pressure_remove_only_uploaded_segments(tmp_path, tier_uri,
                                                                                    monkeypatch):
    rng = random.Random(46)
    root = tmp_path / "store"
    config = tier_config(tier_uri, tier_local_retention_bytes=2 * SEGMENT, dispatch_process=True)
    with MessageStore.open(root, config) as store:  # file_reserved_hours=72: nothing expires
        put_orders(store, rng, 900)
        assert store.wait_dispatched(10)
        expected = every_message(store)
        wait_uploaded(store, sealed_end(store))
        report = store.clean_expired()
        listed_end = store.stats()["tier"]["uploaded_end"]
        segments = store.stats()["commitlog"]["segments"]
        assert report["offloaded_segments_removed"] == report["segments_removed"] != []
        assert report["unexpired_segments_removed"] == [] and segments * SEGMENT <= 2 * SEGMENT
        assert all(int(name) + SEGMENT <= listed_end for name in report["segments_removed"])
        assert every_message(store) == expected and store.stats()["disk"]["unexpired_segments_removed"] == 0
    monkeypatch.setattr(retention_module, "disk_usage_probe", lambda path: 0.8)  # over the ratio below
    pressed = tier_config(tier_uri, disk_max_used_space_ratio=0.75)
    with MessageStore.open(root, pressed) as store:
        assert wait_until(lambda: store.stats()["tier"]["uploaded_end"] is not None)  # the uploader read the tier
        store._tier_uploader.stop()  # what is put from here on is not uploaded
        put_orders(store, rng, 600, first=900)
        assert store.wait_dispatched(10)
        listed_end = store.stats()["tier"]["uploaded_end"]
        report = store.clean_expired()
        stats = store.stats()
        assert stats["commitlog"]["min_offset"] == listed_end < sealed_end(store)  # the rest is not in the tier
        assert report["unexpired_segments_removed"] == [] and store.min_offset(TOPIC, 0) == 0
        assert every_message(store)[0][: len(expected[0])] == expected[0]


def test_a_uri_with_credentials_is_not_saved(tmp_path, s3_server, mqstore):  # noqa: F811
    uri = s3_server.uri("credentials")  # the test server's dummy keys in its user info
    root = tmp_path / "store"
    rng = random.Random(47)
    with MessageStore.open(root, tier_config(uri, file_reserved_hours=0)) as store:
        offload(store, rng, 500)
        expected = every_message(store)
    saved = open(tier_file_path(root)).read()
    assert json.loads(saved)["uri"] is None and f"{S3_KEY}:{S3_KEY}@" not in saved
    with MessageStore.open(root, read_only=True) as store:  # the tier cannot be named: reads stop at local disk
        assert store.config.tier_uri is None and store.min_offset(TOPIC, 0) > 0
        assert store.get(TOPIC, 0, 0).status is GetStatus.OFFSET_TOO_SMALL
    with MessageStore.open(root, tier_config(uri), read_only=True) as store:
        assert every_message(store) == expected
    assert mqstore("get", root, "--topic", TOPIC, "--queue", 0, "--offset", 0, "--json").json()["status"] == \
        "OFFSET_TOO_SMALL"
    got = mqstore("get", root, "--topic", TOPIC, "--queue", 0, "--offset", 0, "--tier-uri", uri, "--json").json()
    assert [m["body_hex"] for m in got["messages"]] == [m.body.hex() for m in expected[0][:32]]


def test_a_crash_keeps_the_queues_and_index_entries_of_the_tiers_history(tmp_path):
    from mqstore.store.markers import ABORT_FILE_NAME

    rng = random.Random(48)
    root = tmp_path / "store"
    config = tier_config((tmp_path / "tier").as_uri(), file_reserved_hours=0)
    with MessageStore.open(root, config) as store:
        store.put_batch([Message("early", b"e" * 200, queue_id=0, keys=[f"early-{n}"]) for n in range(20)])
        offload(store, rng, 600)
        early = store.get("early", 0, 0, max_count=20).messages
    (root / ABORT_FILE_NAME).touch()  # a crash after the close's last flush: recovery runs
    with MessageStore.open(root, config) as store:
        assert store.query("early", "early-3") == [early[3]]
        assert store.get("early", 0, 0, max_count=20).messages == early
