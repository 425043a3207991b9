"""Start a writer process, kill it with SIGKILL at a random moment, return what it printed.

For the kill tests of the timed services (schedule, timer, retries): with probability `early_probability` the
kill comes during start-up and recovery, else after the writer's first line (OPENED) plus a random part of
`kill_after_max_s`. The moment is random, never a timing assertion.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

EARLY_KILL_WINDOW_S = 0.5


def run_and_kill(writer: Path, arguments: list[str], rng: random.Random, *, early_probability: float,
                 kill_after_max_s: float) -> list[str]:
    """The lines the writer printed before its kill."""
    process = subprocess.Popen([sys.executable, str(writer), *arguments], stdout=subprocess.PIPE)
    first = b""
    if rng.random() < early_probability:
        time.sleep(rng.uniform(0.0, EARLY_KILL_WINDOW_S))
    else:
        first = process.stdout.readline()  # OPENED: the store is recovered and its services running
        time.sleep(rng.uniform(0.0, kill_after_max_s))
    process.send_signal(signal.SIGKILL)
    rest, _ = process.communicate()
    return (first + rest).decode().splitlines()
