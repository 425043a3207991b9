"""StoreConfig: checked when built, frozen, keyword-only; format fields saved and checked on reopen."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mqstore import (
    ConfigMismatchError,
    CorruptionError,
    FlushMode,
    InvalidConfigError,
    Message,
    MessageStore,
    StoreConfig,
)
from mqstore.store.config import FORMAT_FIELDS, config_as_dict
from tests.conftest import small_config


def test_defaults_are_rocketmqs():
    config = StoreConfig(store_host="10.0.0.7")
    assert config.segment_size_bytes == 1 << 30 and config.consume_queue_entries_per_file == 300_000
    assert config.max_message_size_bytes == 4 << 20 and config.flush_mode is FlushMode.ASYNC
    assert config.store_port == 10911 and config.born_host is None


def test_config_is_frozen_and_keyword_only():
    config = small_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.segment_size_bytes = 1
    with pytest.raises(TypeError):
        StoreConfig(65536)


@pytest.mark.parametrize("field, value", [
    ("segment_size_bytes", 4095), ("segment_size_bytes", "65536"), ("segment_size_bytes", True),
    ("consume_queue_entries_per_file", 0), ("max_message_size_bytes", -1), ("max_queues_per_topic", 0),
    ("max_message_size_bytes", 65536),  # does not fit a 64 KiB segment with the largest topic and properties
    ("flush_mode", "SYNC"), ("store_host", "example.com"), ("store_host", None), ("born_host", "1.2.3.256"),
    ("store_port", 65536), ("born_port", -1), ("max_dispatch_lag_bytes", -1), ("max_dispatch_lag_bytes", 1.5),
    ("write_fault_readahead", 0), ("warm_segments", "yes"),
])
def test_out_of_range_values_are_refused_when_built(field, value):
    with pytest.raises(InvalidConfigError):
        small_config(**{field: value})


def test_invalid_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        small_config(segment_size_bytes=0)


def test_only_the_format_fields_and_the_index_choice_are_saved(tmp_path):
    config = small_config()
    MessageStore.open(tmp_path, config).close()
    saved = json.loads((tmp_path / "config" / "mqstore.json").read_text())
    assert {"segment_size_bytes", "consume_queue_entries_per_file"} <= set(FORMAT_FIELDS)
    assert "max_message_size_bytes" not in FORMAT_FIELDS and "flush_mode" not in FORMAT_FIELDS
    assert saved == {"format_version": 1, **{name: getattr(config, name) for name in FORMAT_FIELDS},
                     "record_crc_from_offset": 0, "index_slot_count": 64, "index_entry_count_max": 256,
                     "index_enabled": config.index_enabled}
    assert (saved["segment_size_bytes"], saved["consume_queue_entries_per_file"]) == (65536, 64)
    assert config_as_dict(config)["flush_mode"] == "ASYNC"


@pytest.mark.parametrize("changed", [{"segment_size_bytes": 128 * 1024}, {"consume_queue_entries_per_file": 128}])
@pytest.mark.parametrize("read_only", [False, True])
def test_reopening_with_other_format_settings_is_a_mismatch(tmp_path, changed, read_only):
    with MessageStore.open(tmp_path, small_config()) as store:
        store.put(Message("t", b"x"))
    with pytest.raises(ConfigMismatchError):
        MessageStore.open(tmp_path, small_config(**changed), read_only=read_only)
    with MessageStore.open(tmp_path, small_config(max_message_size_bytes=100, flush_mode=FlushMode.SYNC)) as store:
        assert store.max_offset("t", 0) == 1  # other settings may change; the refused open left no lock behind


def test_an_unknown_format_version_is_a_mismatch(tmp_path):
    MessageStore.open(tmp_path, small_config()).close()
    path = tmp_path / "config" / "mqstore.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 99}))
    with pytest.raises(ConfigMismatchError):
        MessageStore.open(tmp_path, small_config())


def test_an_unreadable_settings_file_is_corruption(tmp_path):
    MessageStore.open(tmp_path, small_config()).close()
    (tmp_path / "config" / "mqstore.json").write_text("[1, 2")
    with pytest.raises(CorruptionError):
        MessageStore.open(tmp_path, small_config())
