"""The delayed messages' rewrites in the compiled put (commitlog/csrc/put_rewrite.c) against the Python references
(ScheduleService.rewrite, mqstore/timer/rewrite.py): the compiled put does them without calling Python, gives the
same records, hands bad input back so that every put path raises the same error with nothing written, and keeps
RocketMQ 5's rule for a message with both a delay level and a timer property (the level wins, the timer
properties are removed). Byte-for-byte comparisons over many messages: test_timer_codecs.py and
tests/unit/schedule/test_schedule_codecs.py."""

from __future__ import annotations

import pytest
from mqstore.commitlog import _native, native

from mqstore import InvalidMessageError, Message, MessageStore, StoreConfig
from mqstore.store.clock import SYSTEM_CLOCK, ManualClock
from mqstore.timer import format as tfmt
from mqstore.timer.rewrite import out_time_ms
from tests.unit.mqstore.test_compiled_put import PATHS

START_MS = 1_700_000_000_000
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_PROPERTIES = {tfmt.PROPERTY_DELIVER_MS, tfmt.PROPERTY_DELAY_MS, tfmt.PROPERTY_DELAY_SEC}

needs_native = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")


def _open(root, path: str, monkeypatch, clock=None) -> MessageStore:
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    config = StoreConfig(segment_size_bytes=1 << 20, index_enabled=False, timer_max_delay_ms=3_600_000)
    store = MessageStore.open(str(root), config, clock=ManualClock(START_MS) if clock is None else clock)
    assert (store._commitlog.codec is None) == (path == "python")
    if path != "compiled-put":
        store._put_common = None
    return store


def _count_python_rewrites(store) -> list:
    calls = []
    python_rewrite = store._commitlog.rewrite

    def counting(message):
        calls.append(message)
        return python_rewrite(message)

    store._commitlog.rewrite = counting
    return calls


@needs_native
def test_the_compiled_put_rewrites_delayed_messages_without_python(tmp_path, monkeypatch):
    with _open(tmp_path, "compiled-put", monkeypatch) as store:
        calls = _count_python_rewrites(store)
        level = Message("t", b"x", tags="a", keys=("k",), properties={"DELAY": "3", "u": "v"})
        timer = Message("t", b"y", queue_id=2, properties={"TIMER_DELAY_MS": "5000"})
        for message in (level, timer):  # the first of each: a topic not seen yet, the timer thread not started
            store.put(message)
        calls.clear()
        results = [store.put(message) for message in (level, timer, level, timer)]
        assert calls == []
        stored = [store.read_at(result.commitlog_offset) for result in results]
        assert [(m.topic, m.queue_id) for m in stored] == [(SCHEDULE_TOPIC, 2), (tfmt.TIMER_TOPIC, 0)] * 2
        assert stored[0].properties == {"TAGS": "a", "KEYS": "k", "DELAY": "3", "u": "v", "REAL_TOPIC": "t",
                                        "REAL_QID": "0"}
        assert stored[1].properties == {"TIMER_DELAY_MS": "5000", "TIMER_OUT_MS": str(START_MS + 5000 - 10),
                                        "REAL_TOPIC": "t", "REAL_QID": "2"}


@needs_native
def test_put_batch_takes_the_compiled_rewrite_too(tmp_path, monkeypatch):
    with _open(tmp_path, "compiled-put", monkeypatch) as store:
        batch = [Message("t", b"plain"), Message("t", b"level", properties={"DELAY": "2"}),
                 Message("t", b"timer", queue_id=1, properties={"TIMER_DELIVER_MS": str(START_MS + 55)})]
        store.put_batch(batch)  # topics not seen yet, the timer thread not started: the Python path
        calls = _count_python_rewrites(store)
        results = store.put_batch(batch)
        assert calls == []
        stored = [store.read_at(result.commitlog_offset) for result in results]
        assert [(m.topic, m.queue_id, m.body) for m in stored] == \
            [("t", 0, b"plain"), (SCHEDULE_TOPIC, 1, b"level"), (tfmt.TIMER_TOPIC, 0, b"timer")]
        assert stored[2].properties == {"TIMER_DELIVER_MS": str(START_MS + 55), "TIMER_OUT_MS": str(START_MS + 50),
                                        "REAL_TOPIC": "t", "REAL_QID": "1"}


@needs_native
def test_the_compiled_timer_rewrite_reads_the_system_clock_itself(tmp_path):
    with MessageStore.open(str(tmp_path / "real"), StoreConfig(index_enabled=False)) as store:
        assert store.timer.clock is SYSTEM_CLOCK
        message = Message("t", b"x", properties={"TIMER_DELAY_MS": "60000"})
        store.put(message)
        calls = _count_python_rewrites(store)
        before = SYSTEM_CLOCK.now_ms()
        result = store.put(message)
        after = SYSTEM_CLOCK.now_ms()
        assert calls == []
        stored = store.read_at(result.commitlog_offset)
        precision = store.timer.precision_ms
        out_ms = int(stored.properties["TIMER_OUT_MS"])
        assert out_time_ms(before + 60000, precision) <= out_ms <= out_time_ms(after + 60000, precision)
        assert (stored.topic, stored.properties["REAL_TOPIC"], stored.properties["REAL_QID"]) == \
            (tfmt.TIMER_TOPIC, "t", "0")


BAD = [{"DELAY": "19"}, {"DELAY": "-1"}, {"DELAY": "x"}, {"DELAY": ""}, {"DELAY": "1.0"}, {"DELAY": "99999999999"},
       {"DELAY": " 1"}, {"TIMER_DELAY_MS": "soon"}, {"TIMER_DELAY_MS": "-5"}, {"TIMER_DELAY_SEC": "-1"},
       {"TIMER_DELAY_SEC": "3601"}, {"TIMER_DELAY_SEC": "9223372036854775807"}, {"TIMER_DELAY_MS": "1" * 20},
       {"TIMER_DELIVER_MS": str(START_MS + 3_600_001)}, {"TIMER_DELAY_MS": "1.5"}, {"TIMER_DELAY_MS": "+-1"},
       {"DELAY": "0", "TIMER_DELAY_MS": "x"}, {"DELAY": "2", "TIMER_DELAY_MS": "5000", "TAGS": "reserved"}]


@needs_native
def test_bad_delayed_input_raises_the_same_on_every_put_path_with_nothing_written(tmp_path, monkeypatch):
    raised = {}
    for path in PATHS:
        with _open(tmp_path / path, path, monkeypatch) as store:
            first = store.put(Message("t", b"first"))  # the topic is known: the compiled put takes the next ones
            for properties in BAD:
                with pytest.raises(InvalidMessageError) as error:
                    store.put(Message("t", b"x", properties=dict(properties)))
                raised.setdefault(str(properties), {})[path] = (type(error.value), str(error.value))
            after = store.put(Message("t", b"after"))
            assert after.commitlog_offset == first.commitlog_offset + first.size_bytes  # nothing between them
    for properties, by_path in raised.items():
        assert len(set(by_path.values())) == 1, (properties, by_path)


BOTH = [({"DELAY": "2", "TIMER_DELAY_MS": "5000"}, SCHEDULE_TOPIC),
        ({"TIMER_DELIVER_MS": str(START_MS + 5000), "DELAY": "2", "k": "v"}, SCHEDULE_TOPIC),
        ({"TIMER_DELAY_SEC": "5", "DELAY": "2", "TIMER_DELAY_MS": "7"}, SCHEDULE_TOPIC),
        ({"DELAY": "0", "TIMER_DELAY_MS": "5000"}, tfmt.TIMER_TOPIC)]


@pytest.mark.parametrize("path", PATHS)
def test_a_delay_level_wins_over_a_timer_and_clears_its_properties(tmp_path, monkeypatch, path):
    if path != "python" and native.NATIVE is None:
        pytest.skip("MQSTORE_NATIVE=0: only the pure-Python codec is there")
    with _open(tmp_path, path, monkeypatch) as store:
        for properties, topic in BOTH * 2:  # twice: the compiled put's first of a topic goes to Python
            stored = store.read_at(store.put(Message("t", b"x", properties=dict(properties))).commitlog_offset)
            assert stored.topic == topic, properties
            if topic == SCHEDULE_TOPIC:
                assert stored.queue_id == 1 and not TIMER_PROPERTIES & set(stored.properties)
                expected = {name: value for name, value in properties.items() if name not in TIMER_PROPERTIES}
                assert stored.properties == {**expected, "REAL_TOPIC": "t", "REAL_QID": "0"}
            else:
                assert stored.properties["TIMER_OUT_MS"] == str(START_MS + 5000 - store.timer.precision_ms)
