"""A PySpark data source over CommitLogs: batch and streaming reads of mqstore / RocketMQ 4.x stores.

    from mqstore.spark import CommitLogDataSource
    spark.dataSource.register(CommitLogDataSource)
    df = spark.read.format("commitlog").load("/path/to/store")          # or a list of paths, or a glob
    stream = spark.readStream.format("commitlog").load("/path/to/store")

Python workers must run an interpreter that imports mqstore, numpy and pyarrow (set PYSPARK_PYTHON).
Filter pushdown needs `spark.sql.python.filterPushdown.enabled=true`; without it Spark filters the rows itself.

Schema (one row per message record; `store` only when a list of paths or a glob was loaded):

    topic string, queue_id int, queue_offset long, commitlog_offset long, body binary, tags string (null
    without TAGS), keys array<string>, properties map<string,string> (every property, TAGS/KEYS/UNIQ_KEY too),
    flag int, sys_flag int, born_timestamp timestamp, store_timestamp timestamp, born_host string ("ip:port"),
    store_host string, reconsume_times int, body_crc int, msg_id string (offset message id), [store string]

Options (names are case-insensitive; anything else is refused):

    OPTION                 VALUE                                    EFFECT
    topic                  name[,name...]                           only these topics (read through ConsumeQueues)
    queue_id               id[,id...]                               only these queue ids
    start_offset           commitlog offset, inclusive              records at or after it
    end_offset             commitlog offset, exclusive              records before it
    start_time / end_time  ms since the epoch, or ISO-8601 (naive    store_timestamp in [start_time, end_time);
                           means UTC)                               segments entirely outside are skipped
    maxBytesPerTrigger     bytes                                    streaming: records per micro-batch, by size
    maxRecordsPerTrigger   records                                  streaming: records per micro-batch, by count
    startingOffsets        earliest (default) | latest              streaming: where a new query starts

Pushed filters: topic = / IN, queue_id = / IN, commitlog_offset and store_timestamp comparisons. Every pushed
filter is applied to each record by the reader, planning only skips what provably holds no match, so a query
gives the same rows with pushdown on or off. Other filters are left to Spark.

How a store is planned (batch), case by case:

    CASE                                              DECISION
    a segment's first 8 bytes are zero                preallocated, not written: not read
    the last written segment                          read up to its written end, found by walking its records
                                                      from the dispatched end (or its start) to the first zero or
                                                      invalid header; the last records' body CRCs are checked, a
                                                      record straddling the end is not included
    a topic filter, region the ConsumeQueues cover    read only the records the topic's queues point to
    a topic filter, region past the dispatched end    walk the records and keep the topic's
    a time filter                                     skip segments whose records are all outside the range,
                                                      trusting store timestamps to grow along the log (as
                                                      RocketMQ's own time lookups do)
    a segment larger than the partition target        split at record starts taken from the ConsumeQueues; each
                                                      split is checked by the reader before it, which must land
                                                      exactly on it
    small segments                                    grouped, so each core gets about two partitions

Consistency: every partition carries the byte ranges fixed at planning, so a read sees each store up to its
end at planning time while a writer appends. A segment deleted (or shrunk) under a running read raises
StoreIOError naming it; bytes that break the format raise CorruptionError with file and offset.

Streaming offsets are `{"stores": {"<absolute store path>": <commitlog offset>}}`: the offset up to which a
store has been read, always a record start (or a segment end). Micro-batches end at record starts, so a
restarted query resumes exactly where its checkpoint says. A glob is expanded when the query starts; a store
missing from the checkpoint (matched since) is read from its beginning, and a moved store is a new store. maxRecordsPerTrigger / maxBytesPerTrigger count the log
records a micro-batch reads (before filters), shared between the stores with new records; a micro-batch
always takes at least one record. Trigger.AvailableNow reads up to each store's written end when the query
starts. Records deleted by retention before a query read them raise StoreIOError.

Decoding: the reader finds record starts with numpy (magic codes, then PHYSICALOFFSET equal to the position,
then a check that the TOTALSIZE chain links them; a Python walk when it does not), gathers all fixed headers at
once as a big-endian structured array, and builds every column as Arrow arrays from the segment bytes (bodies,
topics and property names/values are slices copied by Arrow's `take`, the properties are split at their
separators with numpy). Version-2 records, IPv6 hosts and properties that are not plain 'name\x01value\x02'
pairs take a per-record path (commitlog.message.decode_message, commitlog.format.decode_properties).

Caveat: the ConsumeQueue path sees what RocketMQ dispatches. A record with a transaction-prepared or
rolled-back SYSFLAG is never put in a ConsumeQueue, so a topic filter does not return it while a full scan
does. Brokers store half messages under RMQ_SYS_TRANS_HALF_TOPIC as ordinary records, and mqstore cannot write
such flags, so this only concerns logs written through DefaultMessageStore by other means.
"""

from __future__ import annotations

import bisect
import calendar
import dataclasses
import datetime
import glob
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, EqualTo,
                                    GreaterThan, GreaterThanOrEqual, In, InputPartition, IsNotNull, LessThan,
                                    LessThanOrEqual)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField,
                               StructType, TimestampType)

from commitlog import format as fmt
from commitlog.errors import CorruptionError, StoreError, StoreIOError
from commitlog.message import decode_message
from consumequeue import format as cqfmt

__all__ = ["CommitLogDataSource", "CommitLogSourceError", "commitlog_schema"]

FORMAT_NAME = "commitlog"
STORE_COLUMN = "store"

# --- named limits ---------------------------------------------------------------------------------------------
MIB = 1 << 20
READ_CHUNK_BYTES = 16 * MIB  # a reader holds at most this much of a segment at once (or one larger record)
BATCH_RECORDS_MAX = 32768  # rows per RecordBatch handed to Spark
PARTITION_BYTES_MAX = 64 * MIB  # log bytes per partition, at most
PARTITION_BYTES_MIN = 64 * 1024  # below this a partition costs more to schedule than to read
PARTITIONS_PER_CORE = 2
QUEUE_PARTITION_RECORDS_MAX = 262144  # records per partition on the ConsumeQueue path
QUEUE_GAP_BYTES = 16 * 1024  # ConsumeQueue path: records closer than this are read with one pread
TAIL_CRC_RECORDS = 64  # records before a written end whose body CRC is checked when planning
BOUNDARY_QUEUES_MAX = 16  # queues searched for a record start to split a segment at
VIEW_INLINE_BYTES = 12  # Arrow binary views hold values up to 12 bytes inline
BUFFER_PAD_BYTES = 16  # zeros after every read buffer, so fixed-width windows never run off its end

# --- the record header as one big-endian structured dtype (v1, IPv4 hosts) -------------------------------------
HEADER_DTYPE = np.dtype([
    ("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"), ("born_timestamp", ">i8"),
    ("born_host", "V8"), ("store_timestamp", ">i8"), ("store_host", "V8"), ("reconsume_times", ">i4"),
    ("prepared_transaction_offset", ">i8"), ("body_length", ">i4"),
])
assert HEADER_DTYPE.itemsize == fmt.HEADER_SIZE == fmt.HEADER_V1.size
assert HEADER_DTYPE.fields["physical_offset"][1] == fmt.OFFSET_PHYSICAL_OFFSET
assert HEADER_DTYPE.fields["store_timestamp"][1] == fmt.OFFSET_STORE_TIMESTAMP
assert HEADER_DTYPE.fields["store_host"][1] == fmt.OFFSET_STORE_HOST
assert HEADER_DTYPE.fields["body_length"][1] == fmt.OFFSET_BODY_LENGTH
assert fmt.RECORD_SIZE_MIN > fmt.OFFSET_PHYSICAL_OFFSET + 8

_MAGIC_FIRST_BYTE = fmt.MESSAGE_MAGIC_CODE >> 24
_MAGIC_MIDDLE = ((fmt.MESSAGE_MAGIC_CODE >> 16) & 0xFF, (fmt.MESSAGE_MAGIC_CODE >> 8) & 0xFF)
_MAGIC_LAST = (fmt.MESSAGE_MAGIC_CODE & 0xFF, fmt.MESSAGE_MAGIC_CODE_V2 & 0xFF)
assert fmt.MESSAGE_MAGIC_CODE >> 8 == fmt.MESSAGE_MAGIC_CODE_V2 >> 8
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_TAGS_WORD = np.frombuffer(fmt.PROPERTY_TAGS.encode("ascii"), dtype=np.uint32)[0]
_KEYS_WORD = np.frombuffer(fmt.PROPERTY_KEYS.encode("ascii"), dtype=np.uint32)[0]
_HEX_PAIRS = np.frombuffer(b"".join(f"{b:02X}".encode() for b in range(256)), dtype=np.uint16)  # 2 digits a byte
_INLINE_INDEX = np.arange(VIEW_INLINE_BYTES)


# --- errors ---------------------------------------------------------------------------------------------------
class CommitLogSourceError(StoreError, ValueError):
    """A path or option given to the commitlog data source is refused (the message names it)."""


# --- schema ---------------------------------------------------------------------------------------------------
_FIELDS = (
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("commitlog_offset", LongType(), False),
    StructField("body", BinaryType(), False),
    StructField("tags", StringType(), True),
    StructField("keys", ArrayType(StringType(), False), False),
    StructField("properties", MapType(StringType(), StringType(), False), False),
    StructField("flag", IntegerType(), False),
    StructField("sys_flag", IntegerType(), False),
    StructField("born_timestamp", TimestampType(), False),
    StructField("store_timestamp", TimestampType(), False),
    StructField("born_host", StringType(), False),
    StructField("store_host", StringType(), False),
    StructField("reconsume_times", IntegerType(), False),
    StructField("body_crc", IntegerType(), False),
    StructField("msg_id", StringType(), False),
)


_NON_NULL_COLUMNS = frozenset(f.name for f in _FIELDS if not f.nullable) | {STORE_COLUMN}


def commitlog_schema(with_store_column: bool = False) -> StructType:
    """The rows the source produces; `store` names the store of each row when several can be loaded."""
    fields = list(_FIELDS)
    if with_store_column:
        fields.append(StructField(STORE_COLUMN, StringType(), False))
    return StructType(fields)


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks our batches against (its own conversion, timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# --- options --------------------------------------------------------------------------------------------------
_OPTIONS = ("path", "paths", "topic", "queue_id", "start_offset", "end_offset", "start_time", "end_time",
            "maxBytesPerTrigger", "maxRecordsPerTrigger", "startingOffsets")
_OPTION_NAMES = {name.lower(): name for name in _OPTIONS}


@dataclass(frozen=True)
class RowFilter:
    """What a row must satisfy: the AND of the options and the pushed filters. None means no condition.

    Offsets and times are half-open ranges [lo, hi); times in microseconds since the epoch (Spark's unit).
    """

    topics: frozenset | None = None
    queue_ids: frozenset | None = None
    offset_lo: int | None = None
    offset_hi: int | None = None
    time_lo_us: int | None = None
    time_hi_us: int | None = None

    def narrowed(self, **changes) -> "RowFilter":
        """This filter AND the given conditions (sets intersect, ranges shrink)."""
        merged = {}
        for name, value in changes.items():
            current = getattr(self, name)
            if value is None:
                continue
            if name in ("topics", "queue_ids"):
                merged[name] = value if current is None else current & value
            elif name.endswith("_lo") or name.endswith("_lo_us"):
                merged[name] = value if current is None else max(current, value)
            else:
                merged[name] = value if current is None else min(current, value)
        return dataclasses.replace(self, **merged)

    def is_empty(self) -> bool:
        """True when no row can pass."""
        return (self.topics == frozenset() or self.queue_ids == frozenset()
                or _empty_range(self.offset_lo, self.offset_hi) or _empty_range(self.time_lo_us, self.time_hi_us))


def _empty_range(lo, hi) -> bool:
    return lo is not None and hi is not None and lo >= hi


@dataclass(frozen=True)
class StoreRef:
    """One store to read: its absolute root and the label of its `store` column (None without the column)."""

    root: str
    label: str | None


@dataclass(frozen=True)
class SourceOptions:
    """The options of one load(), checked."""

    stores: tuple
    with_store_column: bool
    row_filter: RowFilter
    max_bytes_per_trigger: int | None
    max_records_per_trigger: int | None
    starting_offsets: str


def parse_options(options) -> SourceOptions:
    """Check every option; CommitLogSourceError names the first bad path or option."""
    values = {}
    for key, value in dict(options).items():
        name = _OPTION_NAMES.get(key.lower())
        if name is None:
            raise CommitLogSourceError(f"unknown option {key!r} for the {FORMAT_NAME} source; "
                                       f"known options: {', '.join(_OPTIONS[2:])}")
        values[name] = value
    stores, with_store = _resolve_paths(values)
    row_filter = RowFilter(
        topics=_name_set(values, "topic"),
        queue_ids=_int_set(values, "queue_id"),
        offset_lo=_int_option(values, "start_offset", 0),
        offset_hi=_int_option(values, "end_offset", 0),
        time_lo_us=_time_option(values, "start_time"),
        time_hi_us=_time_option(values, "end_time"),
    )
    starting = values.get("startingOffsets", "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise CommitLogSourceError(f"option 'startingOffsets' must be 'earliest' or 'latest', got {starting!r}")
    return SourceOptions(
        stores=stores, with_store_column=with_store, row_filter=row_filter,
        max_bytes_per_trigger=_int_option(values, "maxBytesPerTrigger", 1),
        max_records_per_trigger=_int_option(values, "maxRecordsPerTrigger", 1),
        starting_offsets=starting,
    )


def _resolve_paths(values) -> tuple[tuple, bool]:
    if "paths" in values:
        try:
            given = json.loads(values["paths"])
        except ValueError as exc:
            raise CommitLogSourceError(f"option 'paths' is not a JSON list: {values['paths']!r}") from exc
        if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
            raise CommitLogSourceError(f"option 'paths' is not a JSON list of strings: {values['paths']!r}")
        if "path" in values:
            given = [values["path"], *given]
    elif "path" in values:
        given = [values["path"]]
    else:
        raise CommitLogSourceError(f"no store path: use spark.read.format({FORMAT_NAME!r}).load('/path/to/store')")
    if not given:
        raise CommitLogSourceError("no store path: the list of paths is empty")
    several = len(given) > 1 or any(glob.has_magic(p) for p in given)
    stores, seen = [], set()
    for pattern in given:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise CommitLogSourceError(f"no store matches the path pattern {pattern!r}")
        for path in matches:
            root = os.path.abspath(path)
            if not os.path.exists(root):
                raise CommitLogSourceError(f"store path does not exist: {path}")
            if not os.path.isdir(root):
                raise CommitLogSourceError(f"store path is not a directory: {path}")
            if not os.path.isdir(os.path.join(root, "commitlog")):
                raise CommitLogSourceError(f"not a RocketMQ store (no commitlog/ directory): {path}")
            real = os.path.realpath(root)
            if real not in seen:
                seen.add(real)
                stores.append(StoreRef(root, root if several else None))
    return tuple(stores), several


def _name_set(values, name) -> frozenset | None:
    if name not in values:
        return None
    names = [part.strip() for part in values[name].split(",")]
    if not all(names):
        raise CommitLogSourceError(f"option {name!r} has an empty name: {values[name]!r}")
    return frozenset(names)


def _int_set(values, name) -> frozenset | None:
    if name not in values:
        return None
    try:
        ids = [int(part) for part in values[name].split(",")]
    except ValueError as exc:
        raise CommitLogSourceError(f"option {name!r} must be integers separated by commas, got {values[name]!r}") \
            from exc
    if any(i < 0 for i in ids):
        raise CommitLogSourceError(f"option {name!r} must not be negative, got {values[name]!r}")
    return frozenset(ids)


def _int_option(values, name, minimum) -> int | None:
    if name not in values:
        return None
    try:
        value = int(str(values[name]).strip())
    except ValueError as exc:
        raise CommitLogSourceError(f"option {name!r} must be an integer, got {values[name]!r}") from exc
    if value < minimum:
        raise CommitLogSourceError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _time_option(values, name) -> int | None:
    """Milliseconds since the epoch or an ISO-8601 timestamp, as microseconds since the epoch."""
    if name not in values:
        return None
    text = str(values[name]).strip()
    try:
        return int(text) * 1000
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommitLogSourceError(f"option {name!r} must be milliseconds since the epoch or an ISO-8601 "
                                   f"timestamp, got {text!r}") from exc
    return _datetime_us(moment)


def _datetime_us(moment) -> int:
    """Microseconds since the epoch of a datetime (naive means UTC) or a date."""
    if isinstance(moment, datetime.datetime):
        if moment.tzinfo is not None:
            moment = moment.astimezone(datetime.timezone.utc)
        return calendar.timegm(moment.timetuple()) * 1_000_000 + moment.microsecond
    return calendar.timegm(moment.timetuple()) * 1_000_000


# --- pushdown -------------------------------------------------------------------------------------------------
def push_filters(row_filter: RowFilter, filters) -> tuple[RowFilter, list]:
    """Fold the filters we can apply exactly into `row_filter`; return it and the filters left to Spark."""
    rest = []
    for item in filters:
        narrowed = _fold_filter(row_filter, item)
        if narrowed is None:
            rest.append(item)
        else:
            row_filter = narrowed
    return row_filter, rest


def _fold_filter(row_filter: RowFilter, item) -> RowFilter | None:
    column = item.attribute[0] if len(getattr(item, "attribute", ())) == 1 else None
    if isinstance(item, IsNotNull):
        return row_filter if column in _NON_NULL_COLUMNS else None  # always true of such a column
    if column in ("topic", "queue_id"):
        kind = str if column == "topic" else int
        if isinstance(item, EqualTo):
            values = (item.value,)
        elif isinstance(item, In):
            values = tuple(item.value)
        else:
            return None
        if not all(type(v) is kind for v in values):
            return None
        key = "topics" if column == "topic" else "queue_ids"
        return row_filter.narrowed(**{key: frozenset(values)})
    if column == "commitlog_offset":
        value = item.value if type(getattr(item, "value", None)) is int else None
        keys = ("offset_lo", "offset_hi")
    elif column == "store_timestamp":
        value = getattr(item, "value", None)
        value = _datetime_us(value) if isinstance(value, (datetime.datetime, datetime.date)) else None
        keys = ("time_lo_us", "time_hi_us")
    else:
        return None
    if value is None:
        return None
    lo, hi = keys
    if isinstance(item, EqualTo):
        return row_filter.narrowed(**{lo: value, hi: value + 1})
    if isinstance(item, GreaterThan):
        return row_filter.narrowed(**{lo: value + 1})
    if isinstance(item, GreaterThanOrEqual):
        return row_filter.narrowed(**{lo: value})
    if isinstance(item, LessThan):
        return row_filter.narrowed(**{hi: value})
    if isinstance(item, LessThanOrEqual):
        return row_filter.narrowed(**{hi: value + 1})
    return None


# --- reading files --------------------------------------------------------------------------------------------
def _open_segment(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise StoreIOError(f"segment {path} was deleted while the read was running (retention?); the rows "
                           f"planned from it can no longer be read") from exc
    except OSError as exc:
        raise StoreIOError(f"cannot open segment {path}: {exc.strerror}") from exc


def _pread(fd: int, path: str, file_offset: int, length: int, out: np.ndarray | None = None,
           out_at: int = 0) -> np.ndarray:
    """`length` bytes at `file_offset`, into a zero-padded array (or into `out` at `out_at`)."""
    if out is None:
        out = np.zeros(length + BUFFER_PAD_BYTES, dtype=np.uint8)
        out_at = 0
    view = memoryview(out)[out_at:out_at + length]
    done = 0
    while done < length:
        try:
            got = os.preadv(fd, [view[done:]], file_offset + done)
        except OSError as exc:
            raise StoreIOError(f"cannot read segment {path} at {file_offset + done}: {exc.strerror}") from exc
        if got == 0:
            raise StoreIOError(f"segment {path} is shorter than planned ({file_offset + done} bytes; {length - done} "
                               f"more were expected): it was truncated or replaced while the read was running")
        done += got
    return out


# --- store layout ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segments:
    """The segment files of one store at planning time: `bases` ascending, all `segment_size` long."""

    directory: str
    segment_size: int
    bases: tuple

    def path(self, base: int) -> str:
        return os.path.join(self.directory, fmt.segment_name(base))

    @property
    def start(self) -> int:
        return self.bases[0] if self.bases else 0

    def base_of(self, commitlog_offset: int) -> int:
        """The base of the segment holding `commitlog_offset` (which may be one past the last byte)."""
        return commitlog_offset - (commitlog_offset - self.start) % self.segment_size


def list_segments(root: str) -> Segments:
    """The store's segments; CorruptionError when their sizes or names break the layout rule."""
    directory = os.path.join(root, "commitlog")
    try:
        names = os.listdir(directory)
    except FileNotFoundError as exc:
        raise CommitLogSourceError(f"not a RocketMQ store (no commitlog/ directory): {root}") from exc
    bases = sorted(b for b in (fmt.parse_segment_name(n) for n in names) if b is not None)
    if not bases:
        return Segments(directory, 0, ())
    sizes = {}
    for base in bases:
        try:
            sizes[base] = os.stat(os.path.join(directory, fmt.segment_name(base))).st_size
        except FileNotFoundError:
            sizes[base] = None  # deleted by retention while listing
    bases = [b for b in bases if sizes[b] is not None]
    if not bases:
        return Segments(directory, 0, ())
    size = sizes[bases[-1]]
    for base in bases:
        if sizes[base] != size or size <= 0:
            raise CorruptionError(f"segment is {sizes[base]} bytes, the store's segments are {size}",
                                  path=os.path.join(directory, fmt.segment_name(base)), rule="segment size")
    for previous, base in zip(bases, bases[1:]):
        if base - previous != size:
            raise CorruptionError(f"segments are not contiguous: {fmt.segment_name(previous)} is followed by "
                                  f"{fmt.segment_name(base)}", path=directory, rule="contiguous")
    return Segments(directory, size, tuple(bases))


# --- ConsumeQueues --------------------------------------------------------------------------------------------
class QueueIndex:
    """The ConsumeQueue files of one store, read on demand (planning only: never pickled into partitions)."""

    def __init__(self, root: str):
        self.directory = os.path.join(root, "consumequeue")
        self._queues = None
        self._first_offsets: dict[str, list[int]] = {}

    def queues(self) -> list[tuple[str, int, str]]:
        """(topic, queue_id, directory) of every queue."""
        if self._queues is None:
            found = []
            try:
                topics = sorted(os.listdir(self.directory))
            except OSError:
                topics = []
            for topic in topics:
                topic_dir = os.path.join(self.directory, topic)
                try:
                    ids = os.listdir(topic_dir)
                except OSError:
                    continue
                for name in ids:
                    if name.isdigit():
                        found.append((topic, int(name), os.path.join(topic_dir, name)))
            self._queues = sorted(found)
        return self._queues

    @staticmethod
    def files(queue_dir: str) -> list[tuple[int, str]]:
        """(first entry number, path) of the queue's files, ascending."""
        try:
            names = os.listdir(queue_dir)
        except OSError:
            return []
        files = []
        for name in names:
            start = cqfmt.parse_file_name(name)
            if start is not None and start % cqfmt.UNIT_SIZE_BYTES == 0:
                files.append((start // cqfmt.UNIT_SIZE_BYTES, os.path.join(queue_dir, name)))
        return sorted(files)

    @staticmethod
    def read_units(path: str, first: int = 0, count: int | None = None) -> np.ndarray:
        """Units [first, first+count) of one file, cut at the first unit with size <= 0 (the queue's end)."""
        try:
            with open(path, "rb") as handle:
                handle.seek(first * cqfmt.UNIT_SIZE_BYTES)
                raw = handle.read(-1 if count is None else count * cqfmt.UNIT_SIZE_BYTES)
        except FileNotFoundError:
            return np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        except OSError as exc:
            raise StoreIOError(f"cannot read ConsumeQueue file {path}: {exc.strerror}") from exc
        units = np.frombuffer(raw[:len(raw) - len(raw) % cqfmt.UNIT_SIZE_BYTES], dtype=cqfmt.CONSUME_QUEUE_UNIT)
        ends = np.flatnonzero(units["size"] <= 0)
        return units[:ends[0]] if len(ends) else units

    def first_offsets(self, queue_dir: str, files) -> list[int]:
        """The commitlog offset of each file's first unit (cached)."""
        cached = self._first_offsets.get(queue_dir)
        if cached is None or len(cached) != len(files):
            cached = []
            for _, path in files:
                units = self.read_units(path, 0, 1)
                cached.append(int(units["commitlog_offset"][0]) if len(units) else 1 << 62)
            self._first_offsets[queue_dir] = cached
        return cached

    def dispatched_end(self) -> tuple[int, int, int] | None:
        """(end, offset, size) of the last unit written to any queue: the log is dispatched up to `end`."""
        best = None
        for _, _, queue_dir in self.queues():
            for first, path in reversed(self.files(queue_dir)):
                last = _last_unit(path)
                if last is not None:
                    offset, size = last
                    if best is None or offset + size > best[0]:
                        best = (offset + size, offset, size)
                    break
        return best

    def boundary_at_or_after(self, commitlog_offset: int, limit: int) -> int | None:
        """A record start in [commitlog_offset, limit) taken from the biggest queues, or None."""
        ranked = sorted(((len(self.files(d)), d) for _, _, d in self.queues()), reverse=True)
        best = None
        for _, queue_dir in ranked[:BOUNDARY_QUEUES_MAX]:
            files = self.files(queue_dir)
            firsts = self.first_offsets(queue_dir, files)
            index = max(bisect.bisect_right(firsts, commitlog_offset) - 1, 0)
            for _, path in files[index:index + 2]:
                found = _first_unit_at_or_after(path, commitlog_offset)
                if found is not None:
                    if found < limit and (best is None or found < best):
                        best = found
                    break
        return best

    def entries(self, queue_dir: str, lo: int, hi: int) -> tuple[int, np.ndarray]:
        """(number of the first returned entry, units) of one queue with commitlog offset in [lo, hi)."""
        files = self.files(queue_dir)
        if not files:
            return 0, np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        firsts = self.first_offsets(queue_dir, files)
        start = max(bisect.bisect_right(firsts, lo) - 1, 0)
        stop = bisect.bisect_left(firsts, hi)
        parts, first_number = [], None
        for number, path in files[start:max(stop, start + 1)]:
            units = self.read_units(path)
            offsets = units["commitlog_offset"]
            a, b = np.searchsorted(offsets, lo), np.searchsorted(offsets, hi)
            if a < b:
                if first_number is None:
                    first_number = number + int(a)
                parts.append(units[a:b])
        if not parts:
            return 0, np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)
        return first_number, np.concatenate(parts)


def _unit_at(fd: int, index: int) -> tuple[int, int] | None:
    """(commitlog offset, size) of unit `index` of an open ConsumeQueue file, None past its written end."""
    raw = os.pread(fd, cqfmt.UNIT_SIZE_BYTES, index * cqfmt.UNIT_SIZE_BYTES)
    if len(raw) < cqfmt.UNIT_SIZE_BYTES:
        return None
    unit = np.frombuffer(raw, dtype=cqfmt.CONSUME_QUEUE_UNIT)
    size = int(unit["size"][0])
    return (int(unit["commitlog_offset"][0]), size) if size > 0 else None


def _first_unit_at_or_after(path: str, commitlog_offset: int) -> int | None:
    """The smallest commitlog offset >= `commitlog_offset` among a file's written units (binary search)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        lo, hi = 0, os.fstat(fd).st_size // cqfmt.UNIT_SIZE_BYTES  # the answer is unit lo once lo == hi
        while lo < hi:
            mid = (lo + hi) // 2
            unit = _unit_at(fd, mid)
            if unit is not None and unit[0] < commitlog_offset:
                lo = mid + 1
            else:
                hi = mid
        unit = _unit_at(fd, lo)
        return unit[0] if unit is not None else None
    finally:
        os.close(fd)


def _last_unit(path: str) -> tuple[int, int] | None:
    """(commitlog offset, size) of the last written unit of one ConsumeQueue file, by binary search."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        lo, hi = 0, os.fstat(fd).st_size // cqfmt.UNIT_SIZE_BYTES  # units [0, lo) are written, [hi, ...) not
        while lo < hi:
            mid = (lo + hi) // 2
            if _unit_at(fd, mid) is not None:
                lo = mid + 1
            else:
                hi = mid
        return _unit_at(fd, lo - 1) if lo else None
    finally:
        os.close(fd)


# --- locating records -----------------------------------------------------------------------------------------
# The state of the log right after the located records of a buffer.
NEXT_DONE = "done"  # the records fill the buffer exactly
NEXT_MORE = "more"  # the next record starts in the buffer but ends after it
NEXT_BLANK = "blank"  # a valid end-of-segment blank
NEXT_END = "end"  # zeros or an invalid header (lenient mode only: strict mode raises)


def _window(buf: np.ndarray, width: int) -> np.ndarray:
    return sliding_window_view(buf, width)


def _be_int(buf: np.ndarray, positions: np.ndarray, width: int, dtype: str) -> np.ndarray:
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
    limit = length - fmt.RECORD_SIZE_MIN  # the last start of a complete record
    positions = np.empty(0, dtype=np.int64)
    if limit >= 0:
        hits = np.flatnonzero(buf[4:limit + 5] == _MAGIC_FIRST_BYTE)
        hits = hits[(buf[hits + 5] == _MAGIC_MIDDLE[0]) & (buf[hits + 6] == _MAGIC_MIDDLE[1])
                    & ((buf[hits + 7] == _MAGIC_LAST[0]) | (buf[hits + 7] == _MAGIC_LAST[1]))]
        if len(hits):
            hits = hits[_be_int(buf, hits + fmt.OFFSET_PHYSICAL_OFFSET, 8, ">i8") == buf_abs + hits]
        if len(hits):
            sizes = _be_int(buf, hits, 4, ">i4")
            complete = (sizes >= fmt.RECORD_SIZE_MIN) & (hits + sizes <= length)
            hits, sizes = hits[complete], sizes[complete]
            if len(hits):
                linked = hits[0] == 0 and bool(np.array_equal(hits[1:], hits[:-1] + sizes[:-1]))
                if not linked:
                    return _walk_python(buf, length, buf_abs, segment_end, lenient=lenient, path=path)
                positions = hits.astype(np.int64)
    following = int(positions[-1] + sizes[-1]) if len(positions) else 0
    return positions, following, _classify_next(buf, length, buf_abs, following, segment_end, lenient, path)


def _classify_next(buf, length, buf_abs, at, segment_end, lenient, path) -> str:
    """What follows the located records: see NEXT_*."""
    if at == length:
        return NEXT_DONE
    if length - at < fmt.END_FILE_MIN_BLANK_LENGTH:
        if buf_abs + length < segment_end:
            return NEXT_MORE  # the header continues in the next read
        if lenient:
            return NEXT_END
        raise CorruptionError(f"{length - at} bytes are left at the end of the segment, less than a blank",
                              path=path, offset=buf_abs + at, rule="1")
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
        raise CorruptionError(f"the log ends at offset {offset}, before the end planned for this read: was the "
                              f"store truncated or a segment replaced?", path=path, offset=offset, rule="end")
    fmt.locate(buf, at, segment_end - offset, offset, path=path)  # raises with the rule that failed
    raise CorruptionError("a record the chain check refused", path=path, offset=offset, rule="4")


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
    return (np.array(positions, dtype=np.int64), at,
            _classify_next(buf, length, buf_abs, at, segment_end, lenient, path))


# --- decoding into Arrow --------------------------------------------------------------------------------------
class FastLayout:
    """Where the parts of many records lie, computed at once for version-1 records with IPv4 hosts.

    `fast[i]` is True when record i is such a record and passes validity rules (2) to (4) (its PHYSICALOFFSET
    is `offsets[i]`); every other record (version 2, IPv6 hosts, or invalid) goes through decode_message.
    """

    def __init__(self, buf: np.ndarray, positions: np.ndarray, offsets: np.ndarray):
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
        self.fast = fast


class Decoder:
    """Turns located records into RecordBatches of one Arrow schema, applying a RowFilter to every record."""

    def __init__(self, arrow_schema: pa.Schema, row_filter: RowFilter, label: str | None):
        self.schema = arrow_schema
        self.row_filter = row_filter
        self.label = label
        self.map_type = arrow_schema.field("properties").type
        self.list_type = arrow_schema.field("keys").type
        self.timestamp_type = arrow_schema.field("store_timestamp").type
        topics = row_filter.topics
        self.topic_values = pa.array(sorted(topics), pa.string()) if topics is not None else None
        self.queue_values = np.array(sorted(row_filter.queue_ids), dtype=np.int64) \
            if row_filter.queue_ids is not None else None

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
        layout = FastLayout(buf, positions, offsets)
        if expect_sizes is not None:
            mismatch = np.flatnonzero(layout.size != expect_sizes)
            if len(mismatch):
                i = mismatch[0]
                raise CorruptionError(f"a ConsumeQueue unit says {int(expect_sizes[i])} bytes, the record there has "
                                      f"TOTALSIZE {int(layout.size[i])}", path=path, offset=int(offsets[i]), rule="cq")
        fast = layout.fast
        keep_fast = np.flatnonzero(self._numeric_mask(layout.header, offsets) & fast)
        batch = None
        if len(keep_fast):
            batch = self._fast_batch(buf, layout, keep_fast, expect_topic, path)
        slow = np.flatnonzero(~fast)
        if len(slow):
            batch = self._merge_slow(batch, buf, positions[slow], offsets[slow], segment_ends[slow], path,
                                     expect_topic)
        return batch

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

    def _fast_batch(self, buf, layout: "FastLayout", rows: np.ndarray, expect_topic, path):
        chosen = slice(None) if len(rows) == len(layout.positions) else rows  # a slice copies nothing
        header_bytes, header, positions = layout.header_bytes[chosen], layout.header[chosen], layout.positions[chosen]
        body_length, topic_at = layout.body_length[chosen], layout.topic_at[chosen]
        topic_length = layout.topic_length[chosen]
        properties_at, properties_length = layout.properties_at[chosen], layout.properties_length[chosen]
        topics = _slices(pa.string(), buf, topic_at + 1, topic_length)
        if len(topics) and int(np.frombuffer(topics.buffers()[2], dtype=np.uint8).max(initial=0)) >= 0x80:
            bad = int(np.flatnonzero(~np.asarray(pc.string_is_ascii(topics)))[0])
            raise CorruptionError(f"topic is not ASCII: {topics[bad]}", path=path,
                                  offset=int(header["physical_offset"][bad]), rule="3")
        if expect_topic is not None:
            wrong = np.flatnonzero(~np.asarray(pc.equal(topics, expect_topic)))
            if len(wrong):
                raise CorruptionError(f"a ConsumeQueue of topic {expect_topic!r} points at a record of topic "
                                      f"{topics[int(wrong[0])].as_py()!r}", path=path,
                                      offset=int(header["physical_offset"][wrong[0]]), rule="cq")
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
            message = decode_message(raw, position, segment_end - offset, offset, path=path)
            if expect_topic is not None and message.topic != expect_topic:
                raise CorruptionError(f"a ConsumeQueue of topic {expect_topic!r} points at a record of topic "
                                      f"{message.topic!r}", path=path, offset=offset, rule="cq")
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


# --- partitions -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """Records of one segment from `start` (a record start) to `end`: exactly, or up to the segment's blank."""

    base: int
    start: int
    end: int


class LogPartition(InputPartition):
    """Pieces of one store's log, read by walking their records."""

    def __init__(self, root: str, label: str | None, segment_size: int, pieces: tuple):
        self.root, self.label, self.segment_size, self.pieces = root, label, segment_size, pieces


class QueuePartition(InputPartition):
    """Records of one store found through ConsumeQueues: (topic, queue directory, first entry, count) slices."""

    def __init__(self, root: str, label: str | None, segment_size: int, first_base: int, slices: tuple):
        self.root, self.label, self.segment_size, self.slices = root, label, segment_size, slices
        self.first_base = first_base


def read_partition(partition, arrow_schema: pa.Schema, row_filter: RowFilter) -> Iterator[pa.RecordBatch]:
    """The RecordBatches of one partition (shared by the batch and the stream reader)."""
    if isinstance(partition, LogPartition):
        decoder = Decoder(arrow_schema, row_filter, partition.label)
        directory = os.path.join(partition.root, "commitlog")
        for piece in partition.pieces:
            yield from _read_piece(decoder, directory, partition.segment_size, piece)
    elif isinstance(partition, QueuePartition):
        decoder = Decoder(arrow_schema, row_filter, partition.label)
        yield from _read_queue_slices(decoder, partition)


def _read_piece(decoder: Decoder, directory: str, segment_size: int, piece: Piece):
    """Decode the records of one piece, READ_CHUNK_BYTES at a time; the last must end exactly at piece.end."""
    path = os.path.join(directory, fmt.segment_name(piece.base))
    segment_end = piece.base + segment_size
    fd = _open_segment(path)
    try:
        position = piece.start
        want_min = 0
        while position < piece.end:
            want = min(piece.end - position, max(READ_CHUNK_BYTES, want_min))
            buf = _pread(fd, path, position - piece.base, want)
            positions, following, state = locate_records(buf, want, position, segment_end, lenient=False, path=path)
            if len(positions):
                offsets = positions + position
                yield from decoder.decode(buf, positions, offsets, np.full(len(positions), segment_end), path)
            if state == NEXT_BLANK:
                if piece.end != segment_end:
                    raise CorruptionError(f"a blank ends the segment at {position + following}, before the end "
                                          f"{piece.end} planned for this read", path=path,
                                          offset=position + following, rule="blank")
                return
            want_min = 0
            if state == NEXT_MORE:
                size = _record_size(buf, want, following)
                if position + following + max(size, fmt.END_FILE_MIN_BLANK_LENGTH) > piece.end:
                    raise CorruptionError(f"the record at {position + following} runs past the end {piece.end} "
                                          f"planned for this read", path=path, offset=position + following, rule="2")
                if following == 0:
                    assert size > want, (size, want)  # else locate_records would have returned the record
                    want_min = size
            position += following
    finally:
        os.close(fd)


def _record_size(buf: np.ndarray, length: int, at: int) -> int:
    """TOTALSIZE of the record at `at`, or 0 when its first 4 bytes are not in buf[:length]."""
    return fmt.I32.unpack_from(buf, at)[0] if at + 4 <= length else 0


def _read_queue_slices(decoder: Decoder, partition: QueuePartition):
    """Gather the records the partition's ConsumeQueue slices point to, topic by topic, segment by segment."""
    by_topic: dict[str, list[np.ndarray]] = {}
    for topic, queue_dir, first, count in partition.slices:
        by_topic.setdefault(topic, []).append(_read_queue_range(queue_dir, first, count))
    directory = os.path.join(partition.root, "commitlog")
    size = partition.segment_size
    for topic, parts in sorted(by_topic.items()):
        units = np.concatenate(parts)
        order = np.argsort(units["commitlog_offset"], kind="stable")
        offsets = units["commitlog_offset"][order].astype(np.int64)
        sizes = units["size"][order].astype(np.int64)
        if not len(offsets):
            continue
        bases = offsets - (offsets - partition.first_base) % size
        cuts = np.flatnonzero(np.diff(bases)) + 1
        for group in np.split(np.arange(len(offsets)), cuts):
            yield from _gather_segment(decoder, directory, int(bases[group[0]]), size, offsets[group], sizes[group],
                                       topic)


def _read_queue_range(queue_dir: str, first: int, count: int) -> np.ndarray:
    """Units [first, first+count) of a queue; CorruptionError when fewer are written than were planned."""
    parts, number, left = [], first, count
    files = QueueIndex.files(queue_dir)
    starts = [f for f, _ in files]
    while left > 0:
        index = bisect.bisect_right(starts, number) - 1
        if index < 0:
            raise StoreIOError(f"ConsumeQueue file of entry {number} in {queue_dir} was deleted while the read was "
                               f"running")
        file_first, path = files[index]
        next_first = starts[index + 1] if index + 1 < len(starts) else None
        take = left if next_first is None else min(left, next_first - number)
        got = QueueIndex.read_units(path, number - file_first, take)
        if len(got) < take:
            raise CorruptionError(f"ConsumeQueue holds {len(got)} of the {take} units planned from entry {number}",
                                  path=path, offset=(number - file_first) * cqfmt.UNIT_SIZE_BYTES, rule="cq")
        parts.append(got)
        number += take
        left -= take
    return np.concatenate(parts) if parts else np.empty(0, dtype=cqfmt.CONSUME_QUEUE_UNIT)


def _gather_segment(decoder: Decoder, directory: str, base: int, segment_size: int, offsets: np.ndarray,
                    sizes: np.ndarray, topic: str):
    """Read the records at `offsets` of one segment (runs of close records with one pread each) and decode."""
    path = os.path.join(directory, fmt.segment_name(base))
    if np.any(sizes < fmt.RECORD_SIZE_MIN) or np.any(offsets + sizes > base + segment_size):
        bad = int(np.flatnonzero((sizes < fmt.RECORD_SIZE_MIN) | (offsets + sizes > base + segment_size))[0])
        raise CorruptionError(f"a ConsumeQueue unit of topic {topic!r} says {int(sizes[bad])} bytes at "
                              f"{int(offsets[bad])}", path=path, offset=int(offsets[bad]), rule="cq")
    fd = _open_segment(path)
    try:
        at = 0
        while at < len(offsets):
            # one buffer of at most READ_CHUNK_BYTES (or one record), made of runs of close records
            ends = offsets + sizes
            gaps = offsets[at + 1:] - ends[at:-1]
            budget = np.cumsum(sizes[at:])
            stop = at + max(int(np.searchsorted(budget, READ_CHUNK_BYTES, side="right")), 1)
            run_breaks = np.flatnonzero(gaps[:stop - at - 1] > QUEUE_GAP_BYTES) + at + 1
            run_starts = np.concatenate(([at], run_breaks))
            run_stops = np.concatenate((run_breaks, [stop]))
            run_lengths = np.maximum.reduceat(ends[at:stop], run_starts - at) - offsets[run_starts]
            buf = np.zeros(int(run_lengths.sum()) + BUFFER_PAD_BYTES, dtype=np.uint8)
            into = 0
            positions = np.empty(stop - at, dtype=np.int64)
            for a, b, length in zip(run_starts.tolist(), run_stops.tolist(), run_lengths.tolist()):
                _pread(fd, path, int(offsets[a]) - base, length, out=buf, out_at=into)
                positions[a - at:b - at] = offsets[a:b] - offsets[a] + into
                into += length
            yield from decoder.decode(buf, positions, offsets[at:stop], np.full(stop - at, base + segment_size), path,
                                      expect_topic=topic, expect_sizes=sizes[at:stop])
            at = stop
    finally:
        os.close(fd)


# --- planning: where a store's written log ends -----------------------------------------------------------------
@dataclass
class StorePlan:
    """What planning learned about one store: its segments, written end, dispatched end, known record starts."""

    ref: StoreRef
    segments: Segments
    end: int
    dispatched_end: int | None
    queues: QueueIndex
    boundaries: list


def plan_store(ref: StoreRef, known_start: int | None = None) -> StorePlan:
    """Snapshot one store: its written end now (walking from the best known record start)."""
    segments = list_segments(ref.root)
    queues = QueueIndex(ref.root)
    dispatched = _verified_dispatched_end(segments, queues)
    starts = [s for s in (dispatched, known_start) if s is not None]
    end, boundaries = written_end(segments, starts)
    if dispatched is not None and dispatched > end:
        dispatched = end
    return StorePlan(ref, segments, end, dispatched, queues, boundaries)


def _verified_dispatched_end(segments: Segments, queues: QueueIndex) -> int | None:
    """The ConsumeQueues' dispatched end, when the record their last unit points to is where they say."""
    found = queues.dispatched_end()
    if found is None or not segments.bases:
        return None
    end, offset, size = found
    base = segments.base_of(offset)
    if offset < segments.start or base not in segments.bases or end > base + segments.segment_size:
        return None
    try:
        fd = os.open(segments.path(base), os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.pread(fd, fmt.OFFSET_PHYSICAL_OFFSET + 8, offset - base)
    finally:
        os.close(fd)
    if len(head) < fmt.OFFSET_PHYSICAL_OFFSET + 8:
        return None
    total, magic = fmt.BLANK.unpack_from(head, 0)
    physical = fmt.struct.unpack_from(">q", head, fmt.OFFSET_PHYSICAL_OFFSET)[0]
    if magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2) or total != size or physical != offset:
        return None
    return end


def written_end(segments: Segments, known_starts=()) -> tuple[int, list]:
    """(written end of the log, record starts met on the way), walking the last written segment.

    The last written segment is the last one whose first header is not zero (the writer may have created the
    next one already). Its records are walked from the latest known record start in it up to the first zero
    or invalid header; the body CRC of the last TAIL_CRC_RECORDS records is checked, so a record still being
    written is not counted.
    """
    if not segments.bases:
        return 0, []
    size = segments.segment_size
    for base in reversed(segments.bases):
        fd = _open_segment(segments.path(base))
        try:
            head = os.pread(fd, fmt.END_FILE_MIN_BLANK_LENGTH, 0)
        finally:
            os.close(fd)
        if head.strip(b"\0"):
            break
    else:
        return segments.start, []
    start = base
    for known in known_starts:
        if base < known <= base + size:
            start = max(start, known)
    if start == base + size:
        return start, [start]
    return _walk_to_end(segments.path(base), base, size, start)


def _walk_to_end(path: str, base: int, size: int, start: int) -> tuple[int, list]:
    segment_end = base + size
    boundaries = [start]
    recent: list[tuple[int, int]] = []
    position, want_min, end = start, 0, None
    fd = _open_segment(path)
    try:
        while position < segment_end and end is None:
            want = min(segment_end - position, max(READ_CHUNK_BYTES, want_min))
            buf = _pread(fd, path, position - base, want)
            positions, following, state = locate_records(buf, want, position, segment_end, lenient=True, path=path)
            if len(positions):
                valid = _structure_valid(buf, positions, position, segment_end, path)
                if not valid.all():
                    first_bad = int(np.flatnonzero(~valid)[0])
                    following, state = int(positions[first_bad]), NEXT_END
                    positions = positions[:first_bad]
                sizes = _be_int(buf, positions, 4, ">i4") if len(positions) else positions
                recent = (recent + list(zip((positions + position).tolist(), sizes.tolist())))[-TAIL_CRC_RECORDS:]
            if state == NEXT_BLANK:
                end = segment_end
            elif state == NEXT_END:
                end = position + following
            elif state == NEXT_MORE and following == 0:  # one record larger than a read chunk
                want_min = _record_size(buf, want, 0)
                assert want_min > want, (want_min, want)  # else locate_records would have returned it
            else:
                want_min = 0
                position += following
                boundaries.append(position)
        if end is None:
            end = position
        for offset, record_size in recent:
            if offset >= end:
                break
            record = _pread(fd, path, offset - base, record_size)
            message = decode_message(record.data, 0, segment_end - offset, offset, path=path)
            if fmt.body_crc(message.body) != message.body_crc:
                end = offset  # a record still being written: not part of the snapshot
                break
    finally:
        os.close(fd)
    return end, [b for b in boundaries if b < end]


def _structure_valid(buf, positions, buf_abs, segment_end, path) -> np.ndarray:
    """Rules (1) to (4) for each located record (vectorized; decode_message for the rare kinds)."""
    layout = FastLayout(buf, positions, positions + buf_abs)
    valid = layout.fast.copy()
    for i in np.flatnonzero(~valid).tolist():
        offset = int(positions[i]) + buf_abs
        try:
            decode_message(buf.data, int(positions[i]), segment_end - offset, offset, path=path)
            valid[i] = True
        except CorruptionError:
            break
    return valid


# --- planning: partitions -------------------------------------------------------------------------------------
def _segment_first_timestamps_us(plan: StorePlan) -> dict[int, int | None]:
    """The store timestamp of each segment's first record (None when it does not start with a record)."""
    found = {}
    for base in plan.segments.bases:
        if base >= plan.end:
            break
        try:
            fd = os.open(plan.segments.path(base), os.O_RDONLY)
            try:
                head = os.pread(fd, fmt.OFFSET_STORE_TIMESTAMP + 8, 0)
            finally:
                os.close(fd)
        except FileNotFoundError:
            found[base] = None
            continue
        total, magic = fmt.BLANK.unpack_from(head, 0)
        found[base] = (fmt.struct.unpack_from(">q", head, fmt.OFFSET_STORE_TIMESTAMP)[0] * 1000
                       if magic == fmt.MESSAGE_MAGIC_CODE else None)
    return found


def _time_allowed(plan: StorePlan, row_filter: RowFilter):
    """The segment bases that may hold a record in the time range (None: all), by first timestamps."""
    lo, hi = row_filter.time_lo_us, row_filter.time_hi_us
    if lo is None and hi is None:
        return None
    firsts = _segment_first_timestamps_us(plan)
    bases = [b for b in plan.segments.bases if b < plan.end]
    allowed = set()
    for i, base in enumerate(bases):
        first = firsts.get(base)
        following = firsts.get(bases[i + 1]) if i + 1 < len(bases) else None
        if first is not None and hi is not None and first >= hi:
            continue  # every record of the segment is stored at or after `first`
        if following is not None and lo is not None and following < lo:
            continue  # every record of the segment is stored at or before the next segment's first
        allowed.add(base)
    return allowed


def _log_pieces(plan: StorePlan, lo: int, hi: int, allowed, *, lo_is_record_start: bool) -> list[Piece]:
    """Pieces holding the records with offsets in [lo, hi) (and more: the reader's filter drops the rest).

    A piece starts at `lo` when it is a record start, else at its segment's base; it ends at the segment's end
    (through the blank) or at the planned written end.
    """
    size = plan.segments.segment_size
    pieces = []
    for base in plan.segments.bases:
        segment_end = base + size
        if segment_end <= lo or base >= hi or base >= plan.end:
            continue
        if allowed is not None and base not in allowed:
            continue
        start = lo if lo_is_record_start and base <= lo else base
        pieces.append(Piece(base, start, min(segment_end, plan.end)))
    return pieces


def _split_piece(plan: StorePlan, piece: Piece, target: int) -> list[Piece]:
    """Cut a long piece at record starts about `target` bytes apart (known ones, or ConsumeQueue units)."""
    if piece.end - piece.start <= target * 3 // 2:
        return [piece]
    cuts, position = [], piece.start
    while piece.end - position > target * 3 // 2:
        wanted = position + target
        known = [b for b in plan.boundaries if wanted <= b < piece.end]
        found = min(known) if known else plan.queues.boundary_at_or_after(wanted, piece.end)
        if found is None or found <= position:
            break
        cuts.append(found)
        position = found
    edges = [piece.start, *cuts, piece.end]
    return [Piece(piece.base, a, b) for a, b in zip(edges, edges[1:])]


def _queue_units(plan: StorePlan, row_filter: RowFilter, lo: int, hi: int, allowed) -> list[tuple]:
    """(topic, queue dir, first entry number, units, wanted) of each selected queue, units in [lo, hi)."""
    size = plan.segments.segment_size
    found = []
    for topic, queue_id, queue_dir in plan.queues.queues():
        if topic not in row_filter.topics:
            continue
        if row_filter.queue_ids is not None and queue_id not in row_filter.queue_ids:
            continue
        first, units = plan.queues.entries(queue_dir, lo, hi)
        if not len(units):
            continue
        wanted = np.ones(len(units), dtype=bool)
        if allowed is not None:
            offsets = units["commitlog_offset"].astype(np.int64)
            wanted = np.isin(offsets - (offsets - plan.segments.start) % size, np.array(sorted(allowed), np.int64))
        found.append((topic, queue_dir, first, units, wanted))
    return found


def _queue_groups(found: list[tuple], target: int) -> list[list]:
    """Groups of (topic, queue dir, first entry, count) slices, each about `target` bytes of records."""
    slices = []  # (topic, queue_dir, first, count, bytes)
    for topic, queue_dir, first, units, wanted in found:
        record_bytes = np.where(wanted, units["size"].astype(np.int64), 0)
        cumulative = np.cumsum(record_bytes)
        at = 0
        while at < len(units):
            stop = max(int(np.searchsorted(cumulative, cumulative[at] - record_bytes[at] + target, side="right")),
                       at + 1)
            stop = min(stop, at + QUEUE_PARTITION_RECORDS_MAX)
            chunk = np.flatnonzero(wanted[at:stop])
            if len(chunk):
                a, b = at + int(chunk[0]), at + int(chunk[-1]) + 1
                slices.append((topic, queue_dir, first + a, b - a, int(record_bytes[a:b].sum())))
            at = stop
    groups, current, current_bytes = [], [], 0
    for item in slices:
        if current and current_bytes + item[4] > target:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(item[:4])
        current_bytes += item[4]
    if current:
        groups.append(current)
    return groups


def _partition_target(total_bytes: int) -> int:
    """Bytes per partition: a multiple of PARTITIONS_PER_CORE partitions per core, none above the maximum."""
    slots = PARTITIONS_PER_CORE * (os.cpu_count() or 1)  # the planner's cores stand for the cluster's
    count = slots * max(1, math.ceil(total_bytes / (PARTITION_BYTES_MAX * slots)))
    return min(PARTITION_BYTES_MAX, max(PARTITION_BYTES_MIN, math.ceil(total_bytes / count)))


def _group_pieces(plan: StorePlan, pieces: list[Piece], target: int) -> list[LogPartition]:
    partitions, current, current_bytes = [], [], 0
    for piece in pieces:
        for part in _split_piece(plan, piece, target):
            length = part.end - part.start
            if current and current_bytes + length > target:
                partitions.append(current)
                current, current_bytes = [], 0
            current.append(part)
            current_bytes += length
    if current:
        partitions.append(current)
    ref = plan.ref
    return [LogPartition(ref.root, ref.label, plan.segments.segment_size, tuple(p)) for p in partitions]


def plan_batch(stores, row_filter: RowFilter) -> list[InputPartition]:
    """The partitions of a batch read of `stores`, each store up to its written end now."""
    if row_filter.is_empty():
        return []
    work = []  # (plan, log pieces, ConsumeQueue units)
    total = 0
    for ref in stores:
        plan = plan_store(ref)
        lo = max(plan.segments.start, row_filter.offset_lo or 0)
        hi = plan.end if row_filter.offset_hi is None else min(plan.end, row_filter.offset_hi)
        if lo >= hi:
            continue
        allowed = _time_allowed(plan, row_filter)
        units, log_lo = [], lo
        by_queues = row_filter.topics is not None and plan.dispatched_end is not None and plan.dispatched_end > lo
        if by_queues:
            units = _queue_units(plan, row_filter, lo, min(hi, plan.dispatched_end), allowed)
            log_lo = plan.dispatched_end  # a record start: the queues cover everything before it
        pieces = _log_pieces(plan, log_lo, hi, allowed, lo_is_record_start=by_queues) if log_lo < hi else []
        total += sum(p.end - p.start for p in pieces)
        total += sum(int(np.sum(u["size"].astype(np.int64)[w])) for _, _, _, u, w in units)
        work.append((plan, pieces, units))
    target = _partition_target(total)
    partitions: list[InputPartition] = []
    for plan, pieces, units in work:
        for group in _queue_groups(units, target):
            partitions.append(QueuePartition(plan.ref.root, plan.ref.label, plan.segments.segment_size,
                                             plan.segments.start, tuple(group)))
        partitions.extend(_group_pieces(plan, pieces, target))
    return partitions


# --- readers --------------------------------------------------------------------------------------------------
def _check_schema(schema: StructType, options: SourceOptions) -> None:
    expected = commitlog_schema(options.with_store_column)
    given = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    wanted = [(f.name, f.dataType.simpleString()) for f in expected.fields]
    if given != wanted:
        raise CommitLogSourceError(f"the {FORMAT_NAME} source has a fixed schema ({expected.simpleString()}); "
                                   f"do not pass another one ({schema.simpleString()})")


class CommitLogBatchReader(DataSourceReader):
    """A batch read: partitions planned once, each store up to its written end at planning."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self.row_filter = options.row_filter

    def partitions(self):
        return plan_batch(self.options.stores, self.row_filter)

    def read(self, partition):
        return read_partition(partition, _arrow_schema(self.schema), self.row_filter)


class CommitLogPushdownReader(CommitLogBatchReader):
    """The batch reader Spark's filter-pushdown planner gets: it folds the filters it can apply exactly."""

    def pushFilters(self, filters):
        self.row_filter, rest = push_filters(self.row_filter, filters)
        return rest


def _pushdown_planning() -> bool:
    """True when called by Spark's filter-pushdown planner.

    Spark refuses a reader that implements pushFilters when spark.sql.python.filterPushdown.enabled is false,
    and only that planner (pyspark.sql.worker.data_source_pushdown_filters) calls it when the setting is true.
    So `reader()` gives the pushdown reader to that planner and the plain one otherwise: both settings work,
    and a missed detection only costs the pushdown, never a wrong row.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.sql.worker.data_source_pushdown_filters":
            return True
        frame = frame.f_back
    return False


class CommitLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between commitlog offsets of every store; admission control by records and bytes."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self._target: dict | None = None

    def initialOffset(self) -> dict:
        return {"stores": {ref.root: self._initial(ref) for ref in self.options.stores}}

    def _initial(self, ref: StoreRef) -> int:
        if self.options.starting_offsets == "latest":
            return plan_store(ref).end
        return list_segments(ref.root).start

    def _starts(self, start: dict) -> dict:
        """Where each store resumes; a store the offsets do not know yet is new: all of it is to be read."""
        known = start.get("stores", {})
        return {ref.root: int(known[ref.root]) if ref.root in known else list_segments(ref.root).start
                for ref in self.options.stores}

    def _ends(self, starts: dict) -> dict:
        ends = {}
        for ref in self.options.stores:
            start = starts[ref.root]
            plan = plan_store(ref, known_start=start)
            ends[ref.root] = max(plan.end, start)
        if self._target is not None:
            ends = {root: max(starts[root], min(end, self._target.get(root, starts[root])))
                    for root, end in ends.items()}
        return ends

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._ends({ref.root: list_segments(ref.root).start for ref in self.options.stores})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        starts = self._starts(start)
        ends = self._ends(starts)
        if isinstance(limit, ReadAllAvailable):
            return {"stores": ends}
        rows_max = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_records_per_trigger
        bytes_max = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows) and self.options.max_bytes_per_trigger is not None:
            bytes_max = self.options.max_bytes_per_trigger
        if rows_max is None and bytes_max is None:
            return {"stores": ends}
        pending = [ref for ref in self.options.stores if ends[ref.root] > starts[ref.root]]
        share = len(pending) or 1
        for ref in pending:
            ends[ref.root] = admit(ref, starts[ref.root], ends[ref.root],
                                   None if rows_max is None else math.ceil(rows_max / share),
                                   None if bytes_max is None else math.ceil(bytes_max / share))
        return {"stores": ends}

    def reportLatestOffset(self):
        return None

    def partitions(self, start: dict, end: dict):
        starts, ends = self._starts(start), end.get("stores", {})
        partitions = []
        for ref in self.options.stores:
            lo, hi = starts[ref.root], int(ends.get(ref.root, starts[ref.root]))
            if hi <= lo:
                continue
            segments = list_segments(ref.root)
            if lo < segments.start:
                raise StoreIOError(f"store {ref.root}: the records from commitlog offset {lo} were deleted by "
                                   f"retention before this query read them (the log now starts at "
                                   f"{segments.start})")
            plan = StorePlan(ref, segments, hi, None, QueueIndex(ref.root), [lo])
            pieces = _log_pieces(plan, lo, hi, None, lo_is_record_start=True)
            partitions.extend(_group_pieces(plan, pieces, _partition_target(hi - lo)))
        return partitions

    def read(self, partition):
        return read_partition(partition, _arrow_schema(self.schema), self.options.row_filter)

    def commit(self, end: dict) -> None:
        pass


def admit(ref: StoreRef, start: int, end: int, rows_max: int | None, bytes_max: int | None) -> int:
    """The record start up to which a micro-batch reads from `start`: within the limits, one record at least."""
    segments = list_segments(ref.root)
    size = segments.segment_size
    rows = data = 0
    position = start
    while position < end:
        base = segments.base_of(position)
        path = segments.path(base)
        fd = _open_segment(path)
        try:
            piece_end = min(end, base + size)
            want = min(piece_end - position, READ_CHUNK_BYTES)
            buf = _pread(fd, path, position - base, want)
        finally:
            os.close(fd)
        positions, following, state = locate_records(buf, want, position, base + size, lenient=False, path=path)
        if len(positions):
            sizes = _be_int(buf, positions, 4, ">i4")
            count = len(positions)
            if rows_max is not None:
                count = min(count, rows_max - rows)
            if bytes_max is not None:
                count = min(count, int(np.searchsorted(np.cumsum(sizes), bytes_max - data, side="right")))
            if rows == 0 and count == 0:
                count = 1  # always make progress, even past a limit smaller than one record
            if count < len(positions):
                return position + int(positions[count])
            rows += count
            data += int(sizes.sum())
        if state == NEXT_BLANK:
            position = base + size
        elif state == NEXT_MORE and following == 0:  # one record larger than a read chunk
            record_size = _record_size(buf, want, 0)
            if rows and (rows_max is not None and rows >= rows_max
                         or bytes_max is not None and data + record_size > bytes_max):
                return position
            rows += 1
            data += record_size
            position += record_size
        else:
            position += following
    return end


# --- the data source ------------------------------------------------------------------------------------------
class CommitLogDataSource(DataSource):
    """spark.read / spark.readStream .format("commitlog"): the messages of mqstore / RocketMQ 4.x stores."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return commitlog_schema(parse_options(self.options).with_store_column)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(self.options)
        _check_schema(schema, options)
        reader_class = CommitLogPushdownReader if _pushdown_planning() else CommitLogBatchReader
        return reader_class(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_options(self.options)
        _check_schema(schema, options)
        return CommitLogStreamReader(options, schema)
