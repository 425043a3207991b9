"""Delay levels as RocketMQ 4.4.0 stores them: the schedule topic, its properties, its tag codes, its progress.

A message put with the property `DELAY` = level L (1 <= L <= the number of levels) is stored on the topic
`SCHEDULE_TOPIC_XXXX`, queue L - 1, with `REAL_TOPIC` (its topic) and `REAL_QID` (its queue id) added and `DELAY`
kept (RocketMQ's CommitLog.putMessage). Level 0 (or no DELAY) is a plain put. The record is otherwise the one the
message would have made; only the ConsumeQueue unit differs:

    ConsumeQueue unit of SCHEDULE_TOPIC_XXXX (consumequeue/format.py's 20 bytes, big-endian)
    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   commitlog_offset   the record, as for any topic
    8       4     i32   size               the record's TOTALSIZE, as for any topic
    12      8     i64   tags_code          the due time: the record's STORETIMESTAMP + the delay of level DELAY (ms)
                        = 20 bytes

The due time is computed at dispatch, as RocketMQ 4.4.0's CommitLog.checkMessageAndReturnSize does: for a record
on the schedule topic whose DELAY parses as an int, the level is clamped to the number of levels and, when it is
> 0, tags_code = store timestamp + delay(level) (ScheduleMessageService.computeDeliverTimestamp; a level with no
delay gives + 1000). Any other record of the topic keeps the TAGS hash. So a store RocketMQ wrote with a DELAY
above the maximum is handled as RocketMQ does (the last level); mqstore's put refuses such a level instead.

Levels (`StoreConfig.delay_levels`, RocketMQ's messageDelayLevel syntax): space-separated durations, each an
integer and a unit s, m, h or d (1000, 60 000, 3 600 000, 86 400 000 ms); level i is the i-th, from 1. mqstore
also takes `ms` (for tests). Levels other than the default are saved in `config/delayLevels.json`
({"delay_levels": "..."}): due times already in tag codes depend on them.

Progress (`config/delayOffset.json`, RocketMQ's form): {"offsetTable": {"<level>": <queue offset>, ...}}: every unit
of queue level - 1 below the offset has been delivered. Read leniently: a missing or unreadable file, or a
non-int entry, counts as offset 0 for that level (messages are delivered again, never lost).

Validity (bytes from disk): a schedule record whose REAL_TOPIC is missing or REAL_QID is not a non-negative int
cannot be delivered; it is skipped with a warning (RocketMQ logs and skips it too), never asserted.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.commitlog.message import Message

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
PROPERTY_DELAY = "DELAY"  # MessageConst.PROPERTY_DELAY_TIME_LEVEL
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
OFFSET_FILE_NAME = "delayOffset.json"  # under config/
LEVELS_FILE_NAME = "delayLevels.json"  # under config/
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"  # RocketMQ's default
UNKNOWN_LEVEL_DELAY_MS = 1000  # computeDeliverTimestamp's delay for a level without an entry
DELAY_LEVEL_COUNT_MAX = 1000  # a bound on the levels a config may name (RocketMQ has none; 18 by default)

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"([0-9]{1,12})(ms|s|m|h|d)\Z")
_JAVA_INT = re.compile(r"[+-]?[0-9]{1,10}\Z")
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def parse_levels(text: str) -> tuple[int, ...]:
    """The delays (ms) of levels 1, 2, ... named by `text`; ValueError for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"delay levels must be a str, got {text!r}")
    words = text.split()
    if not 1 <= len(words) <= DELAY_LEVEL_COUNT_MAX:
        raise ValueError(f"delay levels must name 1..{DELAY_LEVEL_COUNT_MAX} levels, got {text!r}")
    delays = []
    for word in words:
        match = _LEVEL.match(word)
        if match is None:
            raise ValueError(f"delay level {word!r} is not an integer and a unit (ms, s, m, h, d)")
        delays.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    return tuple(delays)


def queue_id_of(level: int) -> int:
    """The schedule topic's queue of `level` (RocketMQ's delayLevel2QueueId)."""
    return level - 1


def parse_java_int(text) -> int | None:
    """The value of Java's Integer.parseInt(text), or None where it would throw."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if text is None or _JAVA_INT.match(text) is None:
        return None
    value = int(text)
    return value if INT32_MIN <= value <= INT32_MAX else None


def due_time_ms(level_text, store_timestamp_ms: int, delays: tuple[int, ...]) -> int | None:
    """The tag code of a schedule-topic record with DELAY `level_text`: its due time, or None when RocketMQ keeps
    the TAGS hash (no DELAY, not an int, a level <= 0). Levels above the maximum count as the maximum."""
    level = parse_java_int(level_text)
    if level is None:
        return None
    level = min(level, len(delays))
    if level <= 0:
        return None
    return store_timestamp_ms + delays[level - 1]


_UNSEEN = object()


def retag_schedule_rows(batch, delays: tuple[int, ...]) -> None:
    """Set the tag codes of a dispatch batch's schedule-topic rows to their due times (the ConsumeQueue
    dispatcher calls this, for the Python and the compiled scan alike: one computation for both)."""
    names = batch.topic_names
    if SCHEDULE_TOPIC not in names:
        return
    rows = np.flatnonzero(batch.topic_ids == names.index(SCHEDULE_TOPIC))
    if not len(rows):
        return
    values = batch.property_values(PROPERTY_DELAY.encode())
    # due_time_ms(value, stamp, delays) is stamp + a delay that depends on the value only: one parse per distinct
    # value (a batch holds a few), then numpy over the rows
    delay_of: dict = {}
    row_delays = np.empty(len(rows), dtype=np.int64)
    known = np.empty(len(rows), dtype=bool)
    for index, row in enumerate(rows.tolist()):
        value = values[row]
        delay = delay_of.get(value, _UNSEEN)
        if delay is _UNSEEN:
            delay = delay_of[value] = due_time_ms(value, 0, delays)  # at store timestamp 0: the delay
        known[index] = delay is not None
        row_delays[index] = 0 if delay is None else delay
    if not known.any():
        return
    codes = batch.tags_codes
    if not codes.flags.writeable:
        codes = batch.tags_codes = codes.copy()
    rows = rows[known]
    codes[rows] = np.asarray(batch.store_timestamps_ms, dtype=np.int64)[rows] + row_delays[known]


def damage(path: str, rule: str, text: str):
    """The CorruptionError for a schedule file breaking rule `rule` ("schedule.<rule>")."""
    return CorruptionError(f"{text} (schedule rule {rule})", path=path, offset=0, rule=f"schedule.{rule}")


def with_delay_level(message, level: int):
    """A copy of `message` with the DELAY property set to `level`, as a RocketMQ producer's setDelayTimeLevel."""
    if type(level) is not int or level < 0:
        raise InvalidMessageError(f"a delay level must be an int >= 0, got {level!r}")
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    fields["properties"] = {**message.properties, PROPERTY_DELAY: str(level)}
    return Message(**fields)
