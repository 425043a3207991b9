"""The machine's own stalls during a benchmark, seen by a bare process that only sleeps.

A child process wakes from 1 ms sleeps and records each wake-up that came more than STALL_MS after the one
before it, with the machine's CPU time accounted in /proc/stat meanwhile (jiffies, both cores together). A
store's thread that is late by as much at the same moment is late for a reason outside the store: the bare
process shares nothing with it but the machine. Measured on the project's machine (bench/README.md, "Timers
during a burst"): idle, or beside two busy loops, this process waits no more than a few milliseconds; beside a
store putting flat out it sometimes waits 60-160 ms while /proc/stat accounts almost no CPU time to either core,
the signature of the virtual machine itself not running.

    with MachineWatch() as watch:
        ...                                    # the measured work
    watch.result                               # {"wakeups", "longest_ms", "stalls": [[start_s, ms, jiffies]]}
    watch.overlaps(start_s, end_s)             # whether a stall overlaps that span (time.time() seconds)
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

STALL_MS = 30.0  # a wake-up later than this after the one before is a stall
SLEEP_S = 0.001


def _jiffies() -> int | None:
    """CPU time /proc/stat has accounted to all cores so far, in clock ticks (None off Linux)."""
    try:
        with open("/proc/stat") as stat:
            return sum(int(value) for value in stat.readline().split()[1:9])
    except (OSError, ValueError):
        return None


def child() -> int:
    """Sleep SLEEP_S at a time until standard input closes; print the figures as JSON."""
    stalls, wakeups, longest = [], 0, 0.0
    previous, jiffies = time.time(), _jiffies()
    sys.stdout.write("watching\n")  # MachineWatch waits for this line: the watch is on when the block starts
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], SLEEP_S)
        now, now_jiffies = time.time(), _jiffies()
        gap_ms = (now - previous) * 1000
        longest = max(longest, gap_ms)
        if gap_ms > STALL_MS:
            accounted = None if jiffies is None or now_jiffies is None else now_jiffies - jiffies
            stalls.append([previous, gap_ms, accounted])
        wakeups += 1
        previous, jiffies = now, now_jiffies
        if readable:
            break
    json.dump({"wakeups": wakeups, "longest_ms": longest, "stall_ms": STALL_MS,
               "ticks_per_s": os.sysconf("SC_CLK_TCK"), "stalls": stalls}, sys.stdout)
    return 0


class MachineWatch:
    """Runs `child` in its own process for the span of a `with` block."""

    def __init__(self):
        self.result: dict | None = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> MachineWatch:
        self._process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._process.stdout.readline() != "watching\n":
            self._process.kill()
            raise RuntimeError("the machine watch did not start")
        return self

    def __exit__(self, *exc_info) -> None:
        output, _ = self._process.communicate(timeout=60)  # closes its standard input: it stops and reports
        if self._process.returncode != 0:
            raise RuntimeError(f"the machine watch ended with {self._process.returncode}")
        self.result = json.loads(output)

    @property
    def pid(self) -> int:
        """The bare process's id, while the block runs."""
        return self._process.pid

    def overlaps(self, start_s: float, end_s: float) -> bool:
        """Whether a stall of the bare process overlaps [start_s, end_s] (time.time() seconds)."""
        return any(begin <= end_s and begin + length / 1000 >= start_s for begin, length, _ in self.result["stalls"])


if __name__ == "__main__":
    if sys.argv[1:] != ["--child"]:
        sys.exit("usage: machine_watch.py --child  (run by MachineWatch)")
    sys.exit(child())
