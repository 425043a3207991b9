"""Timer messages through a store: the put rewrite, delivery at (never before) the due slot, rolls, reopen, bad
input. Time is a ManualClock; no test sleeps for a delay."""

from __future__ import annotations

import pytest

from mqstore import ConfigMismatchError, InvalidMessageError, Message, MessageStore, StoreConfig
from mqstore.store.clock import ManualClock
from mqstore.timer import format as tfmt
from mqstore.timer import service as timer_service
from mqstore.timer import with_delay

START_MS = 1_700_000_000_000
WAIT_S = 20.0

pytestmark = pytest.mark.usefixtures("codec")


def open_store(path, clock, **settings) -> MessageStore:
    config = StoreConfig(segment_size_bytes=1 << 20, timer_log_file_size_bytes=4096, **settings)
    return MessageStore.open(str(path), config, clock=clock)


def delivered(store, topic="t", queue_id=0) -> list:
    assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
    assert store.wait_dispatched(WAIT_S)
    return store.get(topic, queue_id, 0, 1000).messages


@pytest.fixture
def clock():
    return ManualClock(START_MS)


def test_a_delayed_put_is_stored_on_the_timer_topic(tmp_path, clock):
    with open_store(tmp_path, clock) as store:
        result = store.put(Message("t", b"a", queue_id=2, tags="x", properties={"TIMER_DELAY_MS": "105"}))
        stored = store.read_at(result.commitlog_offset)
        assert (stored.topic, stored.queue_id, stored.tags) == (tfmt.TIMER_TOPIC, 0, "x")
        properties = stored.properties
        assert properties["REAL_TOPIC"] == "t" and properties["REAL_QID"] == "2"
        assert properties["TIMER_OUT_MS"] == str(START_MS + 100) and properties["TIMER_DELAY_MS"] == "105"
        assert delivered(store, queue_id=2) == []


def test_delivery_comes_at_the_due_time_never_before(tmp_path, clock):
    with open_store(tmp_path, clock) as store:
        for delay in (30, 100, 1000):
            store.put(with_delay(Message("t", str(delay).encode()), delay_ms=delay))
        store.put(with_delay(Message("t", b"at"), deliver_at_ms=START_MS + 55))
        assert delivered(store) == []
        seen = []
        for step in range(0, 1010, 5):
            clock.set(START_MS + step)
            bodies = [m.body for m in delivered(store)]
            for body in bodies[len(seen):]:
                due = START_MS + (55 if body == b"at" else int(body))
                assert clock.now_ms() >= due, (body, clock.now_ms())
                assert clock.now_ms() < due + 2 * store.timer.precision_ms
            seen = bodies
        assert seen == [b"30", b"at", b"100", b"1000"]
        message = delivered(store)[0]
        assert message.properties["TIMER_ENQUEUE_MS"] == str(START_MS)
        assert "REAL_TOPIC" not in message.properties and message.topic == "t"
        assert store.timer.stats()["pending"] == 0


def test_a_timer_past_the_roll_window_is_rolled(tmp_path, clock):
    with open_store(tmp_path, clock) as store:
        store.timer.roll_window_slots = 10  # 100 ms at 10 ms slots
        store.put(Message("t", b"far", tags="a", keys=["k"], properties={"TIMER_DELAY_SEC": "1"}))
        for step in range(0, 1000, 20):
            clock.set(START_MS + step)
            assert delivered(store) == []
        clock.set(START_MS + 1000)
        (message,) = delivered(store)
        assert (message.body, message.tags, message.keys) == (b"far", "a", ("k",))
        assert int(message.properties["TIMER_ROLL_TIMES"]) >= 5
        assert store.timer.stats()["rolled"] >= 5


def test_pending_timers_survive_a_reopen(tmp_path, clock):
    with open_store(tmp_path, clock) as store:
        for index in range(50):
            store.put(with_delay(Message("t", b"%d" % index), delay_ms=200 + index))
        assert store.timer.wait_caught_up(WAIT_S)
        assert store.timer.stats()["pending"] == 50
    with open_store(tmp_path, clock) as store:
        clock.set(START_MS + 220)
        assert len(delivered(store)) == 21  # due at START_MS + 200 .. + 220
    with open_store(tmp_path, clock) as store:
        clock.set(START_MS + 300)
        bodies = [m.body for m in delivered(store)]
        assert bodies == [b"%d" % index for index in range(50)]


def test_bad_timer_input_writes_nothing(tmp_path, clock):
    with open_store(tmp_path, clock, timer_max_delay_ms=60_000) as store:
        bad = [{"TIMER_DELAY_MS": "soon"}, {"TIMER_DELAY_MS": "-5"}, {"TIMER_DELAY_SEC": "-1"},
               {"TIMER_DELAY_SEC": "61"}, {"TIMER_DELIVER_MS": str(START_MS + 60_001)},
               {"TIMER_DELIVER_MS": "1" * 20}, {"TIMER_DELAY_MS": "1.5"}]
        for properties in bad:
            with pytest.raises(InvalidMessageError):
                store.put(Message("t", b"x", properties=properties))
            with pytest.raises(InvalidMessageError):
                store.put_batch([Message("t", b"ok"), Message("t", b"x", properties=properties)])
        with pytest.raises(InvalidMessageError):
            with_delay(Message("t", b"x"), delay_ms=-1)
        assert store.put(Message("t", b"after")).commitlog_offset == 0  # nothing was written before it


def test_a_due_time_in_the_past_is_stored_directly_and_batches_are_rewritten(tmp_path, clock):
    with open_store(tmp_path, clock) as store:
        store.put(Message("t", b"now", properties={"TIMER_DELIVER_MS": str(START_MS - 1)}))
        store.put_batch([Message("t", b"plain"), with_delay(Message("t", b"later"), delay_ms=10)])
        assert [m.body for m in delivered(store)] == [b"now", b"plain"]
        clock.advance(10)
        assert [m.body for m in delivered(store)] == [b"now", b"plain", b"later"]


def test_timers_enqueued_over_many_batches_are_each_delivered_once_when_due(tmp_path, clock, monkeypatch):
    """The service links the timer queue a batch at a time (ENQUEUE_BATCH_MESSAGES): made small here, so that
    batches end inside runs of one slot and of one delay, and slots get units from several batches."""
    monkeypatch.setattr(timer_service, "ENQUEUE_BATCH_MESSAGES", 7)
    delays = [10 + 10 * (index % 9) + (index * 7) % 3 for index in range(100)]
    with open_store(tmp_path, clock) as store:
        for index, delay in enumerate(delays):
            store.put(with_delay(Message("t", b"%d" % index), delay_ms=delay))
        assert store.timer.wait_caught_up(WAIT_S) and store.timer.stats()["pending"] == len(delays)
        seen: set[int] = set()
        for step in range(0, 121, 10):
            clock.set(START_MS + step)
            bodies = [int(m.body) for m in delivered(store)]
            assert len(bodies) == len(set(bodies))  # none twice
            for index in set(bodies) - seen:
                assert delays[index] <= step, (index, delays[index], step)  # none early
            assert {index for index, delay in enumerate(delays) if delay < step} <= set(bodies)  # none late
            seen = set(bodies)
        assert seen == set(range(len(delays)))


def test_the_wheel_keeps_its_precision(tmp_path, clock):
    with open_store(tmp_path, clock, timer_precision_ms=20) as store:
        store.put(with_delay(Message("t", b"x"), delay_ms=50))
        assert store.timer.wait_caught_up(WAIT_S)
    with open_store(tmp_path, clock) as store:  # the default gives way to the saved precision
        assert store.timer.precision_ms == 20
        clock.advance(60)
        assert [m.body for m in delivered(store)] == [b"x"]
    with pytest.raises(ConfigMismatchError):
        open_store(tmp_path, clock, timer_precision_ms=10).timer.wait_caught_up(WAIT_S)


def test_timer_log_files_of_fired_timers_are_removed(tmp_path, clock):
    with open_store(tmp_path, clock) as store:  # 4 KiB TimerLog files: 78 units each
        for index in range(400):
            store.put(with_delay(Message("t", b"%d" % index), delay_ms=100 + index))
        store.put(with_delay(Message("t", b"last"), delay_ms=5000))
        assert store.timer.wait_caught_up(WAIT_S)
        timer_log = tmp_path / "timerlog"
        assert len(list(timer_log.iterdir())) == 6
        clock.advance(600)
        assert len(delivered(store)) == 400
        store.timer._write_checkpoint()
        assert store.timer.remove_fired_files() == 5  # the last file holds the pending timer
        assert len(list(timer_log.iterdir())) == 1
        clock.advance(5000)
        assert [m.body for m in delivered(store)][-1] == b"last"
    with open_store(tmp_path, clock) as store:
        store.put(with_delay(Message("t", b"again"), delay_ms=10))
        clock.advance(20)
        assert [m.body for m in delivered(store)][-1] == b"again"


def test_slots_pointing_past_a_lost_timer_log_tail_are_relinked(tmp_path, clock, caplog):
    """A power loss kept the wheel's pages but not the TimerLog's last units, nor the checkpoint after them: the
    slots are relinked to the units on disk and the lost ones enqueued again from the older checkpoint."""
    with open_store(tmp_path, clock) as store:
        for index in range(30):
            store.put(with_delay(Message("t", b"a%d" % index), delay_ms=100 + 3 * index))
        assert store.timer.wait_caught_up(WAIT_S)
    checkpoint = tmp_path / "config" / "timercheck"
    older = checkpoint.read_bytes()
    end = int.from_bytes(older[8:16], "big")
    with open_store(tmp_path, clock) as store:
        for index in range(30):
            store.put(with_delay(Message("t", b"b%d" % index), delay_ms=100 + 3 * index))
        assert store.timer.wait_caught_up(WAIT_S)
    checkpoint.write_bytes(older)
    for path in sorted((tmp_path / "timerlog").iterdir()):  # the units after the older checkpoint's end: lost
        base = int(path.name)
        data = bytearray(path.read_bytes())
        cut = max(0, end - base)
        data[cut:] = bytes(len(data) - cut)
        path.write_bytes(bytes(data))
    with open_store(tmp_path, clock) as store:
        clock.advance(300)
        bodies = sorted(m.body for m in delivered(store))
    assert "wheel slots pointed past the TimerLog's end" in caplog.text
    assert bodies == sorted([b"a%d" % index for index in range(30)] + [b"b%d" % index for index in range(30)])


def test_a_refused_delivery_is_tried_again(tmp_path, clock):
    from mqstore import PutResult, PutStatus

    with open_store(tmp_path, clock) as store:
        for index in range(5):
            store.put(with_delay(Message("t", b"%d" % index), delay_ms=20))
        store.put(Message("t", b"due", properties={"TIMER_DELAY_MS": "1"}))
        assert store.timer.wait_caught_up(WAIT_S)
        reput, refusals = store.reput, []

        def refusing_reput(message, header):
            if len(refusals) < 3:
                refusals.append(message.body)
                return PutResult(PutStatus.DISK_FULL, -1, -1, 0, 0, "")
            return reput(message, header)

        store.reput = refusing_reput
        clock.advance(30)
        bodies = [m.body for m in delivered(store)]
        assert len(refusals) == 3 and sorted(set(bodies)) == sorted([b"due"] + [b"%d" % i for i in range(5)])
        assert store.timer.stats()["delivered"] == len(bodies)  # counted once put, not at each refusal


@pytest.mark.parametrize("real", [{"REAL_TOPIC": "no such topic!", "REAL_QID": "0"},
                                  {"REAL_TOPIC": "t", "REAL_QID": "2147483647"}], ids=["topic", "queue"])
def test_a_timer_record_no_store_takes_is_skipped_and_the_service_goes_on(tmp_path, clock, real):
    """A record already on the timer topic (RocketMQ's, or a copy tool's) whose REAL_TOPIC or REAL_QID no put takes:
    skipped with a warning, as RocketMQ 5 drops a MESSAGE_ILLEGAL put, and what follows is delivered."""
    with open_store(tmp_path, clock) as store:
        store.put(Message(tfmt.TIMER_TOPIC, b"x", properties={"TIMER_OUT_MS": str(START_MS + 10), **real}))
        store.put(with_delay(Message("t", b"y"), delay_ms=20))
        assert store.timer.wait_caught_up(WAIT_S)
        clock.advance(30)
        assert [m.body for m in delivered(store)] == [b"y"]
        stats = store.timer.stats()
        assert (stats["delivered"], stats["pending"], stats["error"]) == (1, 0, None)
