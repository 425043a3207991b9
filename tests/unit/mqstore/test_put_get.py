"""MessageStore put/get: every field round-trips, RocketMQ's get statuses and next offsets, tag filters."""

from __future__ import annotations

import os
import shutil

import pytest
from mqstore.commitlog.format import java_string_hash

from mqstore import FlushMode, GetStatus, InvalidMessageError, Message, MessageStore, PutStatus
from tests.unit.mqstore.conftest import config

pytestmark = pytest.mark.usefixtures("codec")  # each test with the Python and the compiled codec


def _put_and_dispatch(store, messages):
    results = [store.put(message) for message in messages]
    assert store.wait_dispatched(30)
    return results


def test_put_then_get_returns_every_field(store):
    result = store.put(Message("orders", b"hello", queue_id=2, tags="TagA", keys=("k1", "k2"),
                               properties={"p": "v", "UNIQ_KEY": "U1"}, flag=7, born_timestamp_ms=123))
    properties = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02p\x01v\x02UNIQ_KEY\x01U1\x02".encode()
    assert result.status is PutStatus.PUT_OK
    assert (result.commitlog_offset, result.queue_offset) == (0, 0)
    assert result.size_bytes == 91 + len(b"hello") + len("orders") + len(properties) + 20  # + the record-CRC pair
    assert result.msg_id == "0A00000700002A9F0000000000000000"
    assert store.wait_dispatched(30)
    got = store.get("orders", 2, 0)
    assert (got.status, got.next_offset, got.min_offset, got.max_offset) == (GetStatus.FOUND, 1, 0, 1)
    [message] = got.messages
    assert (message.topic, message.queue_id, message.queue_offset, message.commitlog_offset) == ("orders", 2, 0, 0)
    assert (message.body, message.flag, message.born_timestamp_ms, message.size_bytes) == (
        b"hello", 7, 123, result.size_bytes)
    assert message.store_timestamp_ms == result.store_timestamp_ms
    assert message.tags == "TagA" and message.keys == ("k1", "k2")
    assert message.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "p": "v", "UNIQ_KEY": "U1"}
    assert message.properties_raw == properties
    assert message.store_host == "10.0.0.7:10911" and message.born_host == "10.0.0.7:0"
    assert message.msg_id == result.msg_id and message.sys_flag == 0 and message.reconsume_times == 0
    assert store.read_at(0) == message


def test_born_timestamp_defaults_to_the_store_timestamp(store):
    result = _put_and_dispatch(store, [Message("t", b"")])[0]
    message = store.get("t", 0, 0).messages[0]
    assert message.born_timestamp_ms == message.store_timestamp_ms == result.store_timestamp_ms


def test_born_host_and_msg_id_follow_the_config(store_dir):
    settings = config(store_host="192.168.0.1", store_port=1234, born_host="172.16.0.9", born_port=4321)
    with MessageStore.open(store_dir, settings) as store:
        store.put(Message("t", b"first"))
        result = store.put(Message("t", b"second"))
        assert result.msg_id == "C0A80001" "000004D2" + "%016X" % result.commitlog_offset
        assert store.wait_dispatched(30)
        message = store.read_at(result.commitlog_offset)
        assert message.born_host == "172.16.0.9:4321" and message.store_host == "192.168.0.1:1234"


def test_queues_are_independent_and_dense(store):
    plan = [("a", 0), ("a", 1), ("b", 0), ("a", 0), ("a", 1), ("a", 0)]
    results = _put_and_dispatch(store, [Message(t, f"{t}{q}".encode(), queue_id=q) for t, q in plan])
    assert [r.queue_offset for r in results] == [0, 0, 0, 1, 1, 2]
    assert store.topics() == {"a": [0, 1], "b": [0]}
    assert (store.max_offset("a", 0), store.max_offset("a", 1), store.max_offset("b", 0)) == (3, 2, 1)
    assert store.max_offset("c", 0) == 0 and store.min_offset("a", 0) == 0
    assert [m.commitlog_offset for m in store.get("a", 0, 0).messages] == [
        results[0].commitlog_offset, results[3].commitlog_offset, results[5].commitlog_offset]


def test_pages_through_a_queue_with_next_offset(store):
    results = _put_and_dispatch(store, [Message("t", b"%d" % i) for i in range(150)])
    offset, bodies = 0, []
    while True:
        got = store.get("t", 0, offset, max_count=16)
        if got.status is GetStatus.OFFSET_OVERFLOW_ONE:
            break
        assert got.status is GetStatus.FOUND and len(got.messages) <= 16
        assert [m.queue_offset for m in got.messages] == list(range(offset, got.next_offset))
        bodies += [m.body for m in got.messages]
        offset = got.next_offset
    assert bodies == [b"%d" % i for i in range(150)] and offset == 150
    assert [r.queue_offset for r in results] == list(range(150))


def test_status_for_an_unknown_queue(store):
    _put_and_dispatch(store, [Message("t", b"x")])
    assert store.get("other", 0, 0) == (GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
    assert store.get("t", 1, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


def test_status_for_an_empty_queue(store_dir):
    os.makedirs(store_dir / "consumequeue" / "empty" / "0")
    with MessageStore.open(store_dir, config()) as store:
        assert store.get("empty", 0, 0) == (GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
        assert store.get("empty", 0, 5).status is GetStatus.NO_MESSAGE_IN_QUEUE


def test_statuses_around_the_ends_of_a_queue(store):
    _put_and_dispatch(store, [Message("t", b"%d" % i) for i in range(5)])
    assert store.get("t", 0, 5) == (GetStatus.OFFSET_OVERFLOW_ONE, [], 5, 0, 5)
    assert store.get("t", 0, 9) == (GetStatus.OFFSET_OVERFLOW_BADLY, [], 0, 0, 5)  # min 0: start over
    assert store.get("t", 0, -1) == (GetStatus.OFFSET_TOO_SMALL, [], 0, 0, 5)
    found = store.get("t", 0, 4, max_count=10)
    assert (found.status, [m.body for m in found.messages], found.next_offset) == (GetStatus.FOUND, [b"4"], 5)


def test_statuses_when_the_first_queue_file_is_gone(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        _put_and_dispatch(store, [Message("t", b"%d" % i) for i in range(100)])
    os.remove(store_dir / "consumequeue" / "t" / "0" / "00000000000000000000")  # entries 0..63, their messages kept
    with MessageStore.open(store_dir, config(), read_only=True) as store:  # a reader takes the queue as it is
        assert (store.min_offset("t", 0), store.max_offset("t", 0)) == (64, 100)
        assert store.get("t", 0, 10) == (GetStatus.OFFSET_TOO_SMALL, [], 64, 64, 100)
        assert store.get("t", 0, 200) == (GetStatus.OFFSET_OVERFLOW_BADLY, [], 100, 64, 100)  # min > 0: the end
        assert store.get("t", 0, 64, max_count=1).messages[0].body == b"64"
    with MessageStore.open(store_dir, config()) as store:  # the log still holds entries 0..63: rebuilt (recovery)
        assert (store.min_offset("t", 0), store.max_offset("t", 0)) == (0, 100)
        assert store.put(Message("t", b"next")).queue_offset == 100


def test_tag_filters(store):
    tags = ["A", "B", None, "A", "C", "B", "A", "é", "😀"]
    _put_and_dispatch(store, [Message("t", b"%d" % i, tags=tag) for i, tag in enumerate(tags)])

    def bodies(filter_, offset=0, max_count=32):
        got = store.get("t", 0, offset, max_count=max_count, tags=filter_)
        return got.status, [int(m.body) for m in got.messages], got.next_offset

    assert bodies(None) == bodies("*") == (GetStatus.FOUND, list(range(9)), 9)
    assert bodies("A") == (GetStatus.FOUND, [0, 3, 6], 9)
    assert bodies("A || C") == bodies(["C", "A"]) == bodies({"A", "C"}) == (GetStatus.FOUND, [0, 3, 4, 6], 9)
    assert bodies("é || 😀") == (GetStatus.FOUND, [7, 8], 9)
    assert bodies("B", max_count=1) == (GetStatus.FOUND, [1], 2)  # the next get starts after the match
    assert bodies("A", offset=1, max_count=1) == (GetStatus.FOUND, [3], 4)
    assert bodies("Z") == (GetStatus.NO_MATCHED_MESSAGE, [], 9)
    assert bodies("C", offset=5) == (GetStatus.NO_MATCHED_MESSAGE, [], 9)
    assert bodies("* || A") == bodies("") == (GetStatus.FOUND, list(range(9)), 9)


def test_tag_filter_compares_tags_not_only_their_hashes(store):
    assert java_string_hash("Aa") == java_string_hash("BB")  # same ConsumeQueue tags code
    _put_and_dispatch(store, [Message("t", b"aa", tags="Aa"), Message("t", b"bb", tags="BB")])
    got = store.get("t", 0, 0, tags="BB")
    assert [m.body for m in got.messages] == [b"bb"] and got.next_offset == 2


def test_offset_for_time(store):
    results = _put_and_dispatch(store, [Message("t", b"%d" % i) for i in range(200)])
    stamps = [r.store_timestamp_ms for r in results]
    for stamp in sorted(set(stamps)):
        assert store.offset_for_time("t", 0, stamp) == stamps.index(stamp)
    assert store.offset_for_time("t", 0, 0) == 0
    assert store.offset_for_time("t", 0, stamps[-1] + 1) == 200
    assert store.offset_for_time("unknown", 0, 0) == 0


def test_put_batch_places_messages_contiguously_in_order(store):
    messages = [Message("t", b"%d" % i, queue_id=i % 3, tags="x") for i in range(30)]
    results = store.put_batch(messages)
    assert [r.queue_offset for r in results] == [i // 3 for i in range(30)]
    for before, after in zip(results, results[1:]):
        assert after.commitlog_offset == before.commitlog_offset + before.size_bytes
    assert len({r.store_timestamp_ms for r in results}) == 1 and len({r.msg_id for r in results}) == 30
    assert store.put_batch([]) == [] and store.put_batch(iter([])) == []
    assert store.wait_dispatched(30)
    assert [m.body for m in store.get("t", 1, 0).messages] == [b"%d" % i for i in range(1, 30, 3)]


def test_read_at_refuses_offsets_that_are_not_records(store):
    first, second = _put_and_dispatch(store, [Message("t", b"one"), Message("t", b"two")])
    assert store.read_at(second.commitlog_offset).body == b"two"
    for bad in (first.commitlog_offset + 1, second.commitlog_offset + second.size_bytes, -1, 10**9):
        with pytest.raises(InvalidMessageError):
            store.read_at(bad)
    with pytest.raises(InvalidMessageError):
        store.read_at("0")


@pytest.mark.parametrize("call", [
    lambda s: s.get("../x", 0, 0), lambda s: s.get("t", -1, 0), lambda s: s.get("t", True, 0),
    lambda s: s.get("t", 0, 1.0), lambda s: s.get("t", 0, 0, max_count=0), lambda s: s.get("t", 0, 0, max_count=10**6),
    lambda s: s.get("t", 0, 0, tags=5), lambda s: s.get("t", 0, 0, tags=[1]), lambda s: s.max_offset("", 0),
    lambda s: s.min_offset("t", -1), lambda s: s.offset_for_time("a/b", 0, 0),
])
def test_bad_read_arguments_are_refused(store, call):
    with pytest.raises(InvalidMessageError):
        call(store)


def test_sync_flush_mode_flushes_before_put_returns(store_dir):
    with MessageStore.open(store_dir, config(flush_mode=FlushMode.SYNC)) as store:
        result = store.put(Message("t", b"durable"))
        assert store.stats()["flush"]["flushed_offset"] == result.commitlog_offset + result.size_bytes
        results = store.put_batch([Message("t", b"a"), Message("t", b"b")])
        assert store.stats()["flush"]["flushed_offset"] == results[-1].commitlog_offset + results[-1].size_bytes


def test_stats_report_positions(store):
    results = _put_and_dispatch(store, [Message("t", b"x" * 100, queue_id=q) for q in (0, 1, 1)])
    end = results[-1].commitlog_offset + results[-1].size_bytes
    stats = store.stats()
    assert stats["commitlog"]["max_offset"] == end and stats["commitlog"]["min_offset"] == 0
    assert stats["dispatch"]["dispatched_offset"] == end and stats["dispatch"]["lag_bytes"] == 0
    assert stats["dispatch"]["records"] == 3 and stats["dispatch"]["error"] is None
    assert stats["queues"] == {"t": {0: {"min_offset": 0, "max_offset": 1}, 1: {"min_offset": 0, "max_offset": 2}}}
    store.flush()
    assert store.stats()["flush"]["flushed_offset"] == end


def test_a_deleted_consume_queue_is_rebuilt_on_open(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        _put_and_dispatch(store, [Message("t", b"%d" % i, queue_id=i % 2, tags="T") for i in range(300)])
        before = [store.get("t", q, 0, max_count=1000).messages for q in (0, 1)]
    shutil.rmtree(store_dir / "consumequeue")
    with MessageStore.open(store_dir, config()) as store:
        assert store.wait_dispatched(30)
        assert [store.get("t", q, 0, max_count=1000).messages for q in (0, 1)] == before
        assert store.put(Message("t", b"new", queue_id=1)).queue_offset == 150
