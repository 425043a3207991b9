"""ConsumeQueue format: the per-(topic, queue) list of pointers into the CommitLog (RocketMQ's ConsumeQueue).

A consumer reads a queue by entry number (`queue_offset`); entry k of a queue is the k-th message stored for
that (topic, queue_id). Entries are fixed-size, so entry k sits at byte k * 20 of the queue's logical file.

Unit, big-endian:

    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   commitlog_offset   where the message record starts in the CommitLog
    8       4     i32   size               the whole record's TOTALSIZE
    12      8     i64   tags_code          Java String.hashCode of the TAGS property (0 without tags)
                        = 20 bytes

Validity rule. An entry read from disk is valid iff (1) size > 0 and (2) commitlog_offset >= 0. The first
entry of a file (or of the unwritten tail) with size 0 ends the queue's written part; written entries never
have size 0, so a zero-filled unit is free space. A negative size is damage wherever it is (RocketMQ takes
any size <= 0 for the end; mqstore reports it instead of hiding the entries after it). (3) Entries hold
strictly increasing commitlog offsets.

Filler units. A queue that starts after entry 0 (its earlier messages were in CommitLog segments already deleted
when it was built) starts in the file that holds its first entry, and the units before it in that file are
fillers: commitlog_offset 0, size 2^31-1, tags_code 0 (RocketMQ's pre-fill of a queue's first file). Fillers
are only at the start of a queue's first file; the queue's `min_offset` is the first unit after them. RocketMQ
reads them as entries pointing below the log's start, which its minimum-offset correction skips.

Files: `consumequeue/<topic>/<queue_id>/<name>`, each holding `consume_queue_entries_per_file` units
(default 300 000, 6 000 000 bytes), named by the logical byte offset of their first unit as 20 zero-padded
decimal digits: the second default file is 00000000000006000000.
"""

from __future__ import annotations

import struct

import numpy as np
from mqstore.commitlog.errors import CorruptionError

CONSUME_QUEUE_UNIT = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
UNIT_SIZE_BYTES = 20
FILE_NAME_DIGITS = 20

assert CONSUME_QUEUE_UNIT.itemsize == UNIT_SIZE_BYTES
assert CONSUME_QUEUE_UNIT.fields["size"][1] == 8 and CONSUME_QUEUE_UNIT.fields["tags_code"][1] == 12
UNIT_STRUCT = struct.Struct(">qiq")  # the same unit, packed one at a time
assert UNIT_STRUCT.size == UNIT_SIZE_BYTES


FILLER_COMMITLOG_OFFSET = 0
FILLER_SIZE = 0x7FFFFFFF
FILLER_TAGS_CODE = 0


def filler_units(count: int) -> np.ndarray:
    """`count` filler units (module docstring)."""
    return make_units(np.full(count, FILLER_COMMITLOG_OFFSET), np.full(count, FILLER_SIZE),
                      np.full(count, FILLER_TAGS_CODE))


def leading_fillers(units: np.ndarray) -> int:
    """How many of `units` (the written units of a queue's first file) are fillers, from the first on."""
    if not len(units) or int(units[0]["size"]) != FILLER_SIZE:
        return 0
    filler = ((units["commitlog_offset"] == FILLER_COMMITLOG_OFFSET) & (units["size"] == FILLER_SIZE)
              & (units["tags_code"] == FILLER_TAGS_CODE))
    return len(units) if filler.all() else int(np.argmin(filler))


def file_name(first_queue_offset: int) -> str:
    """The name of the file whose first unit is entry `first_queue_offset`."""
    assert first_queue_offset >= 0
    return f"{first_queue_offset * UNIT_SIZE_BYTES:0{FILE_NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """The logical byte offset a file name encodes, or None when it is not a queue file name."""
    if len(name) != FILE_NAME_DIGITS or not name.isascii() or not name.isdigit():
        return None
    return int(name)


def make_units(commitlog_offsets, sizes, tags_codes) -> np.ndarray:
    """A unit array from three columns."""
    units = np.empty(len(commitlog_offsets), dtype=CONSUME_QUEUE_UNIT)
    units["commitlog_offset"] = commitlog_offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    return units


def written_count(units: np.ndarray, path: str, first_index: int = 0) -> int:
    """How many of `units` (read from `path`, the first being unit `first_index` of the file) are written: up to
    the first with size 0 (free space). A negative size there is damage (rule 1): CorruptionError, not an end
    that would hide the units after it."""
    if not len(units):
        return 0
    free = units["size"] <= 0
    first_free = int(np.argmax(free))
    if not free[first_free]:
        return len(units)
    if units["size"][first_free] < 0:
        raise CorruptionError(f"queue entry has size {int(units['size'][first_free])}", path=path,
                              offset=(first_index + first_free) * UNIT_SIZE_BYTES, rule="consumequeue.1")
    return first_free
