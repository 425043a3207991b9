"""Damaged bytes under a store are reported as CorruptionError by get/read_at/open, never returned as messages."""

from __future__ import annotations

import struct

import pytest

from mqstore import CorruptionError, InvalidMessageError, Message, MessageStore
from tests.unit.commitlog import handmade
from tests.unit.mqstore.conftest import config

pytestmark = pytest.mark.usefixtures("codec")  # each test with the Python and the compiled codec

SEGMENT_SIZE = config().segment_size_bytes


def _fill_segments(store_dir, count=40):
    """Messages of queue t/0 filling the first segment and starting more; returns their put results."""
    with MessageStore.open(store_dir, config()) as store:
        results = [store.put(Message("t", b"%04d" % i + b"\xff" * 2000)) for i in range(count)]
        other = store.put(Message("u", b"other"))
        assert store.wait_dispatched(30)
    assert results[-1].commitlog_offset > SEGMENT_SIZE > results[5].commitlog_offset
    return results, other


def _fill_two_segments(store_dir):
    return _fill_segments(store_dir, 40)


# (field, bit, what read_at says). read_at cannot tell "no record starts here" (rules 1 and 4) from damage, and a
# record with a wrong QUEUEOFFSET is still a valid record: only get, which knows the expected entry, sees it.
DAMAGE = [
    ("magic", handmade.AT_MAGIC, 3, InvalidMessageError),
    ("size", handmade.AT_TOTAL_SIZE + 3, 0, CorruptionError),
    ("body length", handmade.AT_BODY_LENGTH_V4 + 2, 4, CorruptionError),
    ("queue offset", handmade.AT_QUEUE_OFFSET + 7, 0, None),
    ("physical offset", handmade.AT_PHYSICAL_OFFSET + 7, 1, InvalidMessageError),
]


@pytest.mark.parametrize("field, at, bit, read_at_error", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_record_below_the_checked_segments_fails_get(store_dir, field, at, bit, read_at_error):
    results, _ = _fill_segments(store_dir, 130)  # five segments: a clean open checks the last three
    assert results[-1].commitlog_offset > 4 * SEGMENT_SIZE
    damaged = results[5]
    handmade.flip_bit(store_dir / "commitlog" / f"{0:020d}", damaged.commitlog_offset + at, bit)
    with MessageStore.open(store_dir, config()) as store:
        assert [m.queue_offset for m in store.get("t", 0, 0, max_count=5).messages] == list(range(5))
        with pytest.raises(CorruptionError):
            store.get("t", 0, 0, max_count=10)
        with pytest.raises(CorruptionError):
            store.get("t", 0, 5, max_count=1)
        assert store.get("t", 0, 6, max_count=1).messages[0].body[:4] == b"0006"
        if read_at_error is not None:
            with pytest.raises(read_at_error):
                store.read_at(damaged.commitlog_offset)


def test_a_damaged_record_in_the_last_segment_fails_open(store_dir):
    results, _ = _fill_two_segments(store_dir)
    last = results[-1].commitlog_offset
    handmade.flip_bit(store_dir / "commitlog" / f"{SEGMENT_SIZE:020d}", last - SEGMENT_SIZE + handmade.AT_MAGIC, 0)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(store_dir, config())
    assert raised.value.path.endswith(f"{SEGMENT_SIZE:020d}")
    with MessageStore.open(store_dir, config(), read_only=True) as reader:  # a reader can still look around
        assert reader.get("t", 0, 0, max_count=3).messages[2].body[:4] == b"0002"


def _rewrite_unit(store_dir, topic, queue_id, queue_offset, commitlog_offset, size):
    path = store_dir / "consumequeue" / topic / str(queue_id) / f"{0:020d}"
    data = bytearray(path.read_bytes())
    struct.pack_into(">qi", data, queue_offset * 20, commitlog_offset, size)
    path.write_bytes(bytes(data))


def test_a_queue_entry_pointing_at_another_queues_record_is_corruption(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        first = store.put(Message("a", b"a0"))
        other = store.put(Message("b", b"b0"))
        store.put(Message("a", b"a1"))
        assert store.wait_dispatched(30)
    _rewrite_unit(store_dir, "a", 0, 1, other.commitlog_offset, other.size_bytes)
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        assert reader.get("a", 0, 0, max_count=1).messages[0].body == b"a0"
        with pytest.raises(CorruptionError) as raised:
            reader.get("a", 0, 1)
        assert raised.value.rule == "consumequeue.matches-log"
    assert first.commitlog_offset == 0


def test_a_queue_entry_with_the_wrong_size_is_corruption(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        result = store.put(Message("a", b"payload"))
        assert store.wait_dispatched(30)
    _rewrite_unit(store_dir, "a", 0, 0, result.commitlog_offset, result.size_bytes + 1)
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        with pytest.raises(CorruptionError):
            reader.get("a", 0, 0)


def test_repair_cuts_the_log_and_makes_the_deletion_of_later_segments_durable(store_dir, monkeypatch):
    import mqstore.commitlog.commitlog as commitlog_module

    results, _ = _fill_two_segments(store_dir)
    handmade.flip_bit(store_dir / "commitlog" / f"{0:020d}", results[5].commitlog_offset + handmade.AT_MAGIC, 0)
    synced = []
    real_fsync_directory = commitlog_module.fsync_directory

    def spy(path):
        synced.append((path, sorted(p.name for p in (store_dir / "commitlog").iterdir())))
        real_fsync_directory(path)

    monkeypatch.setattr(commitlog_module, "fsync_directory", spy)
    with MessageStore.open(store_dir, config(), repair=True) as store:
        assert store.recovery_report.dropped_bytes > 0
        assert store.max_offset("t", 0) == 5
    # fsynced once the later segment was gone: a crash cannot bring its records back after new ones
    assert synced and synced[0][0] == str(store_dir / "commitlog") and synced[0][1] == [f"{0:020d}"]


@pytest.mark.parametrize("damage", ["size past the end", "offset past the end", "size, crashed"])
def test_a_queue_entry_past_the_logs_end_rebuilds_the_queue_and_hides_nothing(store_dir, damage):
    # Cutting the queue at such an entry would hide the good entries after it for good: no walk of the log
    # brings back entries the queues say they have.
    with MessageStore.open(store_dir, config()) as store:
        results = store.put_batch([Message("q", b"%03d" % i, queue_id=0) for i in range(30)])
        assert store.wait_dispatched(30)
    end = results[-1].commitlog_offset + results[-1].size_bytes
    victim = 29
    unit = results[victim]
    if damage == "offset past the end":
        _rewrite_unit(store_dir, "q", 0, victim, end + 4096, unit.size_bytes)
    else:
        _rewrite_unit(store_dir, "q", 0, victim, unit.commitlog_offset, unit.size_bytes + (1 << 24))
    if damage == "size, crashed":
        (store_dir / "abort").write_bytes(b"")
    with MessageStore.open(store_dir, config()) as store:
        assert store.recovery_report.queues_rebuilt == ["q/0"]
        got = store.get("q", 0, 0, max_count=100)
        assert [m.body for m in got.messages] == [b"%03d" % i for i in range(30)]
        assert [m.commitlog_offset for m in got.messages] == [r.commitlog_offset for r in results]


@pytest.mark.parametrize("bad_offset, bad_size", [(None, 0), (None, -1), (-1, None)])
def test_a_unit_damaged_under_an_open_store_is_corruption_for_every_get_that_reads_it(store_dir, bad_offset,
                                                                                       bad_size):
    # Opening checks the queues; damage done after that (the disk, another program) is found by the get that reads
    # the unit, whatever entry it starts at, and the entries around it stay readable.
    with MessageStore.open(store_dir, config()) as store:
        results = store.put_batch([Message("q", b"%03d" % i) for i in range(6)])
        assert store.wait_dispatched(30)
    victim = results[3]
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        path = store_dir / "consumequeue" / "q" / "0" / f"{0:020d}"
        with open(path, "r+b") as handle:  # in place: the reader's mapping sees it
            handle.seek(3 * 20)
            handle.write(struct.pack(">qi", victim.commitlog_offset if bad_offset is None else bad_offset,
                                     victim.size_bytes if bad_size is None else bad_size))
        assert [m.body for m in reader.get("q", 0, 0, max_count=3).messages] == [b"000", b"001", b"002"]
        assert [m.body for m in reader.get("q", 0, 4).messages] == [b"004", b"005"]
        for start, count in ((0, 32), (3, 1), (2, 2)):
            with pytest.raises(CorruptionError) as raised:
                reader.get("q", 0, start, max_count=count)
            assert (raised.value.rule == "consumequeue.1" and raised.value.offset == 3 * 20
                    and raised.value.path == str(path))


def test_a_damaged_entry_inside_a_queue_is_reported_or_repaired_never_hides_the_rest(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        results = store.put_batch([Message("q", b"%03d" % i, queue_id=0) for i in range(30)])
        assert store.wait_dispatched(30)
    for victim in range(30):
        unit = results[victim]
        _rewrite_unit(store_dir, "q", 0, victim, unit.commitlog_offset, unit.size_bytes + (1 << 24))
        with MessageStore.open(store_dir, config()) as store:
            for offset in range(30):
                try:
                    got = store.get("q", 0, offset, max_count=1).messages
                except CorruptionError as exc:  # the damaged entry, named
                    assert offset == victim and exc.path.endswith(f"{0:020d}")
                    continue
                assert [m.body for m in got] == [b"%03d" % offset]
        _rewrite_unit(store_dir, "q", 0, victim, unit.commitlog_offset, unit.size_bytes)


def test_entries_past_the_end_of_a_crashed_log_are_cut_without_a_rebuild(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        results = store.put_batch([Message("q", b"%03d" % i, queue_id=0) for i in range(30)])
        assert store.wait_dispatched(30)
    # the log lost its last three records (their pages never reached the disk); the queue kept their entries
    segment = store_dir / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[results[27].commitlog_offset:] = bytes(len(data) - results[27].commitlog_offset)
    segment.write_bytes(bytes(data))
    (store_dir / "abort").write_bytes(b"")
    checkpoint = bytearray((store_dir / "checkpoint").read_bytes())  # which the last flush did not reach
    checkpoint[24:32] = results[27].commitlog_offset.to_bytes(8, "big")
    (store_dir / "checkpoint").write_bytes(bytes(checkpoint))
    with MessageStore.open(store_dir, config()) as store:
        report = store.recovery_report
        assert report.queues_rebuilt == [] and report.queue_entries_dropped == 3
        assert store.max_offset("q", 0) == 27


def test_a_negative_entry_size_on_disk_is_reported_to_a_reader_and_rebuilt_by_a_writer(store_dir):
    with MessageStore.open(store_dir, config()) as store:
        results = store.put_batch([Message("q", b"%03d" % i) for i in range(6)])
        assert store.wait_dispatched(30)
    _rewrite_unit(store_dir, "q", 0, 2, results[2].commitlog_offset, -results[2].size_bytes)
    with pytest.raises(CorruptionError) as raised:  # not a queue that ends at entry 2
        MessageStore.open(store_dir, config(), read_only=True)
    assert raised.value.rule == "consumequeue.1"
    with MessageStore.open(store_dir, config()) as store:
        assert store.max_offset("q", 0) == 6
        assert [m.body for m in store.get("q", 0, 0).messages] == [b"%03d" % i for i in range(6)]
