"""A store's records as Arrow: `MessageStore.scan()` and `scan_store()`, the one reader under the Spark source,
`mqstore export`, and pandas / Polars / DuckDB (docs/arrow.md).

    reader = store.scan(topic="orders", start_time=datetime(2026, 11, 1), columns=["queue_offset", "body"])
    table = reader.read_all()            # a pyarrow.Table; reader.read_pandas(), polars.from_arrow(...) ...

One row per message record, with the Spark source's columns (SCAN_SCHEMA; docs in mqstore/spark.py) and its
filters: topics, queue ids, commitlog offsets [start_offset, end_offset), store times [start_time, end_time).
A scan is planned once (mqstore/store/scan_plan.py: each store up to its written end when `scan` is called; a topic
filter reads through the ConsumeQueues, a time range skips whole segments) into partitions of at most
SCAN_PARTITION_BYTES_MAX bytes of log, and read lazily in RecordBatches of at most
commitlog.arrow_decode.BATCH_RECORDS_MAX rows (commitlog/arrow_decode.py decodes; its record walk is the compiled
scan when the extension is built). With more than one core, two partitions are read at once on threads of the
scan's own and handed on in log order (docs/decisions/0029-scan-reads-two-partitions-at-once.md). Bytes that
break the format raise CorruptionError (file, offset, rule) from the reader; a segment deleted under a running
scan raises StoreIOError. pyspark is not needed.

A store's tier (docs/tier.md) is read too. `scan_store("s3://bucket/prefix?...")` (or `file:///dir`, any tier URI)
reads a store from its tier alone, with no local copy and no writer: its manifest lists the segments (all sealed:
the written end is the last one's end), which are read with range reads of 16 MiB (mqstore/tier/scan_source.py)
into the same record walk and decoder, so the rows, filters and checks are a local scan's and an error names the
object in the tier and the position in it. `MessageStore.scan()` of a store with a tier reads the tier's segments
below the local log's start (what retention removed), then the local ones: every row once, in log order; a local
segment retention removes while the scan runs is read from the tier's copy. A topic filter walks the tier's
segments and keeps the topic's records (the local ConsumeQueues serve the local segments only).
"""

from __future__ import annotations

import collections
import datetime
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import pyarrow as pa

from mqstore.commitlog.arrow_decode import STORE_COLUMN
from mqstore.commitlog.errors import InvalidConfigError
from mqstore.store.scan_options import RowFilter, StoreRef, _datetime_us, is_tier_uri
from mqstore.store.scan_plan import plan_batch
from mqstore.store.scan_read import read_partition

_STAMP = pa.timestamp("us", tz="UTC")
# A scan reads its partitions on this many threads (the compiled walk and Arrow build let go of the interpreter
# lock), each partition whole, in order; so up to SCAN_THREADS + 1 partitions of decoded rows are held at once.
SCAN_THREADS = min(2, os.cpu_count() or 1)
SCAN_PARTITION_BYTES_MAX = 32 * 1024 * 1024  # log bytes a scan partition holds, at most

# The Spark source's rows as Arrow (what pyspark's to_arrow_schema makes of mqstore.store.scan_options'
# commitlog_schema; a test checks the two agree).
SCAN_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), False),
    pa.field("queue_id", pa.int32(), False),
    pa.field("queue_offset", pa.int64(), False),
    pa.field("commitlog_offset", pa.int64(), False),
    pa.field("body", pa.binary(), False),
    pa.field("tags", pa.string(), True),
    pa.field("keys", pa.list_(pa.field("element", pa.string(), False)), False),
    pa.field("properties", pa.map_(pa.field("key", pa.string(), False), pa.field("value", pa.string(), False)),
             False),
    pa.field("flag", pa.int32(), False),
    pa.field("sys_flag", pa.int32(), False),
    pa.field("born_timestamp", _STAMP, False),
    pa.field("store_timestamp", _STAMP, False),
    pa.field("born_host", pa.string(), False),
    pa.field("store_host", pa.string(), False),
    pa.field("reconsume_times", pa.int32(), False),
    pa.field("body_crc", pa.int32(), False),
    pa.field("msg_id", pa.string(), False),
])
COLUMNS = tuple(SCAN_SCHEMA.names)


def scan_schema(with_store_column: bool = False) -> pa.Schema:
    """SCAN_SCHEMA, with the `store` column (the label of each row's store) when asked."""
    return SCAN_SCHEMA.append(pa.field(STORE_COLUMN, pa.string(), False)) if with_store_column else SCAN_SCHEMA


def row_filter(*, topic=None, queue_ids=None, start_offset: int | None = None, end_offset: int | None = None,
               start_time=None, end_time=None) -> RowFilter:
    """The RowFilter of scan()'s arguments: `topic` a name or names, `queue_ids` an int or ints, offsets commitlog
    offsets, times datetimes (naive means UTC) or ms since the epoch. Ranges are half-open: [start, end)."""
    topics = None if topic is None else frozenset([topic] if isinstance(topic, str) else topic)
    queues = None if queue_ids is None else frozenset([queue_ids] if isinstance(queue_ids, int) else queue_ids)
    if topics is not None and not all(isinstance(t, str) for t in topics):
        raise InvalidConfigError(f"topic must be a name or names, got {topic!r}")
    if queues is not None and not all(isinstance(q, int) and not isinstance(q, bool) for q in queues):
        raise InvalidConfigError(f"queue_ids must be an int or ints, got {queue_ids!r}")
    for name, value in (("start_offset", start_offset), ("end_offset", end_offset)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InvalidConfigError(f"{name} must be a commitlog offset (an int >= 0), got {value!r}")
    return RowFilter(topics=topics, queue_ids=queues, offset_lo=start_offset, offset_hi=end_offset,
                     time_lo_us=_time_us("start_time", start_time), time_hi_us=_time_us("end_time", end_time))


def _time_us(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, (datetime.datetime, datetime.date)):
        return _datetime_us(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    raise InvalidConfigError(f"{name} must be a datetime or ms since the epoch, got {value!r}")


def scan_store(root, *, columns: Iterable[str] | None = None, label: str | None = None, tier=None, **filters
               ) -> pa.RecordBatchReader:
    """The records of the store under `root` (read from its files: a writer may be appending) as a
    RecordBatchReader; see the module's docstring. `label` adds the `store` column. `root` may be a tier's URI
    (`s3://bucket/prefix?...`, `file:///dir`): the store is then read from the tier alone. `tier` is the local
    store's tier (its TierReader, or a URI), read below the local log's start."""
    wanted = row_filter(**filters)
    schema = scan_schema(label is not None)
    names = list(schema.names) if columns is None else list(columns)
    unknown = [name for name in names if name not in schema.names]
    if unknown or not names:
        raise InvalidConfigError(f"unknown columns {unknown}; the columns are {', '.join(schema.names)}"
                                 if unknown else "columns is empty")
    out_schema = pa.schema([schema.field(name) for name in names])
    root = os.fspath(root)
    ref = StoreRef(root, label) if is_tier_uri(root) else StoreRef(os.path.abspath(root), label, tier)
    partitions = plan_batch([ref], wanted, partition_bytes_max=SCAN_PARTITION_BYTES_MAX)
    return pa.RecordBatchReader.from_batches(out_schema, _batches(partitions, schema, wanted, names))


def _batches(partitions, schema: pa.Schema, wanted: RowFilter, names: list[str],
             threads: int | None = None) -> Iterator[pa.RecordBatch]:
    """The partitions' batches in log order: read one after the other, or with `threads` > 1 (SCAN_THREADS by
    default) that many partitions at once, each kept whole until the ones before it were handed on."""
    project = names != list(schema.names)
    threads = SCAN_THREADS if threads is None else threads
    if threads < 2 or len(partitions) < 2:
        for partition in partitions:
            for batch in read_partition(partition, schema, wanted):
                yield batch.select(names) if project else batch
        return
    stop = threading.Event()  # the consumer went away: readers stop at their next batch

    def read_whole(partition) -> list[pa.RecordBatch]:
        kept = []
        for batch in read_partition(partition, schema, wanted):
            if stop.is_set():
                break
            kept.append(batch.select(names) if project else batch)
        return kept

    with ThreadPoolExecutor(threads, thread_name_prefix="mqstore-scan") as pool:
        ahead = collections.deque(pool.submit(read_whole, partition) for partition in partitions[:threads])
        following = threads
        try:
            while ahead:
                batches = ahead.popleft().result()  # raises what reading that partition raised, in log order
                if following < len(partitions):
                    ahead.append(pool.submit(read_whole, partitions[following]))
                    following += 1
                yield from batches
                del batches
        finally:
            stop.set()
            for future in ahead:
                future.cancel()
