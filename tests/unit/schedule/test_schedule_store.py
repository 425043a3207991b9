"""Delay levels in a store: the put rewrite, the due time in the tag code, delivery by a ManualClock, progress."""

from __future__ import annotations

import json
import time

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import InvalidMessageError

from mqstore import ConfigMismatchError, InvalidConfigError, Message, MessageStore, StoreConfig
from mqstore.schedule import format as sfmt
from mqstore.schedule import with_delay_level
from mqstore.store.clock import ManualClock

WAIT_S = 20.0
LEVELS = "1s 5s 10s"


def _open(root, clock, **fields):
    config = StoreConfig(segment_size_bytes=1 << 20, delay_levels=LEVELS, **fields)
    return MessageStore.open(str(root), config, clock=clock)


@pytest.fixture(params=[True, False], ids=["dispatch-process", "dispatch-thread"])
def dispatch_process(request):
    return request.param


@pytest.mark.usefixtures("codec")
def test_a_delayed_message_is_stored_on_the_schedule_topic_and_delivered_when_due(tmp_path, dispatch_process):
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=dispatch_process) as store:
        message = Message("orders", b"body", queue_id=3, tags="TagA", keys=("k1", "k2"), flag=7,
                          properties={"DELAY": "2", "user": "u"}, born_timestamp_ms=123)
        result = store.put(message)
        assert store.wait_dispatched(WAIT_S)
        assert store.max_offset("orders", 3) == 0
        units = store.queue_units(sfmt.SCHEDULE_TOPIC, 1, 0, 10)
        assert units.tolist() == [(result.commitlog_offset, result.size_bytes, result.store_timestamp_ms + 5000)]
        stored = store.read_at(result.commitlog_offset)
        assert (stored.topic, stored.queue_id) == (sfmt.SCHEDULE_TOPIC, 1)
        assert {name: stored.properties[name] for name in ("DELAY", "REAL_TOPIC", "REAL_QID", "user")} == {
            "DELAY": "2", "REAL_TOPIC": "orders", "REAL_QID": "3", "user": "u"}
        assert store.stats()["schedule"]["pending"] == {2: 1}

        clock.set(result.store_timestamp_ms + 4999)  # one ms early: nothing delivered
        assert store.schedule.wait_caught_up(WAIT_S)
        assert store.max_offset("orders", 3) == 0
        clock.advance(1)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        [delivered] = store.get("orders", 3, 0).messages
        assert (delivered.body, delivered.tags, delivered.keys, delivered.flag, delivered.born_timestamp_ms) == (
            b"body", "TagA", ("k1", "k2"), 7, 123)
        assert delivered.properties["DELAY"] == "2"  # kept in the bytes, as RocketMQ's re-put keeps it
        assert (delivered.sys_flag, delivered.born_host_raw, delivered.reconsume_times) == (
            stored.sys_flag, stored.born_host_raw, stored.reconsume_times)
        assert delivered.properties["REAL_TOPIC"] == "orders" and delivered.properties["user"] == "u"
        assert delivered.properties["UNIQ_KEY"] == stored.properties["UNIQ_KEY"]
        assert store.get("orders", 3, 0, tags="TagA").messages  # the tags code of TAGS, as RocketMQ sets it
        assert store.stats()["schedule"] == {"running": True, "delivered": 1, "pending": {}, "error": None}
    offsets = json.loads((tmp_path / "config" / sfmt.OFFSET_FILE_NAME).read_text())["offsetTable"]
    assert offsets["2"] == 1 and offsets["1"] == 0


@pytest.mark.usefixtures("codec")
def test_levels_deliver_in_due_order_and_a_clean_reopen_does_not_deliver_again(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=False) as store:
        for index, level in enumerate([3, 1, 2, 1, 0]):
            store.put(with_delay_level(Message("t", b"%d" % index), level))
        assert store.wait_dispatched(WAIT_S)
        assert store.max_offset("t", 0) == 1  # level 0: a plain put
        clock.advance(1000 + 1000)  # store timestamps are the wall clock's: allow for the time the puts took
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"4", b"1", b"3"]
    with _open(tmp_path, clock, dispatch_process=False) as store:
        assert store.schedule.wait_caught_up(WAIT_S)
        assert store.max_offset("t", 0) == 3
        clock.advance(60_000)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"4", b"1", b"3", b"2", b"0"]
        assert store.stats()["schedule"]["pending"] == {}


@pytest.mark.usefixtures("codec")
@pytest.mark.parametrize("level", ["4", "-1", "x", "", "1.0", "99999999999"])
def test_a_level_out_of_range_is_refused_with_nothing_written(tmp_path, level):
    with _open(tmp_path, ManualClock(), dispatch_process=False) as store:
        with pytest.raises(InvalidMessageError, match="DELAY"):
            store.put(Message("t", b"x", properties={"DELAY": level}))
        with pytest.raises(InvalidMessageError):
            store.put_batch([Message("t", b"y"), Message("t", b"x", properties={"DELAY": level})])
        assert store.stats()["commitlog"]["max_offset"] == 0


def test_with_delay_level_refuses_a_negative_level():
    with pytest.raises(InvalidMessageError):
        with_delay_level(Message("t", b""), -1)


def test_delay_levels_are_checked_at_build_and_against_the_store(tmp_path):
    with pytest.raises(InvalidConfigError):
        StoreConfig(delay_levels="1s 2x")
    MessageStore.open(str(tmp_path), StoreConfig(delay_levels="1s 2s", dispatch_process=False)).close()
    with pytest.raises(ConfigMismatchError):
        MessageStore.open(str(tmp_path), StoreConfig(delay_levels="1s 3s", dispatch_process=False))
    with MessageStore.open(str(tmp_path), StoreConfig(dispatch_process=False)) as store:  # the default gives way
        assert store.schedule.delays == (1000, 2000)
        with pytest.raises(InvalidMessageError):
            store.put(Message("t", b"x", properties={"DELAY": "3"}))


@pytest.mark.usefixtures("codec")
def test_put_batch_rewrites_delayed_messages_too(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=False) as store:
        store.put_batch([Message("t", b"a"), Message("t", b"b", properties={"DELAY": "1"}), Message("t", b"c")])
        assert store.wait_dispatched(WAIT_S)
        assert store.max_offset("t", 0) == 2 and store.max_offset(sfmt.SCHEDULE_TOPIC, 0) == 1
        clock.advance(2000)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"a", b"c", b"b"]


def test_a_schedule_record_without_real_topic_is_skipped(tmp_path):
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=False) as store:
        store.put(Message(sfmt.SCHEDULE_TOPIC, b"x", queue_id=0, properties={"DELAY": "1"}))
        store.put(Message("t", b"y", properties={"DELAY": "1"}))
        assert store.wait_dispatched(WAIT_S)
        clock.advance(2000)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"y"]
        assert store.stats()["schedule"]["pending"] == {}


@pytest.mark.parametrize("real", [{"REAL_TOPIC": "no such topic!", "REAL_QID": "0"},
                                  {"REAL_TOPIC": "t", "REAL_QID": "2147483647"}], ids=["topic", "queue"])
def test_a_schedule_record_no_store_takes_is_skipped_and_the_service_goes_on(tmp_path, real):
    """A record already on the schedule topic (RocketMQ's, or a copy tool's) whose REAL_TOPIC or REAL_QID no put
    takes: skipped with a warning (RocketMQ 5's timer drops such a put; 4.4.0 retries it for good), and what follows
    is delivered."""
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=False) as store:
        store.put(Message(sfmt.SCHEDULE_TOPIC, b"x", queue_id=0, properties={"DELAY": "1", **real}))
        store.put(Message("t", b"y", properties={"DELAY": "1"}))
        assert store.wait_dispatched(WAIT_S)
        clock.advance(2000)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"y"]
        stats = store.stats()["schedule"]
        assert stats["pending"] == {} and stats["error"] is None


@pytest.mark.usefixtures("codec")
def test_a_stored_level_above_the_maximum_is_dispatched_as_rocketmq_clamps_it(tmp_path):
    """A record already on the schedule topic (as RocketMQ 4.4.0 or a copy tool stores it) is not rewritten; its
    DELAY above the last level counts as the last level, as in CommitLog.checkMessageAndReturnSize."""
    clock = ManualClock()
    with _open(tmp_path, clock, dispatch_process=False) as store:
        result = store.put(Message(sfmt.SCHEDULE_TOPIC, b"x", queue_id=2, tags="T",
                                   properties={"DELAY": "25", "REAL_TOPIC": "t", "REAL_QID": "1"}))
        plain = store.put(Message(sfmt.SCHEDULE_TOPIC, b"y", queue_id=2, tags="T", properties={"DELAY": "zz"}))
        assert store.wait_dispatched(WAIT_S)
        codes = store.queue_units(sfmt.SCHEDULE_TOPIC, 2, 0, 10)["tags_code"].tolist()
        assert plain.status.name == "PUT_OK"
        assert codes == [result.store_timestamp_ms + 10_000, fmt.tags_code("T")]  # not an int: the TAGS hash
        clock.set(result.store_timestamp_ms + 10_000)
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        assert [m.body for m in store.get("t", 1, 0).messages] == [b"x"]


def test_deliveries_do_not_wait_for_the_flush_and_the_offsets_follow_a_flush(tmp_path):
    # The delivering pass only re-puts; the flush thread takes the offsets, flushes the log, then writes them,
    # every FLUSH_INTERVAL_MS of the clock (the module's docstring says why), and once more at close.
    from mqstore.schedule import service as schedule_service

    clock = ManualClock()
    path = tmp_path / "config" / sfmt.OFFSET_FILE_NAME
    with _open(tmp_path, clock, dispatch_process=False) as store:
        schedule = store.schedule
        schedule.stop()  # passes run here, in this thread, one at a time
        schedule._stop.clear()
        events = []
        real_flush = schedule._flush_log

        def recording_flush():
            events.append(("flush", schedule.offsets[1], path.exists()))
            return real_flush()

        schedule._flush_log = recording_flush
        result = store.put(Message("orders", b"a", properties={"DELAY": "1"}))
        assert store.wait_dispatched(WAIT_S)
        clock.set(result.store_timestamp_ms + 1000)
        schedule.run_once()
        assert store.wait_dispatched(WAIT_S) and len(store.get("orders", 0, 0).messages) == 1
        assert schedule.offsets[1] == 1 and events == [] and not path.exists()  # delivered, nothing flushed
        schedule.save_offsets()
        assert events == [("flush", 1, False)]  # the flush came before the offsets were written
        assert json.loads(path.read_text())["offsetTable"]["1"] == 1
        schedule.save_offsets()
        assert len(events) == 1  # nothing new: no flush, no write

        schedule.start()  # the threads again: the flush thread writes after FLUSH_INTERVAL_MS of the clock
        second = store.put(Message("orders", b"b", properties={"DELAY": "1"}))
        clock.set(max(clock.now_ms(), second.store_timestamp_ms + 1000))
        assert schedule.wait_caught_up(WAIT_S) and schedule.offsets[1] == 2
        clock.advance(schedule_service.FLUSH_INTERVAL_MS)
        deadline = time.monotonic() + WAIT_S
        while json.loads(path.read_text())["offsetTable"]["1"] != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(path.read_text())["offsetTable"]["1"] == 2 and events[-1] == ("flush", 2, True)
        third = store.put(Message("orders", b"c", properties={"DELAY": "1"}))
        clock.set(max(clock.now_ms(), third.store_timestamp_ms + 1000))
        assert schedule.wait_caught_up(WAIT_S) and schedule.offsets[1] == 3
    assert json.loads(path.read_text())["offsetTable"]["1"] == 3  # written at close at the latest
    assert events[-1] == ("flush", 3, True)
