"""The demo behind `make demo` / `mqstore demo`: write a store, read every message back, print a summary, then
read the same store with Spark through the commitlog data source and print the command that does it by hand.

Without pyspark or without Java 17 the Spark part is skipped with one line saying why ("Java 17 not found (set
JAVA_HOME): ...") and the exit code is that of the store part (0 when every message was read back): the demo's
job is the store; the line says what to install for the rest. A Spark session that fails to start is one line
too, and exit code 1."""

from __future__ import annotations

import os
import shlex
import sys
import time

from mqstore import GetStatus, Message, MessageStore, StoreConfig
from mqstore.spark.env import spark_missing, use_this_interpreter

TOPICS = ("orders", "payments", "clicks", "audit-log")
QUEUES_PER_TOPIC = 4
BATCH_MESSAGES = 1000
TAGS = ("created", "paid", "shipped", "cancelled")
SPARK_ROWS_SHOWN = 5  # rows of one queue the Spark part prints
SPARK_SHUFFLE_PARTITIONS = 4  # the per-topic count shuffles a handful of rows: few partitions are enough


def _message(sequence: int) -> Message:
    topic = TOPICS[sequence % len(TOPICS)]
    body = (f'{{"seq":{sequence},"topic":"{topic}","amount":{sequence * 7 % 10_000},'
            f'"note":"{"x" * (sequence % 200)}"}}').encode()
    return Message(topic, body, queue_id=(sequence // len(TOPICS)) % QUEUES_PER_TOPIC,
                   tags=TAGS[(sequence // (len(TOPICS) * QUEUES_PER_TOPIC)) % len(TAGS)], keys=(f"order-{sequence}",))


def run_demo(store_dir: str, message_count: int, spark=None) -> int:
    """Run the demo in `store_dir`; Spark reads through `spark` when given (left running), else a local[*]
    session of its own (stopped at the end). Returns the exit code: 0 when every check passed."""
    store_dir = os.path.abspath(store_dir)
    print(f"mqstore demo: {message_count:,} messages over {len(TOPICS)} topics x {QUEUES_PER_TOPIC} queues "
          f"into {store_dir}")
    with MessageStore.open(store_dir, StoreConfig()) as store:
        ok = _write_and_read_back(store, message_count)
        api_counts = {topic: sum(store.max_offset(topic, q) - store.min_offset(topic, q) for q in queue_ids)
                      for topic, queue_ids in store.topics().items()}
    print("demo " + ("OK: every message read back byte for byte" if ok else "FAILED: see the counts above"))
    spark_ok = _spark_part(store_dir, api_counts, spark)
    return 0 if ok and spark_ok else 1


def _write_and_read_back(store: MessageStore, message_count: int) -> bool:
    """Write the demo messages, read each one back through get(), print what it took; True when all match."""
    first_offsets = {(t, q): store.max_offset(t, q) for t in TOPICS for q in range(QUEUES_PER_TOPIC)}
    started = time.perf_counter()
    written_bytes = 0
    for start in range(0, message_count, BATCH_MESSAGES):
        results = store.put_batch([_message(i) for i in range(start, min(message_count, start + BATCH_MESSAGES))])
        written_bytes += sum(r.size_bytes for r in results)
    put_seconds = time.perf_counter() - started
    store.wait_dispatched(60)
    dispatched_seconds = time.perf_counter() - started
    print(f"  wrote {message_count:,} messages ({written_bytes / 1e6:.1f} MB of records) in {put_seconds:.2f} s "
          f"= {message_count / put_seconds:,.0f} msgs/s; all dispatched after {dispatched_seconds:.2f} s")

    started = time.perf_counter()
    read = 0
    mismatches = 0
    per_topic: dict[str, int] = {}
    expected_bodies = {}
    for i in range(message_count):
        m = _message(i)
        expected_bodies.setdefault((m.topic, m.queue_id), []).append(m.body)
    for (topic, queue_id), bodies in expected_bodies.items():
        offset = first_offsets[(topic, queue_id)]
        index = 0
        while index < len(bodies):
            result = store.get(topic, queue_id, offset, max_count=256)
            if result.status is not GetStatus.FOUND:
                break
            for message in result.messages:
                mismatches += message.body != bodies[index]
                index += 1
                if index == len(bodies):
                    break
            offset = result.next_offset
        read += index
        per_topic[topic] = per_topic.get(topic, 0) + index
    read_seconds = time.perf_counter() - started
    print(f"  read back {read:,} messages in {read_seconds:.2f} s = {read / read_seconds:,.0f} msgs/s, "
          f"{mismatches} body mismatches")
    print("  topic        queues  messages this run  queue max offsets")
    for topic in TOPICS:
        maxima = [store.max_offset(topic, q) for q in range(QUEUES_PER_TOPIC)]
        print(f"  {topic:<12} {QUEUES_PER_TOPIC:>6}  {per_topic.get(topic, 0):>17,}  {maxima}")
    tagged = store.get("orders", 0, first_offsets[("orders", 0)], max_count=3, tags="paid")
    print(f"  tag filter: first 'paid' orders of queue 0: "
          f"{[m.body[:40].decode() for m in tagged.messages]}")
    stats = store.stats()
    print(f"  commitlog: {stats['commitlog']['segments']} segment(s), end offset "
          f"{stats['commitlog']['max_offset']:,}")
    return read == message_count and mismatches == 0


# --- the Spark part -------------------------------------------------------------------------------------------
def _spark_session():
    """A quiet local[*] session with the JVM reader's jar, whose Python workers run this interpreter (which imports
    mqstore)."""
    use_this_interpreter()
    from pyspark.sql import SparkSession

    import mqstore.spark

    builder = (SparkSession.builder.master("local[*]").appName("mqstore-demo")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(SPARK_SHUFFLE_PARTITIONS))
               .config("spark.sql.python.filterPushdown.enabled", "true"))
    session = mqstore.spark.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def read_by_hand_command(store_dir: str) -> str:
    """A shell command that reads `store_dir` with Spark as a user would (docs/spark.md), with this Python."""
    program = ("from pyspark.sql import SparkSession; import mqstore.spark; "
               "spark = mqstore.spark.configure(SparkSession.builder).getOrCreate(); mqstore.spark.register(spark); "
               f"spark.read.format('commitlog').load({store_dir!r}).groupBy('topic').count().show()")
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(program)}"


def _spark_part(store_dir: str, api_counts: dict[str, int], spark=None) -> bool:
    """Count the store's messages per topic with Spark, compare with the API's counts, show a few rows.

    True when the counts agree (or when Spark is not available here: that part is skipped, with the reason)."""
    missing = spark_missing()
    if missing is not None:
        print(f"spark part skipped: {missing}")
        return True
    started = time.perf_counter()
    own_session = spark is None
    if own_session:
        print("spark: starting a local[*] session (about 10 s)...", flush=True)
        try:
            spark = _spark_session()
        except Exception as exc:  # the JVM did not start (a Java Spark cannot run on, no memory, ...)
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"spark part FAILED: the local Spark session did not start: {first_line}")
            return False
    try:
        import mqstore.spark

        mqstore.spark.register(spark)
        print(f"spark: session ready after {time.perf_counter() - started:.1f} s (Spark {spark.version}); "
              f"reading with spark.read.format(\"commitlog\").load({store_dir!r})")
        agree = _spark_queries(spark, store_dir, api_counts)
    finally:
        if own_session:
            spark.stop()
    print("to read the store with Spark yourself (docs/spark.md explains each line):")
    print(f"  {read_by_hand_command(store_dir)}")
    return agree


def _spark_queries(spark, store_dir: str, api_counts: dict[str, int]) -> bool:
    from pyspark.sql import functions as F

    df = spark.read.format("commitlog").load(store_dir)
    started = time.perf_counter()
    spark_counts = {row["topic"]: row["count"] for row in df.groupBy("topic").count().collect()}
    print(f"  messages per topic, whole store ({time.perf_counter() - started:.2f} s for the Spark count):")
    print("  topic          spark count    API count (sum of max_offset - min_offset over the topic's queues)")
    topics = [t for t in TOPICS if t in api_counts or t in spark_counts]
    topics += sorted((set(api_counts) | set(spark_counts)) - set(topics))
    for topic in topics:
        spark_count, api_count = spark_counts.get(topic, 0), api_counts.get(topic, 0)
        verdict = "same" if spark_count == api_count else "DIFFERENT"
        print(f"  {topic:<12} {spark_count:>13,} {api_count:>12,}  {verdict}")
    agree = all(spark_counts.get(t, 0) == api_counts.get(t, 0) for t in topics)
    print(f"  first {SPARK_ROWS_SHOWN} messages of orders/0 (topic and queue filters pushed down: read through "
          f"its ConsumeQueue):")
    rows = (df.where((F.col("topic") == "orders") & (F.col("queue_id") == 0))
            .select("topic", "queue_id", "queue_offset", "tags", F.col("body").cast("string").alias("body"),
                    "store_timestamp")
            .orderBy("queue_offset").limit(SPARK_ROWS_SHOWN))
    rows.show(truncate=44)
    print("spark " + ("OK: Spark counts every topic's messages as the API does" if agree
                      else "FAILED: Spark and the API count different numbers of messages"))
    return agree
