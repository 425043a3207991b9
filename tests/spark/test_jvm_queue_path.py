"""The JVM reader's ConsumeQueue path (a topic or queue filter): each record a unit points to is copied alone out of
a read-only mapping of its segment and checked as store.scan(topic=...) checks it. Rows equal a Python scan's with
the same filter, value for value, when a queue's units run over several ConsumeQueue files and its records over
several segments; a damaged selected record, or a unit that disagrees with its record, gives scan()'s error (rule,
file, position); a small read is planned as one partition a core."""

from __future__ import annotations

import pytest
from mqstore.commitlog import format as fmt

from mqstore import MessageStore
from mqstore.store.scan import scan_store
from tests.spark.storegen import StoreWriter
from tests.spark.test_jvm_hostile import jvm_outcome, python_outcome
from tests.spark.test_scan_parity import rows_by_offset

SEGMENT = 64 * 1024
QUEUE_ENTRIES_PER_FILE = 64  # a queue of 500 entries spans 8 files


def many_files(tmp_path):
    """About 40 segments of 64 KiB; "bulk" has 3 queues of 500 entries, "other" 2 of 200."""
    root = tmp_path / "store"
    with StoreWriter(root, segment_size_bytes=SEGMENT, queue_entries_per_file=QUEUE_ENTRIES_PER_FILE) as writer:
        writer.put_bulk("bulk", 1500, 1500, queue_count=3)
        writer.put_bulk("other", 400, 30, queue_count=2, seed=1)
    assert len(list((root / "commitlog").iterdir())) > 20
    assert len(list((root / "consumequeue" / "bulk" / "1").iterdir())) > 4
    return root


@pytest.mark.parametrize("options, filters", [
    ({"topic": "bulk", "queue_id": "1"}, {"topic": "bulk", "queue_ids": [1]}),
    ({"topic": "bulk", "queue_id": "0,2"}, {"topic": "bulk", "queue_ids": [0, 2]}),
    ({"topic": "other"}, {"topic": "other"}),
    ({"topic": "bulk,other"}, {"topic": ["bulk", "other"]}),
])
def test_a_queue_filter_gives_a_python_scans_rows_across_queue_files_and_segments(spark, jvm_reader, tmp_path,
                                                                                   options, filters):
    root = many_files(tmp_path)
    expected = rows_by_offset(scan_store(root, **filters).read_all())
    got = rows_by_offset(spark.read.format(jvm_reader).options(**options).load(str(root)).toArrow())
    assert len(got) == len(expected) > 0
    assert got == expected
    where = " AND ".join(f"{column} IN ({', '.join(repr(v) if column == 'topic' else v for v in value.split(','))})"
                         for column, value in options.items())
    pushed = rows_by_offset(spark.read.format(jvm_reader).load(str(root)).where(where).toArrow())
    assert pushed == expected


def _selected_record(root, rank: int) -> tuple:
    """(commitlog offset, size, segment path, position in it) of a record of "bulk" queue 1 past the first segment."""
    rows = scan_store(root, topic="bulk", queue_ids=[1]).read_all().to_pylist()
    row = rows[rank]
    offset = row["commitlog_offset"]
    assert offset >= SEGMENT
    with MessageStore.open(str(root), read_only=True) as store:
        size = store.read_at(offset).size_bytes
    return offset, size, root / "commitlog" / fmt.segment_name(offset - offset % SEGMENT), offset % SEGMENT


def _patch(path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


@pytest.mark.parametrize("damage, rule", [
    ("magic", "commitlog.1"),  # the record's magic code
    ("totalsize", "consumequeue.matches-log"),  # TOTALSIZE disagrees with the unit
    ("topic", "consumequeue.matches-log"),  # a record of another topic, same length
    ("physical-offset", "commitlog.4"),  # PHYSICALOFFSET is not the record's position
])
def test_a_damaged_selected_record_gives_scans_error(spark, jvm_reader, tmp_path, damage, rule):
    root = many_files(tmp_path)
    offset, size, path, position = _selected_record(root, 300)
    if damage == "magic":
        _patch(path, position + fmt.OFFSET_MAGIC_CODE, b"\x00\x00\x00\x00")
    elif damage == "totalsize":
        _patch(path, position, (size - 8).to_bytes(4, "big"))
    elif damage == "topic":
        data = path.read_bytes()
        at = data.index(b"bulk", position, position + size)
        _patch(path, at, b"bulx")
    else:
        _patch(path, position + fmt.OFFSET_PHYSICAL_OFFSET, (offset + 1).to_bytes(8, "big"))
    with MessageStore.open(str(root), read_only=True) as store:
        expected = python_outcome(lambda: store.scan(topic="bulk", queue_ids=[1]).read_all())
    assert expected[0] == rule
    assert jvm_outcome(spark, jvm_reader, root, topic="bulk", queue_id="1") == expected
    assert jvm_outcome(spark, jvm_reader, root, topic="bulk", queue_id="2") == ("ok",)  # never read


def test_a_unit_past_its_segment_is_refused_before_the_record_is_read(spark, jvm_reader, tmp_path):
    root = many_files(tmp_path)
    queue = root / "consumequeue" / "bulk" / "1"
    first = sorted(queue.iterdir())[1]
    unit = bytearray(first.read_bytes()[:20])
    offset = int.from_bytes(unit[:8], "big")
    unit[8:12] = (SEGMENT - offset % SEGMENT + 1).to_bytes(4, "big")  # one byte past the segment's end
    _patch(first, 0, bytes(unit))
    outcome = jvm_outcome(spark, jvm_reader, root, topic="bulk", queue_id="1")
    assert outcome[0] == "consumequeue.matches-log"
    assert outcome[1:] == (str(root / "commitlog" / fmt.segment_name(offset - offset % SEGMENT)), offset % SEGMENT)


def test_a_small_read_is_planned_as_one_partition_a_core(spark, jvm_reader, tmp_path):
    """Half a megabyte of records: a task costs more than splitting it finer saves."""
    root = many_files(tmp_path)
    cores = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().availableProcessors()
    full = spark.read.format(jvm_reader).load(str(root))
    by_queue = spark.read.format(jvm_reader).options(topic="bulk", queue_id="0,1").load(str(root))
    assert full.rdd.getNumPartitions() <= cores + 1  # cores, and one more when the records do not divide evenly
    assert by_queue.rdd.getNumPartitions() <= cores + 1
    assert by_queue.count() == 1000
