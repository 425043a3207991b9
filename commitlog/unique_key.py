"""UNIQ_KEY values in the form RocketMQ's client gives them (MessageClientIDSetter), so every message can be
found by a key even when its producer set none.

    32 upper-case hex digits = 16 bytes:
    OFFSET  SIZE  FIELD
    0       4     producer IPv4 address
    4       2     process id, low 16 bits (as RocketMQ's client keeps them)
    6       4     instance id: random per generator (RocketMQ: the class loader's hash code)
    10      4     milliseconds since the start of the current calendar month, UTC (i32, wrapping)
    14      2     counter (u16, wrapping)

As RocketMQ's setStartTime, the month's start moves when the clock reaches the start of the next calendar month
(RocketMQ reads the calendar in the JVM's time zone; here it is UTC). With the compiled core the state (counter,
month, time digits) lives in `mqstore.commitlog._native.UniqueKeys` (commitlog/csrc/unique_key.c), which the
compiled put draws from too: one sequence for every path that makes a record. The class below is its pure-Python
twin: from the same state both make the same keys.
"""

from __future__ import annotations

import calendar
import itertools
import os
import time

from mqstore.commitlog import native

UNIQUE_KEY_HEX_DIGITS = 32
INSTANCE_ID_BYTES = 4


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """The starts (ms, UTC) of the calendar month holding `now_ms` and of the next one."""
    moment = time.gmtime(now_ms // 1000)
    year, month = moment.tm_year, moment.tm_mon
    start = calendar.timegm((year, month, 1, 0, 0, 0))
    following = calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0))
    return start * 1000, following * 1000


_COUNTER_HEX = [b"%04X" % value for value in range(1 << 16)]  # the last 4 digits, looked up, not formatted
_time_ns = time.time_ns  # the generator's clock (tests replace it)


class UniqueKeyGenerator:
    """Makes UNIQ_KEY values; `next()` and `next_many()` are safe to call from many threads.

    `core` is the compiled state (the compiled put takes keys from it) or None without the compiled core.
    `instance_id` (4 bytes) is random unless given (tests give it, to compare stores byte for byte).
    """

    def __init__(self, ip_raw: bytes, *, instance_id: bytes | None = None):
        assert len(ip_raw) == 4
        instance_id = os.urandom(INSTANCE_ID_BYTES) if instance_id is None else instance_id
        assert len(instance_id) == INSTANCE_ID_BYTES
        prefix = ip_raw + (os.getpid() & 0xFFFF).to_bytes(2, "big") + instance_id
        self._prefix = prefix.hex().upper().encode("ascii")
        self.core = None if native.NATIVE is None else native.NATIVE.UniqueKeys(self._prefix, globals(), time.time_ns)
        if self.core is not None:  # the compiled methods, called without a Python frame between
            self.next, self.next_many = self.core.next, self.core.next_many
        self._counter = itertools.count()  # atomic under the GIL
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._last_ms = -(1 << 63)
        self._time_prefix = b""

    def _refresh(self, now: int) -> bytes:
        if now >= self._next_month_ms:
            self._month_start_ms, self._next_month_ms = _month_bounds_ms(now)
        time_prefix = self._prefix + b"%08X" % ((now - self._month_start_ms) & 0xFFFFFFFF)
        self._time_prefix, self._last_ms = time_prefix, now
        return time_prefix

    def next(self) -> bytes:  # noqa: A003
        """The next key."""
        now = _time_ns() // 1_000_000
        time_prefix = self._time_prefix if now == self._last_ms else self._refresh(now)
        return time_prefix + _COUNTER_HEX[next(self._counter) & 0xFFFF]

    def next_many(self, count: int) -> list[bytes]:
        """`count` values at once (one clock read, for a batch of messages)."""
        now = _time_ns() // 1_000_000
        time_prefix = self._time_prefix if now == self._last_ms else self._refresh(now)
        return [time_prefix + _COUNTER_HEX[value & 0xFFFF] for value in itertools.islice(self._counter, count)]
