"""The Python data source of the "commitlog" format: batch and streaming reads of mqstore / RocketMQ 4.x stores.

    from pyspark.sql import SparkSession
    import mqstore.spark

    spark = mqstore.spark.configure(SparkSession.builder).getOrCreate()  # the JVM reader's jar on spark.jars
    mqstore.spark.register(spark)                                        # this source only where that jar is not
    df = spark.read.format("commitlog").load("/path/to/store")          # or a list of paths, or a glob
    stream = spark.readStream.format("commitlog").load("/path/to/store")

One format name, two implementations (docs/decisions/0041-one-spark-format-name.md): the JVM reader
(mqstore/spark/jvm/src, a DataSource V2 whose jar `configure` puts on spark.jars) answers to "commitlog" in a
session that loaded its jar; `register(spark)` registers this source under "commitlog" only in a session that
did not, and says so once with a warning (the rows are the same, a full scan is slower). This source is always
registered under "commitlog-python" too, to compare the two or to choose it.

Importing this module sets PYSPARK_PYTHON to this interpreter when it is unset (sessions started afterwards run
their Python workers with it, so they import mqstore, numpy and pyarrow) and registers the source with the
active session, if there is one. `register(spark)` registers it with a session started before or after the
import and points that session's workers at this interpreter unless PYSPARK_PYTHON or spark.pyspark.python
chose another (on a cluster, choose one that has mqstore installed on every node). Needs Java 17 or later
(mqstore.spark.env.java_missing() says whether it is found). docs/spark.md is the user's guide.
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

A tier (docs/tier.md) is read straight from its object store, with no local copy and no writer running: give its
URI as the path, `load("s3://bucket/prefix?region=...")` or `load("file:///dir")` (a list of paths may mix tiers
and store directories; a glob is expanded for directories only). The driver reads the tier's manifest and plans
partitions of its segments' byte ranges; each partition carries the URI, and the executor reading it opens the
tier itself (credentials from pyarrow's usual configuration there, or from the URI) and reads its ranges with
range reads of 16 MiB. A topic filter walks the segments and keeps the topic's records (the tier's queue images
only cut long segments at record starts); batch reads only (a stream of a tier URI is refused). Errors name the
object in the tier (redacted URI and key) and the byte position in it.

Pushed filters: topic = / IN, queue_id = / IN, commitlog_offset and store_timestamp comparisons. Every pushed
filter is applied to each record by the reader, planning only skips what provably holds no match, so a query
gives the same rows with pushdown on or off. Other filters are left to Spark.

How a store is planned (a snapshot of each store up to its written end; ConsumeQueues for a topic filter;
segments skipped by time; large segments split at record starts): see mqstore/store/scan_plan.py.

Consistency: every partition carries the byte ranges fixed at planning, so a read sees each store up to its
end at planning time while a writer appends. A segment deleted (or shrunk) under a running read raises
StoreIOError naming it; bytes that break the format raise CorruptionError with file and offset.

Streaming offsets are `{"stores": {"<absolute store path>": <commitlog offset>}}`: the offset up to which a
store has been read, always a record start (or a segment end). Micro-batches end at record starts, so a
restarted query resumes exactly where its checkpoint says. A glob is expanded when the query starts; a store
missing from the checkpoint (matched since) is read from its beginning, and a moved store is a new store.
maxRecordsPerTrigger / maxBytesPerTrigger count the log records a micro-batch reads (before filters), shared
between the stores with new records; a micro-batch always takes at least one record. Trigger.AvailableNow
reads up to each store's written end when the query starts. Records deleted by retention before a query read
them raise StoreIOError.

Decoding (numpy and Arrow, many records at once; a per-record path for rare kinds): see commitlog/arrow_decode.py.

Caveat: the ConsumeQueue path sees what RocketMQ dispatches. A record with a transaction-prepared or
rolled-back SYSFLAG is never put in a ConsumeQueue, so a topic filter does not return it while a full scan
does. Brokers store half messages under RMQ_SYS_TRANS_HALF_TOPIC as ordinary records, and mqstore cannot write
such flags, so this only concerns logs written through DefaultMessageStore by other means.

The modules, each importing only those below it:

    mqstore/spark.py          the DataSource and its batch and stream readers (this module)
    mqstore/store/scan_plan.py     the snapshot of each store and its partitions
    mqstore/store/scan_end.py      the written end of a store's log, as planning finds it
    mqstore/store/scan_read.py     partitions read into RecordBatches; streaming admission
    mqstore/store/store_files.py    segment files and ConsumeQueue files, read without a lock
    mqstore/store/scan_options.py  schema, options, filter pushdown
    mqstore/store/scan_errors.py   CommitLogSourceError, the source's one error (shared with store.scan())
    commitlog/arrow_decode.py     locating records and decoding them into Arrow columns (knows nothing of Spark)
"""

from __future__ import annotations

import math
import os
import sys
import warnings

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mqstore.spark.env import use_this_interpreter
from mqstore.store.scan_errors import CommitLogSourceError
from mqstore.store.scan_options import (
    FORMAT_NAME,
    SourceOptions,
    StoreRef,
    arrow_schema,
    check_schema,
    commitlog_schema,
    is_tier_uri,
    parse_options,
    push_filters,
    shown_tier,
)
from mqstore.store.scan_plan import plan_batch, plan_store, plan_stream
from mqstore.store.scan_read import admit, read_partition
from mqstore.store.store_files import list_segments

__all__ = ["CommitLogDataSource", "CommitLogSourceError", "PythonCommitLogDataSource", "commitlog_schema", "register"]

PYTHON_FORMAT_NAME = "commitlog-python"  # this source's own name, registered beside the JVM reader
JVM_READER_MISSING = (
    "mqstore.spark: this Spark session did not load the JVM reader's jar, so format('commitlog') is the Python "
    "data source: the same rows and options, streaming too, a full scan 2-3x slower. Start the session with "
    "mqstore.spark.configure(SparkSession.builder) to load it (it needs a JDK 17 or later: javac); docs/spark.md")
_warned: list = []  # the fallback warning is given once per process

PYSPARK_PYTHON_DEFAULT = "python3"  # what a SparkContext runs its Python workers with when PYSPARK_PYTHON is unset
_WORKER_PYTHON_CHOSEN = "PYSPARK_PYTHON" in os.environ  # by the user, before this module set it


# --- readers --------------------------------------------------------------------------------------------------
class CommitLogBatchReader(DataSourceReader):
    """A batch read: partitions planned once, each store up to its written end at planning."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self.row_filter = options.row_filter

    def partitions(self):
        return plan_batch(self.options.stores, self.row_filter)

    def read(self, partition):
        return read_partition(partition, arrow_schema(self.schema), self.row_filter)


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
            partitions.extend(plan_stream(ref, lo, hi))
        return partitions

    def read(self, partition):
        return read_partition(partition, arrow_schema(self.schema), self.options.row_filter)

    def commit(self, end: dict) -> None:
        pass


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
        check_schema(schema, options)
        reader_class = CommitLogPushdownReader if _pushdown_planning() else CommitLogBatchReader
        return reader_class(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_options(self.options)
        check_schema(schema, options)
        tiers = [shown_tier(ref.root) for ref in options.stores if is_tier_uri(ref.root)]
        if tiers:
            raise CommitLogSourceError(f"readStream of a tier ({', '.join(tiers)}) is not supported: read the store "
                                       "that uploads to it, or spark.read the tier in batches")
        return CommitLogStreamReader(options, schema)


class PythonCommitLogDataSource(CommitLogDataSource):
    """format("commitlog-python"): this source under its own name, beside the JVM reader's "commitlog"."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_FORMAT_NAME


# --- registration ---------------------------------------------------------------------------------------------
def register(spark=None):
    """Make the "commitlog" format available in `spark` (default: the active session); return the session.

    In a session that loaded the JVM reader's jar (mqstore.spark.configure(builder)) "commitlog" is that reader
    and nothing is registered under it; in any other session this Python source is registered as "commitlog",
    with a warning, once per process, that the faster reader is not loaded. This source is also registered as
    "commitlog-python" in both cases. A session whose workers would run the default `python3` (no
    PYSPARK_PYTHON when it started, and no spark.pyspark.python) is pointed at this interpreter, which imports
    mqstore: a worker running another one fails with "No module named 'mqstore'". Registering twice is
    harmless."""
    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("no active SparkSession: start one (SparkSession.builder.getOrCreate()) and pass it")
    _point_workers_here(spark)
    spark.dataSource.register(PythonCommitLogDataSource)
    try:
        spark.dataSource.register(CommitLogDataSource)
    except Exception as exc:  # the JVM reader's DataSourceRegister holds the name: Spark refuses a second one
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
        return spark
    if not _warned:
        _warned.append(True)
        warnings.warn(JVM_READER_MISSING, RuntimeWarning, stacklevel=2)
    return spark


def _point_workers_here(spark) -> None:
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: no context here; the server's workers are configured on the server
        return
    if _WORKER_PYTHON_CHOSEN or context.pythonExec != PYSPARK_PYTHON_DEFAULT:
        return
    chosen = context.getConf().get("spark.pyspark.python")
    context.pythonExec = chosen or sys.executable


use_this_interpreter()
if SparkSession.getActiveSession() is not None:  # a session started before the import: register with it
    register()
