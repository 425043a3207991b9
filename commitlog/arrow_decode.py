"""The bulk columnar decoder: CommitLog records to Arrow RecordBatches, many records at a time.

It knows segment bytes, numpy and pyarrow, nothing of Spark or of where a store's files are. Callers read bytes
into a buffer padded with BUFFER_PAD_BYTES zeros; `locate_records` finds the records that tile it: magic codes,
then PHYSICALOFFSET equal to the position, then a check that the TOTALSIZE chain links them (a Python walk
when it does not). `Decoder.decode` gathers all their fixed headers at once as a big-endian structured array
(HEADER_DTYPE) and builds every column of the Arrow schema it is given (topic, queue_id, queue_offset,
commitlog_offset, body, tags, keys, properties, flag, sys_flag, born_timestamp, store_timestamp, born_host,
store_host, reconsume_times, body_crc, msg_id, [STORE_COLUMN]) from the segment bytes: bodies, topics and
property names/values are slices copied by Arrow's `take`, the properties are split at their separators with
numpy. Version-2 records, IPv6 hosts and properties that are not plain 'name\x01value\x02' pairs take a
per-record path (commitlog.message.decode_message, commitlog.format.decode_properties).

The decoder applies a row filter to every record: any object with `topics`, `queue_ids` (sets, None for no
condition), `offset_lo`/`offset_hi` (commitlog offsets) and `time_lo_us`/`time_hi_us` (store timestamps, in
microseconds since the epoch), half-open ranges [lo, hi) whose bounds may be None. Bytes are untrusted: a
record that breaks a format rule raises CorruptionError with file, offset and rule.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.message import decode_message
from mqstore.commitlog.native import NATIVE
from numpy.lib.stride_tricks import sliding_window_view

STORE_COLUMN = "store"  # the optional column holding a constant label (the store each row comes from)

# --- named limits ---------------------------------------------------------------------------------------------
BATCH_RECORDS_MAX = 32768  # rows per RecordBatch the decoder yields
VIEW_INLINE_BYTES = 12  # Arrow binary views hold values up to 12 bytes inline
BUFFER_PAD_BYTES = 16  # zeros after every read buffer, so fixed-width windows never run off its end

# --- the record header as one big-endian structured dtype (v1, IPv4 hosts) -------------------------------------
HEADER_DTYPE = fmt.HEADER_V1_DTYPE  # layout and its checks: commitlog/format.py
assert fmt.RECORD_SIZE_MIN > fmt.OFFSET_PHYSICAL_OFFSET + 8

_MAGIC_FIRST_BYTE = fmt.MESSAGE_MAGIC_CODE >> 24
_MAGIC_MIDDLE = ((fmt.MESSAGE_MAGIC_CODE >> 16) & 0xFF, (fmt.MESSAGE_MAGIC_CODE >> 8) & 0xFF)
_MAGIC_LAST = (fmt.MESSAGE_MAGIC_CODE & 0xFF, fmt.MESSAGE_MAGIC_CODE_V2 & 0xFF)
_STRING = pa.string()  # the default value type of the native decoder's string columns
assert fmt.MESSAGE_MAGIC_CODE >> 8 == fmt.MESSAGE_MAGIC_CODE_V2 >> 8
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_TAGS_WORD = np.frombuffer(fmt.PROPERTY_TAGS.encode("ascii"), dtype=np.uint32)[0]
_KEYS_WORD = np.frombuffer(fmt.PROPERTY_KEYS.encode("ascii"), dtype=np.uint32)[0]
_HEX_PAIRS = np.frombuffer(b"".join(f"{b:02X}".encode() for b in range(256)), dtype=np.uint16)  # 2 digits a byte
_INLINE_INDEX = np.arange(VIEW_INLINE_BYTES)


# --- locating records -----------------------------------------------------------------------------------------
# The state of the log right after the located records of a buffer.
NEXT_DONE = "done"  # the records fill the buffer exactly
NEXT_MORE = "more"  # the next record starts in the buffer but ends after it
NEXT_BLANK = "blank"  # a valid end-of-segment blank
NEXT_END = "end"  # zeros or an invalid header (lenient mode only: strict mode raises)


def file_offset(path: str, commitlog_offset: int) -> int:
    """Where `commitlog_offset` lies inside the segment file `path`: CorruptionError's `offset` (commitlog/errors.py).
    The segment's base comes from its file name (format.segment_name); a path that is not a segment name keeps
    the commitlog offset, as format.locate does."""
    base = fmt.parse_segment_name(os.path.basename(path))
    return commitlog_offset if base is None else commitlog_offset - base


def in_file(exc: CorruptionError, path: str, commitlog_offset: int) -> CorruptionError:
    """`exc` (raised by a check of the record at `commitlog_offset` read into a buffer, where it lies at another
    position than in its file) naming the record's position in the file `path` instead."""
    position = file_offset(path, commitlog_offset)
    if exc.path == path and exc.offset == position:
        return exc
    message = str(exc).removesuffix(f" (file {exc.path}, offset {exc.offset})")
    return CorruptionError(message, path=path, offset=position, rule=exc.rule, length_sound=exc.length_sound,
                           not_a_record=exc.not_a_record)


def decode_record(raw, position: int, remaining: int, commitlog_offset: int, path: str,
                  record_crc_from: int | None = None):
    """decode_message of the record at `position` of a buffer read from the segment file `path`; its
    CorruptionError names the record's position in the file."""
    try:
        return decode_message(raw, position, remaining, commitlog_offset, path=path, record_crc_from=record_crc_from)
    except CorruptionError as exc:
        raise in_file(exc, path, commitlog_offset) from None


def _window(buf: np.ndarray, width: int) -> np.ndarray:
    return sliding_window_view(buf, width)


def big_endian_ints(buf: np.ndarray, positions: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """The big-endian integers of `width` bytes at each position, as native int64."""
    return np.ascontiguousarray(_window(buf, width)[positions]).view(dtype).reshape(-1).astype(np.int64)


def locate_records(buf: np.ndarray, length: int, buf_abs: int, segment_end: int, *, lenient: bool,
                   path: str) -> tuple[np.ndarray, int, str]:
    """Find the complete records that tile `buf[:length]` from its start (a record start at offset buf_abs).

    Returns (positions in buf, position right after the last of them, what is there: NEXT_*). Message records
    are found with numpy: a message magic code at p+4 and PHYSICALOFFSET equal to buf_abs+p, then a check that
    each TOTALSIZE leads to the next one; when that check fails (a body holding a copy of a record header)
    a Python walk decides. Strict mode raises CorruptionError where lenient mode reports NEXT_END.
    """
    if NATIVE is not None:  # the same chain, walked in C (commitlog/csrc/scan_core.c's mq_walk_chain)
        positions = np.empty(max(0, length) // fmt.RECORD_SIZE_MIN + 1, dtype=np.int64)
        count, following = NATIVE.walk_chain(buf, length, buf_abs, positions)
        return positions[:count], following, _next_state(buf, length, buf_abs, positions[:count], following,
                                                         segment_end, lenient, path)
    limit = length - fmt.RECORD_SIZE_MIN  # the last start of a complete record
    positions = np.empty(0, dtype=np.int64)
    if limit >= 0:
        hits = np.flatnonzero(buf[4:limit + 5] == _MAGIC_FIRST_BYTE)
        hits = hits[(buf[hits + 5] == _MAGIC_MIDDLE[0]) & (buf[hits + 6] == _MAGIC_MIDDLE[1])
                    & ((buf[hits + 7] == _MAGIC_LAST[0]) | (buf[hits + 7] == _MAGIC_LAST[1]))]
        if len(hits):
            hits = hits[big_endian_ints(buf, hits + fmt.OFFSET_PHYSICAL_OFFSET, 8, ">i8") == buf_abs + hits]
        if len(hits):
            sizes = big_endian_ints(buf, hits, 4, ">i4")
            complete = (sizes >= fmt.RECORD_SIZE_MIN) & (hits + sizes <= length)
            hits, sizes = hits[complete], sizes[complete]
            if len(hits):
                linked = hits[0] == 0 and bool(np.array_equal(hits[1:], hits[:-1] + sizes[:-1]))
                if not linked:
                    return _walk_python(buf, length, buf_abs, segment_end, lenient=lenient, path=path)
                positions = hits.astype(np.int64)
    following = int(positions[-1] + sizes[-1]) if len(positions) else 0
    return positions, following, _next_state(buf, length, buf_abs, positions, following, segment_end, lenient, path)


def _next_state(buf, length, buf_abs, positions, at, segment_end, lenient, path) -> str:
    """_classify_next; in strict mode, a TOTALSIZE that led the chain off the records is reported at its own
    record (as read_at reports it) rather than at the bytes it points to."""
    try:
        return _classify_next(buf, length, buf_abs, at, segment_end, lenient, path)
    except CorruptionError:
        if len(positions):
            last = int(positions[-1])
            offset = buf_abs + last
            try:
                fmt.locate(buf, last, segment_end - offset, offset, path=path)
            except CorruptionError as exc:
                raise in_file(exc, path, offset) from None
        raise


def _classify_next(buf, length, buf_abs, at, segment_end, lenient, path) -> str:
    """What follows the located records: see NEXT_*."""
    if at == length:
        return NEXT_DONE
    if length - at < fmt.END_FILE_MIN_BLANK_LENGTH:
        if buf_abs + length < segment_end:
            return NEXT_MORE  # the header continues in the next read
        if lenient:
            return NEXT_END
        raise CorruptionError(f"{length - at} bytes are left at the end of the segment (commitlog offset "
                              f"{buf_abs + at}), less than a blank", path=path, offset=file_offset(path, buf_abs + at),
                              rule="commitlog.1")
    size, magic = fmt.BLANK.unpack_from(buf, at)
    offset = buf_abs + at
    if magic == fmt.BLANK_MAGIC_CODE and size == segment_end - offset:
        return NEXT_BLANK
    if magic in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2) and \
            fmt.RECORD_SIZE_MIN <= size <= segment_end - offset and at + size > length:
        return NEXT_MORE
    if lenient:
        return NEXT_END
    if size == 0 and magic == 0:
        raise CorruptionError(f"the log ends at commitlog offset {offset}, before the end planned for this read: "
                              f"was the store truncated or a segment replaced?", path=path,
                              offset=file_offset(path, offset), rule="commitlog.end")
    try:
        fmt.locate(buf, at, segment_end - offset, offset, path=path)  # raises with the rule that failed
    except CorruptionError as exc:
        raise in_file(exc, path, offset) from None
    raise CorruptionError(f"a record the chain check refused at commitlog offset {offset}", path=path,
                          offset=file_offset(path, offset), rule="commitlog.4")


def _walk_python(buf, length, buf_abs, segment_end, *, lenient, path) -> tuple[np.ndarray, int, str]:
    """The TOTALSIZE chain walked record by record (the exact fallback of locate_records)."""
    positions = []
    at = 0
    unpack = fmt.BLANK.unpack_from
    phys = fmt.struct.Struct(">q").unpack_from
    while length - at >= fmt.RECORD_SIZE_MIN:
        size, magic = unpack(buf, at)
        if magic != fmt.MESSAGE_MAGIC_CODE and magic != fmt.MESSAGE_MAGIC_CODE_V2:
            break
        if size < fmt.RECORD_SIZE_MIN or at + size > length or phys(buf, at + fmt.OFFSET_PHYSICAL_OFFSET)[0] \
                != buf_abs + at:
            break
        positions.append(at)
        at += size
    positions = np.array(positions, dtype=np.int64)
    return positions, at, _next_state(buf, length, buf_abs, positions, at, segment_end, lenient, path)


_CRC_DIGITS_FROM_END = fmt.RECORD_CRC_LENGTH - len(fmt.RECORD_CRC_PREFIX)  # the digits start this far before the end
_ZERO_DIGIT = np.uint8(ord("0"))


def _digits_well_formed(buf: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each row in `rows`, whether buf[start : start + RECORD_CRC_DIGITS] are ASCII digits (True elsewhere)."""
    digits = _window(buf, fmt.RECORD_CRC_DIGITS)[np.where(rows, starts, 0)]
    return ~rows | ((digits - _ZERO_DIGIT) < 10).all(axis=1)  # uint8: bytes below '0' wrap to large values


# --- decoding into Arrow --------------------------------------------------------------------------------------
class FastLayout:
    """Where the parts of many records lie, computed at once for version-1 records with IPv4 hosts.

    `fast[i]` is True when record i is such a record, passes validity rules (2) to (4) (its PHYSICALOFFSET
    is `offsets[i]`) and rule 6's shape (its record-CRC pair, if it has one, holds 10 digits; it has one when its
    offset is at or past `record_crc_from`); every other record (version 2, IPv6 hosts, or invalid) goes through
    decode_message. `structure[i]`: the same without rule 6.
    """

    def __init__(self, buf: np.ndarray, positions: np.ndarray, offsets: np.ndarray,
                 record_crc_from: int | None = None):
        self.positions = positions
        self.header_bytes = _window(buf, fmt.HEADER_SIZE)[positions]
        self.header = header = self.header_bytes.view(HEADER_DTYPE).reshape(-1)
        self.size = size = header["total_size"].astype(np.int64)
        self.body_length = body_length = header["body_length"].astype(np.int64)
        fast = (header["magic"] == fmt.MESSAGE_MAGIC_CODE) & ((header["sys_flag"] & _V6_FLAGS) == 0)
        fast &= (size >= fmt.RECORD_SIZE_MIN) & (body_length >= 0) & (fmt.RECORD_SIZE_FIXED + body_length <= size)
        fast &= header["physical_offset"] == offsets
        self.topic_at = topic_at = np.where(fast, positions + fmt.OFFSET_BODY + body_length, positions)
        self.topic_length = topic_length = buf[topic_at].astype(np.int64)
        properties_at = topic_at + 1 + topic_length
        fast &= (topic_length >= 1) & (properties_at + 2 <= positions + size)
        self.properties_at = properties_at = np.where(fast, properties_at, positions)
        self.properties_length = length = (buf[properties_at].astype(np.int64) << 8) | buf[properties_at + 1]
        fast &= (length < 0x8000) & (properties_at + 2 + length == positions + size)
        # The record-CRC pair (format rule 6) is the store's, not a user property: it is left out of `properties`.
        has_crc = fmt.record_crc_present(buf, properties_at + 2, length, positions + size, fast)
        self.properties_length = np.where(has_crc, length - fmt.RECORD_CRC_LENGTH, length)
        self.structure = fast  # rules (2) to (4) hold (the planning walk's test of where the written log ends)
        # Rule 6's shape includes the pair's 10 ASCII digits: a pair holding anything else goes to decode_message,
        # which reports it (as read_at does).
        self.fast = fast & (~has_crc | _digits_well_formed(buf, positions + size - _CRC_DIGITS_FROM_END, has_crc))
        if record_crc_from is not None:  # a record CRC is required from there on
            self.fast &= has_crc | (offsets < record_crc_from)


class Decoder:
    """Turns located records into RecordBatches of one Arrow schema, applying a row filter to every record."""

    def __init__(self, arrow_schema: pa.Schema, row_filter, label: str | None, record_crc_from: int | None = None):
        self.schema = arrow_schema
        self.record_crc_from = record_crc_from  # records from this commitlog offset on must carry a record CRC
        self.row_filter = row_filter
        self.label = label
        self.map_type = arrow_schema.field("properties").type
        self.list_type = arrow_schema.field("keys").type
        self.timestamp_type = arrow_schema.field("store_timestamp").type
        topics = row_filter.topics
        self._topics = topics
        self._topic_values = None
        self.queue_values = np.array(sorted(row_filter.queue_ids), dtype=np.int64) \
            if row_filter.queue_ids is not None else None
        self.topic_bytes = tuple(t.encode("utf-8") for t in sorted(topics)) if topics is not None else None

    @property
    def topic_values(self) -> pa.Array | None:
        """The topic filter as an Arrow array, made when the Python decoder first needs it: `pa.array` imports
        pandas when it is installed, 0.2-0.5 s that a scan through the compiled decoder does not pay."""
        if self._topic_values is None and self._topics is not None:
            self._topic_values = pa.array(sorted(self._topics), pa.string())
        return self._topic_values

    def decode(self, buf: np.ndarray, positions: np.ndarray, offsets: np.ndarray, segment_ends: np.ndarray,
               path: str, expect_topic: str | None = None, expect_sizes: np.ndarray | None = None):
        """Batches of the records at `positions` of `buf`, whose commitlog offsets are `offsets`."""
        for at in range(0, len(positions), BATCH_RECORDS_MAX):
            part = slice(at, at + BATCH_RECORDS_MAX)
            batch = self._decode_part(buf, positions[part], offsets[part], segment_ends[part], path, expect_topic,
                                      None if expect_sizes is None else expect_sizes[part])
            if batch is not None and batch.num_rows:
                yield batch

    def _decode_part(self, buf, positions, offsets, segment_ends, path, expect_topic, expect_sizes):
        if NATIVE is not None:
            batch = self._native_part(buf, positions, offsets, expect_topic, expect_sizes)
            if batch is not _USE_PYTHON:
                return batch
        layout = FastLayout(buf, positions, offsets, self.record_crc_from)
        if expect_sizes is not None:
            mismatch = np.flatnonzero(layout.size != expect_sizes)
            if len(mismatch):
                i = mismatch[0]
                raise CorruptionError(f"a ConsumeQueue unit says {int(expect_sizes[i])} bytes, the record there has "
                                      f"TOTALSIZE {int(layout.size[i])}", path=path,
                                      offset=file_offset(path, int(offsets[i])),
                                      rule="consumequeue.matches-log")
        fast = layout.fast
        keep_fast = np.flatnonzero(self._numeric_mask(layout.header, offsets) & fast)
        batch = None
        if len(keep_fast):
            batch = self._fast_batch(buf, layout, keep_fast, segment_ends, expect_topic, path)
        slow = np.flatnonzero(~fast)
        if len(slow):
            batch = self._merge_slow(batch, buf, positions[slow], offsets[slow], segment_ends[slow], path,
                                     expect_topic)
        return batch

    def _native_part(self, buf, positions, offsets, expect_topic, expect_sizes):
        """The batch `_decode_part` makes, with every buffer built by the compiled decoder (commitlog/csrc/
        arrow_core.c) in one pass over the records; _USE_PYTHON when the records are not all of the common kind
        it decodes (then the Python decoder gives the rows, or the CorruptionError)."""
        f = self.row_filter
        found = NATIVE.arrow_columns(
            buf, np.ascontiguousarray(positions, dtype=np.int64), np.ascontiguousarray(offsets, dtype=np.int64),
            self.queue_values, f.offset_lo, f.offset_hi, f.time_lo_us, f.time_hi_us, self.topic_bytes,
            None if expect_topic is None else expect_topic.encode("utf-8"),
            None if expect_sizes is None else np.ascontiguousarray(expect_sizes, dtype=np.int64), self.record_crc_from)
        if found is None:
            return _USE_PYTHON
        n, tags_nulls, keys, pairs, raw = found
        if not n:
            return None
        b = [pa.py_buffer(part) for part in raw]
        int32, int64, stamp = pa.int32(), pa.int64(), self.timestamp_type

        def fixed(value_type, at):
            return pa.Array.from_buffers(value_type, n, [None, b[at]])

        def strings(count, at, value_type=_STRING):
            return pa.Array.from_buffers(value_type, count, [None, b[at], b[at + 1]])

        keys_values = strings(keys, 11)
        map_offsets = pa.Array.from_buffers(int32, n + 1, [None, b[13]])
        columns = {
            "topic": strings(n, 0),
            "queue_id": fixed(int32, 2),
            "queue_offset": fixed(int64, 3),
            "commitlog_offset": fixed(int64, 4),
            "body": strings(n, 5, pa.binary()),
            "tags": pa.Array.from_buffers(pa.string(), n, [b[7] if tags_nulls else None, b[8], b[9]],
                                          null_count=tags_nulls),
            "keys": pa.Array.from_buffers(self.list_type, n, [None, b[10]], children=[keys_values]),
            "properties": pa.MapArray.from_arrays(map_offsets, strings(pairs, 14), strings(pairs, 16),
                                                  type=self.map_type),
            "flag": fixed(int32, 18),
            "sys_flag": fixed(int32, 19),
            "born_timestamp": fixed(stamp, 20),
            "store_timestamp": fixed(stamp, 21),
            "born_host": strings(n, 22),
            "store_host": strings(n, 24),
            "reconsume_times": fixed(int32, 26),
            "body_crc": fixed(int32, 27),
            "msg_id": pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)),
                                                  b[28]),
        }
        if STORE_COLUMN in self.schema.names:
            columns[STORE_COLUMN] = _constant_strings(self.label, n)
        return pa.RecordBatch.from_arrays([columns[name] for name in self.schema.names], schema=self.schema)

    def _numeric_mask(self, header, offsets) -> np.ndarray:
        f = self.row_filter
        keep = np.ones(len(offsets), dtype=bool)
        if f.queue_ids is not None:
            keep &= np.isin(header["queue_id"].astype(np.int64), self.queue_values)
        if f.offset_lo is not None:
            keep &= offsets >= f.offset_lo
        if f.offset_hi is not None:
            keep &= offsets < f.offset_hi
        if f.time_lo_us is not None or f.time_hi_us is not None:
            stored_us = header["store_timestamp"].astype(np.int64) * 1000
            if f.time_lo_us is not None:
                keep &= stored_us >= f.time_lo_us
            if f.time_hi_us is not None:
                keep &= stored_us < f.time_hi_us
        return keep

    def _fast_batch(self, buf, layout: "FastLayout", rows: np.ndarray, segment_ends, expect_topic, path):
        chosen = slice(None) if len(rows) == len(layout.positions) else rows  # a slice copies nothing
        header_bytes, header, positions = layout.header_bytes[chosen], layout.header[chosen], layout.positions[chosen]
        body_length, topic_at = layout.body_length[chosen], layout.topic_at[chosen]
        topic_length = layout.topic_length[chosen]
        properties_at, properties_length = layout.properties_at[chosen], layout.properties_length[chosen]
        topics = _slices(pa.string(), buf, topic_at + 1, topic_length)
        if len(topics) and int(np.frombuffer(topics.buffers()[2], dtype=np.uint8).max(initial=0)) >= 0x80:
            bad = int(rows[np.flatnonzero(~np.asarray(pc.string_is_ascii(topics)))[0]])
            offset = int(layout.header["physical_offset"][bad])
            position = int(layout.positions[bad])  # decode_message raises the error read_at gives (rule 3)
            decode_record(buf.data, position, int(segment_ends[bad]) - offset, offset, path, self.record_crc_from)
            raise AssertionError(f"decode_message took the non-ASCII topic of the record at {offset}")
        if expect_topic is not None:
            wrong = np.flatnonzero(~np.asarray(pc.equal(topics, expect_topic)))
            if len(wrong):
                raise CorruptionError(f"a ConsumeQueue of topic {expect_topic!r} points at a record of topic "
                                      f"{topics[int(wrong[0])].as_py()!r}", path=path,
                                      offset=file_offset(path, int(header["physical_offset"][wrong[0]])),
                                      rule="consumequeue.matches-log")
        if self.topic_values is not None:
            chosen = np.flatnonzero(np.asarray(pc.is_in(topics, value_set=self.topic_values)))
            if len(chosen) < len(topics):
                if not len(chosen):
                    return None
                header_bytes, header, positions, body_length = (header_bytes[chosen], header[chosen],
                                                                positions[chosen], body_length[chosen])
                properties_at, properties_length = properties_at[chosen], properties_length[chosen]
                topics = topics.take(pa.array(chosen))
        n = len(positions)
        properties, tags, keys = self._properties(buf, properties_at + 2, properties_length, n)
        stamp = self.timestamp_type
        columns = {
            "topic": topics,
            "queue_id": pa.array(header["queue_id"].astype(np.int32)),
            "queue_offset": pa.array(header["queue_offset"].astype(np.int64)),
            "commitlog_offset": pa.array(header["physical_offset"].astype(np.int64)),
            "body": _slices(pa.binary(), buf, positions + fmt.OFFSET_BODY, body_length),
            "tags": tags,
            "keys": keys,
            "properties": properties,
            "flag": pa.array(header["flag"].astype(np.int32)),
            "sys_flag": pa.array(header["sys_flag"].astype(np.int32)),
            "born_timestamp": pa.array(header["born_timestamp"].astype(np.int64) * 1000, stamp),
            "store_timestamp": pa.array(header["store_timestamp"].astype(np.int64) * 1000, stamp),
            "born_host": _hosts(header_bytes[:, fmt.OFFSET_BORN_HOST:fmt.OFFSET_BORN_HOST + fmt.HOST_V4_LENGTH]),
            "store_host": _hosts(header_bytes[:, fmt.OFFSET_STORE_HOST:fmt.OFFSET_STORE_HOST + fmt.HOST_V4_LENGTH]),
            "reconsume_times": pa.array(header["reconsume_times"].astype(np.int32)),
            "body_crc": pa.array(header["body_crc"].astype(np.int32)),
            "msg_id": _message_ids(header_bytes),
        }
        if STORE_COLUMN in self.schema.names:
            columns[STORE_COLUMN] = _constant_strings(self.label, n)
        return pa.RecordBatch.from_arrays([columns[name] for name in self.schema.names], schema=self.schema)

    def _properties(self, buf, starts, lengths, n):
        """(properties map, tags, keys) with a vectorized parse; per record when a record is irregular."""
        raw = _slices(pa.binary(), buf, starts, lengths)
        offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=n + 1)
        total = int(offsets[-1])
        data = np.frombuffer(raw.buffers()[2], dtype=np.uint8, count=total) if total else np.zeros(0, np.uint8)
        separators = np.flatnonzero(data <= 2)  # bytes 0x01 and 0x02 (and NUL, which is text)
        kinds = data[separators]
        if len(kinds) and kinds.min() == 0:
            separators, kinds = separators[kinds != 0], kinds[kinds != 0]
        nonempty_ends = offsets[1:][lengths > 0] - 1
        regular = (len(separators) % 2 == 0 and bool(np.all(kinds[0::2] == 1)) and bool(np.all(kinds[1::2] == 2))
                   and bool(np.all(data[nonempty_ends] == 2)))
        if regular:
            try:
                return self._properties_regular(data, offsets, separators, n)
            except pa.ArrowInvalid:
                pass  # not UTF-8: decoded with replacement characters below
        return self._properties_slow(raw)

    def _properties_regular(self, data, offsets, separators, n):
        """Records whose properties are all 'name\x01value\x02' pairs: every pair at once."""
        names_end = separators[0::2]
        values_end = separators[1::2]
        names_start = np.zeros(len(values_end), dtype=np.int64)
        names_start[1:] = values_end[:-1] + 1
        names = _slices(pa.string(), data, names_start, names_end - names_start)
        values = _slices(pa.string(), data, names_end + 1, values_end - names_end - 1)
        if len(data) and int(data.max()) >= 0x80:
            names.validate(full=True)  # ArrowInvalid unless UTF-8
            values.validate(full=True)
        map_offsets = np.searchsorted(values_end, offsets).astype(np.int32)  # pairs before each record
        properties = pa.MapArray.from_arrays(pa.array(map_offsets), names, values, type=self.map_type)
        # TAGS and KEYS are both 4-byte names: one gather of the 4-byte names finds them
        short = np.flatnonzero(names_end - names_start == 4)
        words = (np.ascontiguousarray(_window(data, 4)[names_start[short]]).view(np.uint32).reshape(-1)
                 if len(short) else np.zeros(0, dtype=np.uint32))
        tags_at = _pair_of_each_record(short[words == _TAGS_WORD], map_offsets, n)
        tags = values.take(pa.array(tags_at, mask=tags_at < 0))
        keys_at = _pair_of_each_record(short[words == _KEYS_WORD], map_offsets, n)
        present = np.flatnonzero(keys_at >= 0)
        keys = self._split_keys(values.take(pa.array(keys_at[present])), present, n)
        return properties, tags, keys

    def _split_keys(self, raw_keys: pa.Array, owners: np.ndarray, n: int) -> pa.Array:
        """KEYS values (of records `owners`) split on spaces, empty names dropped, one list per record."""
        counts = np.zeros(n, dtype=np.int64)
        flat = pa.array([], pa.string())
        if len(raw_keys):
            split = pc.split_pattern(raw_keys, fmt.KEY_SEPARATOR)
            flat = pc.list_flatten(split)
            parents = np.asarray(pc.list_parent_indices(split))
            nonempty = np.asarray(pc.greater(pc.binary_length(flat), 0))
            flat = flat.filter(pa.array(nonempty))
            counts = np.bincount(owners[parents[nonempty]], minlength=n)
        list_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=list_offsets[1:])
        return pa.ListArray.from_arrays(pa.array(list_offsets), flat, type=self.list_type)

    def _properties_slow(self, raw: pa.Array):
        decoded = [fmt.decode_properties(value) for value in raw.to_pylist()]
        return self._property_columns(decoded)

    def _property_columns(self, decoded: list[dict]):
        properties = pa.array([list(d.items()) for d in decoded], type=self.map_type)
        tags = pa.array([d.get(fmt.PROPERTY_TAGS) for d in decoded], pa.string())
        keys = pa.array([[k for k in d[fmt.PROPERTY_KEYS].split(fmt.KEY_SEPARATOR) if k]
                         if d.get(fmt.PROPERTY_KEYS) else [] for d in decoded], type=self.list_type)
        return properties, tags, keys

    def _merge_slow(self, batch, buf, positions, offsets, segment_ends, path, expect_topic):
        """Decode version-2, IPv6 and suspicious records one by one; merge them into `batch` in log order."""
        f = self.row_filter
        messages = []
        raw = buf.data
        for position, offset, segment_end in zip(positions.tolist(), offsets.tolist(), segment_ends.tolist()):
            message = decode_record(raw, position, segment_end - offset, offset, path, self.record_crc_from)
            if expect_topic is not None and message.topic != expect_topic:
                raise CorruptionError(f"a ConsumeQueue of topic {expect_topic!r} points at a record of topic "
                                      f"{message.topic!r}", path=path, offset=file_offset(path, offset),
                                      rule="consumequeue.matches-log")
            stored_us = message.store_timestamp_ms * 1000
            if ((f.topics is None or message.topic in f.topics)
                    and (f.queue_ids is None or message.queue_id in f.queue_ids)
                    and (f.offset_lo is None or offset >= f.offset_lo) and (f.offset_hi is None or offset < f.offset_hi)
                    and (f.time_lo_us is None or stored_us >= f.time_lo_us)
                    and (f.time_hi_us is None or stored_us < f.time_hi_us)):
                messages.append(message)
        if not messages:
            return batch
        slow = self._slow_batch(messages)
        if batch is None:
            return slow
        table = pa.Table.from_batches([batch, slow]).combine_chunks()
        order = pc.sort_indices(table, sort_keys=[("commitlog_offset", "ascending")])
        return table.take(order).to_batches()[0]

    def _slow_batch(self, messages) -> pa.RecordBatch:
        properties, tags, keys = self._property_columns([m.properties for m in messages])
        stamp = self.timestamp_type
        columns = {
            "topic": pa.array([m.topic for m in messages], pa.string()),
            "queue_id": pa.array([m.queue_id for m in messages], pa.int32()),
            "queue_offset": pa.array([m.queue_offset for m in messages], pa.int64()),
            "commitlog_offset": pa.array([m.commitlog_offset for m in messages], pa.int64()),
            "body": pa.array([m.body for m in messages], pa.binary()),
            "tags": tags,
            "keys": keys,
            "properties": properties,
            "flag": pa.array([m.flag for m in messages], pa.int32()),
            "sys_flag": pa.array([m.sys_flag for m in messages], pa.int32()),
            "born_timestamp": pa.array([m.born_timestamp_ms * 1000 for m in messages], stamp),
            "store_timestamp": pa.array([m.store_timestamp_ms * 1000 for m in messages], stamp),
            "born_host": pa.array([m.born_host for m in messages], pa.string()),
            "store_host": pa.array([m.store_host for m in messages], pa.string()),
            "reconsume_times": pa.array([m.reconsume_times for m in messages], pa.int32()),
            "body_crc": pa.array([m.body_crc for m in messages], pa.int32()),
            "msg_id": pa.array([m.msg_id for m in messages], pa.string()),
        }
        if STORE_COLUMN in self.schema.names:
            columns[STORE_COLUMN] = _constant_strings(self.label, len(messages))
        return pa.RecordBatch.from_arrays([columns[name] for name in self.schema.names], schema=self.schema)


_USE_PYTHON = object()  # Decoder._native_part's answer for records the compiled decoder leaves to Python


def _slices(value_type, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary or string array of buf[starts[i] : starts[i] + lengths[i]], copied by Arrow in C++.

    The slices must be in order and not overlap (true of records read in log order): they are the even
    elements of one array over `buf` whose odd elements are the gaps between them. Strings are not checked
    for UTF-8 here.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], value_type)
    ends = starts + lengths
    if not (np.all(lengths >= 0) and np.all(starts[1:] >= ends[:-1]) and ends[-1] < (1 << 31)):
        return _views(pa.binary_view() if value_type == pa.binary() else pa.string_view(), buf, starts,
                      lengths).cast(value_type)
    edges = np.empty(2 * n, dtype=np.int32)
    edges[0::2] = starts
    edges[1::2] = ends
    both = pa.Array.from_buffers(value_type, 2 * n - 1, [None, pa.py_buffer(edges), pa.py_buffer(buf)])
    return both.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def _views(view_type, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary_view / string_view array of buf[starts[i] : starts[i] + lengths[i]] (no copy of the values).

    Cast the result to binary/string to get the contiguous layout Spark takes (one C++ copy).
    """
    n = len(starts)
    if n and int(starts.max()) + VIEW_INLINE_BYTES > len(buf):
        buf = np.concatenate((buf, np.zeros(VIEW_INLINE_BYTES, dtype=np.uint8)))
    views = np.zeros((n, 16), dtype=np.uint8)
    if n:
        lengths32 = lengths.astype(np.int32)
        views[:, 0:4] = lengths32.view(np.uint8).reshape(n, 4)
        window = _window(buf, VIEW_INLINE_BYTES)[starts]
        short = lengths32 <= VIEW_INLINE_BYTES
        if short.any():
            views[short, 4:16] = np.where(_INLINE_INDEX < lengths32[short, None], window[short], 0)
        if not short.all():
            long_ = ~short
            views[long_, 4:8] = window[long_, 0:4]
            views[long_, 12:16] = starts[long_].astype(np.int32).view(np.uint8).reshape(-1, 4)
    return pa.Array.from_buffers(view_type, n, [None, pa.py_buffer(views), pa.py_buffer(buf)])


def _pair_of_each_record(matches: np.ndarray, map_offsets: np.ndarray, n: int) -> np.ndarray:
    """Per record, the index of its last pair among `matches` (as a dict keeps it), or -1."""
    index = np.full(n, -1, dtype=np.int64)
    index[np.searchsorted(map_offsets, matches, side="right") - 1] = matches  # ascending: the last one wins
    return index


def _hosts(raw: np.ndarray) -> pa.Array:
    """'ip:port' strings of 8-byte IPv4 host fields; formatted once per distinct host."""
    keys = np.ascontiguousarray(raw).view(np.uint64).reshape(-1)
    if len(keys) and bool(np.all(keys == keys[0])):
        return _constant_strings(fmt.decode_host(keys[:1].tobytes()), len(keys))
    distinct, inverse = np.unique(keys, return_inverse=True)
    names = pa.array([fmt.decode_host(distinct[i:i + 1].tobytes()) for i in range(len(distinct))], pa.string())
    return names.take(pa.array(inverse.reshape(-1)))


def _message_ids(header_bytes: np.ndarray) -> pa.Array:
    """Offset message ids: hex of store host (8 bytes) and PHYSICALOFFSET (8 bytes), fixed 32 digits."""
    n = len(header_bytes)
    raw = np.empty((n, 16), dtype=np.uint8)
    raw[:, 0:8] = header_bytes[:, fmt.OFFSET_STORE_HOST:fmt.OFFSET_STORE_HOST + 8]
    raw[:, 8:16] = header_bytes[:, fmt.OFFSET_PHYSICAL_OFFSET:fmt.OFFSET_PHYSICAL_OFFSET + 8]
    digits = np.take(_HEX_PAIRS, raw)  # (n, 16) pairs of ASCII digits
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(digits))


def _constant_strings(value: str, n: int) -> pa.Array:
    raw = value.encode("utf-8")
    offsets = np.arange(0, len(raw) * n + 1, max(len(raw), 1), dtype=np.int32)[:n + 1] if raw \
        else np.zeros(n + 1, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))
