"""Retries and dead letters and RocketMQ 4.4.0: `rmq read` reads mqstore's retry, DLQ and schedule-hop records
field by field as mqstore reads them (RETRY_TOPIC, ORIGIN_MESSAGE_ID, reconsume times, sys flag, born host and
timestamp, DELAY, REAL_TOPIC on the SCHEDULE_TOPIC_XXXX hop), and its ConsumeQueues of %RETRY%/%DLQ% are ours."""

from __future__ import annotations

from mqstore import Message, MessageStore
from mqstore.schedule import format as sfmt
from mqstore.store.clock import ManualClock
from tests.conftest import small_config
from tests.interop.rmq_delay import RmqDelay
from tests.rocketmq import assert_same_messages, copy_store, entry_of, store_entries

WAIT_S = 20.0
DELAYS_MS = sfmt.parse_levels(sfmt.DEFAULT_DELAY_LEVELS)
# A delivered retry as both stores write it: all but where and when it was stored.
DELIVERED_FIELDS = ("topic", "queue_id", "queue_offset", "size_bytes", "body_hex", "body_crc", "flag", "sys_flag",
                    "born_timestamp_ms", "born_host", "reconsume_times", "tags", "keys", "tags_code", "properties")


def _write(root, config) -> dict[str, int]:
    """Four messages of `orders` failed by group `g`: m0 retried once and back, m1 waiting on its hop, m2 sent to
    the DLQ (delay_level -1), m3 to the DLQ after its one retry (max_reconsume_times 1)."""
    clock = ManualClock()
    with MessageStore.open(str(root), config, clock=clock) as store:
        for index in range(4):
            store.put(Message("orders", b"m%d" % index, tags="T", keys=(f"k{index}",), flag=index,
                              born_timestamp_ms=1000 + index, properties={"u": "v"}))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders", max_reconsume_times=1)
        m0, m1, m2, m3 = consumer.poll()
        first, third = consumer.nack(m0), consumer.nack(m3)
        consumer.nack(m2, delay_level=-1)
        # m0's and m3's first retries are due (each is due DELAYS_MS[2] after its own store time, which may differ)
        clock.set(max(first.store_timestamp_ms, third.store_timestamp_ms) + DELAYS_MS[2])
        assert store.wait_dispatched(WAIT_S) and store.schedule.wait_caught_up(WAIT_S)
        assert store.wait_dispatched(WAIT_S)
        retried = {message.body: message for message in consumer.poll()}
        consumer.nack(retried[b"m3"])  # its reconsume times 1 >= 1: the DLQ
        consumer.nack(m1, delay_level=18)  # two hours: still on its hop when RocketMQ reads
        consumer.commit()
        assert store.wait_dispatched(WAIT_S)
        return {entry["body_hex"] + entry["topic"]: entry["commitlog_offset"] for entry in store_entries(store)}


def test_rocketmq_reads_mqstores_retry_and_dlq_topics_field_by_field(tmp_path, rmq):
    config = small_config(record_crc=False, born_host="10.1.2.3", born_port=4567)
    root = tmp_path / "store"
    _write(root, config)
    with MessageStore.open(str(root), config, read_only=True) as store:
        ours = sorted(store_entries(store), key=lambda entry: entry["commitlog_offset"])
    theirs = sorted(rmq.read(root, config, tmp_path).entries, key=lambda entry: entry["commitlog_offset"])
    assert_same_messages(ours, theirs, "retry")
    by_topic: dict[str, list] = {}
    for entry in theirs:
        by_topic.setdefault(entry["topic"], []).append(entry)
    originals = {entry["body_hex"]: entry for entry in by_topic["orders"]}
    assert [bytes.fromhex(e["body_hex"]) for e in by_topic["%RETRY%g"]] == [b"m0", b"m3"]
    assert [bytes.fromhex(e["body_hex"]) for e in by_topic["%DLQ%g"]] == [b"m2", b"m3"]
    for entry in by_topic["%RETRY%g"] + by_topic["%DLQ%g"] + by_topic[sfmt.SCHEDULE_TOPIC]:
        original = originals[entry["body_hex"]]
        properties = entry["properties"]
        assert entry["queue_id"] == 0 or entry["topic"] == sfmt.SCHEDULE_TOPIC
        assert (entry["flag"], entry["sys_flag"], entry["born_timestamp_ms"], entry["born_host"], entry["tags"],
                entry["keys"]) == (original["flag"], 0, original["born_timestamp_ms"], "10.1.2.3:4567", "T",
                                   original["keys"])
        assert (properties["RETRY_TOPIC"], properties["ORIGIN_MESSAGE_ID"], properties["WAIT"], properties["u"]) == (
            "orders", original["msg_id"], "false", "v")
        if entry["topic"] == sfmt.SCHEDULE_TOPIC:
            assert (properties["REAL_TOPIC"], properties["REAL_QID"]) == ("%RETRY%g", "0")
            assert entry["queue_id"] == int(properties["DELAY"]) - 1
        elif entry["topic"] == "%RETRY%g":
            assert (entry["reconsume_times"], properties["DELAY"]) == (1, "3")
        else:
            assert "DELAY" not in properties
    dead = {bytes.fromhex(e["body_hex"]): e["reconsume_times"] for e in by_topic["%DLQ%g"]}
    assert dead == {b"m2": 1, b"m3": 2}
    pending = [e for e in by_topic[sfmt.SCHEDULE_TOPIC] if e["body_hex"] == b"m1".hex()]
    assert [(e["queue_id"], e["reconsume_times"]) for e in pending] == [(17, 1)]


def test_rocketmqs_schedule_service_delivers_mqstores_retry_hop_as_mqstore_does(tmp_path, rmq):
    """A retry waiting on its SCHEDULE_TOPIC_XXXX hop, delivered once by RocketMQ 4.4.0's ScheduleMessageService
    and once by mqstore's, from copies of one store: the two %RETRY%g records agree field by field (DELAY kept)."""
    config = small_config(record_crc=False, born_host="10.1.2.3", born_port=4567)
    root = tmp_path / "store"
    with MessageStore.open(str(root), config, clock=ManualClock()) as store:
        store.put(Message("orders", b"m", tags="T", keys=("k",), flag=3, born_timestamp_ms=1000,
                          properties={"u": "v"}))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders")
        sent = consumer.nack(consumer.poll()[0], delay_level=1)
        consumer.commit()
    due = sent.store_timestamp_ms + DELAYS_MS[0]
    copy_store(root, tmp_path / "ours")
    RmqDelay(rmq).run_for(root, config, max(0, due - ManualClock().now_ms()) + 3000)
    with MessageStore.open(str(root), config, read_only=True) as store:
        theirs = [entry_of(message) for message in store.get("%RETRY%g", 0, 0).messages]
    with MessageStore.open(str(tmp_path / "ours"), config, clock=ManualClock(due)) as store:
        assert store.wait_dispatched(WAIT_S) and store.schedule.wait_caught_up(WAIT_S)
        assert store.wait_dispatched(WAIT_S)
        ours = [entry_of(message) for message in store.get("%RETRY%g", 0, 0).messages]
    assert len(theirs) == len(ours) == 1
    assert {name: theirs[0][name] for name in DELIVERED_FIELDS} == {name: ours[0][name] for name in DELIVERED_FIELDS}
    assert (ours[0]["reconsume_times"], ours[0]["properties"]["DELAY"]) == (1, "1")
