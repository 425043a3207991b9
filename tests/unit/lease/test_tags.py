"""Lease consumers with a tag filter (mqstore/lease/consumer.py): only matching messages are handed out, the
others are acknowledged in the journal as receive passes over them, so the prefix advances past them."""

from __future__ import annotations

import os

import pytest

from mqstore import InvalidMessageError, Message
from mqstore.lease import open_lease_consumer
from mqstore.lease.journal import journal_paths
from mqstore.store.reads import GET_FILTER_SCAN_ENTRIES_MIN

TOPIC = "jobs"
GROUP = "workers"

pytestmark = pytest.mark.usefixtures("codec")


def put(store, tags: list[str], queues: int = 1) -> None:
    store.put_batch([Message(TOPIC, b"%s%d" % (tag.encode(), i), queue_id=i % queues, tags=tag, keys=[f"k{i}"])
                     for i, tag in enumerate(tags)])
    assert store.wait_dispatched(10)


def test_only_matching_messages_are_handed_out_and_the_prefix_passes_the_rest(store, clock):
    put(store, ["a", "b", "c", "a", "c", "c", "b", "a"], queues=2)
    with open_lease_consumer(store, GROUP, TOPIC, tags="a || b") as consumer:
        received = consumer.receive(max_count=32, visibility_ms=1000)
        assert sorted(leased.message.tags for leased in received) == ["a", "a", "a", "b", "b"]
        assert consumer.receive(max_count=32, visibility_ms=1000) == []
        consumer.ack_many(leased.lease for leased in received[:-1])
        last = received[-1].lease
        assert consumer.prefixes()[last.queue_id] <= last.queue_offset  # the prefix waits for the unacknowledged
        consumer.ack(last)
        assert consumer.prefixes() == {0: 4, 1: 4} and consumer.leased_count() == 0
        clock.advance(10_000)
        assert consumer.receive(max_count=32, visibility_ms=1000) == []  # passed over means done, not leased


def test_a_match_past_the_scan_window_is_found_by_one_waiting_receive(store):
    skipped = GET_FILTER_SCAN_ENTRIES_MIN * 2 + 5
    put(store, ["other"] * skipped + ["wanted"])
    with open_lease_consumer(store, GROUP, TOPIC, tags=["wanted"]) as consumer:
        (leased,) = consumer.receive(max_count=4, visibility_ms=1000, timeout_ms=60_000)
        assert leased.message.tags == "wanted" and leased.lease.queue_offset == skipped
        consumer.ack(leased.lease)
        assert consumer.commit() == {0: skipped + 1}
    # nothing was outstanding while passing over: each run was one BASE record, not an ACK an entry
    size = os.path.getsize(journal_paths(store.root_dir, TOPIC, GROUP)[0])
    assert size < 32 * 32, size


def test_passed_over_entries_between_leases_are_acknowledged_one_by_one(store):
    put(store, ["a", "x", "x", "a", "x"])
    with open_lease_consumer(store, GROUP, TOPIC, tags="a") as consumer:
        first, second = consumer.receive(max_count=32, visibility_ms=1000)
        consumer.ack(second.lease)
        assert consumer.prefixes() == {0: 0}  # the first is still leased
        consumer.ack(first.lease)
        assert consumer.prefixes() == {0: 5}


def test_star_and_none_take_everything_and_bad_tags_are_refused(store):
    put(store, ["a", "b"])
    for number, tags in enumerate((None, "*", "a || *", "")):
        with open_lease_consumer(store, f"group{number}", TOPIC, tags=tags) as consumer:
            assert consumer.tags is None and len(consumer.receive(max_count=4, visibility_ms=1000)) == 2
    for tags in (5, ["a", 7], b"a"):
        with pytest.raises(InvalidMessageError):
            open_lease_consumer(store, GROUP, TOPIC, tags=tags)
