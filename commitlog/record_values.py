"""Two property values of many records, without building their messages: for a service that reads one queue in
bulk and needs a number and a text of each record (the timer's enqueue: TIMER_OUT_MS and REAL_TOPIC).

Each record is checked as `decode_records` checks it (CRCs, the size its entry gives, the queue entry it must be);
then row i of the result holds, for records[i] (columns below): the number property's value when it is ASCII digits
up to 2**63 - 1, whether it is, the text property's state, and Java's String.hashCode of the text when it is ASCII.
A text that is not ASCII is left to the caller (TEXT_NOT_ASCII): how it decodes such bytes is its own rule.

`values_of` is the reference, in Python, for one record's PROPERTIES; the compiled pass (scan_core.c's
mq_record_values) gives the same rows, and tests compare the two.
"""

from __future__ import annotations

import numpy as np
from mqstore.commitlog.message import decode_records

NUMBER, NUMBER_OK, TEXT_STATE, TEXT_HASH = range(4)  # the columns (scan_core.h's MQ_VALUE_*)
COLUMNS = 4
TEXT_ABSENT, TEXT_HASHED, TEXT_NOT_ASCII = range(3)  # TEXT_STATE's values (MQ_TEXT_*)
INT64_MAX = (1 << 63) - 1


def property_value(raw: bytes, name: bytes) -> bytes | None:
    """The value of the first pair `name` in a record's PROPERTIES bytes (pairs name\\x01value, separated by
    \\x02), or None."""
    key = name + b"\x01"
    at = raw.find(key)
    while at > 0 and raw[at - 1] != 2:  # a pair starts at 0 or after \x02
        at = raw.find(key, at + 1)
    if at < 0:
        return None
    start = at + len(key)
    end = raw.find(b"\x02", start)
    return raw[start:] if end < 0 else raw[start:end]


def ascii_java_hash(text: bytes) -> int:
    """Java's String.hashCode of ASCII text (int32 wrap-around)."""
    value = 0
    for byte in text:
        value = (31 * value + byte) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def values_of(raw: bytes, number_name: bytes, text_name: bytes) -> tuple[int, int, int, int]:
    """The row of one record whose PROPERTIES (without the record-CRC pair) are `raw`: the reference."""
    number = property_value(raw, number_name)
    value = int(number) if number is not None and number.isdigit() else -1  # isdigit: ASCII digits, not empty
    ok = 0 <= value <= INT64_MAX
    text = property_value(raw, text_name)
    if text is None:
        state, text_hash = TEXT_ABSENT, 0
    elif text.isascii():
        state, text_hash = TEXT_HASHED, ascii_java_hash(text)
    else:
        state, text_hash = TEXT_NOT_ASCII, 0
    return (value if ok else 0, int(ok), state, text_hash)


def read_values(codec, segments, commitlog_offsets, sizes, number_name: bytes, text_name: bytes, *,
                record_crc_from: int | None = None, queue: tuple[str, int, int] | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
    """The rows (count x COLUMNS int64) of the records at `commitlog_offsets`, whose TOTALSIZE an index gives in
    `sizes`; `segments(offset)` is the MappedFile holding an offset. With `queue` = (topic, queue_id, first entry)
    records[i] must be entry first + i of that queue. Damage raises CorruptionError, as decode_records does.
    `codec`: the compiled core, or None for the Python path. With `out` (int64, count x COLUMNS) the rows are
    written there and the compiled pass keeps the interpreter lock: the caller is a service thread that would
    otherwise wait out a producer's switch interval for it (the timer's enqueue, timer_link.c)."""
    offsets = np.ascontiguousarray(commitlog_offsets, dtype=np.int64)
    lengths = np.ascontiguousarray(sizes, dtype=np.int64)
    count = len(offsets)
    rows = np.zeros((count, COLUMNS), dtype=np.int64) if out is None else out
    assert rows.shape == (count, COLUMNS) and rows.dtype == np.int64
    topic_raw = None if queue is None else queue[0].encode("ascii")
    queue_id, first_entry = (0, 0) if queue is None else (queue[1], queue[2])
    required = -1 if record_crc_from is None else record_crc_from
    done = 0
    while done < count:
        if codec is not None:
            segment = segments(int(offsets[done]))
            if segment.view is not None:
                done = codec.record_values(segment.view, segment.base_offset, offsets, lengths, done,
                                           required, topic_raw, queue_id, first_entry, number_name, text_name, rows,
                                           out is not None)
                if done == count:
                    break
        # a record the compiled pass does not take (another version or host width, or damage), or no compiled core
        stop = done + 1 if codec is not None else count
        single = None if queue is None else (queue[0], queue_id, range(first_entry + done, first_entry + stop))
        messages = decode_records(segments, offsets[done:stop].tolist(), lengths[done:stop].tolist(),
                                  record_crc_from=record_crc_from, queue=single)
        for index, message in enumerate(messages, done):
            rows[index] = values_of(message.properties_raw, number_name, text_name)
        done = stop
    return rows
