"""IndexFile: put, select, collisions, time ranges, full files, truncation and corrupt bytes."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest
from mqstore.commitlog.errors import CorruptionError, ReadOnlyStoreError, StoreClosedError, StoreIOError
from mqstore.indexfile import format as fmt
from mqstore.indexfile.index_file import IndexFile

T0 = 1_700_000_000_000
EVERYTHING = (0, 2**62)


def _new(tmp_path, slots=4, entries=8, name="20260101000000000", **inherit) -> IndexFile:
    return IndexFile.create(str(tmp_path / name), slots, entries, **inherit)


def _select(index_file, key_hash, begin_ms=EVERYTHING[0], end_ms=EVERYTHING[1], max_count=100):
    return index_file.select(key_hash, begin_ms, end_ms, max_count, [])


def test_create_is_full_size_and_empty(tmp_path):
    index_file = _new(tmp_path, slots=4, entries=8)
    assert os.path.getsize(index_file.path) == 40 + 4 * 4 + 20 * 8
    assert index_file.index_count == 1 and index_file.entry_count == 0 and not index_file.is_full
    assert _select(index_file, 7) == []
    assert not os.path.exists(index_file.path + ".creating")
    index_file.close()
    with pytest.raises(StoreIOError):
        _new(tmp_path, slots=4, entries=8)  # never overwrites an existing file


def test_put_and_select_newest_first(tmp_path):
    index_file = _new(tmp_path)
    for offset in (100, 200, 300):
        assert index_file.put_key(5, offset, T0 + offset)
    assert _select(index_file, 5) == [300, 200, 100]
    assert index_file.begin_phy_offset == 100 and index_file.end_phy_offset == 300
    assert index_file.begin_timestamp_ms == T0 + 100 and index_file.end_timestamp_ms == T0 + 300
    assert index_file.index_count == 4 and index_file.header_hash_slot_count == 3
    assert _select(index_file, 5, max_count=2) == [300, 200]


def test_collisions_in_one_slot_are_told_apart_by_hash(tmp_path):
    index_file = _new(tmp_path, slots=1, entries=16)  # every key shares slot 0
    hashes = [11, 22, 11, 33, 22, 11]
    for i, key_hash in enumerate(hashes):
        index_file.put_key(key_hash, 1000 + i, T0)
    assert _select(index_file, 11) == [1005, 1002, 1000]
    assert _select(index_file, 22) == [1004, 1001]
    assert _select(index_file, 44) == []
    assert index_file.entries()["prev_index"].tolist() == [0, 1, 2, 3, 4, 5]


def test_same_hash_collisions_are_returned(tmp_path):
    index_file = _new(tmp_path, slots=3)
    key_hash = fmt.index_key_hash("t#Aa")
    assert key_hash == fmt.index_key_hash("t#BB")
    index_file.put_key(key_hash, 10, T0)
    index_file.put_key(key_hash, 20, T0)
    assert _select(index_file, key_hash) == [20, 10]  # the store filters by reading the messages


def test_time_range_filters_entries_at_second_precision(tmp_path):
    index_file = _new(tmp_path, slots=2, entries=16)
    for second in range(5):
        index_file.put_key(9, second, T0 + second * 1000 + 400)
    # entries read back at begin + timeDiff * 1000: T0+400, T0+1400, ...
    assert _select(index_file, 9, T0 + 1400, T0 + 3400) == [3, 2, 1]
    assert _select(index_file, 9, T0 + 1401, T0 + 3399) == [2]
    assert not index_file.is_time_matched(T0 + 10_000, T0 + 20_000)
    assert index_file.is_time_matched(0, 2**62) and index_file.is_time_matched(T0 + 1000, T0 + 1000)


def test_full_file_refuses_puts(tmp_path):
    index_file = _new(tmp_path, slots=2, entries=3)  # entry 0 is never used: room for two
    assert index_file.put_key(1, 1, T0) and index_file.put_key(2, 2, T0)
    assert index_file.is_full and not index_file.put_key(3, 3, T0)
    assert index_file.put_hashes(np.array([4]), np.array([4]), np.array([T0])) == 0


def test_inherited_header_and_first_time_diff(tmp_path):
    index_file = _new(tmp_path, end_phy_offset=500, end_timestamp_ms=T0)
    assert (index_file.begin_phy_offset, index_file.end_phy_offset) == (500, 500)
    assert (index_file.begin_timestamp_ms, index_file.end_timestamp_ms) == (T0, T0)
    index_file.put_key(1, 600, T0 + 7_500)
    index_file.put_key(1, 700, T0 + 9_000)
    # RocketMQ: the first put measures from the inherited begin, then begin becomes its own time
    assert index_file.entries()["time_diff"].tolist() == [7, 1]
    assert index_file.begin_timestamp_ms == T0 + 7_500 and index_file.begin_phy_offset == 600


def _random_rows(rng, count, start_offset=0):
    hashes = np.array([rng.randrange(2**31) % 50 for _ in range(count)], dtype=np.int64)
    offsets = np.cumsum([rng.randrange(0, 3) for _ in range(count)]).astype(np.int64) + start_offset
    timestamps = np.array([T0 + rng.randrange(-3000, 60_000) for _ in range(count)], dtype=np.int64)
    return hashes, offsets, timestamps


@pytest.mark.parametrize("inherit", [{}, {"end_phy_offset": 0, "end_timestamp_ms": T0 - 20_000}])
def test_batch_put_writes_the_same_bytes_as_single_puts(tmp_path, inherit):
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    hashes, offsets, timestamps = _random_rows(rng, 60)
    one = _new(tmp_path, slots=7, entries=50, name="20260101000000001", **inherit)
    many = _new(tmp_path, slots=7, entries=50, name="20260101000000002", **inherit)
    put_one = sum(one.put_key(int(h), int(o), int(t)) for h, o, t in zip(hashes, offsets, timestamps))
    put_many = 0
    for start, stop in ((0, 1), (1, 13), (13, 60)):
        put_many += many.put_hashes(hashes[start:stop], offsets[start:stop], timestamps[start:stop])
    assert put_one == put_many == 49
    one.close()
    many.close()
    with open(one.path, "rb") as a, open(many.path, "rb") as b:
        assert a.read() == b.read()


def test_reopen_and_read_only(tmp_path):
    index_file = _new(tmp_path)
    index_file.put_key(3, 42, T0)
    index_file.close()
    index_file.close()  # idempotent
    with pytest.raises(StoreClosedError):
        _select(index_file, 3)
    again = IndexFile.open(index_file.path, 4, 8)
    assert _select(again, 3) == [42] and again.index_count == 2
    again.put_key(3, 43, T0)
    again.close()
    read_only = IndexFile.open(index_file.path, 4, 8, read_only=True)
    assert _select(read_only, 3) == [43, 42]
    with pytest.raises(ReadOnlyStoreError):
        read_only.put_key(3, 44, T0)
    read_only.close()


def test_tail_count(tmp_path):
    index_file = _new(tmp_path)
    for key_hash, offset in ((1, 10), (2, 20), (3, 20), (4, 20)):
        index_file.put_key(key_hash, offset, T0)
    assert index_file.tail_count(20) == 3 and index_file.tail_count(10) == 0


def test_truncate_drops_entries_and_rebuilds_slots(tmp_path):
    index_file = _new(tmp_path, slots=2, entries=16)
    for i in range(8):  # keyHash 2, 3, 4 (slots 0, 1, 0): an entry of hash 0 at offset 0 would be all zeros
        index_file.put_key(i % 3 + 2, 100 * i, T0 + 1000 * i)
    assert index_file.truncate(450) == 3
    assert index_file.entry_count == 5 and index_file.end_phy_offset == 400
    assert index_file.end_timestamp_ms == T0 + 4000
    assert _select(index_file, 2) == [300, 0] and _select(index_file, 3) == [400, 100]
    index_file.check()
    assert index_file.truncate(450) == 0  # idempotent
    index_file.put_key(3, 500, T0 + 5000)
    assert _select(index_file, 3) == [500, 400, 100]
    assert index_file.truncate(0) == 6 and index_file.entry_count == 0
    assert index_file.end_phy_offset == 0 and _select(index_file, 3) == []


def test_truncate_drops_entries_a_lost_page_left_behind(tmp_path):
    index_file = _new(tmp_path, slots=2, entries=16)
    for i in range(6):
        index_file.put_key(i % 2, 100 * (i + 1), T0 + 1000 * i)
    index_file.flush()
    # a power loss kept the header (indexCount 7) and the slots, but entries 4..6 never reached the disk;
    # entry 3, before the damage, goes too (a lost page may begin inside an entry)
    index_file._map[fmt.entries_offset(2) + 20 * 4 : fmt.entries_offset(2) + 20 * 7] = 0
    assert index_file.truncate(10**9) == 4
    assert index_file.entry_count == 2 and index_file.end_phy_offset == 200
    assert _select(index_file, 0) == [100] and _select(index_file, 1) == [200]
    index_file.check()


def test_rebuild_slots_heals_a_put_cut_before_its_slot_write(tmp_path):
    index_file = _new(tmp_path, slots=3)
    index_file.put_key(1, 10, T0)
    with open(index_file.path, "rb") as handle:
        slots_before = handle.read()[40:52]
    index_file.put_key(4, 20, T0)  # same slot as hash 1
    index_file.flush()
    with open(index_file.path, "r+b") as handle:  # undo the slot write: the new entry is unreachable
        handle.seek(40)
        handle.write(slots_before)
    index_file.close()
    healed = IndexFile.open(index_file.path, 3, 8)
    assert _select(healed, 4) == []
    healed.rebuild_slots()
    assert _select(healed, 4) == [20] and _select(healed, 1) == [10]


# --- corruption --------------------------------------------------------------------------------------------
def _poke(path, offset, fmt_code, value):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(struct.pack(fmt_code, value))


def _filled(tmp_path, slots=1):
    index_file = _new(tmp_path, slots=slots, entries=8)
    for i in range(4):
        index_file.put_key(7, 10 * (i + 1), T0)
    index_file.close()
    return index_file.path


@pytest.mark.parametrize("value", [-1, 5, 2**31 - 1])
def test_slot_out_of_range_is_corruption(tmp_path, value):
    path = _filled(tmp_path)
    _poke(path, 40, ">i", value)
    index_file = IndexFile.open(path, 1, 8)
    with pytest.raises(CorruptionError) as caught:
        _select(index_file, 7)
    assert caught.value.path == path and caught.value.offset == 40 and caught.value.rule == "indexfile.4"
    with pytest.raises(CorruptionError):
        index_file.put_key(7, 99, T0)
    with pytest.raises(CorruptionError):
        index_file.put_hashes(np.array([7]), np.array([99]), np.array([T0]))
    with pytest.raises(CorruptionError):
        index_file.check()


@pytest.mark.parametrize("entry, prev", [
    (4, 4),  # a self-loop
    (3, 4),  # 4 -> 3 -> 4: a cycle of two (RocketMQ would loop forever on it)
    (4, 9),  # past indexCount
    (4, -2),
    (4, 2**31 - 1),
])
def test_bad_prev_link_is_corruption_not_a_loop(tmp_path, entry, prev):
    path = _filled(tmp_path)
    entry_at = fmt.entries_offset(1) + 20 * entry
    _poke(path, entry_at + fmt.OFFSET_PREV_INDEX, ">i", prev)
    index_file = IndexFile.open(path, 1, 8)
    with pytest.raises(CorruptionError) as caught:
        _select(index_file, 7)
    assert caught.value.rule == "indexfile.5" and caught.value.offset == entry_at and caught.value.path == path
    with pytest.raises(CorruptionError):
        index_file.check()


def test_negative_time_diff_is_corruption(tmp_path):
    path = _filled(tmp_path)
    _poke(path, fmt.entries_offset(1) + 20 * 4 + fmt.OFFSET_TIME_DIFF, ">i", -1)
    with pytest.raises(CorruptionError) as caught:
        _select(IndexFile.open(path, 1, 8), 7)
    assert caught.value.rule == "indexfile.6"


@pytest.mark.parametrize("entry, field, value, reported", [
    (1, fmt.OFFSET_KEY_HASH, 4, {1, 4}),  # entry 1 moved to slot 1: entry 4 of slot 0 links to it
    (8, fmt.OFFSET_KEY_HASH, 6, {8}),  # the head of slot 1 with a hash of slot 0
    (4, fmt.OFFSET_KEY_HASH, -3, {4}),
    (5, fmt.OFFSET_PREV_INDEX, 1, {5}),  # slot 1's chain linked into slot 0's
])
def test_check_finds_entries_in_the_chain_of_another_slot(tmp_path, entry, field, value, reported):
    # The damage is away from the newest entry and its link, which check_tail looks at (rule 7).
    index_file = _new(tmp_path, slots=3, entries=12)
    for number in range(1, 10):  # hashes 0 1 2 0 1 2 0 1 2: chains 7 -> 4 -> 1, 8 -> 5 -> 2, 9 -> 6 -> 3
        index_file.put_key((number - 1) % 3, 10 * number, T0)
    index_file.check()
    path = index_file.path
    index_file.close()
    entry_at = fmt.entries_offset(3) + 20 * entry
    _poke(path, entry_at + field, ">i", value)
    damaged = IndexFile.open(path, 3, 12, read_only=True)
    with pytest.raises(CorruptionError) as caught:
        damaged.check()
    assert caught.value.rule == "indexfile.9" and caught.value.path == path
    assert (caught.value.offset - fmt.entries_offset(3)) // 20 in reported
    damaged.close()


def test_bad_header_and_size_are_corruption(tmp_path):
    path = _filled(tmp_path)
    with pytest.raises(CorruptionError) as caught:
        IndexFile.open(path, 2, 8)  # another slot count: another size
    assert caught.value.rule == "indexfile.1"
    _poke(path, fmt.OFFSET_INDEX_COUNT, ">i", 9)
    with pytest.raises(CorruptionError) as caught:
        IndexFile.open(path, 1, 8)
    assert caught.value.rule == "indexfile.2" and caught.value.offset == fmt.OFFSET_INDEX_COUNT
    _poke(path, fmt.OFFSET_INDEX_COUNT, ">i", 5)
    _poke(path, fmt.OFFSET_END_PHY_OFFSET, ">q", -1)
    with pytest.raises(CorruptionError) as caught:
        IndexFile.open(path, 1, 8, read_only=True)
    assert caught.value.rule == "indexfile.3"


def test_zero_index_count_reads_as_empty(tmp_path):
    path = _filled(tmp_path)
    _poke(path, fmt.OFFSET_INDEX_COUNT, ">i", 0)
    _poke(path, 40, ">i", 0)
    index_file = IndexFile.open(path, 1, 8)
    assert index_file.index_count == 1 and _select(index_file, 7) == []


def _zero_from(index_file, position):
    index_file._map[position:] = 0


def test_check_tail_passes_on_files_as_written(tmp_path):
    index_file = _new(tmp_path, slots=3, entries=16)
    index_file.check_tail()  # new and empty
    for i in range(10):
        index_file.put_key(i % 5 + 1, 100 * i, T0 + 1000 * i)
    index_file.check_tail()
    inherited = _new(tmp_path, name="20260101000000001", end_phy_offset=900, end_timestamp_ms=T0 + 9000)
    inherited.check_tail()  # a rolled file inherits begin = end
    index_file.truncate(0)
    index_file.check_tail()  # emptied: a zero header


@pytest.mark.parametrize("damage", ["last entries zeroed", "slots and entries zeroed", "end phy zeroed",
                                    "slot write lost", "prev link of the last entry cut"])
def test_check_tail_reports_a_header_that_disagrees_with_its_entries(tmp_path, damage):
    index_file = _new(tmp_path, slots=3, entries=16)
    for i in range(10):
        index_file.put_key(i % 5 + 1, 100 * (i + 1), T0 + 1000 * i)
    entries_at = fmt.entries_offset(3)
    if damage == "last entries zeroed":
        _zero_from(index_file, entries_at + 20 * 7)
    elif damage == "slots and entries zeroed":
        _zero_from(index_file, fmt.slots_offset() + 4)
    elif damage == "end phy zeroed":  # an empty-looking header: indexCount and endPhyOffset's low bytes zeroed
        _zero_from(index_file, fmt.OFFSET_END_PHY_OFFSET + 6)
        index_file = IndexFile.open(index_file.path, 3, 16)
    elif damage == "slot write lost":
        # entry 10 (hash 5) not yet its head
        struct.pack_into(">i", index_file._buf, fmt.slots_offset() + 4 * (5 % 3), 5)
    else:  # entry 10 (hash 5) linked to entry 5 (hash 5); now to entry 4 (hash 4, another slot)
        struct.pack_into(">i", index_file._buf, entries_at + 20 * 10 + fmt.OFFSET_PREV_INDEX, 4)
    with pytest.raises(CorruptionError) as raised:
        index_file.check_tail()
    assert raised.value.rule == "indexfile.7" and raised.value.path == index_file.path


def test_truncate_drops_the_entry_a_zeroed_tail_begins_in(tmp_path):
    """A zeroed tail that begins inside an entry's phyOffset leaves a smaller offset that keeps the rules; it
    must not survive (dispatch would resume off a record)."""
    index_file = _new(tmp_path, slots=2, entries=16)
    for i in range(6):
        index_file.put_key(i % 2 + 1, 1000 * (i + 1), T0 + 1000 * i)
    _zero_from(index_file, fmt.entries_offset(2) + 20 * 5 + fmt.OFFSET_PHY_OFFSET + 7)  # entry 5: 5000 -> 4864
    assert index_file.truncate(10**9) == 2
    assert index_file.entry_count == 4 and index_file.end_phy_offset == 4000
    index_file.check()


def test_truncate_keeps_entries_at_or_past_the_previous_files_end(tmp_path):
    index_file = _new(tmp_path, slots=2, entries=16)
    for i in range(4):
        index_file.put_key(1, 100 * (i + 1), T0)
    assert index_file.truncate(10**9, commitlog_offset_min=100) == 0
    assert index_file.truncate(10**9, commitlog_offset_min=150) == 4 and index_file.entry_count == 0


def test_a_read_only_file_follows_a_writer_whose_slots_are_newer_than_the_header_it_read(tmp_path):
    """A reader's header is a snapshot; the writer's later puts move slots past it (entries, header, slots, in
    that order), so the reader reads the header again instead of calling the slot corrupt."""
    writer = _new(tmp_path, slots=2, entries=16)
    writer.put_key(4, 10, T0)
    reader = IndexFile.open(writer.path, 2, 16, read_only=True)
    assert _select(reader, 4) == [10] and reader.entry_count == 1
    writer.put_key(6, 20, T0 + 3000)  # the same slot (4 % 2 == 6 % 2), entry 2: past the reader's indexCount
    writer.put_key(4, 30, T0 + 5000)
    assert _select(reader, 4) == [30, 10] and _select(reader, 6) == [20]
    assert reader.entry_count == 3 and reader.end_phy_offset == 30
    writer.put_key(5, 40, T0 + 6000)  # another slot: not seen until the header is read again
    assert reader.entry_count == 3
    reader.refresh()
    assert reader.entry_count == 4 and _select(reader, 5) == [40]
    reader.close()
    writer.close()


@pytest.mark.parametrize("value", [-1, 5, 2**31 - 1])
def test_a_slot_out_of_range_is_corruption_for_a_read_only_file_too(tmp_path, value):
    """Read again, the header still does not cover the slot: rule 4, as for a writer."""
    path = _filled(tmp_path)
    _poke(path, 40, ">i", value)
    reader = IndexFile.open(path, 1, 8, read_only=True)
    with pytest.raises(CorruptionError) as caught:
        _select(reader, 7)
    assert caught.value.path == path and caught.value.offset == 40 and caught.value.rule == "indexfile.4"
    reader.close()
