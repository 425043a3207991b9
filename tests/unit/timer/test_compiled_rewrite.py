"""The delayed messages' rewrites in the compiled put (commitlog/csrc/put_rewrite.c) against the Python references
(ScheduleService.rewrite, mqstore/timer/rewrite.py): the compiled put does them without calling Python, gives the
same records, hands bad input back so that every put path raises the same error with nothing written, and keeps
RocketMQ 5's rule for a message with both a delay level and a timer property (the level wins, the timer
properties are removed). Byte-for-byte comparisons over many messages: test_timer_codecs.py and
tests/unit/schedule/test_schedule_codecs.py."""

from __future__ import annotations

import os
import threading

import mqstore.commitlog.commitlog as commitlog_module
import pytest
from mqstore.commitlog import _native, native

from mqstore import InvalidMessageError, Message, MessageStore, StoreConfig
from mqstore.store.clock import SYSTEM_CLOCK, ManualClock
from mqstore.timer import format as tfmt
from mqstore.timer.rewrite import out_time_ms
from mqstore.timer.service import TimerService
from tests.unit.commitlog.test_native_codec import FixedClock
from tests.unit.mqstore.test_compiled_put import PATHS, _same_unique_keys

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


@needs_native
def test_the_compiled_timer_rewrite_follows_the_timers_clock_and_thread(tmp_path, monkeypatch):
    """What the compiled rewrite reads of the timer (its `_put_state`) follows the timer: nothing before its thread
    runs (the Python rewrite starts it), then its precision and clock, a clock given by use_clock included."""
    with _open(tmp_path, "compiled-put", monkeypatch) as store:
        timer = store.timer
        assert timer._put_state is None
        message = Message("t", b"x", properties={"TIMER_DELAY_MS": "5000"})
        store.put(message)  # the Python path: a topic not seen yet, and it starts the thread
        assert timer._thread is not None
        assert timer._put_state == (timer.precision_ms, timer.clock) == (10, timer.clock)
        calls = _count_python_rewrites(store)
        timer.use_clock(ManualClock(START_MS + 100_000))
        stored = store.read_at(store.put(message).commitlog_offset)
        assert calls == []  # the compiled rewrite's, with the new clock
        assert stored.properties["TIMER_OUT_MS"] == str(START_MS + 100_000 + 5000 - 10)
    assert timer._thread is None and timer._put_state is None


@needs_native
def test_the_compiled_timer_rewrite_writes_every_number_of_digits_as_python_does(tmp_path, monkeypatch):
    """TIMER_OUT_MS and REAL_QID as the compiled rewrite writes them (two digits a step): every length of number,
    with the digit pairs at their edges (0, 9, 10, 99, 100, ...), against the Python rewrite's str()."""
    monkeypatch.setattr(native, "NATIVE", _native)
    clock = ManualClock(1)
    config = StoreConfig(segment_size_bytes=1 << 20, index_enabled=False, timer_precision_ms=1,
                         timer_max_delay_ms=1 << 53, max_queues_per_topic=128)
    with MessageStore.open(str(tmp_path), config, clock=clock) as store:
        store.put(Message("t", b"x", properties={"TIMER_DELIVER_MS": "5"}))  # starts the timer thread
        calls = _count_python_rewrites(store)
        outs = sorted({10**n + delta for n in range(16) for delta in (-1, 0, 1)} - {0} | {2, 5, 47, 123_456_789})
        queues = [0, 9, 10, 99, 100, 127]
        for index, out in enumerate(outs):
            queue = queues[index % len(queues)]
            stored = store.read_at(store.put(Message("t", b"x", queue_id=queue,
                                                     properties={"TIMER_DELIVER_MS": str(out + 1)})).commitlog_offset)
            assert (stored.properties["TIMER_OUT_MS"], stored.properties["REAL_QID"]) == \
                (str(out_time_ms(out + 1, 1)), str(queue)) == (str(out), str(queue))
        assert calls == []  # every one was the compiled rewrite's


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


# (properties, whether the compiled put moves the message in place): in place unless the rewrite would replace or
# drop a property the message has (then it makes a new Message, as the Python rewrite makes a new dict)
SHAPES = [({"TIMER_DELAY_MS": "5000"}, True), ({"TIMER_DELIVER_MS": str(START_MS + 70), "u": "v"}, True),
          ({"DELAY": "2"}, True), ({"u": "v", "DELAY": "1", "w": ""}, True),
          ({"DELAY": "0", "TIMER_DELAY_SEC": "3"}, True), ({"TIMER_DELAY_MS": "5000", "REAL_QID": "7"}, False),
          ({"TIMER_DELAY_MS": "5000", "REAL_TOPIC": "x"}, False), ({"DELAY": "2", "REAL_QID": "7"}, False),
          ({"DELAY": "2", "TIMER_DELAY_MS": "9"}, False)]
SHAPE_TOPICS = ("t", "tópico-ü", "t" * 120)  # REAL_TOPIC's value: ASCII, two-byte UTF-8, long


def _write_shapes(root, path: str, monkeypatch) -> tuple[list, dict, list]:
    """Each shape on each topic, twice (a topic's first put may take the Python path), with the same clocks on
    every path: the PutResults, the segment files, and for the compiled put whether each put was moved in place."""
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    _same_unique_keys(monkeypatch)
    results, in_place = [], []
    with _open(root, path, monkeypatch) as store:
        appender = store._commitlog._appender
        for topic in SHAPE_TOPICS:
            for properties, _ in SHAPES * 2:
                before = appender.rewritten_in_place if path == "compiled-put" else 0
                results.append(store.put(Message(topic, b"x", tags="a", keys=("k",), properties=dict(properties))))
                in_place.append(path == "compiled-put" and appender.rewritten_in_place == before + 1)
    files = {name: (root / "commitlog" / name).read_bytes() for name in sorted(os.listdir(root / "commitlog"))}
    return results, files, in_place


@needs_native
def test_the_compiled_put_moves_the_common_delayed_shapes_in_place_with_the_python_bytes(tmp_path, monkeypatch):
    written = {path: _write_shapes(tmp_path / path, path, monkeypatch) for path in PATHS}
    reference_results, reference_files, _ = written["python"]
    for path in PATHS[1:]:
        results, files, _ = written[path]
        assert results == reference_results and files == reference_files, path
    in_place = written["compiled-put"][2]
    for index, topic in enumerate(SHAPE_TOPICS):  # each topic's second round: every common shape, and no other
        second_round = in_place[(2 * index + 1) * len(SHAPES):(2 * index + 2) * len(SHAPES)]
        assert second_round == [moved for _, moved in SHAPES], topic


class ChangingClock(ManualClock):
    """A timer clock that, once armed, calls `change` on the putting thread while the compiled put reads the time
    (as a finalizer or another thread could change a message there)."""

    def __init__(self, start_ms: int):
        super().__init__(start_ms)
        self.armed = None

    def now_ms(self) -> int:
        armed, self.armed = self.armed, None
        if armed is not None and threading.get_ident() == armed[0]:
            armed[1]()
        return super().now_ms()


class ChangingWake(threading.Event):
    """The timer's wake-up event, reading as clear while armed so that the compiled put calls set(), which calls
    `change` on the putting thread: after the put decided its rewrite, before it takes the message's fields."""

    def __init__(self):
        self.armed = None
        super().__init__()

    @property
    def _flag(self) -> bool:
        return self._set and self.armed is None

    @_flag.setter
    def _flag(self, value: bool) -> None:
        self._set = value

    def set(self) -> None:
        armed, self.armed = self.armed, None
        if armed is not None and threading.get_ident() == armed[0]:
            armed[1]()
        super().set()


OUT_MS = str(START_MS + 9000 - 10)  # the test stores' precision: 10 ms
# (property, value changed to, the record's properties then, in their order, as the Python rewrite writes them)
CHANGES = [("TIMER_DELAY_MS", "9000", [("TIMER_DELAY_MS", "9000"), ("TIMER_OUT_MS", OUT_MS), ("REAL_TOPIC", "t"),
                                       ("REAL_QID", "1")]),
           ("REAL_QID", "7", [("TIMER_DELAY_MS", "5000"), ("REAL_QID", "1"), ("TIMER_OUT_MS", str(START_MS + 4990)),
                              ("REAL_TOPIC", "t")]),
           ("TIMER_OUT_MS", "1", [("TIMER_DELAY_MS", "5000"), ("TIMER_OUT_MS", "1")])]


@needs_native
@pytest.mark.parametrize("how", ["in place", "replaced"])
@pytest.mark.parametrize("when", ["clock", "wake"])
@pytest.mark.parametrize("name,value,stored", CHANGES)
def test_a_delayed_message_changed_during_its_compiled_rewrite_is_put_as_it_is_then(tmp_path, monkeypatch, how,
                                                                                    when, name, value, stored):
    """Changed while the time is read (before the rewrite is decided): put as changed, in place when it still can
    be. Changed while the service is woken (after): the compiled put sees it and hands the message to the Python
    path. Either way the record is the Python path's for the changed message. The properties dict is changed in
    place (its version tells) or replaced by a changed copy (another object)."""
    written = {}
    timer_init = TimerService.__init__

    def with_changing_wake(self, *args, **kwargs):  # the compiled put holds the Event it finds at open
        timer_init(self, *args, **kwargs)
        self._wake = ChangingWake()

    monkeypatch.setattr(TimerService, "__init__", with_changing_wake)
    for path in ("python", "compiled-put"):
        monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
        _same_unique_keys(monkeypatch)
        clock = ChangingClock(START_MS)
        with _open(tmp_path / path, path, monkeypatch, clock=clock) as store:
            template = Message("t", b"x", queue_id=1, properties={"TIMER_DELAY_MS": "5000"})
            store.put(template)
            store.put(template)  # the topics are known, the timer thread started: the compiled put takes the next
            wake = store.timer._wake
            assert isinstance(wake, ChangingWake)
            message = Message("t", b"y", queue_id=1, properties={"TIMER_DELAY_MS": "5000"})
            if path == "python":
                message.properties[name] = value  # what the compiled put's clock or wake-up does
            else:
                in_place = store._commitlog._appender.rewritten_in_place

                def change():
                    if how == "in place":
                        message.properties[name] = value
                    else:
                        message.properties = {**message.properties, name: value}

                (clock if when == "clock" else wake).armed = (threading.get_ident(), change)
            result = store.put(message)
            if path == "compiled-put":
                assert (clock.armed, wake.armed) == (None, None)  # the change was made
                moved = store._commitlog._appender.rewritten_in_place - in_place
                # in place only when the dict decided from is the one put (a replaced one is checked and handed on)
                assert moved == (when == "clock" and how == "in place" and name == "TIMER_DELAY_MS")
            assert store.timer.precision_ms == 10
            segment = (tmp_path / path / "commitlog" / f"{0:020d}").read_bytes()
            record = segment[result.commitlog_offset:result.commitlog_offset + result.size_bytes]
            written[path] = (result, record, list(store.read_at(result.commitlog_offset).properties.items()))
    assert written["compiled-put"] == written["python"]
    assert written["python"][2] == stored
