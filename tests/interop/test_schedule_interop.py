"""Delay levels and RocketMQ 4.4.0, both ways (tests/interop/RmqDelay.java runs RocketMQ's store).

mqstore writes, RocketMQ reads: a store with delayed messages pending (a ManualClock holds them) and one already
delivered is read by `rmq read`, field by field as mqstore reads it; RocketMQ's SCHEDULE_TOPIC_XXXX units are
mqstore's (queue level - 1, tag code = store timestamp + the level's delay), and RocketMQ rebuilding them from the
CommitLog (its ConsumeQueues removed) computes the same due times.

RocketMQ writes, mqstore delivers: RocketMQ 4.4.0's putMessage moves DELAY messages to the schedule topic and
shuts down before they fire; mqstore reads RocketMQ's units (and rebuilds the same ones), delivers nothing before
its time and every message at its time, with DELAY, REAL_TOPIC and REAL_QID kept in its bytes (as RocketMQ's own
re-put keeps them) and RocketMQ's born host, born timestamp, sys flag and reconsume times carried over.

RocketMQ delivers mqstore's: its ScheduleMessageService, run on a store mqstore wrote, puts every due message on
its topic (RocketMQ runs a few seconds of real time: its levels are at least 1 s).
"""

from __future__ import annotations

import shutil

import pytest

from mqstore import Message, MessageStore
from mqstore.schedule import format as sfmt
from mqstore.store.clock import ManualClock
from tests.conftest import small_config
from tests.interop.rmq_delay import RmqDelay
from tests.rocketmq import assert_same_messages, copy_store, store_entries

WAIT_S = 20.0
DEFAULT_DELAYS_MS = sfmt.parse_levels(sfmt.DEFAULT_DELAY_LEVELS)
HEADER_FIELDS = ("sys_flag", "born_timestamp_ms", "born_host", "reconsume_times")  # a re-put keeps them


@pytest.fixture(scope="module")
def rmq_delay(rmq) -> RmqDelay:
    return RmqDelay(rmq)


def _units(store) -> list[tuple[int, int, int, int, int]]:
    found = []
    for queue_id in range(len(DEFAULT_DELAYS_MS)):
        units = store.queue_units(sfmt.SCHEDULE_TOPIC, queue_id, 0, 1 << 20)
        found.extend((queue_id, index, *unit) for index, unit in enumerate(units.tolist()))
    return found


def _copy_without_queues(source, target):
    """A copy whose ConsumeQueues must be rebuilt from the CommitLog: no queues, no checkpoint, and an abort marker
    (RocketMQ 4.4.0 re-dispatches the log only in its abnormal recovery)."""
    copy_store(source, target)
    shutil.rmtree(target / "consumequeue")
    (target / "checkpoint").unlink(missing_ok=True)
    (target / "abort").touch()


def test_rocketmq_reads_mqstores_pending_and_delivered_delay_messages(tmp_path, rmq, rmq_delay):
    clock = ManualClock()
    config = small_config()  # the default levels, RocketMQ's
    root = tmp_path / "store"
    levels = [1, 3, 18, 2, 3]
    with MessageStore.open(str(root), config, clock=clock) as store:
        results = [store.put(Message("orders", b"body-%d" % index, queue_id=index % 4, tags="TagA",
                                     keys=(f"key-{index}",), properties={"DELAY": str(level), "u": "v"}))
                   for index, level in enumerate(levels)]
        assert store.wait_dispatched(WAIT_S)
        clock.set(results[0].store_timestamp_ms + 1000)  # level 1 of message 0 is due: delivered
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        ours, our_units = store_entries(store), _units(store)
    assert [e["body_hex"] for e in ours if e["topic"] == "orders"] == [b"body-0".hex()]
    assert [unit[4] for unit in sorted(our_units, key=lambda unit: unit[2])] == [
        result.store_timestamp_ms + DEFAULT_DELAYS_MS[level - 1] for result, level in zip(results, levels)]
    theirs = sorted(rmq.read(root, config, tmp_path).entries, key=lambda entry: entry["commitlog_offset"])
    assert_same_messages(sorted(ours, key=lambda entry: entry["commitlog_offset"]), theirs, "schedule")
    for entry, level, index in zip(theirs, levels, range(len(levels))):
        assert (entry["topic"], entry["queue_id"]) == (sfmt.SCHEDULE_TOPIC, level - 1)
        assert {name: entry["properties"][name] for name in ("REAL_TOPIC", "REAL_QID", "DELAY")} == {
            "REAL_TOPIC": "orders", "REAL_QID": str(index % 4), "DELAY": str(level)}
    [real] = [entry for entry in theirs if entry["topic"] == "orders"]
    assert real["properties"]["DELAY"] == str(levels[0]) and real["properties"]["REAL_TOPIC"] == "orders"
    copy = tmp_path / "copy"
    copy_store(root, copy)
    assert sorted(rmq_delay.units(copy, config)) == sorted(our_units)
    rebuilt = tmp_path / "rebuilt"
    _copy_without_queues(root, rebuilt)
    assert sorted(rmq_delay.units(rebuilt, config)) == sorted(our_units)  # RocketMQ's dispatch: the same due times


def test_mqstore_delivers_what_rocketmq_scheduled(tmp_path, rmq_delay):
    config = small_config()
    root = tmp_path / "rocketmq"
    acked = rmq_delay.put(root, config, 8, [3, 4, 5, 18])
    assert len(acked) == 8
    due = {index: stamp + DEFAULT_DELAYS_MS[level - 1] for index, level, _, stamp in acked}
    copy_store(root, tmp_path / "copy")
    their_units = rmq_delay.units(tmp_path / "copy", config)
    assert sorted(unit[4] for unit in their_units) == sorted(due.values())
    rebuilt = tmp_path / "rebuilt"
    _copy_without_queues(root, rebuilt)
    with MessageStore.open(str(rebuilt), config, clock=ManualClock()) as store:
        assert sorted(_units(store)) == sorted(their_units)  # mqstore's dispatch: RocketMQ's due times
    clock = ManualClock(min(due.values()) - 1)
    with MessageStore.open(str(root), config, clock=clock) as store:
        assert sorted(_units(store)) == sorted(their_units)
        assert store.schedule.wait_caught_up(WAIT_S)
        assert store.topics().get("delayed") is None  # one ms before the first is due: nothing delivered
        clock.set(max(due.values()))
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        entries = store_entries(store)
        delivered = [entry for entry in entries if entry["topic"] == "delayed"]
        scheduled = {entry["body_hex"]: entry for entry in entries if entry["topic"] == sfmt.SCHEDULE_TOPIC}
        assert sorted(int(bytes.fromhex(entry["body_hex"])[2:]) for entry in delivered) == list(range(8))
        for entry in delivered:
            index = int(bytes.fromhex(entry["body_hex"])[2:])
            assert entry["queue_id"] == index % 4 and entry["tags"] == "TagD" and entry["keys"] == f"key-{index}"
            level = {number: level for number, level, _, _ in acked}[index]
            assert entry["store_timestamp_ms"] >= 0 and entry["properties"]["DELAY"] == str(level)
            original = scheduled[entry["body_hex"]]
            assert [entry[name] for name in HEADER_FIELDS] == [original[name] for name in HEADER_FIELDS]
            assert entry["properties"]["u"] == f"v{index}" and entry["properties"]["REAL_QID"] == str(index % 4)


def test_rocketmqs_schedule_service_delivers_what_mqstore_scheduled(tmp_path, rmq_delay):
    """RocketMQ 4.4.0 opens a store mqstore wrote with due level-1 messages and its ScheduleMessageService puts
    them on their topic. (No record CRC: RocketMQ's own records would not carry it.) RocketMQ's re-put keeps DELAY
    in the stored properties (its messageTimeup clears it from the map after encoding them); so does mqstore's."""
    config = small_config(record_crc=False)
    root = tmp_path / "store"
    with MessageStore.open(str(root), config, clock=ManualClock()) as store:  # the clock holds them: none delivered
        results = [store.put(Message("orders", b"m%d" % index, queue_id=index, tags="A", keys=("k",),
                                     properties={"DELAY": "1", "u": "v"})) for index in range(4)]
    due = max(result.store_timestamp_ms for result in results) + DEFAULT_DELAYS_MS[0]
    rmq_delay.run_for(root, config, max(0, due - ManualClock().now_ms()) + 3000)
    with MessageStore.open(str(root), config, read_only=True) as store:
        for index in range(4):
            [message] = store.get("orders", index, 0).messages
            assert (message.body, message.tags, message.keys) == (b"m%d" % index, "A", ("k",))
            assert message.store_timestamp_ms >= results[index].store_timestamp_ms + DEFAULT_DELAYS_MS[0]
            assert {name: message.properties.get(name) for name in ("REAL_TOPIC", "REAL_QID", "u", "DELAY")} == {
                "REAL_TOPIC": "orders", "REAL_QID": str(index), "u": "v", "DELAY": "1"}
