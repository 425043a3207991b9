"""Issue 31's end to end: a store with a tier runs the demo's workload, seals and uploads everything, drops its
local history, and every message is still read back byte for byte through the API and the command line (from local
queue files and the tier's segments) and through scan() from the bucket alone, and RocketMQ 4.4.0 reads a
downloaded copy of the bucket. Spark from the bucket alone: tests/spark/test_tier_done_when.py."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from mqstore import MessageStore
from mqstore.demo import QUEUES_PER_TOPIC, TOPICS, _message
from mqstore.store.scan import scan_store
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from tests.cli.conftest import mqstore  # noqa: F401 - the fixture that runs the command line in-process
from tests.rocketmq import assert_same_messages, require_rmq, store_entries
from tests.tier.test_uploader import SEGMENT, tier_config

MESSAGES = 3000

# about a minute over its two tiers: `make test-long` (CI runs it after `make test`)
pytestmark = pytest.mark.long


def expected_messages() -> dict[tuple[str, int], list]:
    """The demo's messages by queue, in put order."""
    found: dict[tuple[str, int], list] = {(topic, queue): [] for topic in TOPICS for queue in range(QUEUES_PER_TOPIC)}
    for number in range(MESSAGES):
        message = _message(number)
        found[(message.topic, message.queue_id)].append(message)
    return found


def same_message(stored, put) -> bool:
    return (stored.topic, stored.queue_id, stored.body, stored.tags, tuple(stored.keys)) == \
        (put.topic, put.queue_id, put.body, put.tags, tuple(put.keys))


@pytest.fixture
def offloaded(tmp_path, tier_uri):
    """The demo's workload in a store with a tier, sealed, uploaded and then removed from local disk."""
    root = tmp_path / "store"
    config = tier_config(tier_uri, file_reserved_hours=0)
    with MessageStore.open(root, config) as store:
        for start in range(0, MESSAGES, 500):
            store.put_batch([_message(number) for number in range(start, start + 500)])
        end = store.seal_segment()
        assert store.wait_dispatched(30) and store.wait_tiered(end, 60)
        report = store.clean_expired()
        stats = store.stats()
    assert stats["commitlog"]["min_offset"] == end  # nothing of the history is on local disk any more
    assert len(report["segments_removed"]) == end // SEGMENT and end > 10 * SEGMENT
    assert sorted(p.name for p in (root / "commitlog").iterdir()) == [f"{end:020d}"]
    return root, tier_uri, config, end


def test_every_message_reads_back_through_the_api_after_the_local_history_is_gone(offloaded):
    root, _, config, _ = offloaded
    expected = expected_messages()
    for read_only in (False, True):
        with MessageStore.open(root, config, read_only=read_only) as store:
            for (topic, queue_id), messages in expected.items():
                got = store.get(topic, queue_id, 0, max_count=len(messages) + 1)
                assert len(got.messages) == len(messages), (topic, queue_id, got.status)
                assert all(same_message(s, p) for s, p in zip(got.messages, messages)), (topic, queue_id)
                for stored in got.messages[:: 97]:
                    assert store.read_at(stored.commitlog_offset) == stored
                    assert stored in store.query(topic, stored.keys[0])


def test_every_message_reads_back_through_the_command_line(offloaded, mqstore):  # noqa: F811
    root, uri, _, _ = offloaded
    expected = expected_messages()
    for topic in TOPICS:  # the URI is given: one with credentials is not saved in the store
        run = mqstore("tail", root, "--topic", topic, "--json", "--tier-uri", uri)
        assert run.code == 0, run.err
        lines = run.json_lines()
        by_queue = {queue: [line for line in lines if line["queue_id"] == queue] for queue in range(QUEUES_PER_TOPIC)}
        for queue, printed in by_queue.items():
            messages = expected[(topic, queue)]
            assert [bytes.fromhex(line["body_hex"]) for line in printed] == [m.body for m in messages], (topic, queue)
            assert [line["keys"] for line in printed] == [list(m.keys) for m in messages]


def test_every_message_reads_back_through_scan_from_the_bucket_alone(offloaded):
    root, uri, _, _ = offloaded
    table = scan_store(uri, columns=["topic", "queue_id", "queue_offset", "body", "tags", "keys"]).read_all()
    assert table.num_rows == MESSAGES
    rows = sorted(table.to_pylist(), key=lambda row: (row["topic"], row["queue_id"], row["queue_offset"]))
    expected = [message for key in sorted(expected_messages()) for message in expected_messages()[key]]
    assert [(r["topic"], r["queue_id"], r["body"], r["tags"], tuple(r["keys"])) for r in rows] == \
        [(m.topic, m.queue_id, m.body, m.tags, tuple(m.keys)) for m in expected]
    with MessageStore.open(root, tier_config(uri), read_only=True) as store:
        assert store.scan().read_all() == scan_store(uri).read_all()  # the store's scan reads its history there


def test_rocketmq_reads_a_downloaded_copy_of_the_bucket(offloaded, tmp_path):
    rmq = require_rmq()
    root, uri, config, end = offloaded
    location = TierLocation.open(uri)
    copy = tmp_path / "downloaded"
    pafs.copy_files(location.root, str(copy), source_filesystem=location.filesystem,
                    destination_filesystem=pafs.LocalFileSystem())
    assert manifest_module.load(TierLocation.open(str(copy))).end == end
    theirs = rmq.read(copy, config, tmp_path / "work").entries
    with MessageStore.open(root, config, read_only=True) as store:
        ours = store_entries(store)
    assert len(ours) == MESSAGES
    for entry in theirs + ours:
        entry["properties"].pop("__CRC32#", None)
    assert_same_messages(ours, theirs, "RocketMQ 4.4.0 reading a downloaded copy of the tier")
