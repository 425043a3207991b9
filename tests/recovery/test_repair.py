"""The recovery table's rows about damage that looks like the end of the log, files of the wrong size or missing,
and what repair does with what it cuts (mqstore/store/recovery.py, mqstore/store/repair.py): one test per row, plus the
check that every row of the table is a `RecoveryCase` produced by the code and named by a test here."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil

import pytest

from mqstore import CorruptionError, Message, MessageStore
from mqstore.cli import main as cli_main
from mqstore.store.recovery import RecoveryCase
from tests.conftest import small_config

SEGMENT = 64 * 1024
COUNT = 1200  # messages: about 620 bytes each, 11-12 segments
QUEUES = 3


def _config(**overrides):
    return small_config(**overrides)


def _body(i: int) -> bytes:
    return b"%05d" % i + bytes([65 + i % 26]) * (500 + i % 97)


def _write(root, count=COUNT):
    with MessageStore.open(root, _config()) as store:
        return store.put_batch([Message("t", _body(i), queue_id=i % QUEUES) for i in range(count)])


def _segment_path(root, base) -> pathlib.Path:
    return pathlib.Path(root) / "commitlog" / f"{base:020d}"


def _bases(root) -> list[int]:
    return sorted(int(p.name) for p in (pathlib.Path(root) / "commitlog").iterdir() if p.name.isdigit())


def _all_bodies(store) -> dict[int, bytes]:
    """Every message the store returns, by its number (the body's first five digits)."""
    found = {}
    for queue_id in range(QUEUES):
        result = store.get("t", queue_id, store.min_offset("t", queue_id), max_count=65_536)
        for message in result.messages:
            found[int(message.body[:5])] = message.body
    return found


def _in_segment(results, base):
    return [r for r in results if base <= r.commitlog_offset < base + SEGMENT]


def _reopens_clean_and_writable(root, kept: int):
    with MessageStore.open(root, _config()) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]
        assert len(_all_bodies(store)) == kept
        store.put_batch([Message("t", b"after-repair-%d" % i, queue_id=i % QUEUES) for i in range(300)])
    with MessageStore.open(root, _config()) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]
        assert sum(store.max_offset("t", q) - store.min_offset("t", q) for q in range(QUEUES)) == kept + 300


def _check_repair_folder(report, root):
    """The README names every file kept, and every file it names is there."""
    folder = pathlib.Path(report.repair_dir)
    assert folder.parent == pathlib.Path(root) and folder.name.startswith("repair-")
    readme = (folder / "README.txt").read_text()
    named = re.findall(r"^- ([^:]+):", readme, flags=re.M)
    assert named and all((folder / name).exists() for name in named)
    return folder


@pytest.mark.parametrize("damage", ["zeros", "magic"])
def test_damage_at_a_record_start_where_the_log_goes_on_raises_and_repair_keeps_what_it_cuts(tmp_path, damage):
    """CLEAN_CORRUPT: a page of zeros (or a bad magic code) at a record start in the second-last segment of a
    cleanly stopped store is damage, not the end of the log: the segment's later bytes, the last segment, the
    checkpoint and the queues all say the log goes on."""
    results = _write(tmp_path)
    base = _bases(tmp_path)[-3]  # the last one is empty (made ahead): two segments with data from here
    path = _segment_path(tmp_path, base)
    original = {b: _segment_path(tmp_path, b).read_bytes() for b in _bases(tmp_path)}
    data = bytearray(path.read_bytes())
    if damage == "zeros":
        data[0:4096] = bytes(4096)
    else:
        data[4:8] = b"\x12\x34\x56\x78"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, _config())
    assert (raised.value.path, raised.value.offset) == (str(path), 0)
    assert raised.value.rule == ("commitlog.end" if damage == "zeros" else "commitlog.1")

    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CLEAN_CORRUPT and report.log_end == base
        lost = [r for r in results if r.commitlog_offset >= base]
        damaged = [r for r in lost if r.commitlog_offset < 4096 + base] if damage == "zeros" else lost[:1]
        intact = [r for r in lost if r not in damaged]
        assert report.dropped_messages == len(intact)
        assert (report.dropped_offset_first, report.dropped_offset_last) == (
            intact[0].commitlog_offset, intact[-1].commitlog_offset)
        written_end = results[-1].commitlog_offset + results[-1].size_bytes
        assert report.dropped_bytes == written_end - base
        assert report.dropped_files == [f"commitlog/{b:020d}" for b in sorted(original) if b >= base]
        assert sorted(_all_bodies(store)) == list(range(len(results) - len(lost)))
    folder = _check_repair_folder(report, tmp_path)
    for b, before in original.items():  # nothing cut is destroyed: every segment from the cut on, as it was
        if b >= base:
            assert (folder / "commitlog" / f"{b:020d}").read_bytes() == (bytes(data) if b == base else before)
    # `mqstore dump` reads a message of a moved segment from the folder
    last = results[-1]
    assert cli_main(["dump", str(folder), "--offset", str(last.commitlog_offset), "--json"]) == 0
    _reopens_clean_and_writable(tmp_path, len(results) - len(lost))


def test_zeros_below_the_flushed_offset_after_a_crash_are_damage(tmp_path):
    """CRASH_CORRUPT: after a crash, zeros at a record start below the checkpoint's flushed offset were flushed
    (the disk lost them): a plain open raises; a crash that lost unflushed pages is CRASH_TORN_TAIL instead."""
    with MessageStore.open(tmp_path / "live", _config()) as store:
        results = store.put_batch([Message("t", _body(i), queue_id=i % QUEUES) for i in range(COUNT)])
        store.flush()
        assert store.wait_dispatched(10)
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    crashed = tmp_path / "crashed"
    victim = results[COUNT // 2]
    base = victim.commitlog_offset - victim.commitlog_offset % SEGMENT
    path = _segment_path(crashed, base)
    data = bytearray(path.read_bytes())
    position = victim.commitlog_offset - base
    data[position : position + victim.size_bytes] = bytes(victim.size_bytes)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(crashed, _config())
    assert (raised.value.path, raised.value.offset, raised.value.rule) == (str(path), position, "commitlog.end")
    with MessageStore.open(crashed, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_CORRUPT and report.log_end == victim.commitlog_offset
        assert report.dropped_messages == COUNT - COUNT // 2 - 1
        assert sorted(_all_bodies(store)) == list(range(COUNT // 2))
    _reopens_clean_and_writable(crashed, COUNT // 2)


def test_a_middle_segment_cut_to_nothing_is_refused_then_repaired(tmp_path):
    """SEGMENT_TOO_SHORT: a plain open refuses the file; repair keeps it as found, extends it with zeros and cuts
    the log there; the later segments go to the repair folder, not back into the log."""
    results = _write(tmp_path)
    base = _bases(tmp_path)[4]
    path = _segment_path(tmp_path, base)
    later = {b: _segment_path(tmp_path, b).read_bytes() for b in _bases(tmp_path) if b > base}
    path.write_bytes(b"")
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, _config())
    assert raised.value.rule == "commitlog.file-size" and raised.value.path == str(path)
    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.file_cases == {f"commitlog/{base:020d}": RecoveryCase.SEGMENT_TOO_SHORT}
        assert report.case is RecoveryCase.CLEAN_CORRUPT and report.log_end == base
        assert report.dropped_messages == len([r for r in results if r.commitlog_offset >= base + SEGMENT])
        kept = len([r for r in results if r.commitlog_offset < base])
        assert sorted(_all_bodies(store)) == list(range(kept))
    folder = _check_repair_folder(report, tmp_path)
    assert (folder / "other" / f"{base:020d}").read_bytes() == b""
    assert all((folder / "commitlog" / f"{b:020d}").read_bytes() == raw for b, raw in later.items())
    _reopens_clean_and_writable(tmp_path, kept)


def test_bytes_appended_past_a_segments_size_are_cut_and_kept(tmp_path):
    """SEGMENT_TOO_LONG: a plain open refuses the file; repair moves the extra bytes to the folder and keeps
    every message."""
    results = _write(tmp_path)
    path = _segment_path(tmp_path, _bases(tmp_path)[3])
    with open(path, "ab") as handle:
        handle.write(b"garbage!" * 3)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, _config())
    assert raised.value.rule == "commitlog.file-size"
    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.file_cases == {f"commitlog/{path.name}": RecoveryCase.SEGMENT_TOO_LONG}
        assert report.dropped_bytes == 24 and report.dropped_messages == 0
        assert len(_all_bodies(store)) == len(results)
    folder = _check_repair_folder(report, tmp_path)
    assert (folder / "other" / f"{path.name}.extra-bytes").read_bytes() == b"garbage!" * 3
    assert path.stat().st_size == SEGMENT
    _reopens_clean_and_writable(tmp_path, len(results))


def test_a_missing_middle_segment_cuts_the_log_at_the_gap(tmp_path):
    """SEGMENT_MISSING: a plain open refuses the gap; repair ends the log where the missing segment began and
    moves the segments after it to the folder, where `mqstore dump` reads them."""
    results = _write(tmp_path)
    bases = _bases(tmp_path)
    gone = bases[5]
    later = {b: _segment_path(tmp_path, b).read_bytes() for b in bases if b > gone}
    _segment_path(tmp_path, gone).unlink()
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(tmp_path, _config())
    assert raised.value.rule == "commitlog.contiguous"
    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.file_cases == {f"commitlog/{gone:020d}": RecoveryCase.SEGMENT_MISSING}
        assert report.case is RecoveryCase.CLEAN_CORRUPT and report.log_end == gone
        moved = [r for r in results if r.commitlog_offset >= gone + SEGMENT]
        assert report.dropped_messages == len(moved)
        assert report.dropped_offset_last == moved[-1].commitlog_offset
        kept = len([r for r in results if r.commitlog_offset < gone])
        assert sorted(_all_bodies(store)) == list(range(kept))
    folder = _check_repair_folder(report, tmp_path)
    assert all((folder / "commitlog" / f"{b:020d}").read_bytes() == raw for b, raw in later.items())
    assert cli_main(["dump", str(folder), "--offset", str(moved[0].commitlog_offset), "--json"]) == 0
    _reopens_clean_and_writable(tmp_path, kept)


def test_segments_moved_after_a_gap_are_kept_whatever_their_size(tmp_path):
    """SEGMENT_MISSING with a later segment cut short too (found by the corruption fuzz): the segments after
    the gap are moved as they are, and the report still counts the valid records they hold."""
    results = _write(tmp_path)
    bases = _bases(tmp_path)
    gone, short = bases[3], bases[5]
    _segment_path(tmp_path, gone).unlink()
    os.truncate(_segment_path(tmp_path, short), 1000)
    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert report.file_cases == {f"commitlog/{gone:020d}": RecoveryCase.SEGMENT_MISSING}
        assert report.log_end == gone
        in_short = [r for r in results if short <= r.commitlog_offset and r.commitlog_offset + r.size_bytes
                    <= short + 1000]
        counted = [r for r in results if r.commitlog_offset >= gone + SEGMENT and not short <= r.commitlog_offset
                   < short + SEGMENT]
        assert report.dropped_messages == len(counted) + len(in_short)
    folder = _check_repair_folder(report, tmp_path)
    assert (folder / "commitlog" / f"{short:020d}").stat().st_size == 1000
    _reopens_clean_and_writable(tmp_path, len([r for r in results if r.commitlog_offset < gone]))


def test_a_missing_first_consume_queue_file_is_rebuilt_not_taken_for_retention(tmp_path):
    """QUEUE_REBUILT: the first file of a queue is gone while the log still holds its messages: the queue is
    rebuilt from the log, so none of them becomes unreachable."""
    results = _write(tmp_path)
    queue_dir = tmp_path / "consumequeue" / "t" / "1"
    first = sorted(queue_dir.iterdir())[0]
    assert len(list(queue_dir.iterdir())) > 1
    first.unlink()
    with MessageStore.open(tmp_path, _config()) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CLEAN and report.queue_cases == {"t/1": RecoveryCase.QUEUE_REBUILT}
        assert store.min_offset("t", 1) == 0 and len(_all_bodies(store)) == len(results)


def test_an_index_file_that_breaks_its_format_is_rebuilt(tmp_path):
    """INDEX_REBUILT: an index file whose header breaks rules (1)-(3) is deleted with the index, which
    dispatch rebuilds from the log."""
    cfg = _config(index_enabled=True, index_slot_count=16, index_entry_count_max=4096)
    with MessageStore.open(tmp_path, cfg) as store:
        store.put_batch([Message("t", b"m%d" % i, keys=(f"k{i}",)) for i in range(50)])
    index_file = sorted((tmp_path / "index").iterdir())[0]
    data = bytearray(index_file.read_bytes())
    data[36:40] = (10**6).to_bytes(4, "big")  # indexCount past the file's entries
    index_file.write_bytes(bytes(data))
    with MessageStore.open(tmp_path, cfg) as store:
        assert store.recovery_report.index_case is RecoveryCase.INDEX_REBUILT
        assert store.wait_dispatched(10)
        assert all(len(store.query("t", f"k{i}")) == 1 for i in range(50))


def test_every_row_of_the_table_is_a_case_produced_by_code_and_named_by_a_test():
    import inspect

    import mqstore.store.recovery as recovery

    table = recovery.__doc__
    code = "".join(p.read_text() for p in pathlib.Path(recovery.__file__).parent.glob("*.py"))
    this = inspect.getsource(test_every_row_of_the_table_is_a_case_produced_by_code_and_named_by_a_test)
    tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py")).replace(this, "")
    for case in RecoveryCase:
        assert re.search(rf"\| {case.value}\s*\|", table), f"{case.value} is not a row of the table"
        assert f"RecoveryCase.{case.name}" in code, f"no code produces {case.value}"
        assert f"RecoveryCase.{case.name}" in tests, f"no test names {case.value}"
    rows = re.findall(r"\| ([A-Z_]+)\s*\|", table)
    assert set(rows) == {case.value for case in RecoveryCase}, "a row of the table is not a RecoveryCase"


def test_a_new_store_has_nothing_to_recover_and_its_report_is_plain_data(tmp_path):
    with MessageStore.open(tmp_path, _config()) as store:
        report = store.recovery_report
        assert report.cases() == [RecoveryCase.NEW_STORE]
    plain = report.as_dict()
    assert type(plain["case"]) is str and plain["case"] == "NEW_STORE" and json.loads(json.dumps(plain)) == plain


SETTINGS_DAMAGE = {
    # name: (how the file is damaged, the error a plain open raises with the test's explicit config)
    "not JSON": (lambda text: text[: len(text) // 2], "SettingsFileError"),
    "segment size digit": (lambda text: text.replace('"segment_size_bytes": 65536', '"segment_size_bytes": 85536'),
                           "ConfigMismatchError"),
    "entries digit": (lambda text: text.replace('"consume_queue_entries_per_file": 64',
                                                '"consume_queue_entries_per_file": 84'), "ConfigMismatchError"),
    "crc start": (lambda text: text.replace('"record_crc_from_offset": 0', '"record_crc_from_offset": -8'),
                  "SettingsFileError"),
}


@pytest.mark.parametrize("damage", SETTINGS_DAMAGE)
def test_a_damaged_settings_file_is_refused_then_repaired_from_the_store_s_files(tmp_path, damage):
    _write(tmp_path)
    settings = tmp_path / "config" / "mqstore.json"
    original = json.loads(settings.read_text())
    change, refusal = SETTINGS_DAMAGE[damage]
    damaged = change(settings.read_text())
    assert damaged != settings.read_text()
    settings.write_text(damaged)
    with pytest.raises(Exception) as caught:
        MessageStore.open(tmp_path, _config()).close()
    assert type(caught.value).__name__ == refusal
    with MessageStore.open(tmp_path, _config(), repair=True) as store:
        report = store.recovery_report
        assert len(_all_bodies(store)) == COUNT
        assert report.dropped_messages == 0 and "config/mqstore.json" in report.dropped_files
    folder = _check_repair_folder(report, tmp_path)
    assert (folder / "other" / "mqstore.json.damaged").read_text() == damaged
    saved = json.loads(settings.read_text())
    for name in ("segment_size_bytes", "consume_queue_entries_per_file", "record_crc"):
        assert saved[name] == original[name]
    assert saved["record_crc_from_offset"] > 0  # record CRCs are trusted from the repair's log end on
    _reopens_clean_and_writable(tmp_path, COUNT)


def test_a_segment_of_the_wrong_length_does_not_make_sound_settings_look_damaged(tmp_path):
    from mqstore.store.settings import saved_settings_damage

    _write(tmp_path)
    assert saved_settings_damage(str(tmp_path)) is None
    with open(_segment_path(tmp_path, 0), "ab") as handle:
        handle.write(b"\x01" * 100)
    assert saved_settings_damage(str(tmp_path)) is None  # the other segments have the saved length
    settings = tmp_path / "config" / "mqstore.json"
    settings.write_text(settings.read_text().replace('"segment_size_bytes": 65536', '"segment_size_bytes": 65636'))
    assert "the segments are 65536 bytes" in saved_settings_damage(str(tmp_path))
