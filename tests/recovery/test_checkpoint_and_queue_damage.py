"""Rows CRASH_CORRUPT, CRASH_TORN_TAIL, CHECKPOINT_REPLACED and QUEUE_REBUILT where damage meets damage.

A damaged or missing checkpoint cannot say how far the log was flushed: after a crash, damage followed by valid
records is then reported (CRASH_CORRUPT), never taken for a torn tail. A valid checkpoint that puts the damage
past the last flush makes it a torn tail, and the report names what the cut dropped. A ConsumeQueue whose
entries name another queue's records is rebuilt, so that a repaired store reopens CLEAN.
"""

from __future__ import annotations

import os
import shutil

import pytest
from mqstore.flush.checkpoint import CHECKPOINT_DTYPE

from mqstore import CorruptionError, Message, MessageStore
from mqstore.store.recovery import RecoveryCase
from mqstore.store.verify import verify_store
from tests.conftest import small_config

SEGMENT = 64 * 1024
PAGE = 4096
QUIET = dict(flush_interval_ms=3_600_000, flush_thorough_interval_ms=86_400_000,
             flush_consume_queue_interval_ms=3_600_000)  # only store.flush() makes bytes durable


def _body(number: int) -> bytes:
    return b"%05d|" % number + b"." * (300 + number % 200)


def _segment(root, offset: int):
    return root / "commitlog" / f"{offset - offset % SEGMENT:020d}"


def _zero_page(root, offset: int) -> None:
    """Zero the 4 KiB page of the log holding `offset`."""
    path = _segment(root, offset)
    data = bytearray(path.read_bytes())
    start = (offset % SEGMENT) // PAGE * PAGE
    data[start : start + PAGE] = bytes(PAGE)
    path.write_bytes(bytes(data))


def _crashed_store(tmp_path, count: int, **overrides):
    """A store of `count` messages, flushed, copied while its writer runs (an `abort` marker: a kill)."""
    with MessageStore.open(tmp_path / "live", small_config(**overrides)) as store:
        results = store.put_batch([Message("t", _body(i)) for i in range(count)])
        store.flush()
        assert store.wait_dispatched(10)
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    assert (tmp_path / "crashed" / "abort").exists()
    return tmp_path / "crashed", results


def _damage_checkpoint(path, how: str, results) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        os.truncate(path, 1000)
    elif how == "overwritten from the flushed offset on":  # a record boundary there, garbage in the rest
        data = bytearray(path.read_bytes())
        at = CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1]
        data[at : at + 8] = results[5].commitlog_offset.to_bytes(8, "big")
        data[at + 8 : at + 400] = bytes(range(1, 256)) + bytes(range(1, 138))
        path.write_bytes(bytes(data))
    elif how == "fields overwritten":
        data = bytearray(path.read_bytes())
        data[8:40] = b"\xa5" * 32
        path.write_bytes(bytes(data))
    elif how == "flushed offset inside an early record":  # a valid-looking field that no flush can have written
        data = bytearray(path.read_bytes())
        at = CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1]
        data[at : at + 8] = (results[5].commitlog_offset + 17).to_bytes(8, "big")
        path.write_bytes(bytes(data))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing", "truncated", "fields overwritten",
                                 "overwritten from the flushed offset on", "flushed offset inside an early record"])
def test_a_crash_with_a_damaged_checkpoint_reports_damage_followed_by_valid_records(tmp_path, how, codec):
    """CRASH_CORRUPT: the checkpoint cannot tell how far the log was flushed, and a zeroed page in a segment that is
    not the last is followed by valid records: a plain open raises; repair cuts there and names what it cut."""
    crashed, results = _crashed_store(tmp_path, 600)
    last_segment = max(result.commitlog_offset for result in results) // SEGMENT
    damaged = next(r for r in results if r.commitlog_offset // SEGMENT == 1 and r.commitlog_offset % PAGE > 600)
    assert last_segment >= 3
    _zero_page(crashed, damaged.commitlog_offset)
    _damage_checkpoint(crashed / "checkpoint", how, results)
    with pytest.raises(CorruptionError) as raised:
        MessageStore.open(crashed, small_config())
    cut = damaged.commitlog_offset // PAGE * PAGE  # the first record start at or before the zeroed page
    cut = max(r.commitlog_offset for r in results if r.commitlog_offset <= cut)
    assert raised.value.path == str(_segment(crashed, cut)) and raised.value.offset == cut % SEGMENT
    assert "valid records follow" in str(raised.value)
    with MessageStore.open(crashed, small_config(), repair=True) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_CORRUPT and report.log_end == cut
        assert report.checkpoint_case is RecoveryCase.CHECKPOINT_REPLACED
        kept = [r for r in results if r.commitlog_offset < cut]
        assert report.dropped_offset_last == results[-1].commitlog_offset
        assert report.dropped_messages >= sum(r.commitlog_offset // SEGMENT > 1 for r in results)
        assert [m.body for m in store.get("t", 0, 0, max_count=1000).messages] == [_body(i) for i in range(len(kept))]
    with MessageStore.open(crashed, small_config()) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]


def test_a_crash_with_a_damaged_checkpoint_and_only_a_torn_tail_keeps_the_log(tmp_path):
    """CRASH_TORN_TAIL with a replaced checkpoint: zeros with garbage after them and no valid record past them
    lose nothing by the cut."""
    crashed, results = _crashed_store(tmp_path, 100)
    end = results[-1].commitlog_offset + results[-1].size_bytes
    path = _segment(crashed, end)
    data = bytearray(path.read_bytes())
    data[end % SEGMENT + 64 : end % SEGMENT + 96] = b"\x5a" * 32  # torn bytes past the end, no record
    path.write_bytes(bytes(data))
    os.truncate(crashed / "checkpoint", 10)
    with MessageStore.open(crashed, small_config()) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_TORN_TAIL and report.log_end == end
        assert report.checkpoint_case is RecoveryCase.CHECKPOINT_REPLACED and report.dropped_messages == 0
        assert len(store.get("t", 0, 0, max_count=1000).messages) == 100


def test_a_hole_past_the_last_flush_is_a_torn_tail_and_the_report_names_what_it_cut(tmp_path):
    """CRASH_TORN_TAIL: the checkpoint is valid and the lost page lies past its flushed offset (ASYNC writeback
    out of order after a power cut): the cut is right, and the report counts the valid records it dropped."""
    with MessageStore.open(tmp_path / "live", small_config(**QUIET)) as store:
        flushed = store.put_batch([Message("t", _body(i)) for i in range(150)])
        store.flush()
        unflushed = store.put_batch([Message("t", _body(i)) for i in range(150, 450)])
        assert store.wait_dispatched(10)
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    crashed = tmp_path / "crashed"
    flushed_end = flushed[-1].commitlog_offset + flushed[-1].size_bytes
    lost = next(r for r in unflushed if r.commitlog_offset >= flushed_end + PAGE and r.commitlog_offset % PAGE > 600)
    _zero_page(crashed, lost.commitlog_offset)
    cut = max(r.commitlog_offset for r in unflushed if r.commitlog_offset <= lost.commitlog_offset // PAGE * PAGE)
    with MessageStore.open(crashed, small_config()) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CRASH_TORN_TAIL and report.log_end == cut
        page = lost.commitlog_offset // PAGE * PAGE
        intact = [r.commitlog_offset for r in unflushed  # past the cut and clear of the zeroed page
                  if r.commitlog_offset >= cut
                  and not (r.commitlog_offset < page + PAGE and r.commitlog_offset + r.size_bytes > page)]
        assert report.dropped_messages == len(intact) > 100
        assert (report.dropped_offset_first, report.dropped_offset_last) == (intact[0], intact[-1])
        assert len(store.get("t", 0, 0, max_count=1000).messages) == sum(r.commitlog_offset < cut for r in
                                                                         flushed + unflushed)


def _two_topics_store(root, dispatch_process: bool):
    """Topics a and b, queue 0 each: 40 messages of a, 64 of b, 40 of a. File 0 of a/0 (entries 0-63) and of b/0
    (entries 0-63) share a name; their commitlog offsets interleave."""
    results = {}
    with MessageStore.open(root, small_config(dispatch_process=dispatch_process)) as store:
        number = 0
        for topic, count in (("a", 40), ("b", 64), ("a", 40)):
            for _ in range(count):
                results.setdefault(topic, []).append(store.put(Message(topic, _body(number))))
                number += 1
        assert store.wait_dispatched(10)
    return results


@pytest.mark.parametrize("dispatch_process", [False, True])
def test_a_queue_file_of_another_queue_is_rebuilt_and_the_repaired_store_reopens(tmp_path, dispatch_process):
    """QUEUE_REBUILT: file 0 of a/0 swapped with file 0 of b/0, a damaged record in b's run: repair cuts the log
    there and must rebuild both queues (their entries name the other topic's records), not keep the entries
    below the cut and append after them; the repaired store reopens CLEAN and every get returns its own topic."""
    results = _two_topics_store(tmp_path, dispatch_process)
    queue_dir = tmp_path / "consumequeue"
    first, second = queue_dir / "a" / "0" / f"{0:020d}", queue_dir / "b" / "0" / f"{0:020d}"
    a_bytes, b_bytes = first.read_bytes(), second.read_bytes()
    first.write_bytes(b_bytes)
    second.write_bytes(a_bytes)
    damaged = results["b"][32]
    path = _segment(tmp_path, damaged.commitlog_offset)
    data = bytearray(path.read_bytes())
    data[damaged.commitlog_offset % SEGMENT + 120] ^= 0x04  # in the body: the CRC sees it
    path.write_bytes(bytes(data))
    config = small_config(dispatch_process=dispatch_process)
    with MessageStore.open(tmp_path, config, repair=True) as store:
        report = store.recovery_report
        assert report.case is RecoveryCase.CLEAN_CORRUPT and report.log_end == damaged.commitlog_offset
    with MessageStore.open(tmp_path, config) as store:
        assert store.recovery_report.cases() == [RecoveryCase.CLEAN]
        for topic, expected in (("a", results["a"][:40]), ("b", results["b"][:32])):
            got = store.get(topic, 0, 0, max_count=1000).messages
            assert [(m.topic, m.commitlog_offset) for m in got] == [(topic, r.commitlog_offset) for r in expected]
    assert report.queue_cases == {"a/0": RecoveryCase.QUEUE_REBUILT, "b/0": RecoveryCase.QUEUE_REBUILT}


@pytest.mark.parametrize("how, rule", [("missing", "checkpoint.missing"), ("truncated", "file-size"),
                                       ("overwritten from the flushed offset on", "checkpoint.reserved")])
def test_verify_names_a_checkpoint_recovery_would_replace(tmp_path, how, rule):
    """`mqstore verify` reports the checkpoints a crash recovery replaces (CHECKPOINT_REPLACED). (A checkpoint of
    the wrong size is reported with MappedFile's rule, "commitlog.file-size", today: flush/checkpoint.py does not
    name its format when it maps the file.)"""
    crashed, results = _crashed_store(tmp_path, 20)
    assert verify_store(crashed, small_config()).ok
    _damage_checkpoint(crashed / "checkpoint", how, results)
    problems = verify_store(crashed, small_config()).problems
    assert [(p.rule.endswith(rule), p.path) for p in problems] == [(True, str(crashed / "checkpoint"))]
