"""The timer service's compiled enqueue (commitlog/csrc/timer_link.c) against its reference, the Python `_link`:
the same TimerLog files, the same wheel and the same deliveries for any batch, including the rare rows the compiled
path hands back to Python (a REAL_TOPIC that is not ASCII, a timer already due, a TIMER_OUT_MS the wheel cannot
hold), rolls past the window, TimerLog files that end inside a batch and slots that batches add to. And the reason
it exists: a batch is linked without letting go of the interpreter lock."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqstore.commitlog import _native, native

from mqstore import Message, MessageStore, StoreConfig
from mqstore.store.clock import ManualClock
from mqstore.timer import format as tfmt
from mqstore.timer import service as timer_service
from tests.lock_held import turns_of_another_thread

pytestmark = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")

START_MS = 1_700_000_000_000
INT64_MAX = (1 << 63) - 1

# A timer row: how its TIMER_OUT_MS is made, and its REAL_TOPIC.
OUT_KINDS = ("due", "soon", "window", "near_roll", "far_roll", "huge", "not_digits", "too_big", "absent")
TOPICS = ("t", "tópico", None)


def _out_ms(kind: str, step: int, write_time: int, precision: int, window: int) -> str | None:
    span = window * precision
    return {"due": str(write_time - 1 - step * precision), "soon": str(write_time + step),
            "window": str(write_time + span - 1 - step), "near_roll": str(write_time + span + step),
            "far_roll": str(write_time + 2 * span + step * precision), "huge": str(INT64_MAX - step),
            "not_digits": "-5" if step % 2 else "12a", "too_big": str(INT64_MAX + 1 + step), "absent": None}[kind]


def _timer_messages(rows, write_time: int, precision: int, window: int) -> list[Message]:
    """Messages as the rewrite stores them on the timer topic (TIMER_OUT_MS stops a second rewrite)."""
    messages = []
    for index, (kind, step, topic) in enumerate(rows):
        properties = {"REAL_QID": "0", "n": str(index)}
        out = _out_ms(kind, step, write_time, precision, window)
        if out is not None:
            properties["TIMER_OUT_MS"] = out
        if topic is not None:
            properties["REAL_TOPIC"] = topic
        if out is None and topic is None:
            properties["REAL_TOPIC"] = "t"  # one of the two stops the rewrite
        messages.append(Message(tfmt.TIMER_TOPIC, b"%d" % index, properties=properties, born_timestamp_ms=START_MS))
    return messages


def _run(root, compiled: bool, rows, batches, precision: int, window: int, file_size: int, behind: int) -> dict:
    """Enqueue `rows` a batch at a time by one path; the timer files and what was delivered."""
    clock = ManualClock(START_MS)
    config = StoreConfig(segment_size_bytes=1 << 20, timer_precision_ms=precision, index_enabled=False)
    write_time = START_MS // precision * precision
    with MessageStore.open(str(root), config, clock=clock) as store:
        timer = store.timer
        timer._native = _native if compiled else None
        for message in _timer_messages(rows, write_time, precision, window):
            store.put(message)
        assert store.wait_dispatched(20)
        timer._open_files()
        timer.timer_log.file_size = file_size  # below the setting's least (4096): a few units a file
        timer.roll_window_slots = window
        timer.read_time_ms = write_time - behind * precision
        for batch in batches:
            timer_service.ENQUEUE_BATCH_MESSAGES = batch
            assert timer._enqueue(write_time) > 0
        assert timer.queue_offset == len(rows)
        enqueued, rolled = timer.enqueued_count, timer.rolled_count
        timer.timer_log.flush()
        timer.close()
        assert store.wait_dispatched(20)
        delivered = [(m.topic, m.body, m.properties["TIMER_ENQUEUE_MS"]) for m in store.get("t", 0, 0, 10_000).messages]
    files = {name: (root / "timerlog" / name).read_bytes() for name in sorted(os.listdir(root / "timerlog"))}
    return {"files": files, "wheel": (root / "timerwheel").read_bytes(), "delivered": delivered,
            "enqueued": enqueued, "rolled": rolled}


def _batches(count: int, sizes: list[int]) -> list[int]:
    batches, left = [], count
    for size in sizes:
        if left <= 0:
            break
        batches.append(min(size, left))
        left -= size
    while left > 0:
        batches.append(min(7, left))
        left -= 7
    return batches


@st.composite
def _cases(draw):
    rows = draw(st.lists(st.tuples(st.sampled_from(OUT_KINDS), st.integers(0, 40), st.sampled_from(TOPICS)),
                         min_size=1, max_size=60))
    sizes = draw(st.lists(st.integers(1, 25), min_size=1, max_size=6))
    return (rows, _batches(len(rows), sizes), draw(st.sampled_from((1, 7, 1000))), draw(st.integers(2, 50)),
            draw(st.sampled_from((68, 200, 1000, 4096))), draw(st.integers(0, 3)))


def _compare(root, case) -> None:
    rows, batches, precision, window, file_size, behind = case
    python = _run(root / "python", False, rows, batches, precision, window, file_size, behind)
    compiled = _run(root / "compiled", True, rows, batches, precision, window, file_size, behind)
    assert compiled["files"].keys() == python["files"].keys()
    for name, data in python["files"].items():
        assert compiled["files"][name] == data, name
    assert compiled["wheel"] == python["wheel"]
    assert compiled["delivered"] == python["delivered"]
    assert (compiled["enqueued"], compiled["rolled"]) == (python["enqueued"], python["rolled"])


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_the_compiled_enqueue_writes_what_the_python_one_writes(tmp_path_factory, monkeypatch, case):
    monkeypatch.setattr(timer_service, "ENQUEUE_BATCH_MESSAGES", timer_service.ENQUEUE_BATCH_MESSAGES)
    _compare(tmp_path_factory.mktemp("link"), case)


@pytest.mark.long
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_the_compiled_enqueue_writes_what_the_python_one_writes_in_many_cases(tmp_path_factory, monkeypatch, case):
    monkeypatch.setattr(timer_service, "ENQUEUE_BATCH_MESSAGES", timer_service.ENQUEUE_BATCH_MESSAGES)
    _compare(tmp_path_factory.mktemp("link"), case)


def test_every_kind_of_row_is_in_one_compared_case(tmp_path, monkeypatch):
    """One case with every kind of row, several batches and a TimerLog file boundary inside a batch: the example
    hypothesis may not draw, held to the same comparison."""
    monkeypatch.setattr(timer_service, "ENQUEUE_BATCH_MESSAGES", timer_service.ENQUEUE_BATCH_MESSAGES)
    rows = [(kind, step, topic) for step in range(3) for kind in OUT_KINDS for topic in TOPICS]
    batches = _batches(len(rows), [5, 1, 30])
    python = _run(tmp_path / "python", False, rows, batches, 7, 10, 200, 2)
    compiled = _run(tmp_path / "compiled", True, rows, batches, 7, 10, 200, 2)
    assert len(python["files"]) > 3 and python["enqueued"] == 3 * 6 * len(TOPICS)  # 6 kinds have a TIMER_OUT_MS
    assert python["delivered"]  # a due row with a legal REAL_TOPIC
    magic = [int.from_bytes(data[at + 12:at + 16], "big") for data in python["files"].values()
             for at in range(0, len(data) - 51, 52) if int.from_bytes(data[at:at + 4], "big") == 52]
    assert tfmt.MAGIC_DEFAULT in magic and tfmt.MAGIC_DEFAULT | tfmt.MAGIC_ROLL in magic
    assert compiled == python


def test_a_batch_is_linked_without_letting_go_of_the_interpreter_lock(tmp_path):
    """Another Python thread runs only when this one lets go of the lock or its switch interval ends. With the
    interval far longer than a batch, a thread that counts while it runs must not count during the batch."""
    clock = ManualClock(START_MS)
    count = 4000
    with MessageStore.open(str(tmp_path), StoreConfig(index_enabled=False), clock=clock) as store:
        timer = store.timer
        for index in range(2 * count):
            store.put(Message(tfmt.TIMER_TOPIC, b"x", properties={
                "TIMER_OUT_MS": str(START_MS + 1000 * (1 + index % 50)), "REAL_TOPIC": "t", "REAL_QID": "0"}))
        assert store.wait_dispatched(20)
        timer._open_files()
        timer.read_time_ms = START_MS
        original = timer_service.ENQUEUE_BATCH_MESSAGES
        timer_service.ENQUEUE_BATCH_MESSAGES = count
        try:
            assert timer._enqueue(START_MS) == count  # the first batch opens the TimerLog file (os.open lets go)
            linked, during = turns_of_another_thread(lambda: timer._enqueue(START_MS))
        finally:
            timer_service.ENQUEUE_BATCH_MESSAGES = original
        assert linked == count and timer.enqueued_count == 2 * count
        assert during == 0
        timer.close()
    assert np.frombuffer((tmp_path / "timerwheel").read_bytes(), dtype=tfmt.SLOT)["count"].sum() == 2 * count


def test_the_compiled_layout_is_the_formats():
    assert _native.timer_layout() == (tfmt.UNIT_SIZE_BYTES, tfmt.BLANK_SIZE_BYTES, tfmt.SLOT_SIZE_BYTES,
                                      tfmt.WHEEL_SLOT_COUNT, tfmt.MAGIC_DEFAULT, tfmt.MAGIC_ROLL)
