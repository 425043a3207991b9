"""mqstore.consumer.offsets: RocketMQ's consumerOffset.json, fastjson's unquoted keys; atomic, advancing commits."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from mqstore import CorruptionError, InvalidMessageError, StoreIOError
from mqstore.consumer.offsets import (
    JSON_NESTING_MAX,
    ConsumerOffsets,
    decode_offsets_file,
    encode_offsets_file,
    offset_key,
    offsets_path,
    parse_lenient_json,
    split_offset_key,
    validate_group,
)
from tests.conftest import FIXTURES_DIR

ROCKETMQ_OFFSETS = FIXTURES_DIR / "consumerOffset.json"
ROCKETMQ_TABLE = {
    "%RETRY%group_a@group_a": {0: 0},
    "orders@group_a": {0: 120, 1: 97, 2: 0, 3: 64},
    "TopicTest@audit": {0: 3, 1: 3, 2: 3, 3: 3},
}


@pytest.fixture
def rocketmq_offsets() -> Path:
    if not ROCKETMQ_OFFSETS.is_file():
        pytest.fail(f"the RocketMQ offsets fixture is missing: {ROCKETMQ_OFFSETS}")
    return ROCKETMQ_OFFSETS


def test_the_fixture_is_not_strict_json(rocketmq_offsets):
    with pytest.raises(json.JSONDecodeError):
        json.loads(rocketmq_offsets.read_text())


def test_reads_the_file_rocketmq_wrote(rocketmq_offsets):
    offsets = ConsumerOffsets(str(rocketmq_offsets))
    assert offsets.table() == ROCKETMQ_TABLE
    assert offsets.offsets("orders", "group_a") == {0: 120, 1: 97, 2: 0, 3: 64}
    assert offsets.offsets("%RETRY%group_a", "group_a") == {0: 0}
    assert offsets.offsets("orders", "nobody") == {}


def test_a_commit_rewrites_it_as_strict_json_keeping_everything(rocketmq_offsets, tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    path.parent.mkdir()
    shutil.copy(rocketmq_offsets, path)
    assert ConsumerOffsets(str(path)).commit("orders", "group_a", {1: 100, 2: 5}) == {0: 120, 1: 100, 2: 5, 3: 64}
    strict = json.loads(path.read_text())
    assert strict["offsetTable"]["orders@group_a"] == {"0": 120, "1": 100, "2": 5, "3": 64}
    assert strict["offsetTable"]["TopicTest@audit"] == {"0": 3, "1": 3, "2": 3, "3": 3}
    assert ConsumerOffsets(str(path)).table() == {**ROCKETMQ_TABLE, "orders@group_a": {0: 120, 1: 100, 2: 5, 3: 64}}
    assert sorted(os.listdir(path.parent)) == ["consumerOffset.json", "consumerOffset.json.lock"]


@pytest.mark.parametrize("text, value", [
    ('{"offsetTable":{"t@g":{"0":1}}}', {"offsetTable": {"t@g": {"0": 1}}}),
    ("{0:543,1:-2 , 17 :\n3}", {"0": 543, "1": -2, "17": 3}),
    ('{dataVersion:{counter:7,"timestamp":1.5e3},list:[1, "a", true, false, null, []]}',
     {"dataVersion": {"counter": 7, "timestamp": 1500.0}, "list": [1, "a", True, False, None, []]}),
    ('{"a{0:1}\\"b":"x,2:3}"}', {'a{0:1}"b': "x,2:3}"}),  # bare-key syntax inside strings is text
    ("  {}  ", {}),
    ('"\\u00e9t\\u00e9"', "été"),
])
def test_lenient_parser_accepts_json_and_fastjson(text, value):
    assert parse_lenient_json(text) == value


@pytest.mark.parametrize("text", ["", "{", '{"a" 1}', "{0:1,}", "{0:1} x", "[1 2]", "{a-b:1}", "{0:01}", "tru",
                                  '{"a":"unterminated}', "{0:1]", "[" * (JSON_NESTING_MAX + 2)])
def test_lenient_parser_refuses_what_is_neither(text):
    with pytest.raises(ValueError, match="at character"):
        parse_lenient_json(text)


@pytest.mark.parametrize("raw, rule", [
    (b"{0:", "1"),
    (b"[1]", "1"),
    (b"\xff{}", "1"),
    (b'{"offsetTable":[]}', "2"),
    (b'{"offsetTable":{"no-separator":{}}}', "3"),
    (b'{"offsetTable":{"bad topic@g":{}}}', "3"),
    (b'{"offsetTable":{"t@g":[1]}}', "4"),
    (b'{"offsetTable":{"t@g":{x:1}}}', "4"),
    (b'{"offsetTable":{"t@g":{0:-1}}}', "4"),
    (b'{"offsetTable":{"t@g":{0:1.0}}}', "4"),
    (b'{"offsetTable":{"t@g":{0:true}}}', "4"),
])
def test_invalid_files_are_reported_as_corruption(tmp_path, raw, rule):
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(raw)
    with pytest.raises(CorruptionError) as caught:
        ConsumerOffsets(str(path)).table()
    assert caught.value.rule == f"offsets.{rule}" and caught.value.path == str(path)


def test_a_file_without_an_offset_table_is_empty_and_its_fields_are_kept(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"dataVersion":{"counter":3}}')
    offsets = ConsumerOffsets(str(path))
    assert offsets.table() == {}
    offsets.commit("t", "g", {0: 1})
    assert json.loads(path.read_text()) == {"dataVersion": {"counter": 3}, "offsetTable": {"t@g": {"0": 1}}}


def test_commit_only_advances(tmp_path):
    offsets = ConsumerOffsets.of_store(tmp_path)
    assert offsets.path == offsets_path(tmp_path) == str(tmp_path / "config" / "consumerOffset.json")
    assert offsets.offsets("t", "g") == {}
    assert offsets.commit("t", "g", {0: 10, 1: 4}) == {0: 10, 1: 4}
    assert offsets.commit("t", "g", {0: 7, 1: 5, 2: 0}) == {0: 10, 1: 5, 2: 0}
    assert offsets.offsets("t", "g") == {0: 10, 1: 5, 2: 0}
    before = os.stat(offsets.path).st_mtime_ns
    assert offsets.commit("t", "g", {0: 3}) == {0: 10, 1: 5, 2: 0}  # nothing advanced: nothing written
    assert os.stat(offsets.path).st_mtime_ns == before


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    offsets = ConsumerOffsets.of_store(tmp_path)
    offsets.commit("t", "g", {0: 1})

    def crash(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreIOError, match="No space left"):
        offsets.commit("t", "g", {0: 2})
    monkeypatch.undo()
    assert offsets.offsets("t", "g") == {0: 1}


def test_concurrent_commits_lose_nothing(tmp_path):
    offsets_path_ = offsets_path(tmp_path)
    errors = []

    def commit_queue(queue_id: int) -> None:
        try:
            for offset in range(1, 21):
                ConsumerOffsets(offsets_path_).commit("t", "g", {queue_id: offset})
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=commit_queue, args=(queue_id,)) for queue_id in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert ConsumerOffsets(offsets_path_).offsets("t", "g") == {queue_id: 20 for queue_id in range(8)}


def test_encode_decode_round_trip():
    table = {"b@g": {10: 1, 2: 3}, "a@g": {0: 0}}
    raw = encode_offsets_file(table, {"dataVersion": {"counter": 1}})
    assert decode_offsets_file(raw, "p") == (table, {"dataVersion": {"counter": 1}})
    assert list(json.loads(raw)["offsetTable"]) == ["a@g", "b@g"]
    assert list(json.loads(raw)["offsetTable"]["b@g"]) == ["2", "10"]


def test_names():
    assert offset_key("orders", "billing") == "orders@billing"
    assert split_offset_key("%RETRY%g@g") == ("%RETRY%g", "g")
    assert split_offset_key("orders") is None and split_offset_key("a@b@c") is None
    assert validate_group("group_a-1|%") == "group_a-1|%"
    for bad in ("", "a@b", "a b", "x" * 256, None, 5):
        with pytest.raises(InvalidMessageError):
            validate_group(bad)
