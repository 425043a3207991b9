"""Lookups by key through the store: exact matches despite collisions, time ranges, file rolls, rebuilds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mqstore.indexfile import format as index_format

from mqstore import ConfigMismatchError, CorruptionError, InvalidMessageError, Message, MessageStore
from tests.conftest import rocketmq_config, rocketmq_manifest, small_config


def config(**overrides):
    settings = dict(index_enabled=True, index_slot_count=4, index_entry_count_max=64)
    settings.update(overrides)
    return small_config(**settings)


def test_every_message_gets_a_unique_key_it_can_be_found_by(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        results = store.put_batch([Message("t", b"m%d" % i, queue_id=i % 2) for i in range(40)])
        results.append(store.put(Message("t", b"single", properties={"p": "v"})))
        assert store.wait_dispatched(10)
        keys = set()
        for result in results:
            message = store.get_by_msg_id(result.msg_id)
            key = message.properties["UNIQ_KEY"]
            assert len(key) == 32 and key == key.upper() and int(key, 16) >= 0
            keys.add(key)
            assert store.get_by_unique_key("t", key).commitlog_offset == result.commitlog_offset
            assert [m.commitlog_offset for m in store.query("t", key)] == [result.commitlog_offset]
        assert len(keys) == len(results)
        assert store.read_at(results[-1].commitlog_offset).properties["p"] == "v"


def test_a_caller_given_unique_key_is_kept(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        store.put(Message("t", b"mine", properties={"UNIQ_KEY": "my-own-id"}))
        assert store.wait_dispatched(10)
        assert store.get_by_unique_key("t", "my-own-id").body == b"mine"
        assert store.get_by_unique_key("other", "my-own-id") is None


def test_query_returns_exact_matches_newest_first_despite_hash_collisions(tmp_path):
    # Four hash slots for hundreds of keys: almost every chain mixes keys; results must not.
    with MessageStore.open(tmp_path, config(index_entry_count_max=4096)) as store:
        results = store.put_batch([Message("t", b"%d" % i, keys=(f"k{i % 37}", "shared")) for i in range(370)])
        store.put(Message("u", b"other topic", keys=("k5",)))
        assert store.wait_dispatched(10)
        found = store.query("t", "k5", max_count=100)
        expected = [r.commitlog_offset for i, r in enumerate(results) if i % 37 == 5][::-1]
        assert [m.commitlog_offset for m in found] == expected
        assert all("k5" in m.keys and m.topic == "t" for m in found)
        assert len(store.query("t", "shared", max_count=1000)) == 370
        assert [m.commitlog_offset for m in store.query("t", "k5", max_count=3)] == expected[:3]
        assert store.query("t", "no-such-key") == []


def test_query_filters_by_store_time(tmp_path, step_clock):
    with MessageStore.open(tmp_path, config()) as store:  # the step clock: each put its own store millisecond
        early = store.put(Message("t", b"early", keys=("k",)))
        late = store.put(Message("t", b"late", keys=("k",)))
        assert store.wait_dispatched(10)
        assert [m.body for m in store.query("t", "k")] == [b"late", b"early"]
        assert [m.body for m in store.query("t", "k", end_ms=early.store_timestamp_ms)] == [b"early"]
        assert [m.body for m in store.query("t", "k", begin_ms=late.store_timestamp_ms)] == [b"late"]


def test_index_files_roll_and_survive_a_reopen(tmp_path):
    with MessageStore.open(tmp_path, config(index_entry_count_max=16)) as store:
        results = store.put_batch([Message("t", b"%d" % i, keys=("k",)) for i in range(100)])
        assert store.wait_dispatched(10)
    assert len(os.listdir(tmp_path / "index")) > 5
    with MessageStore.open(tmp_path, config(index_entry_count_max=16)) as store:
        found = store.query("t", "k", max_count=1000)
        assert [m.commitlog_offset for m in found] == [r.commitlog_offset for r in results][::-1]


def test_a_missing_or_corrupt_index_is_rebuilt_from_the_commitlog(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        results = store.put_batch([Message("t", b"%d" % i, keys=(f"k{i % 3}",)) for i in range(30)])
    for name in os.listdir(tmp_path / "index"):
        os.unlink(tmp_path / "index" / name)
    with MessageStore.open(tmp_path, config()) as store:
        assert store.wait_dispatched(10)
        assert len(store.query("t", "k1", max_count=100)) == 10
    first = sorted(os.listdir(tmp_path / "index"))[0]
    with open(tmp_path / "index" / first, "r+b") as handle:
        handle.seek(36)
        handle.write((10**6).to_bytes(4, "big"))  # indexCount far past the file's room
    with MessageStore.open(tmp_path, config()) as store:
        assert store.index_rebuilt_because is not None and "indexCount" in store.index_rebuilt_because
        assert store.wait_dispatched(10)
        assert [m.commitlog_offset for m in store.query("t", "k2", max_count=100)] == \
            [r.commitlog_offset for i, r in enumerate(results) if i % 3 == 2][::-1]


def test_index_files_of_other_sizes_are_rebuilt_by_a_writer_and_refused_to_a_reader(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        store.put(Message("t", b"x", keys=("k",)))
    with pytest.raises(ConfigMismatchError):
        MessageStore.open(tmp_path, config(index_slot_count=8), read_only=True)
    with MessageStore.open(tmp_path, config(index_slot_count=8)) as store:
        assert "bytes" in store.index_rebuilt_because
        assert store.wait_dispatched(10)
        assert [m.body for m in store.query("t", "k")] == [b"x"]
    with MessageStore.open(tmp_path, config(index_enabled=False)) as store:
        with pytest.raises(InvalidMessageError):
            store.query("t", "k")


def test_bad_lookups_are_refused(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        result = store.put(Message("t", b"x"))
        for bad in ("", "zz", "0" * 31, result.msg_id[:-1] + "G"):
            with pytest.raises(InvalidMessageError):
                store.get_by_msg_id(bad)
        other_host = "C0A80001" + result.msg_id[8:]
        with pytest.raises(InvalidMessageError):
            store.get_by_msg_id(other_host)
        for bad_key in ("", None, 5):
            with pytest.raises(InvalidMessageError):
                store.query("t", bad_key)
        with pytest.raises(InvalidMessageError):
            store.query("../t", "k")
        with pytest.raises(InvalidMessageError):
            store.query("t", "k", max_count=0)


def test_rocketmqs_own_index_answers_through_the_store(rocketmq_store_copy):
    manifest = {m["commitlog_offset"]: m for m in rocketmq_manifest()}
    with MessageStore.open(rocketmq_store_copy, rocketmq_config(), read_only=True) as store:
        for entry in list(manifest.values())[::50]:
            uniq = entry["properties"]["UNIQ_KEY"]
            assert store.get_by_unique_key(entry["topic"], uniq).commitlog_offset == entry["commitlog_offset"]
            assert store.get_by_msg_id(entry["msg_id"]).commitlog_offset == entry["commitlog_offset"]
            for key in (entry["keys"] or "").split():
                found = {m.commitlog_offset for m in store.query(entry["topic"], key, max_count=1024)}
                expected = {o for o, m in manifest.items()
                            if m["topic"] == entry["topic"] and key in (m["keys"] or "").split()}
                assert found == expected


def test_query_returns_a_message_once_when_its_keys_hold_the_key_twice(tmp_path):
    """The index has an entry per key occurrence (as RocketMQ's, which answers with the message that many times)."""
    with MessageStore.open(tmp_path, config(index_entry_count_max=4096)) as store:
        results = store.put_batch([Message("t", b"%d" % i, keys=("k", "k", "k") if i % 2 else ("k",))
                                   for i in range(10)])
        twice = store.put(Message("t", b"uniq too", keys=("mine", "other"), properties={"UNIQ_KEY": "mine"}))
        assert store.wait_dispatched(10)
        expected = [r.commitlog_offset for r in results][::-1]
        assert [m.commitlog_offset for m in store.query("t", "k", max_count=100)] == expected
        assert [m.commitlog_offset for m in store.query("t", "k", max_count=4)] == expected[:4]
        assert [m.commitlog_offset for m in store.query("t", "mine")] == [twice.commitlog_offset]
        assert store.get_by_unique_key("t", "mine").commitlog_offset == twice.commitlog_offset


def test_a_rocketmq_message_with_a_key_twice_is_found_once(rocketmq_store_copy):
    """On RocketMQ's fixture, KEYS "key-34 key-34" at 334487: RocketMQ's IndexService answers it twice."""
    manifest = rocketmq_manifest()
    twice = [m for m in manifest if m["topic"] == "TopicTest" and (m["keys"] or "").split() == ["key-34", "key-34"]]
    assert [m["commitlog_offset"] for m in twice] == [334487]
    expected = sorted((m["commitlog_offset"] for m in manifest
                       if m["topic"] == "TopicTest" and "key-34" in (m["keys"] or "").split()), reverse=True)
    with MessageStore.open(rocketmq_store_copy, rocketmq_config(), read_only=True) as store:
        assert [m.commitlog_offset for m in store.query("TopicTest", "key-34", max_count=100)] == expected


def test_an_index_entry_pointing_where_no_record_starts_is_corruption_not_another_message(tmp_path):
    with MessageStore.open(tmp_path, config()) as store:
        store.put_batch([Message("t", b"%d" % i, keys=(f"k{i % 3}",)) for i in range(30)])
    path = tmp_path / "index" / sorted(os.listdir(tmp_path / "index"))[0]
    data = bytearray(path.read_bytes())
    entries_at = index_format.HEADER_SIZE_BYTES + index_format.SLOT_SIZE_BYTES * config().index_slot_count
    entries = np.frombuffer(data, dtype=index_format.INDEX_ENTRY, count=60, offset=entries_at).copy()
    entries["phy_offset"][10:50] += 1  # the middle entries (the open checks the first and last of a file)
    data[entries_at : entries_at + entries.nbytes] = entries.tobytes()
    path.write_bytes(bytes(data))
    with MessageStore.open(tmp_path, config(), read_only=True) as reader:
        with pytest.raises(CorruptionError) as raised:
            reader.query("t", "k1", max_count=100)
        assert raised.value.path == str(tmp_path / "index") and raised.value.rule == "indexfile.entry"


def test_a_read_only_store_finds_keys_a_writer_indexes_after_it_opened(tmp_path):
    """The reader's index follows the writer: new keys in slots its header did not count yet, and new files."""
    settings = config(index_slot_count=4, index_entry_count_max=64)
    with MessageStore.open(tmp_path, settings) as writer:
        writer.put_batch([Message("t", b"a%d" % i, keys=("same",)) for i in range(10)])
        assert writer.wait_dispatched(10)
        with MessageStore.open(tmp_path, settings, read_only=True) as reader:
            assert len(reader.query("t", "same", max_count=1000)) == 10
            files_at_open = len(os.listdir(tmp_path / "index"))
            for start in range(0, 60, 10):  # two keys and a UNIQ_KEY each: several new files of 64 entries
                writer.put_batch([Message("t", b"b%d" % i, keys=("same", f"k{i}")) for i in range(start, start + 10)])
            assert writer.wait_dispatched(10)
            assert len(os.listdir(tmp_path / "index")) > files_at_open
            assert len(reader.query("t", "same", max_count=1000)) == 70
            assert [m.body for m in reader.query("t", "k42")] == [b"b42"]
            unique = writer.get_by_msg_id(writer.put(Message("t", b"last")).msg_id).properties["UNIQ_KEY"]
            assert writer.wait_dispatched(10)
            assert reader.get_by_unique_key("t", unique).body == b"last"
