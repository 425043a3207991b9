"""Retries and dead letters of a consumer group (mqstore/consumer/retry.py), with a ManualClock: no test sleeps."""

from __future__ import annotations

import json

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import InvalidMessageError
from mqstore.commitlog.message import StoredMessage

from mqstore import Message, MessageStore, StoreConfig
from mqstore.consumer import retry
from mqstore.schedule import format as sfmt
from mqstore.store.clock import ManualClock

WAIT_S = 20.0
DELAYS_MS = sfmt.parse_levels(sfmt.DEFAULT_DELAY_LEVELS)  # RocketMQ's 18 levels: level 3 is 10 s


def _open(root, clock):
    return MessageStore.open(str(root), StoreConfig(segment_size_bytes=1 << 20), clock=clock)


def _settle(store) -> None:
    assert store.wait_dispatched(WAIT_S) and store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)


def _offsets(root) -> dict:
    return json.loads((root / "config" / "consumerOffset.json").read_text())["offsetTable"]


@pytest.mark.usefixtures("codec")
def test_a_nacked_message_comes_back_after_level_3_plus_its_reconsume_times(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        original = store.put(Message("orders", b"job", tags="T", keys=("k1",), flag=5, born_timestamp_ms=77))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("billing", "orders")
        [message] = consumer.poll()
        for count in range(3):
            sent = consumer.nack(message)
            consumer.commit()
            hop = store.read_at(sent.commitlog_offset)
            level = 3 + count
            assert (hop.topic, hop.queue_id, hop.reconsume_times) == (sfmt.SCHEDULE_TOPIC, level - 1, count + 1)
            assert {name: hop.properties[name] for name in ("DELAY", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC")} == {
                "DELAY": str(level), "REAL_TOPIC": "%RETRY%billing", "REAL_QID": "0", "RETRY_TOPIC": "orders"}
            clock.set(sent.store_timestamp_ms + DELAYS_MS[level - 1] - 1)  # one ms early: not back yet
            _settle(store)
            assert consumer.poll() == []
            clock.advance(1)
            _settle(store)
            [message] = consumer.poll()
            assert (message.topic, message.body, message.tags, message.keys, message.flag) == (
                "orders", b"job", "T", ("k1",), 5)
            raw = store.read_at(message.commitlog_offset)
            assert (raw.topic, raw.queue_id, raw.queue_offset) == ("%RETRY%billing", 0, count)
            assert (raw.reconsume_times, raw.born_timestamp_ms, raw.sys_flag, raw.born_host_raw) == (
                count + 1, 77, 0, store.read_at(original.commitlog_offset).born_host_raw)
            assert raw.properties["ORIGIN_MESSAGE_ID"] == original.msg_id
            assert raw.properties["DELAY"] == str(level)  # kept in the bytes, as RocketMQ keeps it
        assert store.max_offset("orders", 0) == 1  # the topic itself got nothing new
    assert _offsets(tmp_path) == {"orders@billing": {"0": 1}, "%RETRY%billing@billing": {"0": 2}}


@pytest.mark.usefixtures("codec")
def test_sixteen_retries_then_the_dead_letter_queue(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"poison"))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("billing", "orders")
        seen = []
        while True:
            messages = consumer.poll()
            if not messages:
                break
            [message] = messages
            seen.append(store.read_at(message.commitlog_offset).reconsume_times)
            consumer.nack(message)
            clock.advance(DELAYS_MS[-1] + 1)
            _settle(store)
        assert seen == list(range(17))  # the first delivery and 16 retries
        [dead] = consumer.dead_letters()
        raw = store.read_at(dead.commitlog_offset)
        assert (dead.topic, raw.topic, raw.queue_id, raw.reconsume_times) == ("orders", "%DLQ%billing", 0, 17)
        assert "DELAY" not in raw.properties and raw.properties["RETRY_TOPIC"] == "orders"
        assert retry.dead_letter_count(store, "billing") == 1
        assert store.stats()["retry"] == {"retry": {"billing": 16}, "dead_letters": {"billing": 1}}


@pytest.mark.usefixtures("codec")
def test_max_reconsume_times_and_a_negative_delay_level_go_to_the_dlq_at_once(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"a"))
        store.put(Message("orders", b"b"))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders", max_reconsume_times=0)
        first, second = consumer.poll()
        consumer.nack(first)  # max_reconsume_times 0: no retry
        other = store.consumer("h", "orders")
        other.poll()
        other.nack(second, delay_level=-1)
        assert store.wait_dispatched(WAIT_S)  # no clock move: a dead letter is readable at once
        assert [message.body for message in consumer.dead_letters()] == [b"a"]
        assert [message.body for message in other.dead_letters()] == [b"b"]
        assert store.max_offset(sfmt.SCHEDULE_TOPIC, 2) == 0


@pytest.mark.usefixtures("codec")
def test_an_explicit_delay_level_is_used_and_clamped_to_the_level_count(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"a"))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders")
        [message] = consumer.poll()
        assert store.read_at(consumer.nack(message, delay_level=1).commitlog_offset).queue_id == 0
        assert store.read_at(consumer.nack(message, delay_level=99).commitlog_offset).properties["DELAY"] == "18"


def test_committed_offsets_move_past_a_nacked_message_without_losing_it(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        for index in range(3):
            store.put(Message("orders", b"m%d" % index))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders")
        messages = consumer.poll()
        sent = consumer.nack(messages[1])
        consumer.commit()
        consumer.close()
        clock.set(sent.store_timestamp_ms + DELAYS_MS[2])
        _settle(store)
        again = store.consumer("g", "orders")  # from the committed offsets: only the retry is left
        assert [(message.topic, message.body) for message in again.poll()] == [("orders", b"m1")]
        again.commit()
        assert again.poll() == [] and store.consumer("g", "orders").poll() == []


def test_consumers_of_two_topics_of_one_group_share_the_retry_queue(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"o"))
        store.put(Message("refunds", b"r"))
        assert store.wait_dispatched(WAIT_S)
        orders, refunds = store.consumer("g", "orders"), store.consumer("g", "refunds")
        orders.nack(orders.poll()[0])
        sent = refunds.nack(refunds.poll()[0])
        clock.set(sent.store_timestamp_ms + DELAYS_MS[2])
        _settle(store)
        assert [(m.topic, m.body) for m in orders.poll()] == [("orders", b"o")]  # refunds' retry skipped
        orders.commit()  # refunds has not read its retry yet: the retry queue's commit waits for it
        assert store.consumer("g", "orders").committed() == {0: 1}
        assert _offsets(tmp_path)["%RETRY%g@g"] == {"0": 0}
        assert [(m.topic, m.body) for m in refunds.poll()] == [("refunds", b"r")]
        refunds.commit()
        orders.commit()
        assert _offsets(tmp_path)["%RETRY%g@g"] == {"0": 2}


@pytest.mark.usefixtures("codec")
def test_a_dead_letter_is_replayed_on_its_topic_with_its_header_fields(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"a", tags="T", born_timestamp_ms=5))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders")
        consumer.nack(consumer.poll()[0], delay_level=-1)
        assert store.wait_dispatched(WAIT_S)
        [dead] = consumer.dead_letters()
        result = consumer.replay(dead, queue_id=2)
        assert store.wait_dispatched(WAIT_S)
        [back] = store.get("orders", 2, 0).messages
        assert back.commitlog_offset == result.commitlog_offset
        assert (back.body, back.tags, back.born_timestamp_ms, back.reconsume_times) == (b"a", "T", 5, 0)
        assert back.properties["ORIGIN_MESSAGE_ID"] == dead.properties["ORIGIN_MESSAGE_ID"]
        with pytest.raises(InvalidMessageError, match="not a dead letter"):
            retry.replay(store, back)


def test_bad_groups_and_bad_nacks_are_refused_with_nothing_written(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock) as store:
        store.put(Message("orders", b"a"))
        assert store.wait_dispatched(WAIT_S)
        store.consumer("g" * 120, "orders")  # %RETRY% + 120 characters: 127, the longest topic
        with pytest.raises(InvalidMessageError, match="%RETRY%g{121}"):
            store.consumer("g" * 121, "orders")
        with pytest.raises(InvalidMessageError, match="max_reconsume_times"):
            store.consumer("g", "orders", max_reconsume_times=-1)
        end = store._commitlog.readable_end()
        browser = store.consumer(None, "orders")
        [message] = browser.poll()
        with pytest.raises(InvalidMessageError, match="without a group"):
            browser.nack(message)
        consumer = store.consumer("g", "orders")
        forged = StoredMessage(message[:4] + (message.flag + 1,) + message[5:])
        with pytest.raises(InvalidMessageError, match="not read from this store"):
            consumer.nack(forged)
        with pytest.raises(InvalidMessageError, match="only a message read"):
            consumer.nack(Message("orders", b"a"))
        with pytest.raises(InvalidMessageError, match="delay_level"):
            consumer.nack(message, delay_level="1")
        assert store._commitlog.readable_end() == end
        assert fmt.TOPIC_LENGTH_MAX == 127


def test_the_asyncio_consumer_nacks_and_lists_dead_letters(tmp_path):
    import asyncio

    from mqstore import FlushMode
    from mqstore.aio import AsyncMessageStore

    async def main():
        config = StoreConfig(segment_size_bytes=1 << 20, flush_mode=FlushMode.SYNC)
        async with AsyncMessageStore.open(tmp_path, config) as store:
            await store.put(Message("orders", b"a"))
            consumer = store.consumer("g", "orders", max_reconsume_times=0)
            [message] = await consumer.poll(timeout_ms=10_000)
            result = await consumer.nack(message)
            assert store.sync.read_at(result.commitlog_offset).topic == "%DLQ%g"
            assert store.sync.wait_dispatched(WAIT_S)
            return [(m.topic, m.body) for m in consumer.dead_letters()]

    assert asyncio.run(asyncio.wait_for(main(), 60)) == [("orders", b"a")]


def test_a_read_only_store_sends_nothing_back(tmp_path):
    from mqstore.commitlog.errors import ReadOnlyStoreError

    with _open(tmp_path, ManualClock()) as store:
        store.put(Message("orders", b"a"))
    with MessageStore.open(str(tmp_path), StoreConfig(segment_size_bytes=1 << 20), read_only=True) as store:
        consumer = store.consumer("g", "orders")
        [message] = consumer.poll()
        with pytest.raises(ReadOnlyStoreError):
            consumer.nack(message)
        with pytest.raises(ReadOnlyStoreError):
            retry.replay(store, message)
