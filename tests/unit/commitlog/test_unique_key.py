"""UNIQ_KEY values: RocketMQ's 32-hex-digit client id layout, unique across many calls and threads, the time
digits counted from the start of each calendar month, and the compiled generator (commitlog/csrc/unique_key.c)
making the pure-Python one's keys from the same state."""

from __future__ import annotations

import calendar
import os
import threading

import mqstore.commitlog.unique_key as unique_key_module
import pytest
from mqstore.commitlog import _native, native
from mqstore.commitlog.unique_key import UniqueKeyGenerator, _month_bounds_ms

GENERATORS = ("compiled", "python")
INSTANCE = bytes.fromhex("12345678")


def _generator(monkeypatch, kind: str, ip=bytes([10, 1, 2, 3])) -> UniqueKeyGenerator:
    monkeypatch.setattr(native, "NATIVE", _native if kind == "compiled" else None)
    generator = UniqueKeyGenerator(ip, instance_id=INSTANCE)
    assert (generator.core is not None) == (kind == "compiled")
    return generator


class Clock:
    """unique_key._time_ns returning the ms of `now_ms` (set by the test)."""

    def __init__(self, now_ms: int):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms * 1_000_000 + 999_999


def _ms(year: int, month: int, day: int, hour: int = 0) -> int:
    return calendar.timegm((year, month, day, hour, 0, 0)) * 1000


@pytest.mark.parametrize("kind", GENERATORS)
def test_layout_is_ip_pid_instance_time_counter(monkeypatch, kind):
    generator = _generator(monkeypatch, kind)
    first, second = generator.next(), generator.next()
    assert len(first) == 32 and first == first.upper()
    raw = bytes.fromhex(first.decode())
    assert raw[:4] == bytes([10, 1, 2, 3])
    assert int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
    assert raw[6:10] == INSTANCE
    assert int.from_bytes(bytes.fromhex(second.decode())[14:16], "big") == int.from_bytes(raw[14:16], "big") + 1
    assert first[:20] == second[:20]  # ip, pid and instance id never change


def test_month_bounds_are_calendar_months():
    assert _month_bounds_ms(1_700_000_000_000) == (1_698_796_800_000, _ms(2023, 12, 1))  # 2023-11-01T00:00:00Z
    assert _month_bounds_ms(_ms(2024, 2, 29, 23)) == (_ms(2024, 2, 1), _ms(2024, 3, 1))
    assert _month_bounds_ms(_ms(2023, 12, 31, 23)) == (_ms(2023, 12, 1), _ms(2024, 1, 1))
    assert _month_bounds_ms(_ms(2024, 3, 1) - 1) == (_ms(2024, 2, 1), _ms(2024, 3, 1))


@pytest.mark.parametrize("kind", GENERATORS)
def test_time_digits_restart_at_each_calendar_month(monkeypatch, kind):
    """After a February (29 days) the digits count from March 1st, not from February 1st + 31 days (RocketMQ's
    setStartTime moves to the next calendar month)."""
    clock = Clock(_ms(2024, 2, 10))
    monkeypatch.setattr(unique_key_module, "_time_ns", clock)
    generator = _generator(monkeypatch, kind)
    for now, month_start in [(_ms(2024, 2, 10), _ms(2024, 2, 1)), (_ms(2024, 3, 2, 5), _ms(2024, 3, 1)),
                             (_ms(2024, 3, 31, 23), _ms(2024, 3, 1)), (_ms(2024, 4, 1) + 7, _ms(2024, 4, 1))]:
        clock.now_ms = now
        key = generator.next()
        assert int(key[20:28], 16) == now - month_start, (now, key)


def test_the_compiled_and_python_generators_make_the_same_keys(monkeypatch):
    """From the same state (address, instance id, clock), across months, the counter's wrap and next_many."""
    made = {}
    for kind in GENERATORS:
        clock = Clock(_ms(2024, 1, 31, 23))
        monkeypatch.setattr(unique_key_module, "_time_ns", clock)
        generator = _generator(monkeypatch, kind)
        keys = []
        for step in range(200):
            clock.now_ms += 3_600_000 * 7 if step % 3 == 0 else step % 2
            keys += [generator.next()] if step % 5 else generator.next_many(step * 4)
        keys += [generator.next() for _ in range(70_000 - len(keys))]
        made[kind] = keys
    assert made["compiled"] == made["python"]
    assert len(made["python"]) == 70_000 and len(set(made["python"])) > 65_536  # the counter wrapped once


@pytest.mark.parametrize("kind", GENERATORS)
def test_keys_are_unique_across_threads(monkeypatch, kind):
    generator = _generator(monkeypatch, kind, bytes([127, 0, 0, 1]))
    found: list[list[bytes]] = [[] for _ in range(4)]

    def make(index):
        found[index] = [key for _ in range(2_500) for key in (generator.next(), *generator.next_many(3))]

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [key for keys in found for key in keys]
    assert len(set(every)) == len(every) == 40_000
