"""The demo behind `make demo` / `mqstore demo`: write a store, read every message back, print a summary."""

from __future__ import annotations

import os
import time

from mqstore import GetStatus, Message, MessageStore, StoreConfig

TOPICS = ("orders", "payments", "clicks", "audit-log")
QUEUES_PER_TOPIC = 4
BATCH_MESSAGES = 1000
TAGS = ("created", "paid", "shipped", "cancelled")


def _message(sequence: int) -> Message:
    topic = TOPICS[sequence % len(TOPICS)]
    body = (f'{{"seq":{sequence},"topic":"{topic}","amount":{sequence * 7 % 10_000},'
            f'"note":"{"x" * (sequence % 200)}"}}').encode()
    return Message(topic, body, queue_id=(sequence // len(TOPICS)) % QUEUES_PER_TOPIC,
                   tags=TAGS[(sequence // (len(TOPICS) * QUEUES_PER_TOPIC)) % len(TAGS)], keys=(f"order-{sequence}",))


def run_demo(store_dir: str, message_count: int) -> int:
    store_dir = os.path.abspath(store_dir)
    print(f"mqstore demo: {message_count:,} messages over {len(TOPICS)} topics x {QUEUES_PER_TOPIC} queues "
          f"into {store_dir}")
    with MessageStore.open(store_dir, StoreConfig()) as store:
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
    ok = read == message_count and mismatches == 0
    print("demo " + ("OK: every message read back byte for byte" if ok else "FAILED: see the counts above"))
    return 0 if ok else 1
