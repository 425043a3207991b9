"""Settings read from the store: with no config, open() takes a store's saved format settings; only the settings a
caller passes are checked against them; a store RocketMQ wrote (no saved settings) is opened with the sizes its
files tell, and where they do not, the error names the settings to pass."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
from mqstore.commitlog.errors import ConfigMismatchError

from mqstore import FlushMode, GetStatus, Message, MessageStore, StoreConfig
from tests.conftest import ROCKETMQ_STORE, rocketmq_manifest, small_config

MIB = 1 << 20


def test_a_config_remembers_the_fields_its_caller_passed():
    assert StoreConfig().explicit_fields == frozenset()
    config = StoreConfig(segment_size_bytes=64 * MIB, flush_mode=FlushMode.SYNC)
    assert config.explicit_fields == {"segment_size_bytes", "flush_mode"}
    assert config.adopting(consume_queue_entries_per_file=64).explicit_fields == config.explicit_fields
    assert pickle.loads(pickle.dumps(config)).explicit_fields == config.explicit_fields
    assert config == StoreConfig(segment_size_bytes=64 * MIB, flush_mode=FlushMode.SYNC, record_crc=True)
    assert StoreConfig(segment_size_bytes=65536).max_message_size_bytes < 65536  # not given: what fits


@pytest.mark.parametrize("read_only", [False, True])
def test_open_without_a_config_adopts_the_store_s_saved_format(tmp_path, read_only):
    with MessageStore.open(tmp_path, StoreConfig(segment_size_bytes=64 * MIB, consume_queue_entries_per_file=1000,
                                                 store_host="10.0.0.7")) as store:
        store.put(Message("t", b"kept"))
    with MessageStore.open(tmp_path, read_only=read_only) as store:
        assert store.config.segment_size_bytes == 64 * MIB and store.config.consume_queue_entries_per_file == 1000
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"kept"]
    with MessageStore.open(tmp_path, StoreConfig(flush_mode=FlushMode.SYNC), read_only=read_only) as store:
        assert store.config.segment_size_bytes == 64 * MIB and store.config.flush_mode is FlushMode.SYNC


def test_only_settings_passed_explicitly_are_checked_and_the_error_names_them(tmp_path):
    MessageStore.open(tmp_path, StoreConfig(segment_size_bytes=64 * MIB, store_host="10.0.0.7")).close()
    with pytest.raises(ConfigMismatchError, match="segment_size_bytes: store has 67108864, config has 1073741824"):
        MessageStore.open(tmp_path, StoreConfig(segment_size_bytes=1 << 30), read_only=True)
    MessageStore.open(tmp_path, StoreConfig(segment_size_bytes=64 * MIB), read_only=True).close()


def test_a_rocketmq_store_opens_with_the_sizes_its_files_tell(rocketmq_store_copy):
    manifest = rocketmq_manifest()
    with MessageStore.open(rocketmq_store_copy, read_only=True) as store:
        config = store.config
        assert (config.segment_size_bytes, config.consume_queue_entries_per_file) == (65536, 64)
        assert (config.index_slot_count, config.index_entry_count_max) == (64, 256)  # from the index files
        first = manifest[0]
        got = store.get(first["topic"], first["queue_id"], first["queue_offset"])
        assert got.status is GetStatus.FOUND and got.messages[0].body.hex() == first["body_hex"]
        with open(ROCKETMQ_STORE / "queries.jsonl", encoding="utf-8") as handle:
            query = json.loads(handle.readline())
        found = store.query(query["topic"], query["key"], max_count=64)
        assert sorted(m.commitlog_offset for m in found) == query["commitlog_offsets"]


def test_index_files_whose_sizes_nothing_tells_name_the_settings_to_pass(tmp_path):
    config = small_config(index_enabled=True, index_slot_count=100, index_entry_count_max=256)
    with MessageStore.open(tmp_path, config) as store:
        store.put(Message("t", b"x", keys=("k",)))
    os.unlink(tmp_path / "config" / "mqstore.json")  # as a store RocketMQ wrote: no saved settings
    with pytest.raises(ConfigMismatchError) as raised:
        MessageStore.open(tmp_path, read_only=True)
    assert "index_slot_count" in str(raised.value) and "index_entry_count_max" in str(raised.value)
    with MessageStore.open(tmp_path, StoreConfig(index_slot_count=100, index_entry_count_max=256),
                           read_only=True) as store:
        assert [m.body for m in store.query("t", "k")] == [b"x"]
        assert store.config.segment_size_bytes == 65536  # the rest from the files


def test_a_segment_size_passed_against_a_rocketmq_store_s_files_names_both(rocketmq_store_copy):
    with pytest.raises(ConfigMismatchError, match="is 65536 bytes.*segment_size_bytes=1048576"):
        MessageStore.open(rocketmq_store_copy, StoreConfig(segment_size_bytes=MIB), read_only=True)


def test_the_command_line_queries_the_rocketmq_store_with_its_own_index_sizes(tmp_path, capsys):
    from mqstore.cli import main

    store = tmp_path / "rocketmq"
    shutil.copytree(ROCKETMQ_STORE / "store", store)
    with open(ROCKETMQ_STORE / "queries.jsonl", encoding="utf-8") as handle:
        query = json.loads(handle.readline())
    code = main(["query", str(store), "--topic", query["topic"], "--key", query["key"], "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "index_enabled=False" not in err
    offsets = sorted(json.loads(line)["commitlog_offset"] for line in out.splitlines() if line.startswith("{"))
    assert offsets == query["commitlog_offsets"]


def test_a_store_made_without_the_index_keeps_it_off_until_a_writer_passes_it(tmp_path):
    with MessageStore.open(tmp_path, StoreConfig(index_enabled=False, store_host="10.0.0.7")) as store:
        store.put(Message("t", b"no index"))
    with MessageStore.open(tmp_path) as store:  # the CLI's `recover` and a later writer open it like this
        assert store.config.index_enabled is False
        store.put(Message("t", b"still none"))
        assert all("UNIQ_KEY" not in m.properties for m in store.get("t", 0, 0).messages)
    assert not os.path.isdir(tmp_path / "index") or not os.listdir(tmp_path / "index")
    with MessageStore.open(tmp_path, StoreConfig(index_enabled=True)) as store:  # a writer's explicit choice is saved
        store.put(Message("t", b"keyed", keys=("k1",)))
        store.wait_dispatched()
        assert [m.body for m in store.query("t", "k1")] == [b"keyed"]
    with MessageStore.open(tmp_path, read_only=True) as store:
        assert store.config.index_enabled is True
        assert [m.body for m in store.query("t", "k1")] == [b"keyed"]
