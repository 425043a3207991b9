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


class UniqueKeyGenerator:
    """Makes UNIQ_KEY values; `next()` is safe to call from many threads (itertools.count is atomic)."""

    def __init__(self, ip_raw: bytes):
        assert len(ip_raw) == 4
        prefix = ip_raw + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        self._prefix = prefix.hex().upper().encode("ascii")
        self._counter = itertools.count()
        now = time.time_ns() // 1_000_000
        self._month_start_ms = _month_start_ms(now)
        self._next_month_ms = self._month_start_ms + 31 * 86_400_000

    def next(self) -> bytes:
        now = time.time_ns() // 1_000_000
        if now >= self._next_month_ms:
            self._month_start_ms = _month_start_ms(now)
            self._next_month_ms = self._month_start_ms + 31 * 86_400_000
        return self._prefix + b"%08X%04X" % ((now - self._month_start_ms) & 0xFFFFFFFF,
                                              next(self._counter) & 0xFFFF)
