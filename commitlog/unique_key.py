"""UNIQ_KEY values in the form RocketMQ's client gives them (MessageClientIDSetter), so every message can be
found by a key even when its producer set none.

    32 upper-case hex digits = 16 bytes:
    OFFSET  SIZE  FIELD
    0       4     producer IPv4 address
    4       2     process id, low 16 bits (RocketMQ's client happens to keep the high 16 bits)
    6       4     instance id: random per generator (RocketMQ: the class loader's hash code)
    10      4     milliseconds since the start of the current month (i32, wrapping)
    14      2     counter (u16, wrapping)
"""

from __future__ import annotations

import calendar
import itertools
import os
import time

UNIQUE_KEY_HEX_DIGITS = 32


def _month_start_ms(now_ms: int) -> int:
    moment = time.gmtime(now_ms / 1000.0)
    return calendar.timegm((moment.tm_year, moment.tm_mon, 1, 0, 0, 0)) * 1000


_COUNTER_HEX = [b"%04X" % value for value in range(1 << 16)]  # the last 4 digits, looked up, not formatted
_time_ns = time.time_ns


class UniqueKeyGenerator:
    """Makes UNIQ_KEY values; `next()` is safe to call from many threads (itertools.count is atomic).

    A hot path (every put calls it): the first 28 digits are rebuilt only when the millisecond changes.
    """

    def __init__(self, ip_raw: bytes):
        assert len(ip_raw) == 4
        prefix = ip_raw + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        self._prefix = prefix.hex().upper().encode("ascii")
        self._counter = itertools.count()
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._last_ms = -1
        self._time_prefix = b""

    def _refresh(self, now: int) -> bytes:
        if now >= self._next_month_ms:
            self._month_start_ms = _month_start_ms(now)
            self._next_month_ms = self._month_start_ms + 31 * 86_400_000
        time_prefix = self._prefix + b"%08X" % ((now - self._month_start_ms) & 0xFFFFFFFF)
        self._time_prefix, self._last_ms = time_prefix, now
        return time_prefix

    def next(self) -> bytes:
        now = _time_ns() // 1_000_000
        time_prefix = self._time_prefix if now == self._last_ms else self._refresh(now)
        return time_prefix + _COUNTER_HEX[next(self._counter) & 0xFFFF]

    def next_many(self, count: int) -> list[bytes]:
        """`count` values at once (one clock read, for a batch of messages)."""
        now = _time_ns() // 1_000_000
        time_prefix = self._time_prefix if now == self._last_ms else self._refresh(now)
        return [time_prefix + _COUNTER_HEX[value & 0xFFFF] for value in itertools.islice(self._counter, count)]
