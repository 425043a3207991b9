"""A queue rebuilt from a log whose first segment is gone starts with filler units (RocketMQ's pre-fill): RocketMQ
4.4.0 reads such a store with the same queue minimums and the same messages as mqstore."""

from __future__ import annotations

from mqstore import MessageStore
from tests.conftest import small_config
from tests.recovery.test_queue_starts_late import ENTRIES_PER_FILE, store_without_its_first_segment
from tests.rocketmq import assert_same_messages, store_entries


def test_rocketmq_reads_a_queue_that_starts_late_as_mqstore_does(rmq, tmp_path):
    root = tmp_path / "store"
    bodies = store_without_its_first_segment(root, queues=3)
    config = small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)
    MessageStore.open(root, config).close()  # builds the queues, fillers first
    with MessageStore.open(root, config, read_only=True) as store:
        ours = store_entries(store)
        minimums = {q: store.min_offset("t", q) for q in range(3)}
    assert all(low > 0 for low in minimums.values())
    assert len(ours) == sum(len(bodies[q]) - minimums[q] for q in range(3))
    theirs = rmq.read(root, config, tmp_path)
    assert_same_messages(ours, theirs.entries, "mqstore's get() vs RocketMQ's read of late-starting queues")
    first_read = {entry["queue_id"]: entry["queue_offset"] for entry in reversed(theirs.entries)}
    assert first_read == minimums  # RocketMQ's own min offset of each queue, skipping the fillers
