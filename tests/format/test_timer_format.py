"""Golden bytes of the timer files (mqstore/timer/format.py), built by hand from RocketMQ 5's layout."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from mqstore.commitlog.errors import CorruptionError

from mqstore.timer import format as tfmt
from mqstore.timer.files import TimerCheckpoint, TimerLog, TimerWheel
from mqstore.timer.rewrite import out_time_ms


def test_unit_bytes_follow_the_timer_log_table():
    unit = tfmt.make_units(1)
    unit["prev_position"], unit["magic"], unit["write_time_ms"], unit["delay_ms"] = 104, 3, 1_700_000_000_000, 2500
    unit["commitlog_offset"], unit["message_size"], unit["topic_hash"] = 0x0102030405, 300, -5
    expected = struct.pack(">iqiqiqiiq", 52, 104, 3, 1_700_000_000_000, 2500, 0x0102030405, 300, -5, 0)
    assert unit.tobytes() == expected
    assert len(expected) == tfmt.UNIT_SIZE_BYTES == 52


def test_slot_and_checkpoint_bytes():
    slot = np.zeros(1, dtype=tfmt.SLOT)
    slot["time_slot"], slot["first_position"], slot["last_position"], slot["count"] = 170000, 0, 52, 2
    assert slot.tobytes() == struct.pack(">qqqii", 170000, 0, 52, 2, 0)
    values = np.zeros(1, dtype=tfmt.CHECKPOINT)
    values["read_time_ms"], values["timer_log_end"], values["queue_offset"] = 5, 6, 7
    assert values.tobytes() == struct.pack(">7q", 5, 6, 7, 0, 0, 0, 0)


def test_constants_match_rocketmq():
    assert tfmt.BLANK_MAGIC == struct.unpack(">i", bytes.fromhex("CBD43194"))[0]
    assert tfmt.blank_bytes(100) == struct.pack(">iqi", 100, 0, tfmt.BLANK_MAGIC)
    assert tfmt.WHEEL_SIZE_BYTES == 604_800 * 2 * 32
    assert tfmt.slot_index(1_000, 1000) == 1 and tfmt.slot_index(1_209_600_000 + 3000, 1000) == 3
    assert tfmt.java_string_hash("hello") == 99162322  # "hello".hashCode()
    assert tfmt.java_string_hash("TopicTest") == -1902610879 and tfmt.java_string_hash(None) == 0
    assert tfmt.magic_valid(1) and tfmt.magic_valid(3) and not tfmt.magic_valid(2) and not tfmt.magic_valid(9)


def test_out_time_is_the_slot_before_a_boundary():
    assert out_time_ms(1_005, 10) == 1_000  # fires at 1_010 >= 1_005
    assert out_time_ms(1_010, 10) == 1_000  # on a boundary: one slot earlier, fires at exactly 1_010
    assert out_time_ms(1_999, 1000) == 1_000


def test_timer_log_files_end_with_a_blank(tmp_path):
    timer_log = TimerLog(str(tmp_path / "timerlog"), 200, 0)  # 3 units and a 44-byte blank a file
    units = tfmt.make_units(5)
    units["magic"], units["commitlog_offset"], units["message_size"] = 1, np.arange(5), 10
    positions = timer_log.append(units)
    assert positions.tolist() == [0, 52, 104, 200, 252]
    first = (tmp_path / "timerlog" / "00000000000000000000").read_bytes()
    assert len(first) == 200 and first[156:172] == tfmt.blank_bytes(44)
    assert (tmp_path / "timerlog" / "00000000000000000200").exists()
    assert int(timer_log.read_unit(252)["commitlog_offset"]) == 4
    timer_log.close()
    reopened = TimerLog(str(tmp_path / "timerlog"), 200, 0)  # the end is found past the blank
    assert reopened.end == 304 and reopened.positions_for(2).tolist() == [304, 400]
    with pytest.raises(CorruptionError) as info:
        reopened.read_unit(304)
    assert info.value.rule == "timer.1"
    reopened.close()


def test_damaged_unit_and_wheel_are_reported(tmp_path):
    timer_log = TimerLog(str(tmp_path / "timerlog"), 4096, 0)
    units = tfmt.make_units(2)
    units["magic"], units["message_size"] = 1, 10
    timer_log.append(units)
    timer_log.close()
    path = tmp_path / "timerlog" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[52 + 12:52 + 16] = struct.pack(">i", 8)  # the second unit's magic: an unknown flag
    path.write_bytes(bytes(data))
    reopened = TimerLog(str(tmp_path / "timerlog"), 4096, 52)
    assert reopened.end == 52  # the end scan stops at the damaged unit
    reopened.end = 104
    with pytest.raises(CorruptionError) as info:
        reopened.read_unit(52)
    assert info.value.rule == "timer.2"
    reopened.close()
    (tmp_path / "timerwheel").write_bytes(b"\0" * 100)
    with pytest.raises(CorruptionError) as info:
        TimerWheel(str(tmp_path / "timerwheel"), 10)
    assert info.value.rule == "timer.4"


def test_checkpoint_round_trip_and_damage(tmp_path):
    path = str(tmp_path / "timercheck")
    TimerCheckpoint(path).write(1_000, 52, 3)
    data = open(path, "rb").read()
    assert len(data) == 4096 and data[:24] == struct.pack(">3q", 1_000, 52, 3)
    assert int(TimerCheckpoint(path).values["queue_offset"]) == 3
    with open(path, "r+b") as handle:
        handle.write(struct.pack(">q", -1))
    with pytest.raises(CorruptionError) as info:
        TimerCheckpoint(path)
    assert info.value.rule == "timer.6"
