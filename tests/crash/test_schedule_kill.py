"""kill -9 of a writer with delay-level messages pending and firing: after reopen none is lost, none early.

Each trial starts tests/crash/schedule_writer_process.py on the same store (it recovers the previous kill), lets
it put messages with delay levels of 50-400 ms, and kills it with SIGKILL at a random moment: during its start-up
and recovery, while it puts, or while its schedule service delivers. After the last trial a store opened here
waits until every acknowledged message is due and checks: every acknowledged message is on its topic (at least
once: a kill between a re-put and config/delayOffset.json delivers it again, docs/schedule.md), and no delivered
copy was stored before its schedule record's store timestamp + its level's delay.
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
from mqstore.schedule.format import parse_levels
from tests.crash.kill import run_and_kill
from tests.crash.schedule_writer_process import SCHEDULE_KILL_LEVELS, TOPIC, schedule_kill_config

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 40 if LONG else 3
PUTS_PER_TRIAL = 300
KILL_AFTER_MAX_S = 1.0
EARLY_KILL_PROBABILITY = 0.2
WAIT_S = 30.0
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240602"))
WRITER = Path(__file__).resolve().parent / "schedule_writer_process.py"
DELAYS_MS = parse_levels(SCHEDULE_KILL_LEVELS)

pytestmark = pytest.mark.timeout(3600 if LONG else 300)


def acknowledged(root: Path, generation: int, rng: random.Random) -> dict[int, int]:
    """One writer, killed at a random moment (tests/crash/kill.py); the acknowledged {seq: due_ms}."""
    lines = run_and_kill(WRITER, [str(root), "--generation", str(generation), "--count", str(PUTS_PER_TRIAL)], rng,
                         early_probability=EARLY_KILL_PROBABILITY, kill_after_max_s=KILL_AFTER_MAX_S)
    acked = {}
    for line in lines:
        words = line.split()
        if words and words[0] == "ACK":
            acked[int(words[1])] = int(words[3]) + DELAYS_MS[int(words[2]) - 1]
    return acked


def _delivered(store) -> list:
    found, offset = [], 0
    while True:
        messages = store.get(TOPIC, 0, offset, 1000).messages
        if not messages:
            return found
        found.extend(messages)
        offset = messages[-1].queue_offset + 1


def test_kill_with_pending_delays_loses_none_and_delivers_none_early(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    acked: dict[int, int] = {}
    for generation in range(1, TRIALS + 1):
        acked.update(acknowledged(tmp_path, generation, rng))
    assert acked, "no writer acknowledged a put before its kill"
    with MessageStore.open(str(tmp_path), schedule_kill_config()) as store:
        due = max(acked.values())
        deadline = time.monotonic() + WAIT_S
        while store.clock.now_ms() <= due and time.monotonic() < deadline:
            time.sleep(0.05)  # until the last acknowledged message is due (real time: the child used it too)
        assert store.schedule.wait_caught_up(WAIT_S), store.schedule.stats()
        assert store.wait_dispatched(WAIT_S)
        copies = collections.Counter()
        for message in _delivered(store):
            seq = int(message.body)
            copies[seq] += 1
            if seq in acked:
                assert message.store_timestamp_ms >= acked[seq], (seq, message.store_timestamp_ms, acked[seq])
        assert store.stats()["schedule"]["pending"] == {}
    lost = sorted(set(acked) - set(copies))
    assert lost == [], f"{len(lost)} acknowledged delayed messages lost, first {lost[:10]}"
    twice = sum(1 for count in copies.values() if count > 1)
    print(f"{len(acked)} acknowledged, {len(copies)} delivered, {twice} more than once")
