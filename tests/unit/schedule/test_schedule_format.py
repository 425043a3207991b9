"""The delay-level format: the level syntax, the due time RocketMQ 4.4.0 computes, delayOffset.json read leniently."""

from __future__ import annotations

import pytest
from mqstore.commitlog.errors import ConfigMismatchError, CorruptionError

from mqstore.schedule import format as sfmt
from mqstore.schedule import progress

DEFAULT_DELAYS_MS = (1000, 5000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
                     480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)


def test_the_default_levels_are_rocketmqs_eighteen():
    assert sfmt.parse_levels(sfmt.DEFAULT_DELAY_LEVELS) == DEFAULT_DELAYS_MS
    assert sfmt.parse_levels("50ms 1s 2m 3h 1d") == (50, 1000, 120_000, 10_800_000, 86_400_000)


@pytest.mark.parametrize("text", ["", "  ", "1", "1x", "1.5s", "-1s", "s", 5, None, " ".join(["1s"] * 1001)])
def test_bad_level_syntax_is_refused(text):
    with pytest.raises(ValueError):
        sfmt.parse_levels(text)


def test_due_time_is_store_timestamp_plus_the_levels_delay_and_clamps_as_rocketmq():
    delays = (1000, 5000)
    assert sfmt.due_time_ms("1", 100, delays) == 1100
    assert sfmt.due_time_ms(b"2", 100, delays) == 5100
    assert sfmt.due_time_ms("7", 100, delays) == 5100  # above the maximum: the maximum (checkMessageAndReturnSize)
    assert sfmt.due_time_ms("0", 100, delays) is None  # the TAGS hash stays
    assert sfmt.due_time_ms("-3", 100, delays) is None
    assert sfmt.due_time_ms("x", 100, delays) is None  # RocketMQ's parseInt throws: mqstore keeps the TAGS hash
    assert sfmt.due_time_ms(None, 100, delays) is None
    assert sfmt.due_time_ms("99999999999", 100, delays) is None  # not a Java int


def test_queue_of_a_level():
    assert sfmt.queue_id_of(1) == 0 and sfmt.queue_id_of(18) == 17


def test_offsets_are_read_from_rocketmqs_unquoted_keys_and_written_back(tmp_path):
    path = tmp_path / "delayOffset.json"
    path.write_text('{\n\t"offsetTable":{1:42,3:7,"2":5}\n}')
    assert progress.read_offsets(str(path), 4) == {1: 42, 2: 5, 3: 7, 4: 0}
    progress.write_offsets(str(path), {1: 43, 2: 5})
    assert progress.read_offsets(str(path), 2) == {1: 43, 2: 5}


@pytest.mark.parametrize("text", ["", "{", "[]", '{"offsetTable":[1]}', '{"offsetTable":{1:"x",2:-5,9:1}}'])
def test_damaged_offsets_read_as_no_progress(tmp_path, text):
    path = tmp_path / "delayOffset.json"
    path.write_text(text)
    assert progress.read_offsets(str(path), 2) == {1: 0, 2: 0}


def test_saved_levels_win_over_defaults_and_refuse_a_different_explicit_value(tmp_path):
    path = str(tmp_path / "delayLevels.json")
    assert progress.resolve_levels(path, "1s 2s", explicit=True, has_schedule_queues=False) == "1s 2s"  # saved
    assert progress.resolve_levels(path, sfmt.DEFAULT_DELAY_LEVELS, explicit=False, has_schedule_queues=True) == \
        "1s 2s"
    assert progress.resolve_levels(path, "1s  2s", explicit=True, has_schedule_queues=True) == "1s 2s"
    with pytest.raises(ConfigMismatchError):
        progress.resolve_levels(path, "1s 3s", explicit=True, has_schedule_queues=True)
    (tmp_path / "delayLevels.json").write_text("{")
    with pytest.raises(CorruptionError):
        progress.resolve_levels(path, "1s", explicit=False, has_schedule_queues=False)


def test_the_default_levels_are_not_saved_and_a_store_written_with_them_keeps_them(tmp_path):
    path = tmp_path / "delayLevels.json"
    default = sfmt.DEFAULT_DELAY_LEVELS
    assert progress.resolve_levels(str(path), default, explicit=True, has_schedule_queues=True) == default
    assert not path.exists()  # no file: the default, as in a store RocketMQ wrote
    with pytest.raises(ConfigMismatchError):
        progress.resolve_levels(str(path), "1s", explicit=True, has_schedule_queues=True)
    assert progress.resolve_levels(str(path), "1s", explicit=False, has_schedule_queues=True) == default
    assert not path.exists()
