"""Timer formats: RocketMQ 5's timer wheel, TimerLog and timer checkpoint, and the timer message properties.

A message put with `TIMER_DELIVER_MS` (absolute ms), `TIMER_DELAY_MS` or `TIMER_DELAY_SEC` is stored on the topic
`rmq_sys_wheel_timer`, queue 0, with `TIMER_OUT_MS` (its slot's time), `REAL_TOPIC` and `REAL_QID` added
(mqstore/timer/rewrite.py). The timer service reads that topic's ConsumeQueue, appends one TimerLog unit per
message and links it into the wheel slot of its `TIMER_OUT_MS`; when a slot's time has passed it walks the slot's
list and puts each message again on its real topic (mqstore/timer/service.py). The layouts below are those
RocketMQ 5's store/timer/ sources write (TimerLog.java, TimerWheel.java, Slot.java, TimerCheckpoint.java);
docs/decisions/0054-timer-wheel-in-rocketmq-5-format.md says which parts could not be checked against a RocketMQ 5
binary. Big-endian, as RocketMQ.

TimerLog unit (`timerlog/`, one per enqueued timer, appended):

    OFFSET  SIZE  TYPE  FIELD
    0       4     i32   size               52 (UNIT_SIZE_BYTES)
    4       8     i64   prev_position      TimerLog position of the slot's previous unit, -1 for the first
    12      4     i32   magic              MAGIC_DEFAULT | MAGIC_ROLL (re-put on the timer topic) | MAGIC_DELETE
    16      8     i64   write_time_ms      the service's write time when the unit was appended (slot-aligned)
    24      4     i32   delay_ms           the unit's slot time minus write_time_ms
    28      8     i64   commitlog_offset   the timer-topic message's record in the CommitLog
    36      4     i32   message_size       that record's TOTALSIZE
    40      4     i32   topic_hash         Java String.hashCode of REAL_TOPIC (RocketMQ's metrics key)
    44      8     i64   reserved           0
                        = 52 bytes

A unit that would not fit in the rest of a TimerLog file (with room for a blank after it) is preceded by a blank:
i32 size (the bytes left in the file), i64 0, i32 BLANK_MAGIC; the unit then starts the next file.

Wheel slot (`timerwheel`, SLOTS_TOTAL * 2 slots, the whole file, 38 707 200 bytes):

    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   time_slot          the slot's time / precision_ms (a slot with another time is empty)
    8       8     i64   first_position     TimerLog position of the slot's first unit
    16      8     i64   last_position      of its last unit: the list is walked from here by prev_position
    24      4     i32   count              units linked (RocketMQ's num)
    28      4     i32   magic              0 (RocketMQ keeps it unused)
                        = 32 bytes

A time t (ms) belongs to slot index (t // precision_ms) % (2 * SLOTS_TOTAL). SLOTS_TOTAL is 7 days of seconds
(604 800) whatever the precision, as in RocketMQ, so the wheel's window is 2 * 604 800 * precision_ms.

Checkpoint (`config/timercheck`, a 4096-byte file, the rest zero):

    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   read_time_ms       every slot before this time has been delivered
    8       8     i64   timer_log_end      the TimerLog's flushed end
    16      8     i64   queue_offset       the timer topic's ConsumeQueue is enqueued below this entry
    24      8     i64   master_queue_offset  = queue_offset (RocketMQ's slave bookkeeping)
    32      8     i64   state_version      RocketMQ's DataVersion: 0
    40      8     i64   version_timestamp_ms  when the checkpoint was written
    48      8     i64   version_counter    raised on each write
                        = 56 bytes used

Validity rules (bytes read from disk). (1) A TimerLog position p read from a slot or a prev_position is -1 or
0 <= p, p + 52 <= the TimerLog's end and p % file size + 52 <= file size. (2) The unit at p has size 52 and a
magic made of the three flag bits with MAGIC_DEFAULT set. (3) A unit's commitlog_offset >= 0 and message_size > 0.
(4) The wheel file is exactly WHEEL_SIZE_BYTES long (RocketMQ refuses another length too). (5) A list walked from
a slot holds at most the units the TimerLog can hold (no cycle). (6) The checkpoint's offsets are >= 0 (a
read_time_ms of 0 means "never ran"). Breaking any is CorruptionError(path, offset, rule).

Files: `timerwheel` and `timerlog/` under the store's root, `config/timercheck`; TimerLog files are named by the
position of their first byte as 20 zero-padded digits and hold `timer_log_file_size_bytes` (RocketMQ: 100 MiB).
"""

from __future__ import annotations

import numpy as np

from mqstore.commitlog.errors import CorruptionError

TIMER_TOPIC = "rmq_sys_wheel_timer"  # TopicValidator.SYSTEM_TOPIC_PREFIX + "wheel_timer"
TIMER_QUEUE_ID = 0

PROPERTY_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_OUT_MS = "TIMER_OUT_MS"
PROPERTY_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_DELETE_KEY = "TIMER_DEL_UNIQKEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
REQUEST_PROPERTIES = (PROPERTY_DELIVER_MS, PROPERTY_DELAY_MS, PROPERTY_DELAY_SEC)

TIMER_LOG_UNIT = np.dtype([
    ("size", ">i4"), ("prev_position", ">i8"), ("magic", ">i4"), ("write_time_ms", ">i8"), ("delay_ms", ">i4"),
    ("commitlog_offset", ">i8"), ("message_size", ">i4"), ("topic_hash", ">i4"), ("reserved", ">i8")])
UNIT_SIZE_BYTES = 52
UNIT_PREV_POSITION_OFFSET = 4
UNIT_MAGIC_OFFSET = UNIT_PREV_POSITION_OFFSET + 8
UNIT_COMMITLOG_OFFSET_OFFSET = 28  # RocketMQ's UNIT_PRE_SIZE_FOR_MSG
UNIT_TOPIC_HASH_OFFSET = 40  # RocketMQ's UNIT_PRE_SIZE_FOR_METRIC
assert TIMER_LOG_UNIT.itemsize == UNIT_SIZE_BYTES
assert TIMER_LOG_UNIT.fields["magic"][1] == UNIT_MAGIC_OFFSET
assert TIMER_LOG_UNIT.fields["commitlog_offset"][1] == UNIT_COMMITLOG_OFFSET_OFFSET
assert TIMER_LOG_UNIT.fields["topic_hash"][1] == UNIT_TOPIC_HASH_OFFSET

MAGIC_DEFAULT = 0x1
MAGIC_ROLL = 0x2
MAGIC_DELETE = 0x4
MAGIC_ALL = MAGIC_DEFAULT | MAGIC_ROLL | MAGIC_DELETE
BLANK_MAGIC = -0x342BCE6C  # 0xCBD43194: Java's `0xBBCCDDEE ^ 1880681586 + 8` as an int
assert BLANK_MAGIC & 0xFFFFFFFF == (0xBBCCDDEE ^ (1880681586 + 8)) & 0xFFFFFFFF
BLANK_SIZE_BYTES = 4 + 8 + 4  # RocketMQ's MIN_BLANK_LEN
NO_POSITION = -1

SLOT = np.dtype([("time_slot", ">i8"), ("first_position", ">i8"), ("last_position", ">i8"), ("count", ">i4"),
                 ("magic", ">i4")])
SLOT_SIZE_BYTES = 32
assert SLOT.itemsize == SLOT_SIZE_BYTES
SLOTS_TOTAL = 7 * 24 * 3600  # TIMER_WHEEL_TTL_DAY * DAY_SECS, whatever the precision
WHEEL_SLOT_COUNT = 2 * SLOTS_TOTAL
WHEEL_SIZE_BYTES = WHEEL_SLOT_COUNT * SLOT_SIZE_BYTES
assert WHEEL_SIZE_BYTES == 38_707_200
BLANK_SLOTS = 60  # TIMER_BLANK_SLOTS: the roll window stays this far inside the wheel

CHECKPOINT = np.dtype([
    ("read_time_ms", ">i8"), ("timer_log_end", ">i8"), ("queue_offset", ">i8"), ("master_queue_offset", ">i8"),
    ("state_version", ">i8"), ("version_timestamp_ms", ">i8"), ("version_counter", ">i8")])
CHECKPOINT_USED_BYTES = 56
CHECKPOINT_FILE_SIZE_BYTES = 4096  # RocketMQ maps OS_PAGE_SIZE
assert CHECKPOINT.itemsize == CHECKPOINT_USED_BYTES

WHEEL_FILE_NAME = "timerwheel"
TIMER_LOG_DIRECTORY = "timerlog"
CHECKPOINT_FILE_NAME = "timercheck"  # in <root>/config/
SETTINGS_FILE_NAME = "timer.json"  # in <root>/config/: the precision the wheel was written with (mqstore's own)
FILE_NAME_DIGITS = 20
TIMER_LOG_FILE_SIZE_DEFAULT_BYTES = 100 * 1024 * 1024  # RocketMQ's mappedFileSizeTimerLog


def slot_index(time_ms: int, precision_ms: int) -> int:
    """The wheel slot holding time `time_ms`."""
    return (time_ms // precision_ms) % WHEEL_SLOT_COUNT


def java_string_hash(text: str | None) -> int:
    """Java's String.hashCode (over UTF-16 code units, int32 wrap-around); 0 for None, as RocketMQ's metrics."""
    if text is None:
        return 0
    value = 0
    data = text.encode("utf-16-be")
    for index in range(0, len(data), 2):
        value = (31 * value + (data[index] << 8 | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def magic_valid(magic: int) -> bool:
    """Rule (2): only the three flag bits, MAGIC_DEFAULT among them."""
    return magic & ~MAGIC_ALL == 0 and magic & MAGIC_DEFAULT != 0


def timer_log_file_name(position: int) -> str:
    """The name of the TimerLog file starting at `position`."""
    return f"{position:0{FILE_NAME_DIGITS}d}"


def blank_bytes(length: int) -> bytes:
    """The blank that fills the last `length` bytes of a TimerLog file (only its first 16 bytes are written)."""
    assert length >= BLANK_SIZE_BYTES
    return (length.to_bytes(4, "big", signed=True) + (0).to_bytes(8, "big")
            + BLANK_MAGIC.to_bytes(4, "big", signed=True))


def make_units(count: int) -> np.ndarray:
    """`count` zeroed units with size set."""
    units = np.zeros(count, dtype=TIMER_LOG_UNIT)
    units["size"] = UNIT_SIZE_BYTES
    return units


def damage(path: str, offset: int, rule: str, text: str) -> CorruptionError:
    """The CorruptionError for bytes of a timer file breaking validity rule `rule` ("timer.<rule>")."""
    return CorruptionError(f"{text} (timer rule {rule})", path=path, offset=offset,
                           rule=f"timer.{rule}")
