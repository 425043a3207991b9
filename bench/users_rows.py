"""The measurements of bench/users.py, each run in a fresh process: `python bench/users_rows.py '{"worker": ...}'`
prints one line `RESULT {json}` last. Every store is opened with `StoreConfig()` unless the worker says otherwise,
and every message is built in the timed loop as a user builds it: a tag (one of 7) and a key each, 4 topics x 4
queues, RocketMQ's harness's shape (../shared/rocketmq-4.4.0/src/RmqHarness.java: topic `T{i % 4}`, queue
`(i // 4) % 4`, tag `tag{i % 7}`, key `k{i}`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mqstore import FlushMode, GetStatus, Message, MessageStore, StoreConfig  # noqa: E402

TOPICS = 4
QUEUES = 4
TAGS = tuple(f"tag{i}" for i in range(7))
MIXED_SEED = 20261128
MIXED_MIN_BYTES, MIXED_MAX_BYTES = 16, 4096
BODY_POOL = 4096  # distinct bodies a worker cycles through (a power of two)


def mixed_sizes(count: int = BODY_POOL) -> list[int]:
    """Body sizes drawn log-uniformly from 16 B to 4 KB with a fixed seed: many small messages, some large."""
    draw = random.Random(MIXED_SEED)
    ratio = MIXED_MAX_BYTES / MIXED_MIN_BYTES
    return [int(MIXED_MIN_BYTES * ratio ** draw.random()) for _ in range(count)]


def bodies(kind) -> list[bytes]:
    """BODY_POOL bodies: `kind` bytes each, or "mixed" sizes; random bytes (RocketMQ's harness's are random too)."""
    sizes = mixed_sizes() if kind == "mixed" else [int(kind)] * BODY_POOL
    source = random.Random(7).randbytes(MIXED_MAX_BYTES * 2)
    return [source[i % MIXED_MAX_BYTES:i % MIXED_MAX_BYTES + size] for i, size in enumerate(sizes)]


def message(i: int, body: bytes, keys: bool = True) -> Message:
    """The i-th message of the harness's shape, built as a user builds one."""
    if keys:
        return Message(f"T{i % TOPICS}", body, queue_id=(i // TOPICS) % QUEUES, tags=TAGS[i % 7], keys=(f"k{i}",))
    return Message(f"T{i % TOPICS}", body, queue_id=(i // TOPICS) % QUEUES, tags=TAGS[i % 7])


def _rolls(store_root: str) -> int:
    return max(0, len(os.listdir(os.path.join(store_root, "commitlog"))) - 1)


def worker_sync_put(root: str, producers: int, count: int, body: int = 100) -> dict:
    """SYNC puts from `producers` threads, `count` in all; each thread builds its own messages."""
    pool = bodies(body)
    per = count // producers
    with MessageStore.open(root, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
        store.put(message(0, pool[0]))
        store.wait_dispatched(30)
        start = threading.Barrier(producers + 1)

        def produce(thread: int) -> None:
            put = store.put
            start.wait()
            for i in range(thread * per, (thread + 1) * per):
                put(message(i, pool[i & (BODY_POOL - 1)]))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(producers)]
        for thread in threads:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - began
    return {"count": per * producers, "seconds": seconds, "rate": per * producers / seconds}


def worker_raw_loop(root: str, count: int) -> dict:
    """bench/sync_share.py's raw loop: pwrite of a 100-byte body and fdatasync, `count` times."""
    import sync_share

    sync_share.N_PUTS = count
    rate = sync_share._raw(root)
    return {"count": count, "seconds": count / rate, "rate": rate}


def worker_aio_put(root: str, inflight: int, count: int) -> dict:
    """SYNC puts from one event loop: `inflight` coroutines, each awaiting its puts in turn."""
    try:
        import mqstore.aio as aio
    except ImportError as exc:
        return {"unavailable": f"no asyncio API (import mqstore.aio: {exc})"}
    pool = bodies(100)
    per = count // inflight

    async def run() -> float:
        async with aio.AsyncMessageStore.open(root, StoreConfig(flush_mode=FlushMode.SYNC)) as store:
            await store.put(message(0, pool[0]))

            async def produce(worker: int) -> None:
                for i in range(worker * per, (worker + 1) * per):
                    await store.put(message(i, pool[i & (BODY_POOL - 1)]))

            began = time.perf_counter()
            await asyncio.gather(*(produce(w) for w in range(inflight)))
            return time.perf_counter() - began

    seconds = asyncio.run(run())
    return {"count": per * inflight, "seconds": seconds, "rate": per * inflight / seconds}


def worker_async_put(root: str, body, count: int) -> dict:
    """ASYNC (the default) puts from one thread; `body` is a size or "mixed"."""
    pool = bodies(body)
    with MessageStore.open(root, StoreConfig()) as store:
        put = store.put
        written = 0
        began = time.perf_counter()
        for i in range(count):
            written += len(pool[i & (BODY_POOL - 1)])
            put(message(i, pool[i & (BODY_POOL - 1)]))
        seconds = time.perf_counter() - began
        rolls = _rolls(root)
    return {"count": count, "seconds": seconds, "rate": count / seconds, "body_bytes": written, "rolls": rolls}


def worker_put_batch(root: str, count: int, batch: int = 1000, keys: bool = True, index: bool | None = None,
                     loop: bool = False) -> dict:
    """1 KB messages by put_batch of `batch` (or, with `loop`, by put() one at a time), built in the timed loop."""
    pool = bodies(1000)
    config = StoreConfig() if index is None else StoreConfig(index_enabled=index)
    with MessageStore.open(root, config) as store:
        began = time.perf_counter()
        if loop:
            put = store.put
            for i in range(count):
                put(message(i, pool[i & (BODY_POOL - 1)], keys))
        else:
            put_batch = store.put_batch
            for start in range(0, count, batch):
                put_batch([message(i, pool[i & (BODY_POOL - 1)], keys) for i in range(start, start + batch)])
        seconds = time.perf_counter() - began
        rolls = _rolls(root)
    return {"count": count, "seconds": seconds, "rate": count / seconds, "body_bytes": count * 1000,
            "gb_per_s": count * 1000 / seconds / 1e9, "rolls": rolls}


def worker_build(root: str, count: int, body: int = 100) -> dict:
    """The user-shaped store the read rows share: `count` messages by put_batch of 1000, default config."""
    pool = bodies(body)
    with MessageStore.open(root, StoreConfig()) as store:
        for start in range(0, count, 1000):
            store.put_batch([message(i, pool[i & (BODY_POOL - 1)]) for i in range(start, min(count, start + 1000))])
        store.wait_dispatched(600)
    return {"count": count}


def worker_get(root: str) -> dict:
    """get() 32 a call over every queue from its start, reading .body, .tags and .keys of every message."""
    with MessageStore.open(root, read_only=True) as store:
        queues = [(topic, queue) for topic, ids in sorted(store.topics().items()) for queue in ids]
        get = store.get
        count = checksum = 0
        began = time.perf_counter()
        for topic, queue in queues:
            offset = 0
            while True:
                result = get(topic, queue, offset, 32)
                if result.status is not GetStatus.FOUND:
                    break
                for got in result.messages:
                    checksum += len(got.body) + len(got.tags) + len(got.keys)
                count += len(result.messages)
                offset = result.next_offset
        seconds = time.perf_counter() - began
    return {"count": count, "seconds": seconds, "rate": count / seconds, "checksum": checksum}


def worker_scan(root: str, topic: str | None = None) -> dict:
    """store.scan() (every column), or scan(topic=...): rows of the Table per second, rows counted."""
    import pyarrow  # noqa: F401  imported before the clock, as in a program that uses Arrow already

    import mqstore.store.scan  # noqa: F401  scan()'s own lazy import

    with MessageStore.open(root, read_only=True) as store:
        began = time.perf_counter()
        reader = store.scan() if topic is None else store.scan(topic=topic)
        rows = sum(batch.num_rows for batch in reader)
        seconds = time.perf_counter() - began
    return {"count": rows, "seconds": seconds, "rate": rows / seconds}


def worker_recover(root: str) -> dict:
    """A crash open (the abort marker left in place): MessageStore.open until it returns, then until every
    record is dispatched to the ConsumeQueues and the index (the work RocketMQ's load() does before it returns)."""
    began = time.perf_counter()
    store = MessageStore.open(root)
    opened = time.perf_counter() - began
    store.wait_dispatched(600)
    seconds = time.perf_counter() - began
    report = str(getattr(store, "recovery_report", ""))[:300]
    store.close()
    return {"seconds": seconds, "open_seconds": opened, "rate": 1 / seconds, "report": report}


def _cpu_now() -> float:
    """CPU seconds of this driver, its JVM and the Python workers under it (bench/spark_read.py's /proc walk)."""
    import spark_read

    tree = spark_read.cpu_seconds() or {}
    own = os.times()
    return own.user + own.system + sum(tree.values())


SPARK_QUERIES = ("full scan", "group-by topic", "topic+queue filter")
# Each query runs this often in its session and the median run counts: a session answers many queries, and the
# first run of a query shape pays for Spark's code generation and the JIT on either side (a full scan warms
# both sides first, but a filter or a group-by compiles code of its own).
SPARK_REPEATS = 3


def _spark_query(spark, side: str, root: str, parquet: str, query: str):
    from pyspark.sql import functions as F

    frame = spark.read.format("commitlog").load(root) if side == "commitlog" else spark.read.parquet(parquet)
    if query == "full scan":  # every column read: a count of each, and the bodies' total length
        return frame.agg(*[F.count(c).alias(c) for c in frame.columns], F.sum(F.length("body"))).collect()
    if query == "group-by topic":
        return frame.groupBy("topic").count().collect()
    return frame.where("topic = 'T1' AND queue_id = 2").agg(F.count("*"), F.sum(F.length("body"))).collect()


def worker_spark(root: str, parquet: str, sides: list[str], warm: bool = True, repeats: int = SPARK_REPEATS) -> dict:
    """The three queries on each of `sides` ("commitlog", "parquet") in one local[2] session (bench/spark_read.py's
    set-up), each side after one untimed full scan: wall and CPU seconds of each query's median run of
    SPARK_REPEATS."""
    import spark_read

    spark = spark_read.spark_session()
    timings = {}
    try:
        for side in sides:
            if warm:
                _spark_query(spark, side, root, parquet, "full scan")
            timings[side] = {}
            for query in SPARK_QUERIES:
                runs = []
                for _ in range(repeats):
                    cpu = _cpu_now()
                    began = time.perf_counter()
                    _spark_query(spark, side, root, parquet, query)
                    runs.append((time.perf_counter() - began, _cpu_now() - cpu))
                seconds, cpu_seconds = sorted(runs)[len(runs) // 2]
                timings[side][query] = {"seconds": seconds, "cpu_seconds": cpu_seconds}
    finally:
        spark.stop()
    return timings


def worker_parquet(root: str, parquet: str) -> dict:
    """The store's rows (every column) as a Parquet file, by bench/spark_read.py's writer."""
    import spark_read

    arrow = parquet + ".arrow"
    spark_read.write_copies(root, parquet, arrow)
    os.unlink(arrow)
    return {"bytes": os.path.getsize(parquet)}


WORKERS = {name[len("worker_"):]: value for name, value in globals().items() if name.startswith("worker_")}


def main() -> int:
    arguments = json.loads(sys.argv[1])
    result = WORKERS[arguments.pop("worker")](**arguments)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
