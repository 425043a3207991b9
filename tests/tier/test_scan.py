"""scan() and the Python Spark source read a store straight from its tier: `scan_store(tier URI)` gives the rows a
scan of the local store gives for the tier's range, with every filter; `MessageStore.scan()` of a store whose local
history left for the tier returns every row once, in order; damaged or short tier objects raise the CorruptionError
the local scan raises for the same damage, naming the object; Spark reads a tier URI as a load path."""

from __future__ import annotations

import os
import pickle
import random
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from mqstore.commitlog import format as fmt

from mqstore import CorruptionError, MessageStore, StoreIOError
from mqstore.store import scan_plan
from mqstore.store.scan import row_filter, scan_store
from mqstore.store.scan_errors import CommitLogSourceError
from mqstore.store.scan_options import StoreRef
from mqstore.store.scan_read import LogPartition, TierPartition
from mqstore.tier import manifest as manifest_module
from mqstore.tier import scan_source
from mqstore.tier.location import TierLocation
from tests.conftest import small_config
from tests.spark.conftest import spark  # noqa: F401 - the session fixture of tests/spark
from tests.tier.conftest import S3_KEY
from tests.tier.test_reads import overwrite
from tests.tier.test_uploader import SEGMENT, TOPICS, put_messages, tier_config

MESSAGES = 700


@pytest.fixture
def uploaded(tmp_path, tier_uri):
    """A store of several segments and topics whose sealed segments are all in the tier, and more records after
    them on local disk only: (store root, tier URI, the tier's end)."""
    root = tmp_path / "store"
    rng = random.Random(51)
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, rng, MESSAGES)
        end = store.seal_segment()
        assert store.wait_dispatched(10) and store.wait_tiered(end, 60)
        put_messages(store, rng, 60, first=MESSAGES)
    assert end >= 5 * SEGMENT
    return root, tier_uri, end


def by_offset(table: pa.Table) -> pa.Table:
    return table.sort_by("commitlog_offset")


def local_rows(root, end: int, **filters) -> pa.Table:
    """The local store's rows below the tier's end (the tier's range)."""
    high = min(end, filters.pop("end_offset", end))
    return scan_store(root, end_offset=high, **filters).read_all()


def test_a_tier_scans_as_the_local_store_does(uploaded):
    root, uri, end = uploaded
    whole = scan_store(uri).read_all()
    assert whole.equals(local_rows(root, end))  # every column, in log order
    assert whole.num_rows >= MESSAGES * 0.9 and pc.max(whole["commitlog_offset"]).as_py() < end
    stamps = whole["store_timestamp"]
    middle = stamps[whole.num_rows // 2].as_py()
    late = stamps[whole.num_rows * 3 // 4].as_py()
    for filters in ({"topic": TOPICS[0]}, {"topic": list(TOPICS[1:])}, {"queue_ids": 1},
                    {"topic": TOPICS[2], "queue_ids": [0, 2]}, {"start_offset": 2 * SEGMENT + 5},
                    {"start_offset": SEGMENT, "end_offset": 3 * SEGMENT + 7}, {"start_time": middle},
                    {"start_time": middle, "end_time": late, "topic": TOPICS[1]}, {"end_time": middle},
                    {"topic": "no-such-topic"}):
        got = scan_store(uri, **filters).read_all()
        assert by_offset(got).equals(by_offset(local_rows(root, end, **filters))), filters
        if "topic" not in filters:
            assert got.equals(local_rows(root, end, **filters)), filters  # in log order
    picked = scan_store(uri, columns=["body", "commitlog_offset"], label="bucket").read_all()
    assert picked.column_names == ["body", "commitlog_offset"] and picked["body"].equals(whole["body"])


def test_a_time_range_skips_the_tiers_segments_outside_it(uploaded):
    root, uri, end = uploaded
    whole = scan_store(uri, columns=["commitlog_offset", "store_timestamp"]).read_all().to_pylist()
    firsts = {}
    for row in whole:
        firsts.setdefault(row["commitlog_offset"] - row["commitlog_offset"] % SEGMENT, row["store_timestamp"])
    bases = sorted(firsts)
    start = firsts[bases[3]]
    # a segment is skipped when the next one's first record is stored before the range starts
    kept = [b for i, b in enumerate(bases) if i + 1 == len(bases) or firsts[bases[i + 1]] >= start]
    partitions = scan_plan.plan_batch([StoreRef(uri, None)], row_filter(start_time=start))
    assert all(isinstance(p, TierPartition) for p in partitions)
    assert sorted({piece.base for p in partitions for piece in p.pieces}) == kept  # (none skipped: same ms)
    got = scan_store(uri, start_time=start).read_all()
    assert by_offset(got).equals(by_offset(local_rows(root, end, start_time=start)))


def test_long_tier_segments_are_cut_at_record_starts_from_the_queue_images(tmp_path, tier_uri, monkeypatch):
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, segment_size_bytes=256 * 1024)) as store:
        put_messages(store, random.Random(52), 900)
        end = store.seal_segment()
        assert store.wait_dispatched(10) and store.wait_tiered(end, 60)
    monkeypatch.setattr(scan_plan, "PARTITION_BYTES_MIN", 4096)
    monkeypatch.setattr(scan_source, "QUEUE_WINDOW_UNITS", 8)  # searches of several reads, across queue files
    partitions = scan_plan.plan_batch([StoreRef(tier_uri, None)], row_filter(), partition_bytes_max=32 * 1024)
    pieces = [piece for partition in partitions for piece in partition.pieces]
    assert len(pieces) > 2 * end // (256 * 1024)  # each segment in several pieces
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))  # contiguous, each cut a record start
    from mqstore.store.scan import SCAN_SCHEMA
    from mqstore.store.scan_read import read_partition

    rows = pa.Table.from_batches([batch for partition in partitions
                                  for batch in read_partition(partition, SCAN_SCHEMA, row_filter())], SCAN_SCHEMA)
    assert rows.equals(scan_store(root, end_offset=end).read_all())


def test_reads_ahead_and_shortened_reads_give_the_same_rows(uploaded, monkeypatch):
    """Chunks of a few KiB: each piece in many range reads, each started while the one before is decoded (or, for a
    mapped file:// object, read where it lies), shortened near an object's end to keep the padding inside it."""
    from mqstore.store import scan_read

    root, uri, end = uploaded
    monkeypatch.setattr(scan_read, "READ_CHUNK_BYTES", 5000)
    monkeypatch.setattr(scan_source, "SHORTENED_READ_MIN_BYTES", 1000)
    taken = []
    chunk = scan_source.SegmentObject.chunk

    def counted(self, position, want, want_min):
        taken.append(self._ahead is not None and self._ahead[0][0] == position)
        return chunk(self, position, want, want_min)

    monkeypatch.setattr(scan_source.SegmentObject, "chunk", counted)
    assert scan_store(uri).read_all().equals(local_rows(root, end))
    assert len(taken) > 5 * end // SEGMENT
    assert any(taken) == uri.startswith("s3:")  # read ahead from an object store only
    reader = scan_store(uri)
    assert reader.read_next_batch().num_rows > 0
    reader.close()  # the consumer goes away with reads ahead under way: they end, nothing is left running
    offsets = local_rows(root, end)["commitlog_offset"].to_pylist()
    victim = next(offset for offset in offsets if offset >= SEGMENT + 3 * 5000) - SEGMENT  # a later read's record
    key = manifest_module.segment_key(SEGMENT)
    overwrite(uri, key, victim + fmt.OFFSET_MAGIC_CODE, b"\x00")
    with pytest.raises(CorruptionError) as raised:
        scan_store(uri).read_all()
    assert (raised.value.path, raised.value.offset) == (TierLocation.open(uri).display(key), victim)


def test_store_scan_reads_the_history_retention_moved_to_the_tier(tmp_path, tier_uri):
    root = tmp_path / "store"
    rng = random.Random(53)
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        put_messages(store, rng, MESSAGES)
        end = store.seal_segment()
        put_messages(store, rng, 80, first=MESSAGES)
        assert store.wait_dispatched(10) and store.wait_tiered(end, 60)
        before = store.scan().read_all()
        report = store.clean_expired()
        assert len(report["segments_removed"]) == end // SEGMENT and store.stats()["commitlog"]["min_offset"] == end
        after = store.scan().read_all()
        topic = store.scan(topic=TOPICS[0], start_offset=SEGMENT).read_all()
    assert after.equals(before) and after.num_rows == MESSAGES + 80
    offsets = after["commitlog_offset"].to_pylist()
    assert offsets == sorted(set(offsets))  # every row once, in log order
    assert by_offset(topic).equals(by_offset(before.filter(pc.and_(
        pc.equal(before["topic"], TOPICS[0]), pc.greater_equal(before["commitlog_offset"], SEGMENT)))))
    with MessageStore.open(root, tier_config(tier_uri), read_only=True) as store:
        assert store.scan().read_all().equals(before)
    assert scan_store(root, tier=tier_uri).read_all().equals(before)  # the tier given by its URI
    assert scan_store(root).read_all().equals(before.filter(pc.greater_equal(before["commitlog_offset"], end)))


class Unreachable:
    """A tier reader whose tier cannot be read (every question raises)."""

    location = None

    def history_start(self, local_min):
        raise StoreIOError("the tier is down")

    manifest = history_start


def test_a_store_whose_log_starts_at_zero_does_not_ask_its_tier(tmp_path):
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        put_messages(store, random.Random(55), 300)
    rows = scan_store(root, tier=Unreachable()).read_all()
    assert rows.num_rows == 300 and rows.equals(scan_store(root).read_all())
    os.remove(root / "commitlog" / fmt.segment_name(0))  # now the history below the local log is the tier's
    with pytest.raises(StoreIOError, match="the tier is down"):
        scan_store(root, tier=Unreachable())


def test_segments_removed_after_planning_are_read_from_the_tier(tmp_path, tier_uri):
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, random.Random(54), MESSAGES)
        end = store.seal_segment()
        assert store.wait_dispatched(10) and store.wait_tiered(end, 60)
        before = store.scan().read_all()
        reader = store.scan()  # planned now, from local segments only
        for base in range(0, end, SEGMENT):  # the tier holds them: as retention removes them
            os.remove(root / "commitlog" / fmt.segment_name(base))
        assert reader.read_all().equals(before)
        assert store.scan().read_all().equals(before)  # planned with them gone: from the tier
    partition = LogPartition(str(root), None, SEGMENT, (scan_plan.Piece(0, 0, SEGMENT),))  # no tier to fall to
    from mqstore.store.scan_read import read_partition

    with pytest.raises(Exception, match="deleted while the read was running"):
        list(read_partition(partition, before.schema, row_filter()))


DAMAGES = {  # (position in the record, bytes written there)
    "magic code": (fmt.OFFSET_MAGIC_CODE + 1, b"\x00"),
    "physical offset": (fmt.OFFSET_PHYSICAL_OFFSET + 6, b"\x7f"),
    "total size": (2, b"\x55"),
    "last bytes": (-3, b"xy"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damage_in_a_tier_segment_is_reported_as_the_local_scan_reports_it(uploaded, tmp_path, damage):
    root, uri, end = uploaded
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    rows = scan_store(root, end_offset=end, columns=["commitlog_offset"]).read_all()["commitlog_offset"].to_pylist()
    victim = [offset for offset in rows if SEGMENT * 2 < offset < SEGMENT * 3][4]
    following = rows[rows.index(victim) + 1]
    position, data = DAMAGES[damage]
    at = victim - 2 * SEGMENT + (position if position >= 0 else following - victim + position)
    path = copy / "commitlog" / fmt.segment_name(2 * SEGMENT)
    content = bytearray(path.read_bytes())
    content[at:at + len(data)] = data
    path.write_bytes(bytes(content))
    overwrite(uri, manifest_module.segment_key(2 * SEGMENT), at, data)
    with pytest.raises(CorruptionError) as local:
        scan_store(copy, end_offset=end).read_all()
    with pytest.raises(CorruptionError) as tier:
        scan_store(uri).read_all()
    assert (tier.value.rule, tier.value.offset) == (local.value.rule, local.value.offset), (tier.value, local.value)
    assert tier.value.offset == victim - 2 * SEGMENT and tier.value.rule.startswith("commitlog.")
    assert tier.value.path == TierLocation.open(uri).display(manifest_module.segment_key(2 * SEGMENT))
    assert S3_KEY + ":" not in str(tier.value)


def test_a_tier_object_shorter_than_listed_raises_object_size(uploaded):
    _, uri, _ = uploaded
    location = TierLocation.open(uri)
    key = manifest_module.segment_key(SEGMENT)
    location.put_bytes(key, location.read_range(key, SEGMENT, 0, SEGMENT)[:SEGMENT - 1000])
    with pytest.raises(CorruptionError) as raised:
        scan_store(uri).read_all()
    assert raised.value.rule == "tier.object-size" and raised.value.path == location.display(key)
    assert raised.value.offset == SEGMENT - 1000


def test_a_tier_partition_carries_the_uri_not_a_handle(uploaded):
    _, uri, _ = uploaded
    partitions = scan_plan.plan_batch([StoreRef(uri, "label")], row_filter())
    assert partitions and all(isinstance(p, TierPartition) and p.uri == uri and p.location is None
                              for p in partitions)
    shipped = pickle.loads(pickle.dumps(partitions[0]))
    assert shipped.uri == uri and S3_KEY + ":" not in repr(shipped)
    scan_source._locations.clear()  # as in an executor's fresh process: opened from the URI
    from mqstore.store.scan import SCAN_SCHEMA, scan_schema
    from mqstore.store.scan_read import read_partition

    rows = pa.Table.from_batches(list(read_partition(shipped, scan_schema(True), row_filter())))
    first = scan_store(uri, label="label", end_offset=rows["commitlog_offset"][-1].as_py() + 1).read_all()
    assert rows.equals(first) and set(rows["store"].to_pylist()) == {"label"} and SCAN_SCHEMA.names[0] == "topic"


def test_a_location_without_a_tier_is_refused(tmp_path):
    with pytest.raises(CommitLogSourceError, match="no tier manifest at"):
        scan_store((tmp_path / "nothing").as_uri())


# --- Spark ----------------------------------------------------------------------------------------------------
SPARK_COLUMNS = ["commitlog_offset", "topic", "queue_id", "queue_offset", "body", "tags", "keys", "msg_id"]


@pytest.fixture
def python_source(request):
    """The Python source's format name in the Spark session tests/spark use (skipped without Java 17)."""
    from mqstore.spark.env import java_missing

    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
    from mqstore.spark.source import PYTHON_FORMAT_NAME

    return request.getfixturevalue("spark"), PYTHON_FORMAT_NAME


@pytest.mark.spark
def test_the_python_spark_source_reads_a_tier_uri(uploaded, python_source):
    session, python_source = python_source
    root, uri, end = uploaded
    frame = session.read.format(python_source).load(uri)
    got = pa.Table.from_pylist([row.asDict() for row in frame.select(*SPARK_COLUMNS).collect()])
    expected = scan_store(root, end_offset=end, columns=SPARK_COLUMNS).read_all()
    assert by_offset(got).select(SPARK_COLUMNS).to_pylist() == expected.to_pylist()
    topic = session.read.format(python_source).option("topic", TOPICS[1]).load(uri).select("commitlog_offset")
    assert sorted(r[0] for r in topic.collect()) == sorted(
        scan_store(root, end_offset=end, topic=TOPICS[1], columns=["commitlog_offset"]).read_all()[0].to_pylist())
    both = session.read.format(python_source).load([uri, str(root)])
    labels = {r[0] for r in both.select("store").distinct().collect()}
    assert labels == {str(root), TierLocation.open(uri).display("").rstrip("/")}  # as the JVM reader names a tier
    with pytest.raises(Exception, match="readStream of a tier"):
        session.readStream.format(python_source).load(uri).writeStream.format("noop").start().awaitTermination(60)
