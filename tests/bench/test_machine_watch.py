"""bench/machine_watch.py, the bare process whose stalls section 5 of bench/timer.py sets beside late timers: a
stall it did not have is not reported, and one it had is, where it was."""

from __future__ import annotations

import os
import signal
import time

from tests.bench.test_tier_ceiling import load

machine_watch = load("machine_watch")


def test_a_stopped_watch_reports_the_stall_where_it_was():
    with machine_watch.MachineWatch() as watch:
        time.sleep(0.05)
        os.kill(watch.pid, signal.SIGSTOP)  # it cannot wake while stopped: its next wake-up is this much later
        stopped = time.time()
        time.sleep(0.3)
        resumed = time.time()
        os.kill(watch.pid, signal.SIGCONT)
        time.sleep(0.05)
    result = watch.result
    assert result["wakeups"] > 0 and result["longest_ms"] >= 300
    spanning = [stall for stall in result["stalls"] if stall[0] <= stopped and stall[0] + stall[1] / 1000 >= resumed]
    assert len(spanning) == 1 and spanning[0][1] >= 300
    assert watch.overlaps(stopped + 0.1, stopped + 0.2)  # inside the stall
    assert not watch.overlaps(stopped - 10, stopped - 9)  # long before it
    accounted = spanning[0][2]  # the machine went on running meanwhile: /proc/stat counted ticks (Linux)
    assert accounted is None or accounted > 0


def test_overlaps_reads_the_stalls_as_spans():
    watch = machine_watch.MachineWatch()
    watch.result = {"stalls": [[100.0, 500.0, 3]]}  # 100.0 s to 100.5 s
    assert watch.overlaps(99.0, 100.0) and watch.overlaps(100.2, 100.3) and watch.overlaps(100.5, 101.0)
    assert not watch.overlaps(99.0, 99.99) and not watch.overlaps(100.51, 101.0)
