"""The commitlog source's schema, options and filter pushdown (the options table is in mqstore/spark/source.py).

`parse_options` checks what a load() was given and resolves its paths to stores; `RowFilter` is the AND of
the row conditions (the options and the filters Spark pushed), which planning uses to skip what provably holds
no match and the decoder (commitlog.arrow_decode) applies to every record. A bad path or option raises
CommitLogSourceError naming it.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import glob
import json
import os
from dataclasses import dataclass

import pyarrow as pa

try:  # pyspark (the `spark` extra) is needed by the Spark source only; RowFilter and StoreRef also serve store.scan()
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
except ImportError:  # pragma: no cover - exercised by a test in a subprocess without pyspark
    StructField = None

from mqstore.commitlog.arrow_decode import STORE_COLUMN
from mqstore.store.scan_errors import CommitLogSourceError
from mqstore.tier.location import redacted

FORMAT_NAME = "commitlog"

# --- schema ---------------------------------------------------------------------------------------------------
_FIELDS = () if StructField is None else (
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


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks our batches against (its own conversion, timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def check_schema(schema: StructType, options: SourceOptions) -> None:
    """CommitLogSourceError unless `schema` is the source's own (the source has a fixed schema)."""
    expected = commitlog_schema(options.with_store_column)
    given = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    wanted = [(f.name, f.dataType.simpleString()) for f in expected.fields]
    if given != wanted:
        raise CommitLogSourceError(f"the {FORMAT_NAME} source has a fixed schema ({expected.simpleString()}); "
                                   f"do not pass another one ({schema.simpleString()})")


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
    """One store to read: its absolute root (or a tier's URI: `is_tier_uri`) and the label of its `store` column
    (None without the column). `tier`, for store.scan() of a store with a tier: its TierReader, through which
    the records below the local log's start are read from the tier."""

    root: str
    label: str | None
    tier: object = None


def is_tier_uri(path: str) -> bool:
    """Whether a store path names a tier (`s3://bucket/prefix?...`, `file:///dir`, ...: a URI with a scheme)
    rather than a local store directory."""
    head = path.split("://", 1)[0] if "://" in path else ""
    return bool(head) and head[0].isalpha() and all(c.isalnum() or c in "+-." for c in head)


def shown_tier(uri: str) -> str:
    """How a tier is named in the `store` column: its URI without user info and query (`s3://bucket/prefix`), as
    the JVM reader names it and as TierLocation.display names its objects."""
    return redacted(uri).split("?", 1)[0].rstrip("/")


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
    several = len(given) > 1 or any(glob.has_magic(p) for p in given if not is_tier_uri(p))
    stores, seen = [], set()
    for pattern in given:
        if is_tier_uri(pattern):  # read from the tier alone (scan_plan.open_tier checks it when planning)
            shown = shown_tier(pattern)
            if shown not in seen:
                seen.add(shown)
                stores.append(StoreRef(pattern, shown if several else None))
            continue
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
