"""IndexService: file roll, queries across files, reopen, truncate, expiry and ordering checks."""

from __future__ import annotations

import os

import pytest
from mqstore.commitlog.errors import (
    CorruptionError,
    InvalidConfigError,
    InvalidMessageError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.indexfile import format as fmt
from mqstore.indexfile import index_service
from mqstore.indexfile.index_service import IndexService

T0 = 1_700_000_000_000
ALWAYS = (0, 2**62)


@pytest.fixture(autouse=True, params=["numpy", "key-by-key"])
def put_path(request, monkeypatch):
    """Every test runs with each path of IndexService.put_keys: numpy passes, and key by key (a few keys)."""
    monkeypatch.setattr(index_service, "PUT_FEW_KEYS_MAX", 0 if request.param == "numpy" else 1 << 30)
    return request.param


class Clock:
    """A pinned clock: every file is created in the same millisecond (names must still differ)."""

    def __init__(self, now_ms=T0):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _service(tmp_path, slots=4, entries=5, **kwargs) -> IndexService:
    return IndexService(tmp_path / "index", slots, entries, clock_ms=Clock(), **kwargs)


def _put_messages(service, count, keys_per_message=1, offset_step=100, topic="orders"):
    """Message i at offset i*offset_step, stored at T0 + i seconds, with keys k{i % 3} (and u{i})."""
    rows = ([], [], [])
    for i in range(count):
        for key in [f"k{i % 3}", f"u{i}"][:keys_per_message]:
            rows[0].append(fmt.index_key(topic, key).encode())
            rows[1].append(i * offset_step)
            rows[2].append(T0 + 1000 * i)
    return service.put_keys(*rows)


def test_config_is_checked(tmp_path):
    with pytest.raises(InvalidConfigError):
        IndexService(tmp_path, 0, 10)
    with pytest.raises(InvalidConfigError):
        IndexService(tmp_path, 4, 1)
    with pytest.raises(InvalidConfigError):
        IndexService(tmp_path, 2**29, 2**26)  # over the Java int file size


def test_roll_creates_files_that_inherit_the_previous_end(tmp_path):
    service = _service(tmp_path, entries=5)  # 4 keys per file
    assert _put_messages(service, 10) == 10
    files = service.files
    assert [f.entry_count for f in files] == [4, 4, 2]
    first = int(fmt.file_name(T0))  # local time; every file made in the same ms gets the next number
    assert [f.name for f in files] == [str(first), str(first + 1), str(first + 2)]
    assert sorted(os.listdir(tmp_path / "index")) == [f.name for f in files]
    assert (files[1].begin_phy_offset, files[1].end_phy_offset) == (400, 700)
    assert service.max_indexed_offset == 900 and service.entry_count == 10
    assert service.query("orders", "k0", 100, *ALWAYS) == [900, 600, 300, 0]  # newest first, across files
    assert service.query("orders", "k0", 3, *ALWAYS) == [900, 600, 300]
    assert service.query("orders", "k9", 100, *ALWAYS) == []
    assert service.query("other", "k0", 100, *ALWAYS) == []


def test_a_message_can_span_two_files(tmp_path):
    service = _service(tmp_path, entries=4)  # 3 keys per file
    _put_messages(service, 3, keys_per_message=2)
    assert [f.entry_count for f in service.files] == [3, 3]
    assert service.query("orders", "u1", 10, *ALWAYS) == [100]
    assert service.files[1].begin_phy_offset == 100
    assert service.indexed_key_count_at(200) == 2
    assert service.indexed_key_count_at(100) == 0  # not the newest message


def test_time_range_selects_files_and_entries(tmp_path):
    service = _service(tmp_path, entries=5)
    _put_messages(service, 12)  # k0 at messages 0, 3, 6, 9 (T0 + i s)
    assert service.query("orders", "k0", 100, T0 + 3000, T0 + 6000) == [600, 300]
    assert service.query("orders", "k0", 100, T0 + 3001, T0 + 5999) == []
    assert service.query("orders", "k0", 100, T0 + 9000, T0 + 99_000) == [900]
    assert service.query("orders", "k0", 100, T0 + 50_000, T0 + 99_000) == []
    assert service.query("orders", "k0", 100, T0 + 5000, T0 + 1000) == []


def test_reopen_continues_the_newest_file(tmp_path):
    service = _service(tmp_path, entries=5)
    _put_messages(service, 6)
    names = [f.name for f in service.files]
    service.close()
    service.close()
    with pytest.raises(StoreClosedError):
        service.query("orders", "k0", 10, *ALWAYS)
    again = _service(tmp_path, entries=5)
    assert [f.name for f in again.files] == names and again.max_indexed_offset == 500
    assert again.query("orders", "k0", 100, *ALWAYS) == [300, 0]
    again.put_keys([b"orders#k0"], [600], [T0 + 6000])
    assert [f.entry_count for f in again.files] == [4, 3]
    again.close()
    read_only = _service(tmp_path, entries=5, read_only=True)
    assert read_only.query("orders", "k0", 100, *ALWAYS) == [600, 300, 0]
    with pytest.raises(ReadOnlyStoreError):
        read_only.put_keys([b"orders#k0"], [700], [T0])
    with pytest.raises(ReadOnlyStoreError):
        read_only.truncate(0)
    read_only.close()


def test_read_only_on_a_missing_directory_is_empty(tmp_path):
    service = IndexService(tmp_path / "nothing", 4, 5, read_only=True)
    assert service.files == [] and service.max_indexed_offset == 0
    assert service.query("t", "k", 5, *ALWAYS) == []
    assert not (tmp_path / "nothing").exists()


def test_stray_files_are_ignored(tmp_path):
    service = _service(tmp_path)
    _put_messages(service, 2)
    service.close()
    (tmp_path / "index" / "20990101000000000.creating").write_bytes(b"half made")
    (tmp_path / "index" / "notes.txt").write_bytes(b"not ours")
    read_only = _service(tmp_path, read_only=True)
    assert len(read_only.files) == 1
    read_only.close()
    again = _service(tmp_path)
    assert len(again.files) == 1 and again.query("orders", "k1", 5, *ALWAYS) == [100]
    assert sorted(os.listdir(tmp_path / "index")) == [again.files[0].name, "notes.txt"]


def test_keys_must_come_in_log_order(tmp_path):
    service = _service(tmp_path)
    _put_messages(service, 3)
    with pytest.raises(InvalidMessageError):
        service.put_keys([b"orders#a"], [100], [T0])
    with pytest.raises(InvalidMessageError):
        service.put_keys([b"orders#a", b"orders#b"], [500, 400], [T0, T0])
    service.put_keys([b"orders#again"], [200], [T0])  # the last message's offset is allowed: resuming it
    service.put_key("orders", "single", 300, T0 + 3000)
    assert service.query("orders", "single", 5, *ALWAYS) == [300]


def test_truncate_across_files(tmp_path):
    service = _service(tmp_path, entries=5)
    _put_messages(service, 10)  # files hold messages 0-3, 4-7, 8-9
    assert service.truncate(1000) == 0 and len(service.files) == 3
    assert service.truncate(550) == 4  # drops 600..900: the last file, and 600, 700 from the middle one
    assert [f.entry_count for f in service.files] == [4, 2]
    assert service.max_indexed_offset == 500
    assert service.query("orders", "k0", 100, *ALWAYS) == [300, 0]
    service.put_keys([b"orders#k0"], [600], [T0 + 6000])
    assert service.query("orders", "k0", 100, *ALWAYS) == [600, 300, 0]
    assert service.truncate(0) == 7 and service.files == [] and service.max_indexed_offset == 0
    service.put_keys([b"orders#k0"], [0], [T0])
    assert service.query("orders", "k0", 100, *ALWAYS) == [0]


def test_truncate_at_a_file_boundary_drops_the_empty_successor(tmp_path):
    service = _service(tmp_path, entries=5)
    _put_messages(service, 4)  # a full file; the next put creates the second
    service.put_keys([b"orders#x"], [400], [T0 + 4000])
    service.truncate(400)
    assert [f.entry_count for f in service.files] == [4]
    assert service.truncate(300) == 1 and service.max_indexed_offset == 200
    service.close()
    assert len(os.listdir(tmp_path / "index")) == 1


def test_delete_files_below_keeps_the_newest(tmp_path):
    service = _service(tmp_path, entries=5)
    _put_messages(service, 10)  # file ends: 300, 700, 900
    assert service.delete_files_below(300) == 0
    assert service.delete_files_below(301) == 1
    assert service.delete_files_below(10**9) == 1  # the newest file stays
    assert len(service.files) == 1 and len(os.listdir(tmp_path / "index")) == 1
    assert service.query("orders", "k0", 100, *ALWAYS) == [900]


def test_check_passes_on_a_built_index(tmp_path):
    service = _service(tmp_path, slots=3, entries=7)
    _put_messages(service, 40, keys_per_message=2)
    service.check()
    service.flush()
    service.close()


def test_flush_reports_the_durable_end(tmp_path):
    service = _service(tmp_path, entries=5)
    assert service.flush() == 0
    _put_messages(service, 6, keys_per_message=2)
    assert service.flush() == 500 == service.max_indexed_offset


def _zero_from(index_file, position):
    index_file._map[position:] = 0


def test_truncate_cuts_lost_pages_of_an_older_file_and_deletes_the_files_after_it(tmp_path):
    """After a crash the cut must look at every file that may hold entries past it, not only the newest: here
    the middle file's last entries were lost (zeros under a header that counts them) and the newest file's
    header too (it reads as empty)."""
    service = _service(tmp_path, slots=4, entries=5)
    _put_messages(service, 12)  # four keys a file: offsets 0-300, 400-700, 800-1100
    middle, newest = service.files[1:]
    _zero_from(middle, fmt.entries_offset(4) + 20 * 3)  # entries 3, 4 (600, 700) never reached the disk
    _zero_from(newest, 0)
    service.close()
    service = _service(tmp_path, slots=4, entries=5)
    assert service.truncate(650) == 3  # 500 (before the damage), 600, 700 go; the empty newest file is deleted
    assert [f.entry_count for f in service.files] == [4, 1] and service.max_indexed_offset == 400
    assert service.damage_found and "rule 7" in service.damage_found[0]
    service.check()
    service.put_keys([b"orders#k2"], [500], [T0])
    assert service.query("orders", "k2", 100, *ALWAYS) == [500, 200]


def test_truncate_at_a_clean_open_trusts_files_that_pass_the_o1_checks(tmp_path):
    service = _service(tmp_path, slots=4, entries=5)
    _put_messages(service, 10)
    assert service.truncate(10**9, crashed=False) == 0 and service.damage_found == []
    assert [f.entry_count for f in service.files] == [4, 4, 2]


def test_truncate_cuts_at_an_older_file_that_reads_as_empty(tmp_path):
    service = _service(tmp_path, slots=4, entries=5)
    _put_messages(service, 12)
    _zero_from(service.files[1], 0)
    service.close()
    service = _service(tmp_path, slots=4, entries=5)
    assert service.truncate(10**9, crashed=False) == 4  # the newest file's entries; the zeroed file counted none
    assert [f.entry_count for f in service.files] == [4] and service.max_indexed_offset == 300
    assert "rule 8" in service.damage_found[0]
    assert len(os.listdir(tmp_path / "index")) == 1


def test_check_reports_files_out_of_place(tmp_path):
    service = _service(tmp_path, slots=4, entries=5)
    _put_messages(service, 12)
    service.check()
    _zero_from(service.files[1], 0)
    service.close()
    service = _service(tmp_path, slots=4, entries=5)
    with pytest.raises(CorruptionError) as raised:
        service.check()
    assert raised.value.rule == "indexfile.8"


@pytest.mark.parametrize("seed", range(6))
def test_both_put_paths_write_the_same_files(tmp_path, monkeypatch, seed):
    import random

    rng = random.Random(seed)
    calls, offset = [], 0
    for _ in range(rng.randrange(4, 12)):
        rows = ([], [], [])
        for _ in range(rng.randrange(5, 30)):
            offset += rng.choice([0, 0, 100, 250])  # several keys of one message share its offset
            key = rng.choice(["k", "ключ", "\u00e9", "long-key-" * 5, ""]) + str(rng.randrange(50))
            rows[0].append(fmt.index_key(rng.choice(["orders", "t"]), key).encode())
            rows[1].append(offset)
            rows[2].append(T0 + offset * 7)
        calls.append(rows)
    contents = []
    for name, threshold in (("numpy", 0), ("key-by-key", 1 << 30)):
        monkeypatch.setattr(index_service, "PUT_FEW_KEYS_MAX", threshold)
        service = IndexService(tmp_path / name, 5, 17, clock_ms=Clock())
        assert [service.put_keys(*rows) for rows in calls] == [len(rows[0]) for rows in calls]
        service.close()
        files = sorted(os.listdir(tmp_path / name))
        contents.append([(file, (tmp_path / name / file).read_bytes()) for file in files])
    assert len(contents[0]) > 1  # the keys filled several files
    assert contents[0] == contents[1]


def test_a_read_only_service_follows_a_writer_in_its_files_and_keys(tmp_path):
    """refresh(): files the writer created since are opened, files it deleted are dropped, the newest file's
    new keys are seen; queries then answer as the writer's do."""
    writer = _service(tmp_path, entries=5)
    _put_messages(writer, 3)
    reader = IndexService(tmp_path / "index", 4, 5, read_only=True)
    assert reader.query("orders", "k0", 100, *ALWAYS) == [0]
    rows = ([], [], [])
    for i in range(3, 12):  # fills the first file and two more
        rows[0].append(fmt.index_key("orders", f"k{i % 3}").encode())
        rows[1].append(i * 100)
        rows[2].append(T0 + 1000 * i)
    writer.put_keys(*rows)
    assert writer.delete_files_below(401) == 1
    reader.refresh()
    assert [f.name for f in reader.files] == [f.name for f in writer.files] and len(reader.files) == 2
    for key in ("k0", "k1", "k2"):
        assert reader.query("orders", key, 100, *ALWAYS) == writer.query("orders", key, 100, *ALWAYS) != []
    reader.close()
    writer.close()


def test_a_read_only_service_on_a_directory_made_later_finds_its_files(tmp_path):
    reader = IndexService(tmp_path / "index", 4, 5, read_only=True)
    assert reader.files == []
    writer = _service(tmp_path, entries=5)
    _put_messages(writer, 2)
    reader.refresh()
    assert reader.query("orders", "k1", 100, *ALWAYS) == [100]
    reader.close()
    writer.close()


def test_a_read_only_service_sees_the_new_time_range_of_a_file_the_writer_added_keys_to(tmp_path):
    """A query for recent keys skips files whose header ends before the range: the header must be read
    again, not only the slots."""
    writer = _service(tmp_path, entries=5)
    _put_messages(writer, 2)  # stored at T0 and T0 + 1 s
    reader = IndexService(tmp_path / "index", 4, 5, read_only=True)
    writer.put_keys([fmt.index_key("orders", "late").encode()], [500], [T0 + 5000])
    reader.refresh()
    assert reader.query("orders", "late", 100, T0 + 4000, T0 + 6000) == [500]
    reader.close()
    writer.close()
