"""Hostile bytes through the JVM reader: every kind of damage tests/native/test_scan_agrees_with_read_at.py makes
to one record is refused by format("commitlog") with the rule, file and position in that file read_at gives (a
full scan), and with the error store.scan(topic=...) gives when the read goes through the ConsumeQueues; random
damage gives read_at's outcome without CRC checks, error for error. Damage to records a topic or queue filter
does not select is never read: the filter reads through the ConsumeQueues."""

from __future__ import annotations

import random
import re
import shutil

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError
from mqstore.flush.checkpoint import CHECKPOINT_DTYPE, CHECKPOINT_FILE_NAME

from mqstore import Message, MessageStore
from mqstore.store.scan import scan_store
from tests.conftest import small_config
from tests.native.test_scan_agrees_with_read_at import DAMAGES, MIDDLE, SEGMENT_BYTES, _damaged, _outcome
from tests.native.test_scan_agrees_with_read_at import pristine as pristine  # noqa: F401 - the fixture
from tests.spark.test_scan_parity import several_segments

JVM_ERROR = re.compile(r"\[rule ([\w.-]+)\] \(file (\S+), offset (\d+)\)")
RANDOM_STORES = 8
RANDOM_SEED = 20261128


def jvm_outcome(spark, name, root, **options) -> tuple:
    """("ok",) or the (rule, file, offset) the JVM reader's error names."""
    try:
        spark.read.format(name).options(**options).load(str(root)).toArrow()
    except Exception as exc:  # noqa: BLE001 - compared as a value
        found = JVM_ERROR.search(str(exc))
        assert found is not None, str(exc)[-2000:]
        assert "ArrayIndexOutOfBounds" not in str(exc) and "NegativeArraySize" not in str(exc)
        return found.group(1), found.group(2), int(found.group(3))
    return ("ok",)


def python_outcome(call) -> tuple:
    outcome = _outcome(call)
    return outcome[:3]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_record_gives_read_ats_error(spark, jvm_reader, pristine, tmp_path, damage):  # noqa: F811
    root, result, segment, position = _damaged(pristine, tmp_path, MIDDLE, damage)
    with MessageStore.open(str(root), read_only=True) as store:
        read_at = python_outcome(lambda: store.read_at(result.commitlog_offset))
        by_queue = python_outcome(lambda: store.scan(topic="T").read_all())
    assert read_at == (DAMAGES[damage][1], str(segment), position)
    assert jvm_outcome(spark, jvm_reader, root) == read_at
    assert jvm_outcome(spark, jvm_reader, root, topic="T") == by_queue  # through the ConsumeQueue: its unit first


def test_random_damage_gives_read_ats_outcome(spark, jvm_reader, pristine, tmp_path):  # noqa: F811
    rng = random.Random(RANDOM_SEED)
    print(f"seed {RANDOM_SEED}")
    source, results = pristine
    for trial in range(RANDOM_STORES):
        root = tmp_path / f"store-{trial}"
        shutil.copytree(source, root)
        result = results[rng.randrange(MIDDLE - 60, MIDDLE + 60)]
        base = result.commitlog_offset - result.commitlog_offset % SEGMENT_BYTES
        with open(root / "commitlog" / fmt.segment_name(base), "r+b") as handle:
            for _ in range(rng.choice((1, 2, 3))):
                edge = rng.choice((rng.randrange(100), result.size_bytes - 1 - rng.randrange(40)))
                handle.seek(result.commitlog_offset - base + edge)
                handle.write(bytes([rng.choice((0, 1, 2, 0x30, 0x39, 0x80, 0xC3, 0xFF, rng.randrange(256)))]))
        with MessageStore.open(str(root), read_only=True) as store:
            read = python_outcome(lambda: store._commitlog.read(result.commitlog_offset, check_crc=False))
        assert jvm_outcome(spark, jvm_reader, root) == read, (trial, result.commitlog_offset)


def test_a_filter_does_not_read_the_records_it_does_not_select(spark, jvm_reader, tmp_path):
    """A flipped magic code in a record of topic "bulk", queue 0: a full scan and a read of that queue refuse it;
    reads of another topic or another queue of "bulk" go through the ConsumeQueues and never read it."""
    root = several_segments(tmp_path)
    rows = scan_store(root, topic="bulk", queue_ids=[0]).read_all().to_pylist()
    victim = rows[len(rows) // 2]["commitlog_offset"]
    path = root / "commitlog" / fmt.segment_name(victim - victim % (64 * 1024))
    data = bytearray(path.read_bytes())
    data[victim % (64 * 1024) + fmt.OFFSET_MAGIC_CODE] ^= 0xFF
    path.write_bytes(bytes(data))
    assert jvm_outcome(spark, jvm_reader, root)[0] == "commitlog.1"
    assert jvm_outcome(spark, jvm_reader, root, topic="bulk", queue_id="0")[0] == "commitlog.1"
    for options in ({"topic": "other"}, {"topic": "bulk", "queue_id": "1,2"}):
        got = spark.read.format(jvm_reader).options(**options).load(str(root)).toArrow()
        queue_ids = [int(q) for q in options.get("queue_id", "0,1,2").split(",")]
        filters = {"topic": options["topic"], "queue_ids": queue_ids}
        expected = scan_store(root, **filters).read_all()
        assert got.num_rows == expected.num_rows > 0
        assert sorted(got.column("commitlog_offset").to_pylist()) == \
            sorted(expected.column("commitlog_offset").to_pylist())
    with pytest.raises(CorruptionError):
        scan_store(root).read_all()


def _tail_store(tmp_path) -> tuple:
    """600 messages in small segments, closed cleanly; (root, results in log order, last segment, its base)."""
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        results = store.put_batch([Message(f"t{i % 2}", b"x" * 100, queue_id=i % 2, tags="a", keys=(f"k{i}",))
                                   for i in range(600)])
    segment = sorted((root / "commitlog").iterdir())[-1]
    return root, results, segment, int(segment.name)


@pytest.mark.parametrize("damage", ["a record before more records", "the flushed tail zeroed"])
def test_damage_where_the_walk_to_the_end_stops_gives_scans_error(spark, jvm_reader, tmp_path, damage):
    """Without ConsumeQueues to start from, the JVM planner's walk of the last segment took a damaged record, or
    zeros the checkpoint says were flushed, for the end of the log and read the rows before it as the whole log.
    It now refuses both as scan() does: the same rule, file and position."""
    root, results, segment, base = _tail_store(tmp_path)
    in_last = [result for result in results if result.commitlog_offset >= base]
    victim = in_last[len(in_last) // 2] if damage.startswith("a record") else in_last[5]
    end = results[-1].commitlog_offset + results[-1].size_bytes
    with open(segment, "r+b") as file:
        file.seek(victim.commitlog_offset - base)
        file.write(b"\0" * 8 if damage.startswith("a record") else b"\0" * (end - victim.commitlog_offset))
    shutil.rmtree(root / "consumequeue")
    expected = python_outcome(lambda: scan_store(root).read_all())
    assert expected[0] in ("commitlog.1", "commitlog.end") and expected[1:] == (
        str(segment), victim.commitlog_offset - base)
    assert jvm_outcome(spark, jvm_reader, root) == expected


def test_zeros_after_the_flushed_offset_end_the_log(spark, jvm_reader, tmp_path):
    """A tail past the checkpoint's flushed offset lost in a crash is a torn tail, not damage: both readers end the
    log at it and read every row before it."""
    root, results, segment, base = _tail_store(tmp_path)
    victim = [result for result in results if result.commitlog_offset >= base][5]
    end = results[-1].commitlog_offset + results[-1].size_bytes
    with open(segment, "r+b") as file:
        file.seek(victim.commitlog_offset - base)
        file.write(b"\0" * (end - victim.commitlog_offset))
    with open(root / CHECKPOINT_FILE_NAME, "r+b") as checkpoint:
        checkpoint.seek(CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1])
        checkpoint.write(victim.commitlog_offset.to_bytes(8, "big"))
    shutil.rmtree(root / "consumequeue")
    got = spark.read.format(jvm_reader).load(str(root)).toArrow()
    assert got.num_rows == scan_store(root).read_all().num_rows == results.index(victim)
