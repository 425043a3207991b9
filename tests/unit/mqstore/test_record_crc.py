"""The whole-record CRC (format rule 6): damage outside the body is found by reads, by open and by verify."""

from __future__ import annotations

import json

import pytest
from mqstore.commitlog import format as fmt

from mqstore import CorruptionError, Message, MessageStore
from mqstore.store.verify import verify_store
from tests.conftest import rocketmq_config
from tests.unit.commitlog import handmade
from tests.unit.mqstore.conftest import config

pytestmark = pytest.mark.usefixtures("codec")  # each test with the Python and the compiled codec

# Places outside the body that no other rule looks at: a bit flipped there leaves a well-formed record.
OUTSIDE_THE_BODY = [
    ("queue id", handmade.AT_QUEUE_ID),
    ("flag", handmade.AT_QUEUE_ID + 4),
    ("store timestamp", fmt.OFFSET_STORE_TIMESTAMP + 7),
    ("born host", fmt.OFFSET_BORN_HOST + 1),
    ("property value", -25),  # inside the TAGS value, just before the record-CRC pair
    ("crc digit", -5),
]


def _put_tagged(store_dir, count=6, cfg=None):
    with MessageStore.open(store_dir, cfg or config()) as store:
        results = [store.put(Message("t", b"body-%d" % i, tags="TagA")) for i in range(count)]
        assert store.wait_dispatched(30)
    return results


def _flip(store_dir, result, at, bit=0):
    where = result.commitlog_offset + (at if at >= 0 else result.size_bytes + at)
    handmade.flip_bit(store_dir / "commitlog" / f"{0:020d}", where, bit)


@pytest.mark.parametrize("field, at", OUTSIDE_THE_BODY, ids=[f for f, _ in OUTSIDE_THE_BODY])
def test_a_flip_outside_the_body_is_found_by_reads(store_dir, field, at):
    results = _put_tagged(store_dir)
    with MessageStore.open(store_dir, config()) as store:
        _flip(store_dir, results[2], at, bit=1)  # under the open store: recovery has run
        with pytest.raises(CorruptionError) as raised:
            store.get("t", 0, 0, max_count=32)
        assert raised.value.rule == "commitlog.6"
        with pytest.raises(CorruptionError):
            store.read_at(results[2].commitlog_offset)
        assert [m.body for m in store.get("t", 0, 3, max_count=32).messages] == [b"body-%d" % i for i in (3, 4, 5)]


@pytest.mark.parametrize("field, at", OUTSIDE_THE_BODY, ids=[f for f, _ in OUTSIDE_THE_BODY])
def test_a_flip_outside_the_body_fails_open_and_verify_and_repair_cuts_there(store_dir, field, at):
    results = _put_tagged(store_dir)
    _flip(store_dir, results[2], at, bit=1)
    report = verify_store(store_dir, config())
    assert (report.problems[0].rule, report.problems[0].offset) == ("commitlog.6", results[2].commitlog_offset)
    # a queue entry may disagree with it too
    assert {p.rule for p in report.problems[1:]} <= {"consumequeue.matches-log"}
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(store_dir, config())
    assert raised.value.rule == "commitlog.6" and raised.value.offset == results[2].commitlog_offset
    with MessageStore.open(store_dir, config(), repair=True) as store:
        assert store.recovery_report.case == "CLEAN_CORRUPT"
        assert store.recovery_report.log_end == results[2].commitlog_offset
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"body-0", b"body-1"]


def test_a_flipped_body_byte_is_still_named_as_the_body(store_dir):
    results = _put_tagged(store_dir)
    _flip(store_dir, results[1], fmt.OFFSET_BODY + 1)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(store_dir, config())
    assert raised.value.rule == "commitlog.5"


def test_a_record_without_its_crc_pair_is_corrupt_where_the_store_requires_one(store_dir):
    results = _put_tagged(store_dir)
    _flip(store_dir, results[3], -20 + 2, bit=0)  # '__CRC32#' becomes '__BRC32#': no pair any more
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(store_dir, config())
    assert raised.value.rule == "commitlog.6" and "no record-CRC property" in str(raised.value)


def test_properties_hide_the_pair_and_records_without_it_still_read(store_dir):
    with MessageStore.open(store_dir, config(record_crc=False)) as store:
        plain = store.put(Message("t", b"plain", properties={"a": "1"}))
    settings = json.loads((store_dir / "config" / "mqstore.json").read_text())
    assert settings["record_crc"] is False and "record_crc_from_offset" not in settings
    with pytest.raises(Exception, match="record_crc"):
        MessageStore.open(store_dir, config(record_crc=True))  # the setting is part of the format
    with MessageStore.open(store_dir, config(), read_only=True) as reader:  # not given: the store's
        assert reader.config.record_crc is False
    with MessageStore.open(store_dir, config(record_crc=False)) as store:
        message = store.read_at(plain.commitlog_offset)
        assert message.properties == {"a": "1"} and message.size_bytes == plain.size_bytes
    crc_dir = store_dir.parent / "with-crc"
    with MessageStore.open(crc_dir, config()) as store:
        result = store.put(Message("t", b"x", properties={"a": "1"}))
        assert store.wait_dispatched(30)
        assert store.read_at(result.commitlog_offset).properties == {"a": "1"}
        assert store.get("t", 0, 0).messages[0].properties == {"a": "1"}
        assert result.size_bytes == plain.size_bytes - len(b"plain") + len(b"x") + fmt.RECORD_CRC_LENGTH


def test_a_user_property_may_not_take_the_crc_name(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        with pytest.raises(ValueError, match="record CRC"):
            store.put(Message("t", b"x", properties={fmt.PROPERTY_RECORD_CRC: "1"}))


def test_a_rocketmq_store_requires_the_crc_from_where_mqstore_started_writing(rocketmq_store_copy):
    with MessageStore.open(rocketmq_store_copy, rocketmq_config()) as store:
        end = store.recovery_report.log_end
        added = store.put(Message("TopicTest", b"added by mqstore"))
        assert store.wait_dispatched(30)
    settings = json.loads((rocketmq_store_copy / "config" / "mqstore.json").read_text())
    assert settings["record_crc"] is True and settings["record_crc_from_offset"] == end > 0
    assert added.commitlog_offset >= end
    with MessageStore.open(rocketmq_store_copy, rocketmq_config()) as store:
        assert store.recovery_report.case == "CLEAN"
        assert store.read_at(added.commitlog_offset).body == b"added by mqstore"
        assert store.read_at(0).topic  # RocketMQ's own records (no pair) still read
    assert verify_store(rocketmq_store_copy, rocketmq_config()).ok
