"""kill -9 of the writer while it holds leases: after reopen nothing is lost and nothing acknowledged comes back.

Each trial starts tests/crash/lease_worker_process.py on the same store (it recovers the previous kill and reads
the lease journal it left), lets it lease and acknowledge, and kills it with SIGKILL at a random moment: during
start-up, between or inside its receives, acks and journal compactions. After the last trial a consumer here,
on a clock a day ahead (every lease expired), drains the topic and checks against what the workers printed:
- nothing lost: every message was acknowledged by a worker or is received now (or a worker was killed inside
  the ack call of it: that ack may have been written, which is not a loss);
- nothing acknowledged comes back: no message is leased, by a later worker or here, after its ack returned.
`MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqstore import Message, MessageStore
from mqstore.lease import open_lease_consumer
from mqstore.store.clock import ManualClock
from tests.crash.lease_worker_process import GROUP, MAX_DELIVERY_COUNT, TOPIC, lease_kill_config

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 40 if LONG else 4
MESSAGES = 40_000 if LONG else 8000
VISIBILITY_MS = 300
KILL_AFTER_MAX_S = 0.8
EARLY_KILL_PROBABILITY = 0.2
DAY_MS = 24 * 3600 * 1000
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240601"))
WORKER = Path(__file__).resolve().parent / "lease_worker_process.py"

pytestmark = pytest.mark.timeout(3600 if LONG else 300)


def run_and_kill(root: Path, trial: int, rng: random.Random) -> list[tuple[str, str]]:
    """One worker, killed after a random time; its (event, body) lines in order."""
    process = subprocess.Popen([sys.executable, str(WORKER), str(root), "--seed", str(trial),
                                "--visibility-ms", str(VISIBILITY_MS)], stdout=subprocess.PIPE)
    first = b""
    if rng.random() < EARLY_KILL_PROBABILITY:
        time.sleep(rng.uniform(0.0, 0.4))  # during start-up or recovery
    else:
        first = process.stdout.readline()  # OPENED
        time.sleep(rng.uniform(0.0, KILL_AFTER_MAX_S))  # the kill's moment: not a timing assertion
    process.send_signal(signal.SIGKILL)
    rest, _ = process.communicate()
    return [tuple(line.split()[:2]) for line in (first + rest).decode().splitlines() if line != "OPENED"]


def check_events(events: list[tuple[str, str]], drained: list[str]) -> None:
    acked: set[str] = set()
    acking: set[str] = set()
    for event, body in events + [("LEASED", body) for body in drained]:
        assert body not in acked, f"message {body} {event} after its ack returned"
        if event == "ACKED":
            acked.add(body)
        elif event == "ACKING":
            acking.add(body)
    missing = {str(i) for i in range(MESSAGES)} - acked - set(drained) - acking
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"


def test_kill_with_leases_pending_loses_nothing_and_redelivers_nothing_acknowledged(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    with MessageStore.open(tmp_path, lease_kill_config()) as store:
        store.put_batch([Message(TOPIC, str(i).encode(), queue_id=i % 2) for i in range(MESSAGES)])
    events: list[tuple[str, str]] = []
    for trial in range(1, TRIALS + 1):
        events += run_and_kill(tmp_path, trial, rng)
    assert any(event == "ACKED" for event, _ in events), "no worker acknowledged anything before its kill"
    with MessageStore.open(tmp_path, lease_kill_config()) as store:
        clock = ManualClock(store.clock.now_ms() + DAY_MS)  # every lease the workers held has expired
        with open_lease_consumer(store, GROUP, TOPIC, clock=clock,
                                 max_delivery_count=MAX_DELIVERY_COUNT) as consumer:
            drained = []
            while received := consumer.receive(max_count=500, visibility_ms=3_600_000):
                drained += [leased.message.body.decode() for leased in received]
                consumer.ack_many(leased.lease for leased in received)
            assert len(drained) == len(set(drained))
            assert consumer.commit() == {0: MESSAGES // 2, 1: MESSAGES // 2}
    check_events(events, drained)
    print(f"{sum(event == 'ACKED' for event, _ in events)} acknowledged by workers, {len(drained)} drained")
