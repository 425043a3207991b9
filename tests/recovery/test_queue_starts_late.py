"""A ConsumeQueue built from a log whose first segments are gone starts at the first entry the log still holds:
its first file is made with filler units before that entry (RocketMQ's pre-fill, consumequeue/format.py), and
the queue's min_offset is that entry, for this writer, a later one and a reader."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, QueueGapError
from mqstore.consumequeue import format as cqf
from mqstore.consumequeue.consume_queue import ConsumeQueue

from mqstore import GetStatus, Message, MessageStore
from mqstore.store.store_files import QueueIndex
from tests.conftest import small_config

ENTRIES_PER_FILE = 64


def store_without_its_first_segment(root, *, queues: int = 1) -> dict[int, list[bytes]]:
    """Messages over five 64 KiB segments in `queues` queues of topic t; then the first segment and every queue
    file of t are deleted. Returns the bodies each queue's messages have, by queue offset."""
    bodies: dict[int, list[bytes]] = {q: [] for q in range(queues)}
    with MessageStore.open(root, small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)) as store:
        for i in range(400):
            queue_id = i % queues
            body = f"{i:04d}".encode() * 125
            bodies[queue_id].append(body)
            store.put(Message("t", body, queue_id=queue_id))
    os.remove(os.path.join(root, "commitlog", fmt.segment_name(0)))
    shutil.rmtree(os.path.join(root, "consumequeue", "t"))
    return bodies


@pytest.mark.parametrize("queues", [1, 3])
def test_a_rebuilt_queue_starts_at_the_first_entry_the_log_holds(tmp_path, queues):
    bodies = store_without_its_first_segment(tmp_path, queues=queues)
    config = small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)
    with MessageStore.open(tmp_path, config) as store:
        report = store.recovery_report
        log_min = store.stats()["commitlog"]["min_offset"]
        starts = {}
        for queue_id in range(queues):
            assert f"t/{queue_id}" in report.queues_rebuilt
            low, high = store.min_offset("t", queue_id), store.max_offset("t", queue_id)
            assert low > 0 and high == len(bodies[queue_id])
            got = store.get("t", queue_id, low, max_count=1000)
            assert got.status is GetStatus.FOUND
            assert [m.queue_offset for m in got.messages] == list(range(low, high))
            assert [m.body for m in got.messages] == bodies[queue_id][low:]
            assert got.messages[0].commitlog_offset >= log_min  # the first message the log still holds
            assert store.get("t", queue_id, low - 1).status is GetStatus.OFFSET_TOO_SMALL
            starts[queue_id] = low
        store.put(Message("t", b"after", queue_id=0))
        store.wait_dispatched()
    for read_only in (False, True):
        with MessageStore.open(tmp_path, config, read_only=read_only) as store:
            if not read_only:
                assert store.recovery_report.queues_rebuilt == []
            for queue_id, low in starts.items():
                assert store.min_offset("t", queue_id) == low
            last = store.get("t", 0, store.max_offset("t", 0) - 1)
            assert [m.body for m in last.messages] == [b"after"]


def test_the_first_file_holds_fillers_before_the_first_entry(tmp_path):
    store_without_its_first_segment(tmp_path)
    with MessageStore.open(tmp_path, small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)) as store:
        first = store.min_offset("t", 0)
    directory = tmp_path / "consumequeue" / "t" / "0"
    names = sorted(os.listdir(directory))
    file_first = first - first % ENTRIES_PER_FILE
    assert names[0] == cqf.file_name(file_first)  # the file holding the first entry, no earlier one
    units = np.fromfile(directory / names[0], dtype=cqf.CONSUME_QUEUE_UNIT)
    fillers = units[: first - file_first]
    assert len(fillers) == first - file_first > 0
    assert (fillers["commitlog_offset"] == 0).all() and (fillers["size"] == 0x7FFFFFFF).all()
    assert (fillers["tags_code"] == 0).all()
    assert units[first - file_first]["size"] not in (0, 0x7FFFFFFF)
    assert cqf.leading_fillers(units[: first - file_first + 3]) == first - file_first


def test_a_reader_that_maps_the_first_file_later_skips_its_fillers(tmp_path):
    store_without_its_first_segment(tmp_path)
    config = small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)
    with MessageStore.open(tmp_path, config) as store:
        first = store.min_offset("t", 0)
        end = store.max_offset("t", 0)
    queue = ConsumeQueue(str(tmp_path / "consumequeue" / "t" / "9"), "t", 9, ENTRIES_PER_FILE, writable=False)
    assert (queue.min_offset, queue.max_offset) == (0, 0)  # no files yet
    shutil.copytree(tmp_path / "consumequeue" / "t" / "0", tmp_path / "consumequeue" / "t" / "9")
    queue.refresh()
    assert (queue.min_offset, queue.max_offset) == (first, end)
    assert int(queue.read(first, 1)["size"][0]) != cqf.FILLER_SIZE
    queue.close()


def test_a_queue_with_entries_still_refuses_a_gap(tmp_path):
    queue = ConsumeQueue(str(tmp_path / "q"), "t", 0, ENTRIES_PER_FILE, writable=True)
    queue.put(0, cqf.make_units([100], [50], [0]))
    with pytest.raises(QueueGapError) as caught:
        queue.put(5, cqf.make_units([300], [50], [0]))
    assert caught.value.continues_at == 5
    with pytest.raises(QueueGapError, match="not empty"):
        queue.start_at(5)
    queue.close()


def test_fillers_anywhere_but_the_start_of_the_first_file_are_damage(tmp_path):
    queue = ConsumeQueue(str(tmp_path / "q"), "t", 0, ENTRIES_PER_FILE, writable=True)
    queue.put(0, cqf.make_units([100, 200], [50, 50], [0, 0]))
    queue.units[0][2] = cqf.filler_units(1)[0]
    queue.units[0][3] = cqf.make_units([300], [50], [0])[0]
    queue.flush()
    queue.close()
    with pytest.raises(CorruptionError, match="do not increase"):
        ConsumeQueue(str(tmp_path / "q"), "t", 0, ENTRIES_PER_FILE, writable=False)


def test_a_log_that_starts_at_zero_does_not_start_a_queue_late(tmp_path):
    """With the whole log there, a queue whose first message in the log is not entry 0 lost messages the log
    should hold: opening reports it instead of hiding it behind fillers."""
    config = small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE, record_crc=False)
    with MessageStore.open(tmp_path, config) as store:
        for i in range(10):
            store.put(Message("t", b"x%d" % i))
    # The log's first record moved to queue 1 (BODYCRC does not cover QUEUEID): t/0's first record is entry 1.
    segment = tmp_path / "commitlog" / fmt.segment_name(0)
    data = bytearray(segment.read_bytes())
    fmt.I32.pack_into(data, fmt.OFFSET_QUEUE_ID, 1)
    segment.write_bytes(bytes(data))
    shutil.rmtree(tmp_path / "consumequeue" / "t")
    with pytest.raises(QueueGapError, match="the CommitLog itself lacks entries of queue t/0"):
        MessageStore.open(tmp_path, config).close()
    queue_directory = tmp_path / "consumequeue" / "t" / "0"
    assert not queue_directory.exists() or not os.listdir(queue_directory)  # no queue made up with fillers


def test_a_topic_scan_reads_a_queue_that_starts_late_from_its_first_entry(tmp_path):
    bodies = store_without_its_first_segment(tmp_path)
    config = small_config(consume_queue_entries_per_file=ENTRIES_PER_FILE)
    MessageStore.open(tmp_path, config).close()
    with MessageStore.open(tmp_path, config, read_only=True) as store:
        first = store.min_offset("t", 0)
        table = store.scan(topic="t").read_all()
    assert table.column("queue_offset").to_pylist() == list(range(first, len(bodies[0])))
    assert table.column("body").to_pylist() == bodies[0][first:]
    number, units = QueueIndex(str(tmp_path)).entries(str(tmp_path / "consumequeue" / "t" / "0"), 0, 1 << 40)
    assert number == first and len(units) == len(bodies[0]) - first  # from offset 0 on: no filler taken
