"""Finalizers that change decode_run's arguments while it runs (issue #29, part 3: borrowed references).

decode_run (commitlog/csrc/codec.c) builds a StoredMessage per record: each is a GC-tracked allocation, which can
start a collection, which runs the finalizers of unreachable cycles, which are arbitrary Python code. Here such a
finalizer clears, shrinks or replaces the caller's offset, size and queue-offset lists at the k-th collection point
of the call, for every k up to the call's allocations. The call must then return a correct result (the messages it
appended are the records' messages, and it stops where the lists end) or raise cleanly, never read freed memory.
Run under AddressSanitizer with PYTHONMALLOC=malloc to see a stale read as a report rather than as luck.
"""

from __future__ import annotations

import gc

import pytest
from mqstore.commitlog import _native
from mqstore.commitlog.message import StoredMessage, decode_message

from tests.native import hostile

RECORDS = 12
SEGMENT_BASE = 10**12  # offsets are large ints: each is an object of its own, freed when a list drops it


def _segment() -> tuple[bytearray, list[int]]:
    """RECORDS valid records one after the other, and their positions."""
    data = bytearray()
    positions = []
    for number in range(RECORDS):
        positions.append(len(data))
        data += hostile.valid_record(SEGMENT_BASE + len(data), bytes([number]) * (10 + number))
    return data, positions


class Trap:
    """An object in a reference cycle whose finalizer runs `action` when a collection finds the cycle."""

    def __init__(self, action):
        self.action = action
        self.cycle = self

    def __del__(self):
        self.action()


MUTATIONS = {
    "clear": lambda lists: [values.clear() for values in lists],
    "shrink": lambda lists: [values.__delitem__(slice(2, None)) for values in lists],
    "replace": lambda lists: [values.__setitem__(slice(None), [7 * 10**12 + i for i in range(len(values))])
                              for values in lists],
    "grow": lambda lists: [values.extend(values[:1] * 1000) for values in lists],
}


def _run_with_trap(k: int, mutate, with_queue: bool):
    data, positions = _segment()
    offsets = [SEGMENT_BASE + position for position in positions]
    sizes = [int.from_bytes(data[position : position + 4], "big") for position in positions]
    queue_offsets = [0] * RECORDS  # the records say entry 0 of queue 0 of topic T
    lists = [offsets, sizes] + ([queue_offsets] if with_queue else [])
    messages: list = []
    expected = [decode_message(data, position, len(data) - position, SEGMENT_BASE + position, check_crc=True)
                for position in positions]
    fired = []
    thresholds = gc.get_threshold()
    gc.collect(0)
    gc.disable()
    try:
        Trap(lambda: fired.append(mutate(lists)))  # unreachable at once: the next collection runs its finalizer
        gc.set_threshold(k)
        gc.enable()
        topic, topic_raw, queue_id, entries = ("T", b"T", 0, queue_offsets) if with_queue else (None, None, 0, None)
        try:
            done = _native.decode_run(data, SEGMENT_BASE, offsets, sizes, 0, -1, topic, topic_raw, queue_id,
                                      entries, messages, StoredMessage)
        except (TypeError, ValueError, OverflowError):
            done = None  # raised cleanly: a list changed under the call
        fired_inside = bool(fired)
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()
        gc.collect(0)
    return done, messages, expected, fired_inside


@pytest.mark.parametrize("with_queue", [False, True], ids=["by-offset", "by-queue"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_finalizer_changing_the_lists_mid_call_gives_a_correct_result(mutation, with_queue):
    # by-queue: the queue offsets are a list too, read item by item as the offsets are
    fired = 0
    for k in range(1, RECORDS + 4):  # about one GC-tracked allocation per record (its StoredMessage)
        done, messages, expected, fired_inside = _run_with_trap(k, MUTATIONS[mutation], with_queue)
        fired += fired_inside
        if done is None:
            continue
        assert 0 <= done <= RECORDS + 1000
        assert len(messages) == done  # one message for each item it went past
        for message, reference in zip(messages, expected):
            assert tuple(message) == tuple(reference)
    assert fired >= RECORDS  # the finalizer ran inside the call, at each record in turn
