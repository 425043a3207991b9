"""ConsumeQueue and ConsumeQueueTable: dense entries across files, replays skipped, holes and bad units refused."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.consumequeue import format as cqf
from mqstore.consumequeue.consume_queue import ConsumeQueue, ConsumeQueueTable

PER_FILE = 4


def _units(first_commitlog_offset: int, count: int, size: int = 100, tags_code: int = 0) -> np.ndarray:
    offsets = np.arange(count, dtype=np.int64) * size + first_commitlog_offset
    return cqf.make_units(offsets, np.full(count, size), np.full(count, tags_code))


def _queue(directory, *, writable: bool = True) -> ConsumeQueue:
    return ConsumeQueue(str(directory), "t", 0, PER_FILE, writable=writable)


def _write_unit_file(directory, first_queue_offset: int, units: list[tuple[int, int, int]]) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, cqf.file_name(first_queue_offset))
    data = b"".join(struct.pack(">qiq", *unit) for unit in units)
    with open(path, "wb") as handle:
        handle.write(data + bytes(PER_FILE * 20 - len(data)))
    return path


def test_file_names_are_byte_offsets_of_the_first_unit():
    assert cqf.file_name(0) == "00000000000000000000"
    assert cqf.file_name(300_000) == "00000000000006000000"
    assert cqf.parse_file_name("00000000000006000000") == 6_000_000
    assert cqf.parse_file_name("6000000") is None and cqf.parse_file_name("0000000000000600000x") is None


def test_put_and_read_across_files(tmp_path):
    queue = _queue(tmp_path)
    assert queue.put(0, _units(0, 10)) == 10
    assert (queue.min_offset, queue.max_offset) == (0, 10)
    assert sorted(os.listdir(tmp_path)) == [cqf.file_name(0), cqf.file_name(4), cqf.file_name(8)]
    read = queue.read(2, 5)
    assert read["commitlog_offset"].tolist() == [200, 300, 400, 500, 600] and read["size"].tolist() == [100] * 5
    assert len(queue.read(8, 100)) == 2 and len(queue.read(10, 5)) == 0
    assert queue.last_commitlog_end() == 1000
    queue.close()


def test_a_replayed_put_writes_only_the_new_entries(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 3))
    assert queue.put(0, _units(0, 3)) == 0
    assert queue.put(1, _units(100, 5)) == 3  # entries 1 and 2 are already there
    assert queue.max_offset == 6 and queue.read(0, 6)["commitlog_offset"].tolist() == [0, 100, 200, 300, 400, 500]
    queue.close()


def test_a_put_that_would_leave_a_hole_is_refused(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 2))
    with pytest.raises(CorruptionError) as raised:
        queue.put(3, _units(300, 1))
    assert raised.value.rule == "consumequeue.dense" and queue.max_offset == 2
    queue.close()


def _put_lists(queue: ConsumeQueue, first_queue_offset: int, units: np.ndarray) -> int:
    return queue.put_lists(first_queue_offset, units["commitlog_offset"].tolist(), units["size"].tolist(),
                           units["tags_code"].tolist())


def _files(directory) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def test_put_lists_writes_the_files_put_writes(tmp_path):
    """put_lists (units packed one by one) against put (a unit array): the same files byte for byte, the same
    counts, across file boundaries, with replayed entries skipped and negative tags codes."""
    puts = [(0, _units(0, 3, tags_code=-7)), (3, _units(300, 1)), (2, _units(200, 4, tags_code=2**62)),
            (6, _units(600, 6, size=33)), (12, _units(5000, 0)), (12, _units(5000, 2))]
    counts = {}
    for name, put in (("array", ConsumeQueue.put), ("lists", _put_lists)):
        directory = tmp_path / name
        queue = _queue(directory)
        counts[name] = [put(queue, first, units) for first, units in puts]
        assert queue.max_offset == 14
        queue.close()
    assert counts["lists"] == counts["array"] == [3, 1, 2, 6, 0, 2]
    assert _files(tmp_path / "lists") == _files(tmp_path / "array")
    assert len(_files(tmp_path / "lists")) == 4


def test_put_lists_refuses_a_hole_as_put_does(tmp_path):
    queue = _queue(tmp_path)
    _put_lists(queue, 0, _units(0, 2))
    with pytest.raises(CorruptionError) as raised:
        _put_lists(queue, 3, _units(300, 1))
    assert raised.value.rule == "consumequeue.dense" and queue.max_offset == 2
    assert queue.read(0, 2)["commitlog_offset"].tolist() == [0, 100]
    queue.close()


def test_a_new_queue_joins_the_table_after_put_lists_wrote_to_it(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), PER_FILE, writable=True)
    assert table.put_lists("t", 3, 0, [0, 100], [100, 100], [1, 2]) == 2
    assert table.topics() == {"t": [3]}
    assert table.put_lists("t", 3, 1, [100, 200], [100, 50], [2, 3]) == 1
    units = table.get("t", 3).read(0, 3)
    assert units["commitlog_offset"].tolist() == [0, 100, 200] and units["size"].tolist() == [100, 100, 50]
    table.close()


def test_reopen_restores_positions(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 6, tags_code=-7))
    queue.flush()
    queue.close()
    reopened = _queue(tmp_path)
    assert (reopened.min_offset, reopened.max_offset, reopened.flushed_offset) == (0, 6, 6)
    assert reopened.read(5, 1)["tags_code"].tolist() == [-7]
    assert reopened.put(6, _units(600, 1)) == 1 and reopened.max_offset == 7
    reopened.close()


def test_an_exactly_full_last_file_is_read_to_its_end(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, PER_FILE * 2))
    queue.close()
    reopened = _queue(tmp_path)
    assert reopened.max_offset == PER_FILE * 2
    assert reopened.put(PER_FILE * 2, _units(800, 1)) == 1 and reopened.max_offset == PER_FILE * 2 + 1
    reopened.close()


def test_decreasing_commitlog_offsets_on_disk_are_corruption(tmp_path):
    path = _write_unit_file(tmp_path, 0, [(100, 10, 0), (50, 10, 0)])
    with pytest.raises(CorruptionError) as raised:
        _queue(tmp_path)
    assert raised.value.rule == "consumequeue.3" and raised.value.path == path and raised.value.offset == 20


def test_a_negative_commitlog_offset_on_disk_is_corruption(tmp_path):
    _write_unit_file(tmp_path, 0, [(0, 10, 0), (-5, 10, 0)])
    with pytest.raises(CorruptionError) as raised:
        _queue(tmp_path)
    assert raised.value.rule == "consumequeue.2"


def test_a_short_file_followed_by_another_is_corruption(tmp_path):
    _write_unit_file(tmp_path, 0, [(0, 10, 0)])
    _write_unit_file(tmp_path, PER_FILE, [(100, 10, 0)])
    with pytest.raises(CorruptionError) as raised:
        _queue(tmp_path)
    assert raised.value.rule == "consumequeue.1"


def test_offsets_going_backwards_between_files_are_corruption(tmp_path):
    _write_unit_file(tmp_path, 0, [(1000 + i, 1, 0) for i in range(PER_FILE)])
    _write_unit_file(tmp_path, PER_FILE, [(10, 1, 0)])
    with pytest.raises(CorruptionError):
        _queue(tmp_path)


def test_missing_middle_file_is_corruption(tmp_path):
    _write_unit_file(tmp_path, 0, [(i, 1, 0) for i in range(PER_FILE)])
    _write_unit_file(tmp_path, 2 * PER_FILE, [(100, 1, 0)])
    with pytest.raises(CorruptionError):
        _queue(tmp_path)


def test_a_queue_that_starts_after_retention_keeps_its_min_offset(tmp_path):
    _write_unit_file(tmp_path, 2 * PER_FILE, [(500, 10, 0), (510, 10, 0)])
    queue = _queue(tmp_path)
    assert (queue.min_offset, queue.max_offset) == (8, 10)
    assert queue.read(0, 9)["commitlog_offset"].tolist() == [500]
    queue.close()


def test_a_zeroed_unit_read_inside_the_written_range_is_corruption(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 3))
    queue.units[0][1]["size"] = 0
    with pytest.raises(CorruptionError) as raised:
        queue.read(0, 3)
    assert raised.value.offset == 20 and raised.value.rule == "consumequeue.1"
    queue.close()


def test_read_lists_gives_what_read_gives_within_and_across_files(tmp_path):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 10, size=50))
    for start, count in ((0, 1), (1, 3), (2, 5), (4, 4), (8, 100), (0, 10), (10, 5)):
        units = queue.read(start, count)
        offsets = units["commitlog_offset"].tolist()
        assert queue.read_lists(start, count) == (offsets, units["size"].tolist(), min(offsets, default=0),
                                                  max(offsets, default=-1))
    assert queue.read_lists(3, 2) == ([150, 200], [50, 50], 150, 200)
    queue.close()


@pytest.mark.parametrize("field, value", [("size", 0), ("size", -3), ("commitlog_offset", -1)])
@pytest.mark.parametrize("start, count", [(0, 3), (1, 1), (0, 6)])  # inside one file; across two
def test_read_lists_refuses_a_bad_unit_as_read_does(tmp_path, field, value, start, count):
    queue = _queue(tmp_path)
    queue.put(0, _units(0, 6))
    queue.units[0][1][field] = value
    with pytest.raises(CorruptionError) as raised:
        queue.read_lists(start, count)
    assert raised.value.offset == 20 and raised.value.rule == "consumequeue.1"
    assert raised.value.path == os.path.join(str(tmp_path), cqf.file_name(0))
    queue.close()


@pytest.mark.usefixtures("codec")  # the compiled count of new entries, and its reference
def test_a_reader_refresh_sees_new_entries_and_files(tmp_path):
    writer = _queue(tmp_path)
    writer.put(0, _units(0, 2))
    reader = _queue(tmp_path, writable=False)
    assert reader.max_offset == 2
    writer.put(2, _units(200, 7))
    assert reader.max_offset == 2
    reader.refresh()
    assert reader.max_offset == 9
    assert reader.read(0, 9)["commitlog_offset"].tolist() == [i * 100 for i in range(9)]
    writer.close()
    reader.close()


@pytest.mark.usefixtures("codec")  # the compiled count of new entries, and its reference
def test_a_reader_refresh_counts_many_new_entries_and_maps_the_next_file_by_name(tmp_path, monkeypatch):
    # os.listdir lets go of the interpreter lock at every entry (ConsumeQueue._map_next_file says what that cost)
    from mqstore.consumequeue import consume_queue as module

    per_file = 1000  # more than a refresh's first window
    writer = ConsumeQueue(str(tmp_path), "t", 0, per_file, writable=True)
    writer.put(0, _units(0, 3))
    reader = ConsumeQueue(str(tmp_path), "t", 0, per_file, writable=False)
    listings = []
    real = os.listdir
    monkeypatch.setattr(module.os, "listdir", lambda path: listings.append(path) or real(path))
    writer.put(3, _units(300, 700))
    reader.refresh()
    assert reader.max_offset == 703 and listings == []  # its last file is not full: nothing new to list
    writer.put(703, _units(70_300, 500))  # fills the file, starts the next
    reader.refresh()
    assert reader.max_offset == 1203 and listings == [] and len(reader.files) == 2
    assert reader.read(995, 10)["commitlog_offset"].tolist() == [i * 100 for i in range(995, 1005)]
    writer.close()
    reader.close()


@pytest.mark.parametrize("error", ["missing", "refused"])
def test_a_reader_that_finds_no_next_file_waits_for_it_and_other_errors_are_raised(tmp_path, monkeypatch, error):
    # The next file is looked for by name: not there is the common case, also when the writer makes it between the
    # failed open and any later look (which must not turn a missing file into an error); other errors are real.
    from mqstore.consumequeue import consume_queue as module

    writer = _queue(tmp_path)
    writer.put(0, _units(0, 4))  # the first file, full
    reader = _queue(tmp_path, writable=False)
    writer.put(4, _units(400, 2))  # the writer rolls: the second file exists from here on
    real_open = module.MappedFile.open

    def failing_open(path, *args, **kwargs):
        cause = FileNotFoundError(2, "No such file or directory") if error == "missing" else PermissionError(13, "no")
        raise StoreIOError(f"cannot map {path}: {cause.strerror}") from cause

    monkeypatch.setattr(module.MappedFile, "open", failing_open)
    if error == "missing":  # as if the open came just before the writer made the file
        reader.refresh()
        assert (reader.max_offset, len(reader.files)) == (4, 1)
    else:
        with pytest.raises(StoreIOError, match="cannot map"):
            reader.refresh()
    monkeypatch.setattr(module.MappedFile, "open", real_open)
    reader.refresh()
    assert (reader.max_offset, len(reader.files)) == (6, 2)
    writer.close()
    reader.close()


@pytest.mark.usefixtures("codec")  # the compiled count of new entries, and its reference
def test_a_reader_refresh_follows_retention_and_the_files_made_after_it(tmp_path):
    writer = _queue(tmp_path)
    writer.put(0, _units(0, 10))  # files at queue offsets 0, 4, 8
    reader = _queue(tmp_path, writable=False)
    assert (reader.min_offset, reader.max_offset, len(reader.files)) == (0, 10, 3)
    assert writer.delete_files_below(800) == 2  # entries 0-7 point below 800: two files go
    writer.put(10, _units(1000, 5))  # fills the third file, starts a fourth (queue offset 12)
    reader.refresh()  # the next file, by its name; the deleted ones are still held
    assert reader.max_offset == 15 and len(reader.files) == 4
    reader.follow_log_min(800)  # as every read of the store does once the log's minimum moved: lists the files
    assert reader.min_offset == 8 and reader.max_offset == 15
    assert [f.base_offset for f in reader.files] == [f.base_offset for f in writer.files]
    assert reader.read(8, 7)["commitlog_offset"].tolist() == [800, 900] + [1000 + i * 100 for i in range(5)]
    writer.close()
    reader.close()


@pytest.mark.usefixtures("codec")  # the compiled count of new entries, and its reference
def test_a_reader_whose_every_file_was_deleted_starts_again_at_the_writers_first(tmp_path):
    writer = _queue(tmp_path)
    writer.put(0, _units(0, 3))
    reader = _queue(tmp_path, writable=False)
    writer.put(3, _units(300, 14))  # queue offsets 0-16: files at 0, 4, 8, 12, 16
    assert writer.delete_files_below(1300) == 3  # the reader's only file and two it never saw
    reader.refresh()  # the file after its own is gone: nothing new for it
    assert (reader.min_offset, reader.max_offset, len(reader.files)) == (0, 4, 1)
    reader.follow_log_min(1200)  # the log now starts at entry 12
    assert (reader.min_offset, reader.max_offset) == (12, 17)
    assert reader.read(12, 5)["commitlog_offset"].tolist() == [1200 + i * 100 for i in range(5)]
    writer.close()
    reader.close()


@pytest.mark.parametrize("writable", [True, False])
def test_a_negative_size_is_damage_not_the_end_of_the_queue(tmp_path, writable):
    # A zero size ends the written units (free space); no writer puts a negative one there, and taking it for
    # the end would hide the entries after it.
    _write_unit_file(tmp_path, 0, [(0, 10, 0), (10, -10, 0), (20, 10, 0)])
    with pytest.raises(CorruptionError) as raised:
        _queue(tmp_path, writable=writable)
    assert raised.value.rule == "consumequeue.1" and raised.value.offset == 20
    _write_unit_file(tmp_path, 0, [(0, 10, 0), (10, 0, 0), (20, 10, 0)])
    queue = _queue(tmp_path, writable=writable)
    assert queue.max_offset == 1  # a zero size is where the written part ends
    queue.close()


@pytest.mark.usefixtures("codec")  # the compiled count of new entries, and its reference
def test_a_reader_refresh_reports_a_negative_size_past_what_it_has_seen(tmp_path):
    writer = _queue(tmp_path)
    writer.put(0, _units(0, 2))
    reader = _queue(tmp_path, writable=False)
    writer.put(2, _units(200, 4))
    writer.units[1][1]["size"] = -1  # entry 5: in the second file, past the reader's end
    with pytest.raises(CorruptionError) as raised:
        reader.refresh()
    assert raised.value.rule == "consumequeue.1" and raised.value.offset == 20
    assert raised.value.path == os.path.join(str(tmp_path), cqf.file_name(PER_FILE))
    writer.close()
    reader.close()


def test_table_loads_queues_and_lists_topics(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), PER_FILE, writable=True)
    table.get_or_create("b", 1).put(0, _units(0, 2))
    table.get_or_create("a", 3).put(0, _units(200, 1))
    table.get_or_create("b", 0).put(0, _units(300, 1))
    assert table.topics() == {"a": [3], "b": [0, 1]} and table.max_commitlog_end() == 400
    table.close()
    os.makedirs(tmp_path / "bad topic" / "0")
    os.makedirs(tmp_path / "a" / "not-a-queue")
    reopened = ConsumeQueueTable(str(tmp_path), PER_FILE, writable=False)
    assert reopened.topics() == {"a": [3], "b": [0, 1]}
    assert reopened.get("b", 1).max_offset == 2 and reopened.get("c", 0) is None
    reopened.close()
