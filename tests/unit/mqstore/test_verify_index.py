"""verify_store (6): the index files are checked, or the report says why they were not."""

from __future__ import annotations

import os
import struct

from mqstore.indexfile import format as index_format
from mqstore.indexfile.index_file import IndexFile

from mqstore import Message, MessageStore
from mqstore.store.verify import INDEX_DISABLED, verify_store
from tests.unit.mqstore.conftest import config

SLOTS, ENTRIES = 64, 256


def _slot_not_heading_the_newest_entry(path, wanted):
    """`wanted`, or the next slot when the file's newest entry hashes into `wanted`.

    Damaging the slot that heads the newest entry breaks rule 7 as well (the newest entry must head its slot),
    and rule 7 is checked first; the keys' UNIQ_KEYs differ from run to run, so that slot is not fixed.
    """
    index_file = IndexFile.open(path, SLOTS, ENTRIES, read_only=True)
    newest_hash = int(index_file.entries()["key_hash"][-1])
    index_file.close()
    return wanted if newest_hash % SLOTS != wanted else wanted + 1


def _indexed_store(store_dir):
    settings = config(index_enabled=True, index_slot_count=SLOTS, index_entry_count_max=ENTRIES)
    with MessageStore.open(store_dir, settings) as store:
        store.put_batch([Message("t", b"m%d" % i, keys=(f"k{i % 7}",)) for i in range(50)])
        assert store.wait_dispatched(30)
    [name] = os.listdir(store_dir / "index")
    return settings, str(store_dir / "index" / name)


def test_a_sound_index_is_checked(store_dir):
    settings, _ = _indexed_store(store_dir)
    report = verify_store(store_dir, settings)
    assert report.ok and report.index_files == 1 and report.index_not_checked == ""


def test_a_damaged_index_is_reported_with_its_file_and_rule(store_dir):
    settings, path = _indexed_store(store_dir)
    slot = _slot_not_heading_the_newest_entry(path, 3)
    with open(path, "r+b") as handle:  # the slot names an entry past indexCount
        handle.seek(index_format.slots_offset() + 4 * slot)
        handle.write(struct.pack(">i", ENTRIES - 1))
    report = verify_store(store_dir, settings)
    assert not report.ok and report.problem_count == 1
    [problem] = report.problems
    assert (problem.path, problem.rule, problem.offset) == (path, "indexfile.4", index_format.slots_offset() + 4 * slot)
    assert report.as_dict()["problems"][0]["rule"] == "indexfile.4"


def test_index_files_of_other_sizes_or_a_disabled_index_are_not_checked_and_the_report_says_so(store_dir):
    settings, path = _indexed_store(store_dir)
    with open(path, "r+b") as handle:  # damage that a check would report
        handle.seek(index_format.slots_offset())
        handle.write(struct.pack(">i", -1))
    other = verify_store(store_dir, config(index_enabled=True, index_slot_count=SLOTS * 2,
                                           index_entry_count_max=ENTRIES))
    assert other.ok and other.index_files == 0 and "index_slot_count=128" in other.index_not_checked
    disabled = verify_store(store_dir, config(index_enabled=False))
    assert disabled.ok and disabled.index_not_checked == INDEX_DISABLED
    assert disabled.as_dict()["index_not_checked"] == INDEX_DISABLED
    assert not verify_store(store_dir, settings).ok


def test_every_damaged_index_file_is_reported(store_dir):
    settings = config(index_enabled=True, index_slot_count=SLOTS, index_entry_count_max=ENTRIES)
    with MessageStore.open(store_dir, settings) as store:
        for start in range(0, 600, 50):  # 600 messages, two keys each (KEYS and UNIQ_KEY): files of 255 keys
            store.put_batch([Message("t", b"m%d" % i, keys=(f"k{i % 7}",)) for i in range(start, start + 50)])
        assert store.wait_dispatched(30)
    paths = [str(store_dir / "index" / name) for name in sorted(os.listdir(store_dir / "index"))]
    assert len(paths) >= 3
    damaged = [(paths[0], _slot_not_heading_the_newest_entry(paths[0], 3)),
               (paths[2], _slot_not_heading_the_newest_entry(paths[2], 5))]
    for path, slot in damaged:
        with open(path, "r+b") as handle:  # a slot naming an entry past indexCount: rule 4
            handle.seek(index_format.slots_offset() + 4 * slot)
            handle.write(struct.pack(">i", ENTRIES + 7))
    report = verify_store(store_dir, settings)
    assert report.index_files == len(paths)
    assert [(p.path, p.rule, p.offset) for p in report.problems] == [
        (path, "indexfile.4", index_format.slots_offset() + 4 * slot) for path, slot in damaged]
