"""One index file on numpy.memmap: put keys, select commitlog offsets by key hash and time (RocketMQ's IndexFile).

The layout and the validity rule are in `indexfile.format`. Writes go through the map and reach the disk on
`flush()` (fdatasync). A put writes, in this order, the new entries, the header, then the slots: a writer
stopped between them leaves entries that no slot reaches yet (lost from queries, never corrupt), which
`rebuild_slots()` restores from the entries. Every value read from the file is checked before it is used:
an out-of-range slot, link or time is a `CorruptionError`, and every chain walk is bounded by indexCount.

Not thread-safe: `IndexService` serializes the calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
from mqstore.commitlog.errors import (
    CorruptionError,
    FlushFailedError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
)
from mqstore.commitlog.mapped_file import create_unnamed, link_into_place
from mqstore.commitlog.native import NATIVE
from mqstore.indexfile import format as fmt

# what mqstore.commitlog._native.index_place answers (commitlog/csrc/index_core.h, MQ_INDEX_*)
PLACE_DONE, PLACE_FULL, PLACE_PYTHON_KEY, PLACE_BAD_SLOT, PLACE_BAD_HEADER, PLACE_BAD_INPUT = range(6)
assert NATIVE is None or NATIVE.index_layout() == (
    fmt.HEADER_SIZE_BYTES, fmt.SLOT_SIZE_BYTES, fmt.ENTRY_SIZE_BYTES, fmt.OFFSET_BEGIN_TIMESTAMP,
    fmt.OFFSET_END_TIMESTAMP, fmt.OFFSET_BEGIN_PHY_OFFSET, fmt.OFFSET_END_PHY_OFFSET, fmt.OFFSET_HASH_SLOT_COUNT,
    fmt.OFFSET_INDEX_COUNT, fmt.TIME_DIFF_MAX, PLACE_BAD_INPUT), "index_core.h disagrees with indexfile/format.py"
HEADER_READS_MAX = 8  # a read-only file's header is read until two reads agree, this many times at most
SLOT_NEWER_RETRIES = 5  # a read-only file re-reads its header this often for a slot past its indexCount ...
SLOT_NEWER_WAIT_S = 0.001  # ... waiting this long between reads (then the slot is corrupt: rule 4)


def _java_int(value: int) -> int:
    """`value` wrapped to a Java int, as AtomicInteger.incrementAndGet wraps."""
    return ((value + 2**31) % 2**32) - 2**31


class IndexFile:
    """One index file. Open with `IndexFile.create` or `IndexFile.open`."""

    def __init__(self, path: str, hash_slot_count: int, index_entry_count_max: int, *, read_only: bool):
        """Map an existing file and check rules (1) to (3); use `create` or `open`."""
        assert hash_slot_count >= 1 and index_entry_count_max >= fmt.INDEX_ENTRY_COUNT_MAX_MIN
        self.path = path
        self.name = os.path.basename(path)
        self.hash_slot_count = hash_slot_count
        self.index_entry_count_max = index_entry_count_max
        self.read_only = read_only
        size = fmt.file_size_bytes(hash_slot_count, index_entry_count_max)
        try:
            actual = os.path.getsize(path)
            if actual != size:
                raise CorruptionError(
                    f"index file is {actual} bytes, {size} expected for {hash_slot_count} slots and "
                    f"{index_entry_count_max} entries [rule 1]", path=path, offset=0, rule="indexfile.1")
            self._map = np.memmap(path, dtype=np.uint8, mode="r" if read_only else "r+", shape=(size,))
            self._fd = None if read_only else os.open(path, os.O_RDWR)  # for flush(): see there
        except OSError as exc:
            self._map = None
            raise StoreIOError(f"cannot map index file {path}: {exc}") from exc
        self._buf = memoryview(self._map)
        self._entries_at = fmt.entries_offset(hash_slot_count)
        raw = np.asarray(self._map)  # a plain ndarray view: memmap's own __getitem__ is slow on hot paths
        self._slots = raw[fmt.slots_offset() : self._entries_at].view(fmt.SLOT)
        self._entries = raw[self._entries_at :].view(fmt.INDEX_ENTRY)
        self._dirty = False
        self.flush_error: FlushFailedError | None = None  # the first failed flush: every later one raises it again
        try:
            self._read_header()
        except CorruptionError:
            self.close()
            raise

    def _read_header(self) -> None:
        """Load the header and check rules (2) and (3). A read-only file may be written by another process,
        which stores the header byte by byte: it is read until two reads agree (HEADER_READS_MAX at most), so
        half an update is not taken for the header."""
        header = self._buf[: fmt.HEADER_SIZE_BYTES].tobytes()
        if self.read_only:
            for _ in range(HEADER_READS_MAX):
                again = self._buf[: fmt.HEADER_SIZE_BYTES].tobytes()
                if again == header:
                    break
                header = again
        begin_ms, end_ms, begin_phy, end_phy, put_count, index_count = fmt.HEADER_STRUCT.unpack(header)
        if not 0 <= index_count <= self.index_entry_count_max:
            raise CorruptionError(f"indexCount {index_count} outside 0..{self.index_entry_count_max} [rule 2]",
                                  path=self.path, offset=fmt.OFFSET_INDEX_COUNT, rule="indexfile.2")
        if begin_phy < 0 or end_phy < 0:
            raise CorruptionError(
                f"negative commitlog offset in header: begin {begin_phy}, end {end_phy} [rule 3]", path=self.path,
                offset=fmt.OFFSET_BEGIN_PHY_OFFSET, rule="indexfile.3")
        (self._begin_timestamp_ms, self._end_timestamp_ms, self._begin_phy_offset, self._end_phy_offset,
         self._put_count) = begin_ms, end_ms, begin_phy, end_phy, put_count
        self._index_count = max(index_count, 1)

    def refresh(self) -> None:
        """Read-only: take in what a writer in another process has put since the header was last read (its
        puts write entries, then the header, then the slots: a slot read after the header names an entry the
        header counts)."""
        self._check_open()
        assert self.read_only
        self._read_header()

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, hash_slot_count: int, index_entry_count_max: int, *, end_phy_offset: int = 0,
               end_timestamp_ms: int = 0) -> IndexFile:
        """Create a zero-filled file at full size, inheriting the previous file's end (RocketMQ's constructor).

        The file is built under a temporary name and linked into place, so `path` either does not exist or
        is complete; an existing `path` is never overwritten (StoreIOError).
        """
        size = fmt.file_size_bytes(hash_slot_count, index_entry_count_max)
        assert size <= fmt.FILE_SIZE_BYTES_MAX
        begin_end_phy = end_phy_offset if end_phy_offset > 0 else 0
        begin_end_timestamp = end_timestamp_ms if end_timestamp_ms > 0 else 0
        temporary = None
        try:
            fd, temporary = create_unnamed(path)  # linked into place once its size and header are set
            try:
                os.ftruncate(fd, size)
                os.pwrite(fd, fmt.HEADER_STRUCT.pack(begin_end_timestamp, begin_end_timestamp, begin_end_phy,
                                                     begin_end_phy, 0, 0), 0)
                link_into_place(fd, temporary, path)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot create index file {path}: {exc}") from exc
        finally:
            if temporary is not None and os.path.exists(temporary):
                os.unlink(temporary)
        return cls(path, hash_slot_count, index_entry_count_max, read_only=False)

    @classmethod
    def open(cls, path: str, hash_slot_count: int, index_entry_count_max: int, *,
             read_only: bool = False) -> IndexFile:
        """Map an existing index file; CorruptionError when its size or header breaks rules (1) to (3)."""
        return cls(path, hash_slot_count, index_entry_count_max, read_only=read_only)

    def flush(self) -> None:
        """Write the file to disk when anything was written since the last flush.

        fdatasync of the file, not msync of the mapping (numpy's `memmap.flush`): on Linux both write back the
        pages the mapping dirtied, but CPython's msync holds the interpreter lock throughout, which stopped
        every producer for the whole write-back (11 ms a second with SYNC puts, 14-25 ms with ASYNC ones: the
        keys of a second dirty pages all over the slot table). fdatasync releases it.
        """
        self._check_open()
        if self.flush_error is not None:  # a failed fdatasync is never forgotten (MappedFile.flush says why)
            raise FlushFailedError(f"{self.path} is not flushed: an earlier flush of it failed ({self.flush_error})",
                                   path=self.path) from self.flush_error
        if self._dirty and not self.read_only:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self.flush_error = FlushFailedError(f"fdatasync of index file {self.path} failed: {exc.strerror}",
                                                    path=self.path)
                raise self.flush_error from exc
            self._dirty = False

    def close(self) -> None:
        """Flush (when writable) and unmap. Idempotent."""
        if self._map is None:
            return
        try:
            if self._dirty and not self.read_only:
                self.flush()
        finally:
            self._slots = self._entries = None
            self._buf.release()
            self._map = None  # the last reference: CPython unmaps here
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def closed(self) -> bool:
        return self._map is None

    def _check_open(self) -> None:
        if self._map is None:
            raise StoreClosedError(f"index file {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyStoreError(f"index file {self.path} is open read-only")

    # --- header ------------------------------------------------------------------------------------------
    @property
    def begin_timestamp_ms(self) -> int:
        return self._begin_timestamp_ms

    @property
    def end_timestamp_ms(self) -> int:
        return self._end_timestamp_ms

    @property
    def begin_phy_offset(self) -> int:
        return self._begin_phy_offset

    @property
    def end_phy_offset(self) -> int:
        return self._end_phy_offset

    @property
    def index_count(self) -> int:
        """Number of the next entry to write (1 when empty), RocketMQ's indexCount."""
        return self._index_count

    @property
    def entry_count(self) -> int:
        """Entries written (indexCount - 1)."""
        return self._index_count - 1

    @property
    def header_hash_slot_count(self) -> int:
        """The header's hashSlotCount field as kept (RocketMQ counts keys put in it)."""
        return self._put_count

    @property
    def is_full(self) -> bool:
        return self._index_count >= self.index_entry_count_max

    def _write_header(self) -> None:
        fmt.HEADER_STRUCT.pack_into(self._buf, 0, self._begin_timestamp_ms, self._end_timestamp_ms,
                                    self._begin_phy_offset, self._end_phy_offset, _java_int(self._put_count),
                                    self._index_count)

    def _advance_header(self, first_phy: int, first_timestamp_ms: int, last_phy: int, last_timestamp_ms: int,
                        put: int) -> None:
        if self._index_count <= 1:
            self._begin_phy_offset = first_phy
            self._begin_timestamp_ms = first_timestamp_ms
        self._put_count += put
        self._index_count += put
        self._end_phy_offset = last_phy
        self._end_timestamp_ms = last_timestamp_ms
        self._write_header()
        self._dirty = True

    # --- writing -----------------------------------------------------------------------------------------
    def _slot_corruption(self, slot: int, value: int) -> CorruptionError:
        return CorruptionError(
            f"slot {slot} holds entry {value}, outside 0..{self._index_count - 1} [rule 4]",
            path=self.path, offset=fmt.slots_offset() + fmt.SLOT_SIZE_BYTES * slot, rule="indexfile.4")

    def put_key(self, key_hash: int, commitlog_offset: int, store_timestamp_ms: int) -> bool:
        """Append one entry (RocketMQ's putKey: entry, header, slot); False when the file is full."""
        return self.put_rows([key_hash], [commitlog_offset], [store_timestamp_ms]) == 1

    def put_rows(self, key_hashes: Sequence[int], commitlog_offsets: Sequence[int],
                 store_timestamps_ms: Sequence[int]) -> int:
        """`put_hashes` for a few rows given as lists of ints, in plain Python (its dozens of numpy calls cost
        more than the work): the same bytes, written in the same order (entries, header, slots)."""
        self._check_writable()
        count = self._index_count
        put = min(self.index_entry_count_max - count, len(key_hashes))
        if put <= 0:
            return 0
        buf = self._buf
        slot_count = self.hash_slot_count
        slots_at = fmt.slots_offset()
        unpack_slot = fmt.SLOT_STRUCT.unpack_from
        pack_entry = fmt.ENTRY_STRUCT.pack_into
        entry_size = fmt.ENTRY_SIZE_BYTES
        entries_at = self._entries_at
        time_diff_s = fmt.time_diff_s
        begin = self._begin_timestamp_ms
        first_timestamp = store_timestamps_ms[0]
        heads: dict[int, int] = {}  # slot -> the newest entry number this call put in it
        number = count
        for key_hash, offset, timestamp in zip(key_hashes[:put], commitlog_offsets[:put], store_timestamps_ms[:put]):
            assert 0 <= key_hash < 2**31 and offset >= 0
            slot = key_hash % slot_count
            head = heads.get(slot)
            if head is None:
                head = unpack_slot(buf, slots_at + fmt.SLOT_SIZE_BYTES * slot)[0]
                if not 0 <= head < count:
                    raise self._slot_corruption(slot, head)
            pack_entry(buf, entries_at + entry_size * number, key_hash, offset, time_diff_s(timestamp, begin), head)
            heads[slot] = number
            if number <= 1:  # the file's first put resets beginTimestamp for the rows after it
                begin = first_timestamp
            number += 1
        self._advance_header(commitlog_offsets[0], first_timestamp, commitlog_offsets[put - 1],
                             store_timestamps_ms[put - 1], put)
        pack_slot = fmt.SLOT_STRUCT.pack_into
        for slot, newest in heads.items():
            pack_slot(buf, slots_at + fmt.SLOT_SIZE_BYTES * slot, newest)
        return put

    def put_hashes(self, key_hashes: np.ndarray, commitlog_offsets: np.ndarray,
                   store_timestamps_ms: np.ndarray) -> int:
        """Append entries from three int64 columns as far as room allows; returns how many were put.

        The same bytes as `put_key` once per row, in vector passes: rows are grouped by slot (stable sort),
        each row links to the previous row of its slot, or to the slot's old head for the first row.
        """
        self._check_writable()
        count = self._index_count
        put = min(self.index_entry_count_max - count, len(key_hashes))
        if put <= 0:
            return 0
        hashes = key_hashes[:put]
        offsets = commitlog_offsets[:put]
        timestamps = store_timestamps_ms[:put]
        assert hashes.min() >= 0 and hashes.max() < 2**31 and offsets.min() >= 0
        slots = hashes % self.hash_slot_count
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        sorted_numbers = order + count
        boundary = sorted_slots[1:] != sorted_slots[:-1]
        first = np.concatenate(([True], boundary))
        last = np.concatenate((boundary, [True]))
        head_slots = sorted_slots[first]
        heads = self._slots[head_slots].astype(np.int64)
        bad = (heads < 0) | (heads >= count)
        if bad.any():
            at = int(np.argmax(bad))
            raise self._slot_corruption(int(head_slots[at]), int(heads[at]))
        sorted_prev = np.empty(put, dtype=np.int64)
        sorted_prev[1:] = sorted_numbers[:-1]
        sorted_prev[first] = heads
        prev = np.empty(put, dtype=np.int64)
        prev[order] = sorted_prev

        begins = np.full(put, self._begin_timestamp_ms, dtype=np.int64)
        if count <= 1:  # the file's first put resets beginTimestamp for the rows after it
            begins[1:] = timestamps[0]
        time_diffs = np.clip((timestamps - begins) // 1000, 0, fmt.TIME_DIFF_MAX)
        time_diffs[begins <= 0] = 0

        rows = np.empty(put, dtype=fmt.INDEX_ENTRY)
        rows["key_hash"] = hashes
        rows["phy_offset"] = offsets
        rows["time_diff"] = time_diffs
        rows["prev_index"] = prev
        self._entries[count : count + put] = rows
        self._advance_header(int(offsets[0]), int(timestamps[0]), int(offsets[-1]), int(timestamps[-1]), put)
        self._slots[sorted_slots[last]] = sorted_numbers[last]
        return put

    def place_native(self, rows: tuple, row: int, key: int, *, spans: bool = False) -> tuple[int, int, int, int]:
        """Hash and place the index keys of message rows from the cursor (row `row`, its `key`-th index key) with
        the compiled core (`mqstore.commitlog._native.index_place`, commitlog/csrc/index_core.c), as far as the file has
        room: the bytes `put_hashes` writes for the same keys. `rows` is (prefixes, topic_ids, uniq_keys, keys,
        offsets, timestamps, sys_flags, skip_mask, skip_value), as `IndexService.put_messages` takes them; with
        `spans`, uniq_keys and keys are a buffer and its value spans (`index_place_spans`).
        Returns (row, key, placed, status): the cursor where it stopped and why (PLACE_DONE, PLACE_FULL, or
        PLACE_PYTHON_KEY: the key at the cursor is not valid UTF-8 and is the Python path's). A slot or header on
        disk that breaks rules 2 to 4 is a CorruptionError, raised before anything is written."""
        self._check_writable()
        assert NATIVE is not None
        place = NATIVE.index_place_spans if spans else NATIVE.index_place
        row, key, placed, status, detail, detail2 = place(
            self._map, self.hash_slot_count, self.index_entry_count_max, *rows, row, key)
        if placed:
            self._read_header()  # the header the core wrote (checked as any header read)
            self._dirty = True
        if status == PLACE_BAD_SLOT:
            raise self._slot_corruption(detail, detail2)
        if status == PLACE_BAD_HEADER:
            self._read_header()  # raises the rule-2 or rule-3 CorruptionError of the header on disk
            raise CorruptionError(f"index header changed under its writer (rule {detail}) [rule 2]", path=self.path,
                                  offset=fmt.OFFSET_INDEX_COUNT, rule="indexfile.2")
        if status == PLACE_BAD_INPUT:
            raise MemoryError(f"index_place: no memory for the keys of {self.path}")
        return row, key, placed, status

    # --- reading -----------------------------------------------------------------------------------------
    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether [begin_ms, end_ms] overlaps the file's time range, with RocketMQ's formula."""
        first, last = self._begin_timestamp_ms, self._end_timestamp_ms
        return ((begin_ms < first and end_ms > last) or first <= begin_ms <= last or first <= end_ms <= last)

    def select(self, key_hash: int, begin_ms: int, end_ms: int, max_count: int, out: list[int]) -> list[int]:
        """Append to `out` the commitlog offsets of the entries with `key_hash` stored within [begin_ms,
        end_ms], newest first, until `out` holds `max_count` (RocketMQ's selectPhyOffset). Returns `out`.

        Like RocketMQ, the walk stops at the first entry older than `begin_ms`.
        """
        self._check_open()
        assert 0 <= key_hash < 2**31 and max_count >= 0
        count = self._index_count
        slot_count = self.hash_slot_count
        slot = key_hash % slot_count
        buf = self._buf
        number = fmt.SLOT_STRUCT.unpack_from(buf, fmt.slots_offset() + fmt.SLOT_SIZE_BYTES * slot)[0]
        if not 0 <= number < count:
            count = self._count_covering(slot, number)
        unpack = fmt.ENTRY_STRUCT.unpack_from
        entries_at = self._entries_at
        begin_timestamp_ms = self._begin_timestamp_ms
        for _step in range(count):  # bounded: rule (5) makes every link strictly smaller
            if number == fmt.INVALID_INDEX or len(out) >= max_count:
                break
            at = entries_at + fmt.ENTRY_SIZE_BYTES * number
            hash_read, phy_offset, time_diff, prev = unpack(buf, at)
            if time_diff < 0:
                raise CorruptionError(f"entry {number} has timeDiff {time_diff} [rule 6]", path=self.path,
                                      offset=at, rule="indexfile.6")
            if not 0 <= prev < number:
                raise CorruptionError(f"entry {number} links to entry {prev} [rule 5]", path=self.path,
                                      offset=at, rule="indexfile.5")
            if hash_read < 0 or hash_read % slot_count != slot:
                raise CorruptionError(f"entry {number}, in the chain of slot {slot}, has key hash {hash_read} "
                                      f"[rule 9]", path=self.path, offset=at, rule="indexfile.9")
            stored_ms = begin_timestamp_ms + time_diff * 1000
            if hash_read == key_hash and begin_ms <= stored_ms <= end_ms:
                out.append(phy_offset)
            if stored_ms < begin_ms:
                break
            number = prev
        return out

    def _count_covering(self, slot: int, number: int) -> int:
        """indexCount once it covers entry `number`, read in slot `slot`; CorruptionError (rule 4) when it does not.

        A read-only file another process writes can have a slot newer than the header last read: the header is
        read again (a few times, a writer stopped between its header and slot writes finishes meanwhile).
        """
        if self.read_only and number >= 0:
            for attempt in range(SLOT_NEWER_RETRIES):
                if attempt:
                    time.sleep(SLOT_NEWER_WAIT_S)
                self._read_header()
                if number < self._index_count:
                    return self._index_count
        raise self._slot_corruption(slot, number)

    def tail_count(self, commitlog_offset: int) -> int:
        """How many of the newest entries point at `commitlog_offset` (the keys already put for it)."""
        self._check_open()
        unpack = fmt.ENTRY_STRUCT.unpack_from
        found = 0
        number = self._index_count - 1
        while number >= 1:  # bounded by indexCount
            if unpack(self._buf, self._entries_at + fmt.ENTRY_SIZE_BYTES * number)[1] != commitlog_offset:
                break
            found += 1
            number -= 1
        return found

    def entries(self) -> np.ndarray:
        """A copy of the written entries 1..indexCount-1 (native byte order), for checks and tests."""
        self._check_open()
        return self._entries[1 : self._index_count].astype(
            [("key_hash", "i4"), ("phy_offset", "i8"), ("time_diff", "i4"), ("prev_index", "i4")])

    def check_tail(self) -> None:
        """Check rule (7) in O(1): the header agrees with the entries it counts; CorruptionError when not.

        Catches a file whose written part lost its end (zeroed or never written back) under a header that
        still counts it, and a put stopped between its header and slot writes. Damage that leaves the first
        and last entries and the last entry's slot intact (a hole in the middle) is not seen here.
        """
        self._check_open()
        count = self._index_count
        if count <= 1:
            if (self._begin_phy_offset, self._begin_timestamp_ms) != (self._end_phy_offset, self._end_timestamp_ms):
                raise CorruptionError(
                    f"an empty file's header has begin {self._begin_phy_offset}/{self._begin_timestamp_ms} ms and end "
                    f"{self._end_phy_offset}/{self._end_timestamp_ms} ms, not equal [rule 7]", path=self.path,
                    offset=fmt.OFFSET_BEGIN_TIMESTAMP, rule="indexfile.7")
            return
        unpack = fmt.ENTRY_STRUCT.unpack_from
        last_at = self._entries_at + fmt.ENTRY_SIZE_BYTES * (count - 1)
        key_hash, phy_offset, time_diff, prev = unpack(self._buf, last_at)
        first_phy = unpack(self._buf, self._entries_at + fmt.ENTRY_SIZE_BYTES)[1]
        slot = key_hash % self.hash_slot_count if key_hash >= 0 else None
        head = None if slot is None else int(self._slots[slot])
        problem = None
        if first_phy != self._begin_phy_offset:
            problem = f"entry 1 points at {first_phy}, the header's beginPhyOffset is {self._begin_phy_offset}"
        elif phy_offset != self._end_phy_offset:
            problem = f"entry {count - 1} points at {phy_offset}, the header's endPhyOffset is {self._end_phy_offset}"
        elif head != count - 1:
            problem = f"entry {count - 1} (keyHash {key_hash}) is not the head of its slot (which holds {head})"
        elif time_diff < 0 or not 0 <= prev < count - 1:
            problem = f"entry {count - 1} has timeDiff {time_diff}, prevIndex {prev}"
        elif prev and unpack(self._buf, self._entries_at + fmt.ENTRY_SIZE_BYTES * prev)[0] % self.hash_slot_count \
                != slot:
            problem = f"entry {count - 1} links to entry {prev} of another slot"
        if problem is not None:
            raise CorruptionError(f"{problem} [rule 7]", path=self.path, offset=last_at, rule="indexfile.7")

    def check(self) -> None:
        """Check rules (4) to (7) and (9) on every slot and every written entry at once; CorruptionError at the
        first break. `select` checks only what it reads; this is for `IndexService.check` and tests."""
        self.check_tail()
        count = self._index_count
        heads = self._slots.astype(np.int64)
        bad = np.flatnonzero((heads < 0) | (heads >= count))
        if bad.size:
            raise self._slot_corruption(int(bad[0]), int(heads[bad[0]]))
        written = self._entries[1:count]
        numbers = np.arange(1, count, dtype=np.int64)
        prev = written["prev_index"].astype(np.int64)
        time_diffs = written["time_diff"].astype(np.int64)
        for rule, broken in (("5", (prev < 0) | (prev >= numbers)), ("6", time_diffs < 0)):
            at = np.flatnonzero(broken)
            if at.size:
                number = int(at[0]) + 1
                raise CorruptionError(
                    f"entry {number}: prevIndex {int(prev[at[0]])}, timeDiff {int(time_diffs[at[0]])} [rule {rule}]",
                    path=self.path, offset=self._entries_at + fmt.ENTRY_SIZE_BYTES * number, rule=f"indexfile.{rule}")
        hashes = written["key_hash"].astype(np.int64)
        negative, linking, _linked_to, wrong_heads = self._rule_9_breaks(hashes, prev)
        broken = np.concatenate([negative, linking, wrong_heads])
        if broken.size:
            index = int(broken.min())
            number = index + 1
            raise CorruptionError(
                f"entry {number} (keyHash {int(hashes[index])}) is in the chain of another slot, or heads a slot its "
                f"hash is not in [rule 9]", path=self.path, offset=self._entries_at + fmt.ENTRY_SIZE_BYTES * number,
                rule="indexfile.9")

    # --- repair ------------------------------------------------------------------------------------------
    def truncate(self, commitlog_offset: int, commitlog_offset_min: int = 0) -> int:
        """Keep the longest prefix of valid entries pointing into [commitlog_offset_min, commitlog_offset);
        returns entries dropped.

        An entry stays iff it and every entry before it (a) points below `commitlog_offset` and at or past
        `commitlog_offset_min` (where the previous file ends), (b) points at or past the entry before it (log
        order), (c) keeps rules (5), (6) and (9) (checked against the links and the slot table on disk) and
        (d) is not all zeros; when an entry breaks (b), (c) or (d), the one before it goes too (damage may
        begin inside it without breaking a rule). So the cut also drops what a lost page left behind (zeroed
        or stale entries under a newer header); (d) may cut a real entry (keyHash 0 at offset 0), which, like
        the extra entry, costs only a re-dispatch. The slots are rebuilt from the kept entries (whose links
        all point lower, so they stay valid), the dropped entries are zeroed, the header comes last and is set
        from the kept entries whenever it disagrees with them (rule 7). A shortened file's end timestamp is
        rebuilt from the kept timeDiffs (second precision, where RocketMQ kept the exact ms). A file left
        without entries gets a zero header, like a file never written. Idempotent.
        """
        self._check_writable()
        count = self._index_count
        written = self._entries[1:count]
        phy_offsets = written["phy_offset"].astype(np.int64)
        prev = written["prev_index"].astype(np.int64)
        time_diffs = written["time_diff"].astype(np.int64)
        hashes = written["key_hash"].astype(np.int64)
        damaged = ((phy_offsets < commitlog_offset_min) | (prev < 0) | (prev >= np.arange(1, count))
                   | (time_diffs < 0) | ((hashes == 0) & (phy_offsets == 0) & (time_diffs == 0) & (prev == 0)))
        damaged[1:] |= phy_offsets[1:] < np.maximum.accumulate(phy_offsets)[:-1]
        self._mark_foreign_slots(hashes, prev, damaged)
        past = np.flatnonzero(damaged | (phy_offsets >= commitlog_offset))
        kept = int(past[0]) if past.size else count - 1
        if kept and past.size and damaged[kept]:
            kept -= 1  # the entry before damage may be damaged too, within the rules (a page or a zeroed tail
            # can start inside it): its phyOffset would resume dispatch off a record, its prevIndex cut a chain
        self.rebuild_slots(kept + 1)
        header_agrees = kept == 0 or (self._begin_phy_offset == int(phy_offsets[0])
                                      and self._end_phy_offset == int(phy_offsets[kept - 1]))
        if kept == count - 1 and header_agrees:
            return 0
        self._map[self._entries_at + fmt.ENTRY_SIZE_BYTES * (kept + 1) : self._entries_at
                  + fmt.ENTRY_SIZE_BYTES * count] = 0
        self.flush()
        if kept:
            self._begin_phy_offset = int(phy_offsets[0])
            self._end_phy_offset = int(phy_offsets[kept - 1])
            if self._begin_timestamp_ms > 0:
                self._end_timestamp_ms = self._begin_timestamp_ms + 1000 * int(time_diffs[:kept].max())
        else:
            self._begin_timestamp_ms = self._end_timestamp_ms = 0
            self._begin_phy_offset = self._end_phy_offset = 0
        self._put_count = kept
        self._index_count = kept + 1
        self._write_header()
        self._dirty = True
        self.flush()
        return count - 1 - kept

    def _rule_9_breaks(self, hashes: np.ndarray, prev: np.ndarray) -> tuple[np.ndarray, ...]:
        """Rule (9) over the written entries (their key hashes and prevIndex links) and the slot table on disk:
        (entries with a negative hash, entries linked to an entry of another slot, the entries they link to,
        entries a slot names as its head while their hash is in another slot), as indexes: entry i is at index
        i - 1. Links and heads out of range break rules (4) and (5), not this one, and are passed over."""
        count = len(hashes) + 1
        slots_of = hashes % self.hash_slot_count
        linked = np.flatnonzero((prev > 0) & (prev < np.arange(1, count)))
        targets = prev[linked] - 1
        foreign = slots_of[linked] != slots_of[targets]
        heads = self._slots.astype(np.int64)
        named = np.flatnonzero((heads > 0) & (heads < count))  # slot numbers
        wrong_heads = heads[named][slots_of[heads[named] - 1] != named] - 1
        return np.flatnonzero(hashes < 0), linked[foreign], targets[foreign], wrong_heads

    def _mark_foreign_slots(self, hashes: np.ndarray, prev: np.ndarray, damaged: np.ndarray) -> None:
        """Rule (9) before the slots are rebuilt from the hashes (which would make a damaged hash look right):
        the entries that break it are damaged, and so is the entry a foreign link points to, as either may be
        the damaged one. Entry i is at index i - 1 of the arrays."""
        for broken in self._rule_9_breaks(hashes, prev):
            damaged[broken] = True

    def rebuild_slots(self, index_count: int | None = None) -> None:
        """Recompute every slot from entries 1..index_count-1 (default: all written): each slot gets the
        newest entry of its hash. Heals a put interrupted between its header and slot writes."""
        self._check_writable()
        count = self._index_count if index_count is None else index_count
        assert 1 <= count <= self._index_count
        hashes = self._entries["key_hash"][1:count].astype(np.int64)
        heads = np.zeros(self.hash_slot_count, dtype=np.int32)
        np.maximum.at(heads, hashes % self.hash_slot_count, np.arange(1, count, dtype=np.int32))
        self._slots[:] = heads
        self._dirty = True

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        try:
            os.unlink(self.path)
        except OSError as exc:
            raise StoreIOError(f"cannot delete index file {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.entry_count}/{self.index_entry_count_max - 1} entries"
        return f"IndexFile({self.name}, {state}, phy {self._begin_phy_offset}..{self._end_phy_offset})"
