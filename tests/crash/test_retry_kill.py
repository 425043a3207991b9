"""kill -9 of a writer with retries pending: after reopen no failed message is lost and none comes back early.

Each trial starts tests/crash/retry_writer_process.py on the same store (it recovers the previous kill): it puts
messages, then fails every message it reads as group `workers` (nack: a retry through the schedule topic at level
3 + n, after two retries the DLQ), and is killed at a random moment: during recovery, while it puts, while it
nacks and commits, while the schedule service delivers retries. After the last trial a store opened here goes on
failing everything until every acknowledged message is in the DLQ, and checks: every acknowledged message reached
`%DLQ%workers` (nothing lost; at-least-once, so some more than once: a kill between a nack and the commit reads
the message again), every dead letter has 3 reconsume times, and no retry was stored before the due time of a
schedule record of that message and reconsume count (store timestamp + its level's delay).
Real time, short levels: the child's clock is the system's. `MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials.
"""

from __future__ import annotations

import collections
import os
import random
import time
from pathlib import Path

import pytest

from mqstore import MessageStore
from mqstore.consumer import retry
from mqstore.schedule import format as sfmt
from tests.crash.kill import run_and_kill
from tests.crash.retry_writer_process import (
    GROUP,
    RETRY_KILL_LEVELS,
    RETRY_KILL_MAX_RECONSUME_TIMES,
    fail_everything,
    retry_kill_config,
)

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 40 if LONG else 3
PUTS_PER_TRIAL = 100
KILL_AFTER_MAX_S = 1.0
EARLY_KILL_PROBABILITY = 0.2
DRAIN_SLICE_S = 0.5
WAIT_S = 30.0
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20241128"))
WRITER = Path(__file__).resolve().parent / "retry_writer_process.py"
DELAYS_MS = sfmt.parse_levels(RETRY_KILL_LEVELS)

pytestmark = pytest.mark.timeout(3600 if LONG else 300)


def _all(store, topic: str, queue_id: int) -> list:
    found, offset = [], store.min_offset(topic, queue_id)
    while True:
        messages = store.get(topic, queue_id, offset, 1000).messages
        if not messages:
            return found
        found.extend(messages)
        offset = messages[-1].queue_offset + 1


def _drain_to_dlq(store, acked: set[int]) -> list:
    """Fail everything until every acknowledged message is a dead letter (or WAIT_S passed); the dead letters."""
    deadline = time.monotonic() + WAIT_S
    while True:
        dead = _all(store, retry.dlq_topic(GROUP), 0)
        if acked <= {int(message.body) for message in dead} or time.monotonic() > deadline:
            return dead
        fail_everything(store, time.monotonic() + DRAIN_SLICE_S)


def _check_none_early(store) -> int:
    """Every retry stored at or after the earliest due time of a schedule record of it; the retries checked."""
    due: dict[tuple[int, int], int] = {}
    for level in range(1, len(DELAYS_MS) + 1):
        for hop in _all(store, sfmt.SCHEDULE_TOPIC, level - 1):
            key = (int(hop.body), hop.reconsume_times)
            at = hop.store_timestamp_ms + DELAYS_MS[level - 1]
            due[key] = min(due.get(key, at), at)
    retries = _all(store, retry.retry_topic(GROUP), 0)
    for message in retries:
        key = (int(message.body), message.reconsume_times)
        assert key in due, key
        assert message.store_timestamp_ms >= due[key], (key, message.store_timestamp_ms, due[key])
    return len(retries)


def test_kill_with_pending_retries_loses_none_and_retries_none_early(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    acked: set[int] = set()
    for generation in range(1, TRIALS + 1):
        lines = run_and_kill(WRITER, [str(tmp_path), "--generation", str(generation), "--count",
                                      str(PUTS_PER_TRIAL)], rng, early_probability=EARLY_KILL_PROBABILITY,
                             kill_after_max_s=KILL_AFTER_MAX_S)
        acked.update(int(line.split()[1]) for line in lines if line.startswith("ACK "))
    assert acked, "no writer acknowledged a put before its kill"
    with MessageStore.open(str(tmp_path), retry_kill_config()) as store:
        dead = _drain_to_dlq(store, acked)
        copies = collections.Counter(int(message.body) for message in dead)
        assert {message.reconsume_times for message in dead} == {RETRY_KILL_MAX_RECONSUME_TIMES + 1}
        retries = _check_none_early(store)
    lost = sorted(acked - set(copies))
    assert lost == [], f"{len(lost)} acknowledged failed messages lost, first {lost[:10]}"
    twice = sum(1 for count in copies.values() if count > 1)
    print(f"{len(acked)} acknowledged, {retries} retries, {len(copies)} dead letters, {twice} more than once")
