"""UNIQ_KEY values: RocketMQ's 32-hex-digit client id layout, unique across many calls and threads."""

from __future__ import annotations

import os
import threading

from mqstore.commitlog.unique_key import UniqueKeyGenerator, _month_start_ms


def test_layout_is_ip_pid_instance_time_counter():
    generator = UniqueKeyGenerator(bytes([10, 1, 2, 3]))
    first, second = generator.next(), generator.next()
    assert len(first) == 32 and first == first.upper()
    raw = bytes.fromhex(first.decode())
    assert raw[:4] == bytes([10, 1, 2, 3])
    assert int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
    assert int.from_bytes(bytes.fromhex(second.decode())[14:16], "big") == int.from_bytes(raw[14:16], "big") + 1
    assert first[:20] == second[:20]  # ip, pid and instance id never change


def test_time_field_counts_milliseconds_since_the_month_began():
    assert _month_start_ms(1_700_000_000_000) == 1_698_796_800_000  # 2023-11-01T00:00:00Z
    generator = UniqueKeyGenerator(bytes(4))
    generator._refresh(1_700_000_000_123)
    assert generator._time_prefix[20:] == b"%08X" % (1_700_000_000_123 - 1_698_796_800_000)


def test_keys_are_unique_across_threads():
    generator = UniqueKeyGenerator(bytes([127, 0, 0, 1]))
    found: list[list[bytes]] = [[] for _ in range(4)]

    def make(index):
        found[index] = [generator.next() for _ in range(10_000)]

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [key for keys in found for key in keys]
    assert len(set(every)) == len(every) == 40_000
