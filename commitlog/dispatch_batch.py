"""Batches of records decoded from the CommitLog with numpy: the input of every dispatcher and of recovery.

`parse_records` walks the TOTALSIZE chain from a record boundary (runs of one record size many at once),
then decodes and checks the headers of a whole segment's records together (a few records one by one), and
returns a `DispatchBatch`: parallel numpy columns (RocketMQ's DispatchRequest, batched) with properties read in
the decoding pass or looked up on demand. The dispatch loop that feeds dispatchers with these batches is
`commitlog.dispatch`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.native import NATIVE

DISPATCH_BATCH_RECORDS_MAX = 8192  # records handed to the dispatchers at once

_TAGS = b"TAGS"
_KEYS = b"KEYS"
_UNIQ_KEY = b"UNIQ_KEY"

HEADER_DTYPE = fmt.HEADER_V1_DTYPE  # the v1 IPv4 header as a numpy record (layout in commitlog/format.py)
_I64 = fmt.struct.Struct(">q")


class _Chunk:
    """Records of one segment inside a batch: where their properties are, for property lookups. `buffer` is the
    segment's mmap (or, for records the writer described, their joined tails as bytes), `data` the same bytes as
    a numpy array."""

    __slots__ = ("buffer", "data", "properties_start", "properties_end")

    def __init__(self, buffer, data: np.ndarray, properties_start: np.ndarray, properties_end: np.ndarray):
        self.buffer = buffer
        self.data = data
        self.properties_start = properties_start
        self.properties_end = properties_end


class DispatchBatch:
    """Consecutive message records of the log, as parallel numpy columns (RocketMQ's DispatchRequest, batched).

    Transaction-prepared and rolled-back records are in the batch too (with their sys_flag); dispatchers
    that must skip them look at `sys_flags`. `end_offset` is the log offset right after the batch, blanks
    included: once the batch is dispatched, everything below it is. Topics are `topic_ids` into
    `topic_names`; tags codes are computed for every record. Other properties (`property_values`, `keys`,
    `uniq_keys`) were read in the decoding pass when the dispatchers named them (`parse_records`' `properties`),
    else they are looked up on demand, so a batch nobody asks them of does not pay for them.
    """

    def __init__(self, start_offset: int):
        empty = np.empty(0, dtype=np.int64)
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.commitlog_offsets = empty
        self.sizes = empty
        self.topic_ids = empty
        self.topic_names: list[str] = []
        self.queue_ids = empty
        self.queue_offsets = empty
        self.tags_codes = empty
        self.store_timestamps_ms = empty
        self.sys_flags = empty
        self.error: CorruptionError | None = None
        self._chunks: list[_Chunk] = []
        self._cache: dict[bytes, list] = {}

    def __len__(self) -> int:
        return len(self.commitlog_offsets)

    @classmethod
    def from_rows(cls, rows: list[dict], *, start_offset: int | None = None,
                  end_offset: int | None = None) -> "DispatchBatch":
        """A batch from one dict per record (keys: commitlog_offset, size, topic, queue_id, queue_offset,
        tags_code, store_timestamp_ms, sys_flag, and optionally keys / uniq_key raw bytes). For tests and tools
        that build dispatch input without a log."""
        batch = cls(rows[0]["commitlog_offset"] if rows and start_offset is None else (start_offset or 0))
        column = lambda name: np.asarray([row.get(name, 0) for row in rows], dtype=np.int64)  # noqa: E731
        batch.commitlog_offsets = column("commitlog_offset")
        batch.sizes = column("size")
        batch.queue_ids = column("queue_id")
        batch.queue_offsets = column("queue_offset")
        batch.tags_codes = column("tags_code")
        batch.store_timestamps_ms = column("store_timestamp_ms")
        batch.sys_flags = column("sys_flag")
        ids: dict[str, int] = {}
        batch.topic_ids = np.asarray([ids.setdefault(row["topic"], len(ids)) for row in rows], dtype=np.int64)
        batch.topic_names = list(ids)
        batch._cache[_KEYS] = [row.get("keys") for row in rows]
        batch._cache[_UNIQ_KEY] = [row.get("uniq_key") for row in rows]
        if end_offset is None:
            end_offset = rows[-1]["commitlog_offset"] + rows[-1]["size"] if rows else batch.start_offset
        batch.end_offset = end_offset
        return batch

    @property
    def topics(self) -> list[str]:
        names = self.topic_names
        return [names[i] for i in self.topic_ids.tolist()]

    def property_values(self, name: bytes) -> list[bytes | None]:
        """The raw value of property `name` for every record (None where a record does not have it)."""
        values = self._cache.get(name)
        if values is None:
            values = []
            for chunk in self._chunks:
                values.extend(_dense(_found_properties(chunk, (name,))[0], len(chunk.properties_start)))
            self._cache[name] = values
        return values

    def property_span_chunks(self, names: tuple[bytes, ...]) -> list[tuple[object, int, np.ndarray]] | None:
        """The value spans of properties `names` without slicing them out: for each chunk of the batch (the records
        of one segment), (its buffer, its first row, spans) with spans[2k] / spans[2k + 1] the start / end of
        names[k]'s value in the buffer per record (-1 when absent), by the compiled property scan
        (commitlog/csrc/scan_core.c's mq_property_span, the pairs `property_values` finds). None without the
        extension or for a batch built from rows."""
        if NATIVE is None or not self._chunks:
            return None
        found = []
        row = 0
        for chunk in self._chunks:
            starts = np.ascontiguousarray(chunk.properties_start, dtype=np.int64)
            spans = np.empty((2 * len(names), len(starts)), dtype=np.int64)
            NATIVE.property_spans(chunk.buffer, starts, np.ascontiguousarray(chunk.properties_end, dtype=np.int64),
                                  tuple(names), spans)
            found.append((chunk.buffer, row, spans))
            row += len(starts)
        return found

    @property
    def keys(self) -> list[bytes | None]:
        """The raw KEYS property of every record (space-separated), or None."""
        return self.property_values(_KEYS)

    @property
    def uniq_keys(self) -> list[bytes | None]:
        """The raw UNIQ_KEY property of every record, or None."""
        return self.property_values(_UNIQ_KEY)


class LogReader(Protocol):
    """What the dispatch loop needs of a CommitLog."""

    def readable_end(self) -> int: ...

    def segment_at(self, commitlog_offset: int): ...


def _dense(found: list[tuple[int, bytes]], count: int) -> list[bytes | None]:
    """The (row, value) pairs of one property as a list of `count` values, None where a row has none."""
    values: list[bytes | None] = [None] * count
    for row, value in found:
        values[row] = value
    return values


def _found_properties(chunk: _Chunk, names: tuple[bytes, ...]) -> list[list[tuple[int, bytes]]]:
    """For each of `names`, (row, raw value) of the chunk's records whose properties hold it, found in one pass
    over their properties spans. Records without properties are passed over (with numpy in a large batch)."""
    starts, ends = chunk.properties_start, chunk.properties_end
    if NATIVE is not None:
        return _found_properties_native(chunk.buffer, starts, ends, names)
    if len(starts) > DECODE_FEW_RECORDS_MAX:
        return _found_properties_vector(chunk.data, starts, ends, names)
    found: list[list[tuple[int, bytes]]] = [[] for _ in names]
    needles = [(name + b"\x01", len(name) + 1, pairs.append) for name, pairs in zip(names, found)]
    buffer = chunk.buffer
    find = buffer.find
    spans = [(row, start, end) for row, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())) if start != end]
    for row, start, end in spans:
        for needle, skip, add in needles:
            at = find(needle, start, end)
            while at > start and buffer[at - 1] != 2:  # a longer name that ends in this one
                at = find(needle, at + 1, end)
            if at >= 0:
                value_end = find(b"\x02", at + skip, end)
                add((row, buffer[at + skip : value_end if value_end >= 0 else end]))
    return found


def _found_properties_native(buffer, starts: np.ndarray, ends: np.ndarray, names: tuple[bytes, ...]
                             ) -> list[list[tuple[int, bytes]]]:
    """`_found_properties` through the compiled scan (commitlog/csrc/scan_core.c's mq_property_span): the same
    pairs; only the values found are sliced in Python."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    spans = np.empty((2 * len(names), len(starts)), dtype=np.int64)
    NATIVE.property_spans(buffer, starts, ends, tuple(names), spans)
    found = []
    for k in range(len(names)):
        rows = np.flatnonzero(spans[2 * k] >= 0)
        found.append(list(zip(rows.tolist(), [buffer[a:b] for a, b in zip(spans[2 * k][rows].tolist(),
                                                                          spans[2 * k + 1][rows].tolist())])))
    return found


PROPERTY_SCAN_CHUNK_BYTES = 1 << 20  # properties bytes gathered at once by the numpy scan (bounds its arrays)


def _found_properties_vector(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: tuple[bytes, ...]
                             ) -> list[list[tuple[int, bytes]]]:
    """`_found_properties` for many records, with numpy: the same pairs. The properties bytes of the records
    are gathered into one array (in chunks of about PROPERTY_SCAN_CHUNK_BYTES: a record's properties are at most
    32 KiB, but a batch may hold thousands); a pair starts at a record's first byte or after a 0x02 inside the
    record; for each name, the first pair of a record that begins with `name` 0x01 (and fits in the record)
    holds the value, up to the next 0x02 or the record's end. Only the values found are sliced in Python."""
    found: list[list[tuple[int, bytes]]] = [[] for _ in names]
    rows = np.flatnonzero(ends != starts)
    lengths = (ends[rows] - starts[rows]).astype(np.int64)
    bytes_through = np.cumsum(lengths)
    first = 0
    while first < len(rows):  # bounded: every chunk takes at least one record
        limit = int(bytes_through[first] - lengths[first]) + PROPERTY_SCAN_CHUNK_BYTES
        last = max(int(np.searchsorted(bytes_through, limit, side="right")), first + 1)
        chunk = rows[first:last]
        _scan_properties(data, chunk, starts[chunk], lengths[first:last], names, found)
        first = last
    return found


def _scan_properties(data: np.ndarray, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                     names: tuple[bytes, ...], found: list[list[tuple[int, bytes]]]) -> None:
    """One chunk of `_found_properties_vector`: records `rows` (in order), properties at `starts`, `lengths`
    bytes long (all > 0); appends to `found`."""
    record_at = np.cumsum(lengths) - lengths  # where each record's properties begin in `joined`
    record_end = record_at + lengths
    total = int(record_end[-1])
    joined = data[np.arange(total, dtype=np.int64) + np.repeat(starts - record_at, lengths)]
    separators = np.flatnonzero(joined == 2)
    pair_flags = np.zeros(total + 1, dtype=bool)
    pair_flags[record_at] = True
    pair_flags[separators + 1] = True
    pair_starts = np.flatnonzero(pair_flags[:total])
    pair_records = np.searchsorted(record_at, pair_starts, side="right") - 1
    pair_limits = record_end[pair_records]
    raw = joined.tobytes()
    for name, pairs in zip(names, found):
        needle = np.frombuffer(name + b"\x01", dtype=np.uint8)
        fits = pair_starts + len(needle) <= pair_limits
        candidates = pair_starts[fits]
        if not len(candidates):
            continue
        span = candidates[:, None] + np.arange(len(needle), dtype=np.int64)
        matched = (joined[span] == needle).all(axis=1)
        at = candidates[matched]
        records = pair_records[fits][matched]
        first = np.ones(len(at), dtype=bool)
        first[1:] = records[1:] != records[:-1]  # pairs are in order: a record's first match
        at, records = at[first], records[first]
        value_at = at + len(needle)
        limits = record_end[records]
        next_separator = np.searchsorted(separators, value_at)
        value_end = np.minimum(np.append(separators, total)[next_separator], limits)
        pairs.extend(zip(rows[records].tolist(),
                         [raw[a:b] for a, b in zip(value_at.tolist(), value_end.tolist())]))


def parse_records(log: LogReader, start: int, end: int, *, check_crc: bool = False,
                  records_max: int = DISPATCH_BATCH_RECORDS_MAX, zeros_end: bool = False,
                  properties: tuple[bytes, ...] = ()) -> DispatchBatch:
    """Decode the records of [start, end) into a batch, stopping after `records_max` records.

    `start` must be a record boundary. Crosses segment ends at blanks. With `zeros_end`, eight zero bytes
    where a record should start end the batch (finding the end of a log); otherwise they are corruption.
    Records are found by walking their TOTALSIZE chain; their fields are then decoded and checked for all
    records of a segment at once with numpy. At the first invalid record the batch stops and `batch.error`
    holds the CorruptionError: the log is read only up to its published end, so anything invalid below it is
    real corruption. The `properties` named (beside TAGS, always read) are read in the same pass over each
    record's properties as TAGS, for dispatchers that read them for every record (`property_values`).
    """
    batch = DispatchBatch(start)
    required_from = getattr(log, "record_crc_from", None)
    parts: list[dict] = []
    offset = start
    count = 0
    while offset < end and count < records_max:
        segment = log.segment_at(offset)
        base = segment.base_offset
        if NATIVE is not None:
            part, error, stop = _scan_native(segment, offset - base, min(end, base + segment.size_bytes) - base,
                                             records_max - count, zeros_end, check_crc, required_from)
            if part is not None:
                parts.append(part)
                count += len(part["offsets"])
            if error is not None:
                batch.error = error
                offset = base + stop
                break
            if base + stop == offset:
                break
            offset = base + stop
            continue
        positions, stop, error = _walk(segment, offset - base, min(end, base + segment.size_bytes) - base,
                                       records_max - count, zeros_end)
        if positions:
            decode = _decode_few if len(positions) <= DECODE_FEW_RECORDS_MAX else _decode
            part, part_error = decode(segment, positions, check_crc, required_from)
            parts.append(part)
            count += len(part["offsets"])
            if part_error is not None:
                batch.error = part_error
                offset = int(part["end"])
                break
        if error is not None:
            batch.error = error
            offset = base + stop
            break
        if base + stop == offset:
            break  # the next record is not complete yet
        offset = base + stop
    _assemble(batch, parts, properties)
    batch.end_offset = offset
    return batch


def batch_from_written(written: list[tuple], crc_length: int, properties: tuple[bytes, ...] = ()) -> DispatchBatch:
    """The batch of consecutive records the writer described as it wrote them, without reading the log.

    Each of `written` is (commitlog offset, TOTALSIZE, (topic, queue_id), queue offset, store timestamp, tail),
    tail being the record's bytes from TOPICLENGTH to its end as the writer copied them (`crc_length` bytes of
    record-CRC pair at its end, whose digits are not read). The columns and properties are those
    `parse_records` decodes from the same records, through the same code: the tails are joined into one buffer
    and handed to `_assemble` as one part. sys_flag is 0: the writer writes no transaction flags.
    """
    buffer = b"".join([record[5] for record in written])
    rows = []
    at = 0
    for offset, size, queue_key, queue_offset, store_timestamp, tail in written:
        topic_length = tail[0]
        rows.append((offset, size, at + 1, topic_length, at + topic_length + 3, at + len(tail) - crc_length,
                     queue_key[1], queue_offset, store_timestamp, 0))
        at += len(tail)
    part = _part_from_rows(rows)
    part.update({"buffer": buffer, "data": np.frombuffer(buffer, dtype=np.uint8)})
    batch = DispatchBatch(written[0][0])
    _assemble(batch, [part], properties)
    batch.end_offset = written[-1][0] + written[-1][1]
    return batch


def _walk(segment, pos: int, limit: int, records_max: int,
          zeros_end: bool = False) -> tuple[list[int], int, CorruptionError | None]:
    """Follow the TOTALSIZE chain from `pos`: (record positions, where it stopped, the error that stopped it).

    Runs of records of one size (a producer's messages often are) are followed many at once: after two
    records of equal size, the next WALK_RUN_MAX positions that size apart are checked together (magic code
    and TOTALSIZE, what the step-by-step walk checks); the run ends at the first that differs.
    """
    view = segment.view
    size_bytes = segment.size_bytes
    peek = fmt.BLANK.unpack_from
    positions: list[int] = []
    append = positions.append
    previous_size = 0
    skip_runs_until = 0  # after a short run, record counts below which no run is tried
    while pos < limit and len(positions) < records_max:
        remaining = size_bytes - pos
        if remaining < fmt.END_FILE_MIN_BLANK_LENGTH:
            return positions, pos, fmt._corrupt("blank", f"{remaining} bytes left in the segment, no room for a "
                                                "blank", segment.path, segment.base_offset + pos, pos)
        size, magic = peek(view, pos)
        if magic == _MAGIC_V1 or magic == _MAGIC_V2:
            if size < _RECORD_SIZE_MIN or size > remaining:
                return positions, pos, _invalid(view, pos, remaining, segment.base_offset + pos, segment.path)
            if pos + size > limit:
                if zeros_end:
                    break  # finding the end: a record not complete yet ends the data
                return positions, pos, fmt._corrupt(
                    "2", f"TOTALSIZE {size} runs past the written end", segment.path, segment.base_offset + pos,
                    pos)
            append(pos)
            pos += size
            if size == previous_size and len(positions) >= skip_runs_until:
                run = _run_of(segment.array, pos, size, min((limit - pos) // size, records_max - len(positions),
                                                              WALK_RUN_MAX))
                if run:
                    positions.extend(range(pos, pos + run * size, size))
                    pos += run * size
                if run < WALK_RUN_SHORT:
                    skip_runs_until = len(positions) + WALK_RUN_BACKOFF
            previous_size = size
        elif magic == fmt.BLANK_MAGIC_CODE and size == remaining:
            return positions, size_bytes, None
        elif zeros_end and size == 0 and magic == 0:
            break
        else:
            return positions, pos, _invalid(view, pos, remaining, segment.base_offset + pos, segment.path)
    return positions, pos, None


WALK_RUN_MAX = 4096  # records of one size checked at once by the walk
WALK_RUN_SHORT = 8  # a run shorter than this ...
WALK_RUN_BACKOFF = 64  # ... makes the walk go step by step for this many records before it tries again
WALK_RUN_MIN = 24  # runs are checked at once only when at least this many records may follow
_HEAD_DTYPE = np.dtype([("size", ">i4"), ("magic", ">u4")])


def _run_of(data, pos: int, size: int, count_max: int) -> int:
    """How many records of TOTALSIZE `size` with a message magic code follow each other from `pos` (at most
    `count_max`, all of which lie inside the segment)."""
    if count_max < WALK_RUN_MIN:
        return 0  # stepping costs less than the numpy check
    starts = pos + size * np.arange(count_max, dtype=np.int64)
    heads = fmt.rows_at(np.asarray(data), starts, _HEAD_DTYPE.itemsize).view(_HEAD_DTYPE)[:, 0]
    same = (heads["size"] == size) & ((heads["magic"] == _MAGIC_V1) | (heads["magic"] == _MAGIC_V2))
    return count_max if same.all() else int(np.argmin(same))


def _decode(segment, positions: list[int], check_crc: bool,
            required_from: int | None = None) -> tuple[dict, CorruptionError | None]:
    """Decode and check the records at `positions` of one segment with numpy; stops at the first bad one."""
    data = segment.array.view(np.ndarray)  # a plain array: indexing a memmap subclass costs more
    base = segment.base_offset
    pos = np.asarray(positions, dtype=np.int64)
    header = fmt.rows_at(data, pos, fmt.HEADER_SIZE).view(HEADER_DTYPE)[:, 0]
    size = header["total_size"].astype(np.int64)
    sys_flag = header["sys_flag"].astype(np.int64)
    record_end = pos + size
    general = (header["magic"] != _MAGIC_V1) | ((sys_flag & _V6_FLAGS) != 0)
    valid, columns = _v1_layout(data, pos, record_end, header, base)
    fields = {
        "queue_id": header["queue_id"].astype(np.int64),
        "queue_offset": header["queue_offset"].astype(np.int64),
        "store_timestamp": header["store_timestamp"].astype(np.int64),
        "sys_flag": sys_flag,
    }
    general_errors = _locate_one_by_one(segment, positions, np.flatnonzero(general).tolist(), valid, columns,
                                        fields["store_timestamp"])
    topic_start, topic_length = columns["topic_start"], columns["topic_length"]
    body_start, body_length = columns["body_start"], columns["body_length"]
    properties_start, properties_length = columns["properties_start"], columns["properties_length"]
    valid &= _topic_matrix(data, topic_start, np.where(valid, topic_length, 0)).max(axis=1, initial=0) < 0x80
    has_crc, crc_value = fmt.record_crc_columns(data, properties_start, properties_length, record_end, valid)
    valid &= crc_value >= 0  # a record-CRC pair without 10 digits in it
    if required_from is not None:
        valid &= has_crc | (base + pos < required_from)
    bad = np.flatnonzero(~valid)
    keep = int(bad[0]) if len(bad) else len(positions)
    error = None
    if keep < len(positions):
        at = positions[keep]
        error = general_errors.get(keep) or _invalid(segment.view, at, segment.size_bytes - at, base + at,
                                                     segment.path, required_from)
    if check_crc and keep:
        # A record CRC covers the whole record (BODYCRC and the body included); other records have their body's.
        starts = np.where(has_crc, pos, body_start)[:keep]
        ends = np.where(has_crc, record_end - fmt.RECORD_CRC_LENGTH, body_start + body_length)[:keep]
        expected = np.where(has_crc, crc_value, header["body_crc"].astype(np.int64))[:keep]
        bad_row = _first_crc_mismatch(segment.view, expected, starts, ends)
        if bad_row is not None:
            keep, error = bad_row, _crc_error(segment, positions[bad_row])
    properties_end = np.where(has_crc, record_end - fmt.RECORD_CRC_LENGTH, properties_start + properties_length)
    part = {
        "offsets": base + pos[:keep], "sizes": size[:keep],
        "topic_start": topic_start[:keep], "topic_length": topic_length[:keep],
        "properties_start": properties_start[:keep],
        "properties_end": properties_end[:keep],
        "buffer": segment.array._mmap, "data": data,
        "end": base + (positions[keep] if keep < len(positions) else int(record_end[-1])),
    }
    part.update({name: column[:keep] for name, column in fields.items()})
    return part, error


def _v1_layout(data, pos: np.ndarray, record_end: np.ndarray, header: np.ndarray, base: int
               ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Where the parts of records at `pos` are if they are v1 records with IPv4 hosts, with numpy: (valid, the
    columns of _LAYOUT_FIELDS). `valid` holds where format rules (2) to (4) hold for that layout; a row that
    breaks them points its topic and properties at the record's start, so no read goes past the record."""
    body_length = header["body_length"].astype(np.int64)
    valid = (body_length >= 0) & (pos + 88 + body_length + 3 <= record_end) & (
        header["physical_offset"] == base + pos)
    topic_length_at = np.where(valid, pos + 88 + body_length, pos)
    topic_length = data[topic_length_at].astype(np.int64)
    properties_length_at = topic_length_at + 1 + topic_length
    valid &= (topic_length >= 1) & (properties_length_at + 2 <= record_end)
    properties_length_at = np.where(valid, properties_length_at, pos)
    properties_length = (data[properties_length_at].astype(np.int64) << 8) | data[properties_length_at + 1]
    properties_length = np.where(properties_length >= 0x8000, properties_length - 0x10000, properties_length)
    properties_start = properties_length_at + 2
    valid &= (properties_length >= 0) & (properties_start + properties_length == record_end)
    columns = {"topic_start": topic_length_at + 1, "topic_length": topic_length, "body_start": pos + fmt.HEADER_SIZE,
               "body_length": body_length, "properties_start": properties_start,
               "properties_length": properties_length}
    return valid, columns


_LAYOUT_FIELDS = ("topic_start", "topic_length", "body_start", "body_length", "properties_start", "properties_length")


def _locate_one_by_one(segment, positions: list[int], rows: list[int], valid: np.ndarray,
                       columns: dict[str, np.ndarray], store_timestamp: np.ndarray) -> dict[int, CorruptionError]:
    """The `rows` `_v1_layout` cannot place (v2 records and IPv6 hosts: rare), through `format.locate` one by
    one: their `columns`, `store_timestamp` and `valid` set in place. Stops at the first that breaks a rule and
    returns its error by row."""
    errors: dict[int, CorruptionError] = {}
    for row in rows:
        at = positions[row]
        try:
            layout = fmt.locate(segment.view, at, segment.size_bytes - at, segment.base_offset + at,
                                path=segment.path)
        except CorruptionError as exc:
            valid[row] = False
            errors[row] = exc
            break
        valid[row] = True
        store_timestamp[row] = _I64.unpack_from(segment.view, layout.store_host[0] - 8)[0]
        for name in _LAYOUT_FIELDS:
            columns[name][row] = getattr(layout, name)
    return errors


# Below this many records of a segment, `_decode_few` decodes them one by one: `_decode` makes about 100 numpy
# calls whatever the count (~0.3 ms), which the tail of a slow stream (SYNC puts, a trickle) paid per message.
DECODE_FEW_RECORDS_MAX = 24
_QUEUE_FIELDS = fmt.struct.Struct(">iiq")  # QUEUEID, FLAG, QUEUEOFFSET
_PART_COLUMNS = ("offsets", "sizes", "topic_start", "topic_length", "properties_start", "properties_end",
                 "queue_id", "queue_offset", "store_timestamp", "sys_flag")


def _part_from_rows(rows: list[tuple]) -> dict:
    """The columns of a part from one tuple of _PART_COLUMNS per record (the decoders of a few records)."""
    return dict(zip(_PART_COLUMNS, np.array(rows, dtype=np.int64).reshape(-1, len(_PART_COLUMNS)).T))


# The fixed fields of a v1 record with IPv4 hosts that `_decode_few` reads: TOTALSIZE, MAGICCODE, QUEUEID,
# QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP, BODYLENGTH (88 bytes, the others skipped).
_V1_HEAD = fmt.struct.Struct(">iI4xi4xqqi8x8xq8x4x8xi")
assert _V1_HEAD.size == fmt.OFFSET_BODY
_PROPERTIES_LENGTH = fmt.I16.unpack_from


def _decode_few(segment, positions: list[int], check_crc: bool,
                required_from: int | None = None) -> tuple[dict, CorruptionError | None]:
    """`_decode` for a few records: the same part and the same error, record by record. A v1 record with
    IPv4 hosts that passes the checks `_decode` vectorises is read with one unpack; any other record (v2, IPv6,
    any failed check) and every record when `check_crc` go through `format.locate` and `format.check_crcs`,
    which decode it in full or raise the precise error."""
    view = segment.view
    base = segment.base_offset
    size_bytes = segment.size_bytes
    path = segment.path
    head = _V1_HEAD.unpack_from
    crc_length = fmt.RECORD_CRC_LENGTH
    fixed = fmt.OFFSET_BODY
    has_record_crc, record_crc_value = fmt.has_record_crc, fmt.record_crc_value
    rows = []
    error = None
    end = base + positions[-1]
    for at in positions:
        offset = base + at
        required = required_from is not None and offset >= required_from
        size, magic, queue_id, queue_offset, physical, sys_flag, store_timestamp, body_length = head(view, at)
        record_end = at + size
        if (magic == _MAGIC_V1 and not sys_flag & _V6_FLAGS and not check_crc and physical == offset
                and _RECORD_SIZE_MIN <= size <= size_bytes - at and 0 <= body_length <= size - fixed - 3):
            topic_start = at + fixed + body_length + 1
            topic_length = view[topic_start - 1]
            properties_start = topic_start + topic_length + 2
            if (topic_length and properties_start <= record_end
                    and _PROPERTIES_LENGTH(view, properties_start - 2)[0] == record_end - properties_start
                    and view[topic_start : properties_start - 2].tobytes().isascii()):
                has_crc = has_record_crc(view, properties_start, record_end)
                if (not has_crc and not required) or (
                        has_crc and record_crc_value(view[record_end - 11 : record_end - 1].tobytes()) is not None):
                    rows.append((offset, size, topic_start, topic_length, properties_start,
                                 record_end - crc_length if has_crc else record_end, queue_id, queue_offset,
                                 store_timestamp, sys_flag))
                    end = base + record_end
                    continue
        try:
            layout = fmt.locate(view, at, size_bytes - at, offset, path=path)
            has_crc = fmt.check_crcs(view, layout, at, offset, check_crc=check_crc, path=path, required=required)
        except CorruptionError as exc:
            error, end = exc, offset
            break
        queue_id, _, queue_offset = _QUEUE_FIELDS.unpack_from(view, at + fmt.OFFSET_QUEUE_ID)
        record_end = at + layout.size
        rows.append((offset, layout.size, layout.topic_start, layout.topic_length, layout.properties_start,
                     record_end - crc_length if has_crc else record_end, queue_id, queue_offset,
                     _I64.unpack_from(view, layout.store_host[0] - 8)[0], layout.sys_flag))
        end = base + record_end
    part = _part_from_rows(rows)
    part.update({"buffer": segment.array._mmap, "data": segment.array.view(np.ndarray), "end": end})
    return part, error


def _crc_error(segment, at: int) -> CorruptionError:
    """The precise CorruptionError of the record at `at`, whose CRC the batch check found wrong."""
    commitlog_offset = segment.base_offset + at
    try:
        layout = fmt.locate(segment.view, at, segment.size_bytes - at, commitlog_offset, path=segment.path)
        fmt.check_crcs(segment.view, layout, at, commitlog_offset, required=False, check_crc=True, path=segment.path)
    except CorruptionError as exc:
        return exc
    raise AssertionError("the batch CRC check and the record's own check disagree")


def _first_crc_mismatch(view, expected: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int | None:
    """The first row whose bytes view[starts[row]:ends[row]] do not have the CRC `expected[row]`, or None."""
    crc32 = fmt.crc32
    actual = np.fromiter((crc32(view[start:end]) for start, end in zip(starts.tolist(), ends.tolist())),
                         dtype=np.int64, count=len(starts))
    bad = np.flatnonzero((actual & 0x7FFFFFFF) != expected)
    return int(bad[0]) if len(bad) else None


def _topic_matrix(data, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The topic bytes of each row, zero-padded to the longest (rows of length 0 are all zeros)."""
    span = np.arange(int(lengths.max(initial=0)), dtype=np.int64)
    matrix = data[np.minimum(starts[:, None] + span, len(data) - 1)]
    matrix[span[None, :] >= lengths[:, None]] = 0
    return matrix


def _topic_ids(data, topic_start: np.ndarray, topic_length: np.ndarray, names: dict[bytes, int]) -> np.ndarray:
    """Map each record's topic bytes (ASCII: the decoders checked rule 3) to an id in `names` (new topics are
    added), decoding each topic once."""
    if len(topic_start) <= DECODE_FEW_RECORDS_MAX:
        return np.array([names.setdefault(data[start : start + length].tobytes(), len(names))
                         for start, length in zip(topic_start.tolist(), topic_length.tolist())], dtype=np.int64)
    matrix = _topic_matrix(data, topic_start, topic_length)
    lengths = topic_length.astype(">u2").view(np.uint8).reshape(-1, 2)  # v2 topics may be longer than 255
    keyed = np.concatenate([lengths, matrix], axis=1)
    rows = np.ascontiguousarray(keyed).view(np.dtype((np.void, matrix.shape[1] + 2)))[:, 0]
    unique, inverse = np.unique(rows, return_inverse=True)
    ids = np.empty(len(unique), dtype=np.int64)
    for index, row in enumerate(unique):
        raw = bytes(row)
        ids[index] = names.setdefault(raw[2 : 2 + ((raw[0] << 8) | raw[1])], len(names))
    return ids[inverse.ravel()]


def _assemble(batch: DispatchBatch, parts: list[dict], properties: tuple[bytes, ...] = ()) -> None:
    if not parts:
        return
    names: dict[bytes, int] = {}
    topic_ids = []
    for part in parts:
        topic_rows = part.get("topic_rows")
        if topic_rows is not None:  # the compiled scan named the part's distinct topics (first row of each)
            data, starts, lengths = part["data"], part["topic_start"], part["topic_length"]
            local = np.array([names.setdefault(data[starts[row] : starts[row] + lengths[row]].tobytes(), len(names))
                              for row in topic_rows], dtype=np.int64)
            topic_ids.append(local[part["topic_local"]])
        else:
            topic_ids.append(_topic_ids(part["data"], part["topic_start"], part["topic_length"], names))
        batch._chunks.append(_Chunk(part["buffer"], part["data"], part["properties_start"], part["properties_end"]))
    batch.topic_names = [name.decode("ascii") for name in names]
    batch.topic_ids = np.concatenate(topic_ids) if len(parts) > 1 else topic_ids[0]
    join = np.concatenate if len(parts) > 1 else (lambda columns: columns[0])  # noqa: E731 - one part: no copy
    batch.commitlog_offsets = join([p["offsets"] for p in parts])
    batch.sizes = join([p["sizes"] for p in parts])
    batch.queue_ids = join([p["queue_id"] for p in parts])
    batch.queue_offsets = join([p["queue_offset"] for p in parts])
    batch.store_timestamps_ms = join([p["store_timestamp"] for p in parts])
    batch.sys_flags = join([p["sys_flag"] for p in parts])
    properties = tuple(name for name in properties if name != _TAGS)
    for name in properties:
        batch._cache[name] = []
    codes = np.zeros(len(batch.commitlog_offsets), dtype=np.int64)
    cache: dict[bytes, int] = {}
    row = 0
    for part, chunk in zip(parts, batch._chunks):
        count = len(chunk.properties_start)
        if "tags_code" in part:  # the compiled scan hashed ASCII tags; others are hashed here
            codes[row : row + count] = part["tags_code"]
            if part["tags_non_ascii"]:
                for i in np.flatnonzero(part["tags_start"] >= 0).tolist():
                    tag = chunk.buffer[int(part["tags_start"][i]) : int(part["tags_end"][i])]
                    if tag and not tag.isascii():
                        codes[row + i] = fmt.tags_code(tag.decode("utf-8", "replace"))
            found = [None] + (_found_properties(chunk, properties) if properties else [])
        else:
            found = _found_properties(chunk, (_TAGS,) + properties)
            for i, tag in found[0]:
                if tag:
                    code = cache.get(tag)
                    if code is None:
                        code = cache[tag] = fmt.tags_code(tag.decode("utf-8", "replace"))
                    codes[row + i] = code
        for name, pairs in zip(properties, found[1:]):
            batch._cache[name].extend(_dense(pairs, count))
        row += count
    batch.tags_codes = codes


_MAGIC_V1 = fmt.MESSAGE_MAGIC_CODE
_MAGIC_V2 = fmt.MESSAGE_MAGIC_CODE_V2
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_RECORD_SIZE_MIN = fmt.RECORD_SIZE_MIN


def _invalid(view, pos, remaining, commitlog_offset, path, required_from: int | None = None) -> CorruptionError:
    """The precise CorruptionError for a record the fast checks refused."""
    size, magic = fmt.peek(view, pos, remaining)
    if size == 0 and magic == 0:
        return fmt._corrupt("1", "zero bytes inside the written part of the log", path, commitlog_offset, pos)
    if magic == fmt.BLANK_MAGIC_CODE:
        return fmt._corrupt("blank", f"end-of-segment blank of {size} bytes with {remaining} left", path,
                            commitlog_offset, pos)
    try:
        layout = fmt.locate(view, pos, remaining, commitlog_offset, path=path)
        fmt.check_record_crc(view, layout, pos, commitlog_offset, check_crc=False, path=path,
                             required=required_from is not None and commitlog_offset >= required_from)
    except CorruptionError as exc:
        return exc
    return CorruptionError("record refused by the batch decoder", path=path, offset=commitlog_offset,
                           rule="commitlog.3")


# --- the compiled scan (commitlog/csrc/scan_core.c, bound in scan.c) --------------------------------------------
# The columns scan_segment writes, in scan_core.h's order (MQ_COL_*); a test ties the two.
NATIVE_COLUMNS = ("offsets", "sizes", "topic_start", "topic_length", "properties_start", "properties_end",
                  "queue_id", "queue_offset", "store_timestamp", "sys_flag", "tags_code", "tags_start", "tags_end",
                  "topic_local", "body_start", "body_length")
# Why scan_segment stopped: scan_core.h's MQ_SCAN_* codes.
SCAN_OK, SCAN_ERR_SHORT, SCAN_ERR_PAST_END, SCAN_ERR_INVALID, SCAN_ERR_CRC = range(5)
_NO_RECORD_CRC_REQUIRED = (1 << 63) - 1


def _scan_native(segment, pos: int, limit: int, records_max: int, zeros_end: bool, check_crc: bool,
                 required_from: int | None) -> tuple[dict | None, CorruptionError | None, int]:
    """`_walk` and `_decode` of one segment in one compiled call, with the interpreter let go: (the part, the
    error that stopped it, the position where it stopped). The part has the columns `_decode` makes, plus the
    tag codes and the distinct topics. The error is built by the Python path's own functions from the position
    and kind the scan reports, so both codecs raise the same CorruptionError."""
    capacity = max(1, min(records_max, (limit - pos) // fmt.RECORD_SIZE_MIN + 1))
    columns = np.empty((len(NATIVE_COLUMNS), capacity), dtype=np.int64)
    array = segment.array
    mapping = array._mmap  # the scan holds its buffer: nothing unmaps it under the loop
    count, stop, kind, _, topic_rows, non_ascii = NATIVE.scan_segment(
        mapping, segment.size_bytes, segment.base_offset, pos, limit, records_max, zeros_end, check_crc,
        _NO_RECORD_CRC_REQUIRED if required_from is None else required_from, columns)
    error = None if kind == SCAN_OK else _scan_error(segment, stop, kind, required_from)
    if not count:
        return None, error, stop
    part = {name: columns[i, :count] for i, name in enumerate(NATIVE_COLUMNS)}
    part.update({"buffer": mapping, "data": array.view(np.ndarray), "end": segment.base_offset + stop,
                 "topic_rows": topic_rows, "tags_non_ascii": non_ascii})
    return part, error, stop


def _scan_error(segment, at: int, kind: int, required_from: int | None) -> CorruptionError:
    """The CorruptionError the Python path raises for the record at `at`, which the compiled scan refused."""
    view, offset, path = segment.view, segment.base_offset + at, segment.path
    remaining = segment.size_bytes - at
    if kind == SCAN_ERR_SHORT:
        return fmt._corrupt("blank", f"{remaining} bytes left in the segment, no room for a blank", path, offset, at)
    if kind == SCAN_ERR_PAST_END:
        size = fmt.I32.unpack_from(view, at)[0]
        return fmt._corrupt("2", f"TOTALSIZE {size} runs past the written end", path, offset, at)
    if kind == SCAN_ERR_CRC:
        return _crc_error(segment, at)
    return _invalid(view, at, remaining, offset, path, required_from)
