"""A batch read while another process appends: each read sees a prefix of the log, whole records only."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest

from mqstore.store.scan_options import StoreRef
from mqstore.store.scan_plan import plan_store
from tests.conftest import wait_until
from tests.spark.conftest import REPO_ROOT

SEGMENT = 128 * 1024
WRITER_RECORD_BYTES_MAX = 1024  # the writer's records: a body of at most 706 bytes, a short topic and properties
TOPICS = 3

WRITER = """
import sys, time
sys.path.insert(0, {root!r})
try:  # the engine when it is there, else the tests' own writer
    from mqstore import MessageStore, StoreConfig, Message
    # no retention under disk pressure: on a busy disk it would remove the first segments mid-test
    config = StoreConfig(segment_size_bytes={segment}, max_message_size_bytes=8192, consume_queue_entries_per_file=256,
                         disk_max_used_space_ratio=1.0, disk_full_ratio=1.0, dispatch_process={process})
    store = MessageStore.open({store!r}, config)
except ImportError:
    from tests.spark.storegen import StoreWriter
    class Message:
        def __init__(self, topic, body, queue_id, tags):
            self.args = (topic, body), dict(queue_id=queue_id, tags=tags)
    class Store(StoreWriter):
        def put(self, message):
            return super().put(*message.args[0], **message.args[1])
    store = Store({store!r}, segment_size_bytes={segment}, queue_entries_per_file=256)
first = int(sys.argv[1])
print("READY", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
i = first
while time.monotonic() < deadline:
    store.put(Message(f"live-{{i % {topics}}}", f"{{i}}:".encode() + b"x" * (i % 700), queue_id=i % 2,
                      tags=f"T{{i % 4}}"))
    i += 1
    if i % 100 == 0:
        time.sleep(0.02)  # about 5 000 messages a second: the reads stay small
store.close()
print("DONE", i, flush=True)
"""


def start_writer(store, first: int, seconds: float, process: bool = False) -> subprocess.Popen:
    script = WRITER.format(root=str(REPO_ROOT), segment=SEGMENT, store=str(store), topics=TOPICS, process=process)
    process = subprocess.Popen([sys.executable, "-c", script, str(first), str(seconds)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "READY"
    return process


def planned_end(store) -> int:
    """The commitlog offset the source would read `store` up to if a read were planned now."""
    return plan_store(StoreRef(str(store), None)).end


def check_prefix(rows, topics=None) -> int:
    """The rows are messages 0..n-1 of the writer (of the given topics), each whole; returns n."""
    sequence = sorted(int(r.body.split(b":", 1)[0]) for r in rows)
    for r in rows:
        number, rest = r.body.split(b":", 1)
        assert rest == b"x" * (int(number) % 700)
        assert r.topic == f"live-{int(number) % TOPICS}"
    wanted = [i for i in range(sequence[-1] + 1) if topics is None or i % TOPICS in topics] if sequence else []
    assert sequence == wanted
    queues = defaultdict(list)
    for r in rows:
        queues[(r.topic, r.queue_id)].append(r.queue_offset)
    for offsets in queues.values():
        assert sorted(offsets) == list(range(len(offsets)))
    return len(sequence)


@pytest.mark.parametrize("process", [False, True], ids=["dispatch-thread", "dispatch-process"])
def test_reads_while_a_writer_process_appends_see_consistent_snapshots(spark, tmp_path, process):
    # with dispatch_process=True the dispatched mark the planner trusts is published by the writer's child
    store = tmp_path / "store"
    writer = start_writer(store, 0, 0.5, process)  # some records before the reads start
    done = writer.stdout.read().split()
    assert writer.wait(60) == 0 and done[0] == "DONE"
    first = int(done[1])
    writer = start_writer(store, first, 20, process)
    try:
        seen = []
        for round_ in range(3):
            df = spark.read.format("commitlog").load(str(store))
            rows = df.select("topic", "queue_id", "queue_offset", "commitlog_offset", "body").collect()
            seen.append(check_prefix(rows))
            one_topic = df.where("topic = 'live-1'").select("topic", "queue_id", "queue_offset", "body").collect()
            check_prefix(one_topic, topics={1})
            if round_ == 0:  # the later reads are planned past the end of the last record this one saw
                read_end = max(r.commitlog_offset for r in rows) + WRITER_RECORD_BYTES_MAX
                assert wait_until(lambda end=read_end: planned_end(store) > end)
        assert seen[0] >= first and seen[-1] > seen[0]  # the writer was really appending
    finally:
        writer.terminate()
        writer.wait(60)
