"""kill -9 of a writer with timers pending and firing: after reopen none is lost, none delivered before its time.

Each trial starts tests/crash/timer_writer_process.py on the same store (it recovers the previous kill), lets it
put timer messages due over the next TIMER_WINDOW_MS, and kills it with SIGKILL at a random moment: during its
start-up and recovery, while it puts, or while its timer service delivers. After the last trial a store opened
here waits until every acknowledged timer is due and checks: every acknowledged message is on its topic (at least
once: a crash may deliver one twice, docs/timer.md), and no delivered copy was stored before its TIMER_DELIVER_MS.
Real time, short delays: the child's clock is the system's. `MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials.
"""

from __future__ import annotations

import collections
import os
import random
import time
from pathlib import Path

import pytest

from mqstore import MessageStore
from tests.crash.kill import run_and_kill
from tests.crash.timer_writer_process import TOPIC, timer_kill_config

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 40 if LONG else 3
PUTS_PER_TRIAL = 300
TIMER_WINDOW_MS = 1500
KILL_AFTER_MAX_S = 1.2
EARLY_KILL_PROBABILITY = 0.2
WAIT_S = 30.0
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240601"))
WRITER = Path(__file__).resolve().parent / "timer_writer_process.py"

pytestmark = pytest.mark.timeout(3600 if LONG else 300)


def acknowledged(root: Path, generation: int, rng: random.Random) -> dict[int, int]:
    """One writer, killed at a random moment (tests/crash/kill.py); the acknowledged {seq: deliver_ms}."""
    lines = run_and_kill(WRITER, [str(root), "--generation", str(generation), "--count", str(PUTS_PER_TRIAL),
                                  "--window-ms", str(TIMER_WINDOW_MS)], rng,
                         early_probability=EARLY_KILL_PROBABILITY, kill_after_max_s=KILL_AFTER_MAX_S)
    acked = {}
    for line in lines:
        words = line.split()
        if words and words[0] == "ACK":
            acked[int(words[1])] = int(words[2])
    return acked


def test_kill_with_pending_timers_loses_none_and_delivers_none_early(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    acked: dict[int, int] = {}
    for generation in range(1, TRIALS + 1):
        acked.update(acknowledged(tmp_path, generation, rng))
    assert acked, "no writer acknowledged a put before its kill"
    with MessageStore.open(str(tmp_path), timer_kill_config()) as store:
        due = max(acked.values())
        deadline = time.monotonic() + WAIT_S
        while store.clock.now_ms() <= due + store.timer.precision_ms and time.monotonic() < deadline:
            time.sleep(0.05)  # until the last acknowledged timer is due (real time: the child used it too)
        assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
        assert store.wait_dispatched(WAIT_S)
        copies = collections.Counter()
        offset = 0
        while True:
            messages = store.get(TOPIC, 0, offset, 1000).messages
            if not messages:
                break
            for message in messages:
                seq = int(message.body)
                copies[seq] += 1
                deliver_ms = int(message.properties["TIMER_DELIVER_MS"])
                assert message.store_timestamp_ms >= deliver_ms, (seq, message.store_timestamp_ms, deliver_ms)
            offset = messages[-1].queue_offset + 1
    lost = sorted(set(acked) - set(copies))
    assert lost == [], f"{len(lost)} acknowledged timers lost, first {lost[:10]}"
    twice = sum(1 for count in copies.values() if count > 1)
    print(f"{len(acked)} acknowledged, {len(copies)} delivered, {twice} more than once")
