"""Whether a call lets go of the interpreter lock: another Python thread runs only when the caller lets go of it or
its switch interval ends, so with the interval far longer than the call, a thread that counts while it runs does
not count during a call that keeps the lock."""

from __future__ import annotations

import sys
import threading


def turns_of_another_thread(call):
    """(call(), how many times a competing thread counted while it ran), under a switch interval of 1 s."""
    turns, stop = [0], threading.Event()

    def other() -> None:
        while not stop.is_set():
            turns[0] += 1

    interval = sys.getswitchinterval()
    thread = threading.Thread(target=other)
    sys.setswitchinterval(1.0)
    try:
        thread.start()
        before = turns[0]
        result = call()
        during = turns[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        thread.join()
    return result, during
