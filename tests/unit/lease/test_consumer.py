"""Lease consumers (mqstore/lease/consumer.py) on a ManualClock: leases, acks, expiry, the DLQ, bad input."""

from __future__ import annotations

import os
import pickle

import pytest
from mqstore.commitlog.errors import InvalidMessageError, StoreClosedError

from mqstore import Message, MessageStore
from mqstore.consumer.offsets import ConsumerOffsets
from mqstore.lease import ForeignLeaseError, LeaseExpiredError, UnknownLeaseError, open_lease_consumer
from mqstore.lease import format as lease_format
from mqstore.lease.journal import journal_paths

TOPIC = "jobs"
GROUP = "workers"

pytestmark = pytest.mark.usefixtures("codec")  # messages read and dead letters put through both codecs


def put(store, count: int, queues: int = 1, start: int = 0) -> None:
    store.put_batch([Message(TOPIC, b"m%d" % i, queue_id=i % queues, tags="t", keys=[f"k{i}"])
                     for i in range(start, start + count)])
    assert store.wait_dispatched(10)


def bodies(received) -> list[bytes]:
    return [leased.message.body for leased in received]


def journal_size(store) -> int:
    return os.path.getsize(journal_paths(store.root_dir, TOPIC, GROUP)[0])


def test_receive_leases_and_ack_advances_the_committed_prefix(store):
    put(store, 10, queues=2)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        first = consumer.receive(max_count=6, visibility_ms=1000)
        assert len(first) == 6 and all(leased.lease.delivery_count == 1 for leased in first)
        second = consumer.receive(max_count=10, visibility_ms=1000)
        assert sorted(bodies(first) + bodies(second)) == sorted(b"m%d" % i for i in range(10))
        assert consumer.receive(max_count=10, visibility_ms=1000) == []
        consumer.ack_many(leased.lease for leased in first + second)
        assert consumer.leased_count() == 0
        assert consumer.commit() == {0: 5, 1: 5}
    assert ConsumerOffsets.of_store(store.root_dir).offsets(TOPIC, GROUP) == {0: 5, 1: 5}
    plain = store.consumer(GROUP, TOPIC)
    assert plain.poll(max_count=10) == []


def test_the_prefix_stops_at_an_unacknowledged_message(store):
    put(store, 5)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        received = consumer.receive(max_count=5, visibility_ms=1000)
        consumer.ack_many([leased.lease for leased in received if leased.message.queue_offset != 2])
        assert consumer.prefixes() == {0: 2}
        consumer.ack(received[2].lease)
        assert consumer.prefixes() == {0: 5}


def test_an_expired_lease_redelivers_with_its_count_raised(store, clock):
    put(store, 3)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        received = consumer.receive(max_count=3, visibility_ms=1000)
        consumer.ack(received[0].lease)
        clock.advance(999)
        assert consumer.receive(max_count=3, visibility_ms=1000) == []
        clock.advance(1)
        again = consumer.receive(max_count=3, visibility_ms=1000)
        assert bodies(again) == [b"m1", b"m2"] and [leased.lease.delivery_count for leased in again] == [2, 2]
        size = journal_size(store)
        with pytest.raises(LeaseExpiredError):
            consumer.ack(received[1].lease)  # the old lease: expired, leased again
        assert journal_size(store) == size
        consumer.ack_many([leased.lease for leased in again])
        assert consumer.prefixes() == {0: 3}


def test_an_expired_lease_cannot_be_acknowledged(store, clock):
    put(store, 1)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        (leased,) = consumer.receive(max_count=1, visibility_ms=50)
        clock.advance(50)
        size = journal_size(store)
        with pytest.raises(LeaseExpiredError):
            consumer.ack(leased.lease)
        assert journal_size(store) == size and consumer.prefixes() == {0: 0}


def test_bad_acks_write_nothing(store, tmp_path):
    put(store, 3)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer, \
            open_lease_consumer(store, "others", TOPIC) as other:
        received = consumer.receive(max_count=3, visibility_ms=1000)
        (foreign,) = other.receive(max_count=1, visibility_ms=1000)
        consumer.ack(received[0].lease)
        size = journal_size(store)
        with pytest.raises(UnknownLeaseError, match="already acknowledged"):
            consumer.ack(received[0].lease)
        with pytest.raises(UnknownLeaseError, match="never handed out"):
            consumer.ack(received[1].lease._replace(queue_offset=99))
        with pytest.raises(ForeignLeaseError):
            consumer.ack(foreign.lease)
        with pytest.raises(UnknownLeaseError):  # one bad lease in a batch: none acknowledged
            consumer.ack_many([received[1].lease, received[0].lease])
        with pytest.raises(UnknownLeaseError):  # the same lease twice
            consumer.ack_many([received[2].lease, received[2].lease])
        with pytest.raises(InvalidMessageError):
            consumer.ack(("jobs@workers", 0, 1, 2, 3, 1))
        assert journal_size(store) == size and consumer.leased_count() == 2
        consumer.ack_many([received[1].lease, received[2].lease])


@pytest.mark.parametrize("arguments", [dict(visibility_ms=0), dict(visibility_ms=-5), dict(visibility_ms=1.5),
                                       dict(visibility_ms=13 * 3600 * 1000), dict(max_count=0),
                                       dict(timeout_ms=-1)])
def test_bad_receive_arguments_write_nothing(store, arguments):
    put(store, 1)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        consumer.receive(max_count=1, visibility_ms=1000)
        size = journal_size(store)
        with pytest.raises(InvalidMessageError):
            consumer.receive(**{"max_count": 1, "visibility_ms": 1000, **arguments})
        assert journal_size(store) == size


def test_bad_group_and_topic_are_refused(store):
    with pytest.raises(InvalidMessageError):
        open_lease_consumer(store, "no spaces", TOPIC)
    with pytest.raises(InvalidMessageError):
        open_lease_consumer(store, GROUP, "bad/topic")
    assert not os.path.exists(os.path.join(store.root_dir, "lease"))


def test_extend_and_nack(store, clock):
    put(store, 2)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        kept, given_up = consumer.receive(max_count=2, visibility_ms=100)
        extended = consumer.extend(kept.lease, 10_000)
        consumer.nack(given_up.lease)
        (again,) = consumer.receive(max_count=2, visibility_ms=100)
        assert again.message.body == b"m1" and again.lease.delivery_count == 2
        clock.advance(5000)
        assert consumer.receive(max_count=2, visibility_ms=100)[0].message.body == b"m1"  # again's lease ended
        consumer.ack(extended)
        with pytest.raises(LeaseExpiredError):
            consumer.extend(again.lease, 100)


def test_past_max_delivery_count_a_message_goes_to_the_dlq(store, clock):
    put(store, 2)
    with open_lease_consumer(store, GROUP, TOPIC, max_delivery_count=2) as consumer:
        for _ in range(2):
            received = consumer.receive(max_count=2, visibility_ms=100)
            consumer.ack_many([leased.lease for leased in received if leased.message.body == b"m1"])
            clock.advance(100)
        assert consumer.receive(max_count=2, visibility_ms=100) == []
        assert consumer.prefixes() == {0: 2} and consumer.leased_count() == 0
    assert store.wait_dispatched(10)
    dead = store.get("%DLQ%" + GROUP, 0, 0).messages
    assert [message.body for message in dead] == [b"m0"]
    original = store.get(TOPIC, 0, 0).messages[0]
    assert dead[0].properties["RETRY_TOPIC"] == TOPIC
    assert dead[0].properties["ORIGIN_MESSAGE_ID"] == original.msg_id
    assert dead[0].tags == "t" and dead[0].keys == ("k0",)


def test_leases_survive_a_reopen_of_the_consumer(store, clock):
    put(store, 4)
    consumer = open_lease_consumer(store, GROUP, TOPIC)
    received = consumer.receive(max_count=4, visibility_ms=1000)
    consumer.ack(received[0].lease)
    consumer.close()
    with open_lease_consumer(store, GROUP, TOPIC) as reopened:
        assert reopened.receive(max_count=4, visibility_ms=1000) == []
        reopened.ack(received[1].lease)  # a live lease handed out before the reopen
        clock.advance(1000)
        assert bodies(reopened.receive(max_count=4, visibility_ms=1000)) == [b"m2", b"m3"]


def test_a_new_journal_starts_at_the_committed_offset(store):
    put(store, 5)
    ConsumerOffsets.of_store(store.root_dir).commit(TOPIC, GROUP, {0: 3})
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        assert bodies(consumer.receive(max_count=5, visibility_ms=1000)) == [b"m3", b"m4"]


def test_compaction_keeps_the_state_for_every_consumer(store, clock):
    put(store, 300)
    first = open_lease_consumer(store, GROUP, TOPIC, compact_bytes=2048)
    second = open_lease_consumer(store, GROUP, TOPIC, compact_bytes=2048)
    held = first.receive(max_count=3, visibility_ms=10_000)  # live across compactions
    seen = set()
    for consumer in [first, second] * 20:
        received = consumer.receive(max_count=5, visibility_ms=10_000)
        seen.update(bodies(received))
        consumer.ack_many(leased.lease for leased in received)
    assert len(seen) == 200 and not seen & set(bodies(held))
    assert journal_size(store) < 9000  # without compaction: 40 receives and 40 acks of 176 bytes each
    assert ConsumerOffsets.of_store(store.root_dir).offsets(TOPIC, GROUP) == {0: 0}  # held at the front
    second.ack_many(leased.lease for leased in held)
    assert second.commit() == {0: 203}
    first.close()
    second.close()


def test_a_single_ack_after_another_consumer_compacted_goes_to_the_new_journal(store):
    put(store, 100)
    first = open_lease_consumer(store, GROUP, TOPIC, compact_bytes=2048)
    second = open_lease_consumer(store, GROUP, TOPIC, compact_bytes=2048)
    (kept,) = second.receive(max_count=1, visibility_ms=10_000)
    path = journal_paths(store.root_dir, TOPIC, GROUP)[0]
    inode = os.stat(path).st_ino
    while os.stat(path).st_ino == inode:  # first acks one by one until it compacts (a MOVED frame, a rename)
        (leased,) = first.receive(max_count=1, visibility_ms=10_000)
        first.ack(leased.lease)
    second.ack(kept.lease)  # its cheap growth check sees the MOVED frame and follows the rename
    with open_lease_consumer(store, GROUP, TOPIC) as third:
        assert third.leased_count() == 0 and third.prefixes() == {0: first.prefixes()[0]} and third.prefixes()[0] > 1
    first.close()
    second.close()


def test_a_moved_frame_of_a_compaction_that_died_before_its_rename_is_skipped(store):
    put(store, 3)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        first, second, _ = consumer.receive(max_count=3, visibility_ms=1000)
        consumer._journal._write(lease_format.encode_frame([lease_format.record(lease_format.KIND_MOVED, 0, 0)]))
        consumer.ack(first.lease)
        with open_lease_consumer(store, GROUP, TOPIC) as other:
            other.ack(second.lease)
            assert other.prefixes() == {0: 2}
        assert consumer.prefixes() == {0: 2} and consumer.leased_count() == 1


def test_a_torn_tail_is_cut_and_the_journal_goes_on(store):
    put(store, 3)
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        received = consumer.receive(max_count=1, visibility_ms=1000)
    path = journal_paths(store.root_dir, TOPIC, GROUP)[0]
    size = os.path.getsize(path)
    with open(path, "ab") as journal:
        journal.write(b"LEAS\x00\x00\x00\x01garbage")  # a writer killed inside its write()
    with open_lease_consumer(store, GROUP, TOPIC) as consumer:
        consumer.ack(received[0].lease)
        assert os.path.getsize(path) == size + 16 + 32
        assert bodies(consumer.receive(max_count=3, visibility_ms=1000)) == [b"m1", b"m2"]


def test_a_lease_can_be_acknowledged_by_another_consumer_of_the_group(store):
    put(store, 2)
    first = open_lease_consumer(store, GROUP, TOPIC)
    second = open_lease_consumer(store, GROUP, TOPIC)
    received = first.receive(max_count=2, visibility_ms=1000)
    second.ack(pickle.loads(pickle.dumps(received[0].lease)))  # e.g. handed to a worker process
    with pytest.raises(UnknownLeaseError):
        first.ack(received[0].lease)
    first.ack(received[1].lease)
    assert second.prefixes() == {0: 2}
    first.close()
    second.close()
    with pytest.raises(StoreClosedError):
        first.receive()


def test_a_read_only_consumer_leaves_dead_letters_to_the_writer(store, clock):
    put(store, 1)
    with MessageStore.open(store.root_dir, read_only=True, clock=clock) as reader, \
            open_lease_consumer(reader, GROUP, TOPIC, max_delivery_count=1) as consumer:
        assert len(consumer.receive(max_count=1, visibility_ms=100)) == 1
        clock.advance(100)
        assert consumer.receive(max_count=1, visibility_ms=100) == []  # cannot put on %DLQ%: left alone
        assert consumer.leased_count() == 1 and consumer.prefixes() == {0: 0}
    with open_lease_consumer(store, GROUP, TOPIC, max_delivery_count=1) as writer:
        assert writer.receive(max_count=1, visibility_ms=100) == []
        assert writer.prefixes() == {0: 1}
    assert store.wait_dispatched(10)
    assert [message.body for message in store.get("%DLQ%" + GROUP, 0, 0).messages] == [b"m0"]
