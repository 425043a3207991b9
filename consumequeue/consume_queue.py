"""ConsumeQueues: one per (topic, queue_id), each a run of fixed-size files of 20-byte units.

The unit layout and the file naming rule are in `consumequeue.format`. A queue keeps three positions, in
entries: `min_offset` (first entry still kept), `max_offset` (next entry to write) and `flushed_offset`.
"""

from __future__ import annotations

import logging
import os
import struct
import threading

import numpy as np
from mqstore.commitlog import native
from mqstore.commitlog.commitlog import TOPIC_PATTERN
from mqstore.commitlog.errors import CorruptionError, QueueGapError, StoreIOError
from mqstore.commitlog.mapped_file import MappedFile, fsync_directory
from mqstore.consumequeue import format as cqf

log = logging.getLogger(__name__)

UNIT = cqf.CONSUME_QUEUE_UNIT
INT64_MAX = (1 << 63) - 1


REFRESH_WINDOW_UNITS = 64  # a reader's refresh looks at this many entries past its end first
_SIZE_AT = 8  # the `size` field's position in a unit
_unit_size = struct.Struct(">i").unpack_from  # (size,) at a byte position: (buffer, unit position + _SIZE_AT)
assert cqf.CONSUME_QUEUE_UNIT.fields["size"] == (np.dtype(">i4"), _SIZE_AT)


class ConsumeQueue:
    """The entries of one (topic, queue_id)."""

    def __init__(self, directory: str, topic: str, queue_id: int, entries_per_file: int, *, writable: bool):
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_file = entries_per_file
        self.file_size_bytes = entries_per_file * cqf.UNIT_SIZE_BYTES
        self.writable = writable
        self.codec = native.NATIVE  # the compiled core, or None for the pure-Python reference (read_lists)
        self.files: list[MappedFile] = []
        self.units: list[np.ndarray] = []
        self.min_offset = 0
        self.max_offset = 0
        self.flushed_offset = 0
        self._followed_log_min = 0  # a reader: the log minimum its min_offset was last corrected for
        self.lock = threading.Lock()
        try:
            self._load()
        except BaseException:
            self.close()  # the files mapped before the bad one: their descriptors and mappings
            raise

    # --- loading -------------------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.directory) if cqf.parse_file_name(n) is not None)
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise StoreIOError(f"cannot list {self.directory}: {exc.strerror}") from exc
        expected = None
        for name in names:
            path = os.path.join(self.directory, name)
            byte_offset = cqf.parse_file_name(name)
            if byte_offset % self.file_size_bytes:
                raise CorruptionError(f"queue file offset {byte_offset} is not a multiple of the file size "
                                      f"{self.file_size_bytes}", path=path, rule="consumequeue.file-name")
            if expected is not None and byte_offset != expected:
                raise CorruptionError("queue files are not contiguous", path=path, rule="consumequeue.file-name")
            expected = byte_offset + self.file_size_bytes
            if not self.writable and name == names[-1] and os.path.getsize(path) == 0:
                break  # an empty last file: a reader racing a writer creating it
            mapped = MappedFile.open(path, byte_offset, self.file_size_bytes, writable=self.writable,
                                     format_name="consumequeue", keep_lock=True)
            self.files.append(mapped)
            self.units.append(mapped.array.view(np.ndarray).view(UNIT))
        if not self.files:
            return
        self.min_offset = self.files[0].base_offset // cqf.UNIT_SIZE_BYTES
        self.max_offset = self.min_offset
        for index, units in enumerate(self.units):
            written = cqf.written_count(units, self.files[index].path)
            fillers = cqf.leading_fillers(units[:written]) if index == 0 else 0
            self.min_offset += fillers
            _check_units(units[fillers:written], self.files[index].path, fillers)
            self.max_offset = self.files[index].base_offset // cqf.UNIT_SIZE_BYTES + written
            if written < self.entries_per_file:
                if index != len(self.units) - 1:
                    raise CorruptionError(f"queue file ends after {written} entries but is not the last",
                                          path=self.files[index].path, offset=written * cqf.UNIT_SIZE_BYTES,
                                          rule="consumequeue.1")
                break
        self._check_order_across_files()
        self.flushed_offset = self.max_offset

    def _check_order_across_files(self) -> None:
        previous = None
        for index, units in enumerate(self.units):
            start = self.files[index].base_offset // cqf.UNIT_SIZE_BYTES
            count = min(self.entries_per_file, self.max_offset - start)
            if count <= 0:
                break
            first = int(units[0]["commitlog_offset"])
            if previous is not None and first <= previous:
                raise CorruptionError("commitlog offsets go backwards between queue files",
                                      path=self.files[index].path, offset=0, rule="consumequeue.3")
            previous = int(units[count - 1]["commitlog_offset"])

    def refresh(self, *, list_files: bool = False) -> None:
        """For a reader of a store another process writes: pick up the entries written since, and the files. When
        the last file this reader holds is full (a new file can only follow a full one), the next file is mapped by
        its name. The directory is listed only when the reader has no file, or `list_files` says so: listing drops
        the files the writer's retention deleted (`min_offset` moves to the first file left) and maps the new ones.
        `follow_log_min` asks for it whenever the log's minimum moves."""
        if self.writable:
            return
        with self.lock:
            self._count_new_entries()
            files = self.files  # (the end of the last file inline: a reader refreshes on every get)
            if list_files or not files:
                self._list_files()
                self._count_new_entries()
                self._skip_fillers()
            while self.files and self.max_offset >= (self.files[-1].base_offset // cqf.UNIT_SIZE_BYTES
                                                     + self.entries_per_file) and self._map_next_file():
                self._count_new_entries()

    def _map_next_file(self) -> bool:
        """Map the file after the last one held, found by its name: os.listdir lets go of the interpreter lock at
        every entry, and a thread that lets go waits for a busy producer's switch interval each time (the timer
        service's batches waited 5-60 ms at each roll of its queue). False when it is not there yet."""
        byte_offset = self.files[-1].base_offset + self.file_size_bytes
        path = os.path.join(self.directory, cqf.file_name(byte_offset // cqf.UNIT_SIZE_BYTES))
        try:
            mapped = MappedFile.open(path, byte_offset, self.file_size_bytes, writable=False,
                                     format_name="consumequeue", keep_lock=True)
        except CorruptionError:
            return False  # being created by the writer right now
        except StoreIOError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return False  # the writer has not rolled yet (it may have since: the next refresh maps it)
            raise
        self.files.append(mapped)
        self.units.append(mapped.array.view(np.ndarray).view(UNIT))
        return True

    def _skip_fillers(self) -> None:
        """A reader that just mapped a queue's first file: `min_offset` past the fillers at its start."""
        if not self.files or self.min_offset != self.files[0].base_offset // cqf.UNIT_SIZE_BYTES:
            return
        units = self.units[0]
        if int(units[0]["size"]) == cqf.FILLER_SIZE:
            self.min_offset += cqf.leading_fillers(units[: self.max_offset - self.min_offset])

    def _end_of_last_file(self) -> int:
        return self.files[-1].base_offset // cqf.UNIT_SIZE_BYTES + self.entries_per_file

    def _list_files(self) -> None:
        found = sorted((offset, name) for name in os.listdir(self.directory)
                       if (offset := cqf.parse_file_name(name)) is not None)
        if not found:
            return
        first_on_disk = found[0][0]
        while self.files and self.files[0].base_offset < first_on_disk:  # deleted by retention
            self.units.pop(0)
            self.files.pop(0).close()
        if not self.files:  # everything this reader held is gone: start again at the writer's first file
            self.min_offset = self.max_offset = max(self.max_offset, first_on_disk // cqf.UNIT_SIZE_BYTES)
        else:
            self.min_offset = max(self.min_offset, self.files[0].base_offset // cqf.UNIT_SIZE_BYTES)
        for byte_offset, name in found:
            if self.files and byte_offset <= self.files[-1].base_offset:
                continue
            if self.files and byte_offset != self.files[-1].base_offset + self.file_size_bytes:
                break  # a gap: not contiguous yet (or damage, which reads report)
            if not self.files and byte_offset // cqf.UNIT_SIZE_BYTES > self.max_offset:
                self.min_offset = self.max_offset = byte_offset // cqf.UNIT_SIZE_BYTES
            path = os.path.join(self.directory, name)
            try:
                mapped = MappedFile.open(path, byte_offset, self.file_size_bytes, writable=False,
                                         format_name="consumequeue", keep_lock=True)
            except CorruptionError:
                break  # being created by the writer right now
            except StoreIOError:
                if os.path.exists(path):
                    raise
                break  # deleted by retention since the listing
            self.files.append(mapped)
            self.units.append(mapped.array.view(np.ndarray).view(UNIT))

    def _count_new_entries(self) -> None:
        """Count the entries written past `max_offset`, a window at a time, the window doubling while it is all
        written: the cost follows what the writer added, not what is left of the file."""
        files = self.files
        if files:  # _locate inline: a reader that has caught up asks on every get, and one size answers it
            index, position = divmod(self.max_offset - files[0].base_offset // cqf.UNIT_SIZE_BYTES,
                                     self.entries_per_file)
            if index < len(files) and _unit_size(files[index].view, position * cqf.UNIT_SIZE_BYTES + _SIZE_AT)[0] == 0:
                return  # nothing new
        if self.codec is not None:  # compiled: keeps the interpreter lock (queue_written's doc says why)
            while True:
                index, position = self._locate(self.max_offset)
                if index >= len(self.units):
                    return
                left = len(self.units[index]) - position  # a short file: what it has, as the slices below
                if left <= 0:
                    return
                written = self.codec.queue_written(self.files[index].view, position, left)
                self.max_offset += written
                if written < left:  # at a free unit; a negative size is damage, reported as written_count does
                    cqf.written_count(self.units[index][position + written:position + written + 1],
                                      self.files[index].path, position + written)
                    return
        window = REFRESH_WINDOW_UNITS
        while True:
            index, position = self._locate(self.max_offset)
            if index >= len(self.units):
                return
            units = self.units[index][position : position + window]
            written = cqf.written_count(units, self.files[index].path, position)
            self.max_offset += written
            if written < len(units):
                return
            window = min(window * 2, self.entries_per_file)

    # --- positions -----------------------------------------------------------------------------------------
    def _locate(self, queue_offset: int) -> tuple[int, int]:
        first = self.files[0].base_offset // cqf.UNIT_SIZE_BYTES if self.files else 0
        return divmod(queue_offset - first, self.entries_per_file)

    def last_commitlog_end(self) -> int:
        """The commitlog offset just past the message of the last entry (0 for an empty queue)."""
        if self.max_offset <= self.min_offset:
            return 0
        unit = self.read(self.max_offset - 1, 1)[0]
        return int(unit["commitlog_offset"]) + int(unit["size"])

    # --- writing -------------------------------------------------------------------------------------------
    def put(self, first_queue_offset: int, units: np.ndarray) -> int:
        """Write units for entries first_queue_offset.. (consecutive); entries already present are skipped.

        Returns how many units were written. A first offset past `max_offset` would leave a hole: that is
        refused with CorruptionError (the queue lost entries the log still has: rebuild it).
        """
        assert self.writable
        assert units.dtype == UNIT
        with self.lock:
            skip = self._entries_present(first_queue_offset)
            if skip >= len(units):
                return 0
            if skip:
                units = units[skip:]
            written = 0
            while written < len(units):
                index, position = self._locate(self.max_offset)
                if index == len(self.files):
                    self._create_file(self.max_offset)
                count = min(len(units) - written, self.entries_per_file - position)
                self.units[index][position : position + count] = units[written : written + count]
                written += count
                self.max_offset += count
            return written

    def put_lists(self, first_queue_offset: int, commitlog_offsets: list[int], sizes: list[int],
                  tags_codes: list[int]) -> int:
        """`put` of units given as three lists of ints, each packed in place: for a few units, where building
        a unit array costs more than the writes (the tail of the log at SYNC rates: about one unit per queue
        a batch)."""
        assert self.writable
        with self.lock:
            skip = self._entries_present(first_queue_offset)
            pack_into, unit_size = cqf.UNIT_STRUCT.pack_into, cqf.UNIT_SIZE_BYTES
            for row in range(skip, len(commitlog_offsets)):
                index, position = self._locate(self.max_offset)
                if index == len(self.files):
                    self._create_file(self.max_offset)
                pack_into(self.files[index].view, position * unit_size, commitlog_offsets[row], sizes[row],
                          tags_codes[row])
                self.max_offset += 1
            return max(len(commitlog_offsets) - skip, 0)

    def _entries_present(self, first_queue_offset: int) -> int:
        """How many entries from `first_queue_offset` on the queue holds already; QueueGapError when it ends
        before `first_queue_offset`. Under the lock."""
        skip = self.max_offset - first_queue_offset
        if skip < 0:
            raise QueueGapError(
                f"queue {self.topic}/{self.queue_id} ends at entry {self.max_offset} but the log continues "
                f"it at entry {first_queue_offset}", path=self.directory, rule="consumequeue.dense",
                continues_at=first_queue_offset)
        return skip

    def start_at(self, first_queue_offset: int) -> None:
        """Make an empty queue start at entry `first_queue_offset`: the file holding it is made, with filler units
        before it (consumequeue/format.py). For a queue built from a log whose first segments are deleted."""
        assert self.writable
        with self.lock:
            if self.files:
                raise QueueGapError(f"queue {self.topic}/{self.queue_id} is not empty", path=self.directory,
                                    rule="consumequeue.dense")
            file_first = first_queue_offset - first_queue_offset % self.entries_per_file
            self._create_file(file_first)
            count = first_queue_offset - file_first
            self.units[0][:count] = cqf.filler_units(count)
            self.flushed_offset = file_first  # the next flush writes the fillers too
            self.min_offset = self.max_offset = first_queue_offset

    def _create_file(self, first_queue_offset: int) -> None:
        if not self.files:
            os.makedirs(self.directory, exist_ok=True)
            self.min_offset = first_queue_offset
        byte_offset = first_queue_offset * cqf.UNIT_SIZE_BYTES
        assert byte_offset % self.file_size_bytes == 0
        path = os.path.join(self.directory, cqf.file_name(first_queue_offset))
        mapped = MappedFile.create(path, byte_offset, self.file_size_bytes)
        self.files.append(mapped)
        self.units.append(mapped.array.view(np.ndarray).view(UNIT))

    def _entries_ending_by(self, commitlog_end: int) -> int:
        """The queue offset of the first entry whose message does not end by `commitlog_end` (max_offset when
        all do). Entries hold increasing offsets, so the others are a tail of the queue. Under the lock."""
        keep = self.max_offset
        while keep > self.min_offset:
            index, position = self._locate(keep - 1)
            file_first = keep - 1 - position  # queue offset of this file's first unit
            start = max(self.min_offset, file_first)
            units = self.units[index][start - file_first : keep - file_first]
            ends = units["commitlog_offset"].astype(np.int64) + units["size"].astype(np.int64)
            inside = int(np.searchsorted(ends, commitlog_end, side="right"))  # units ending by the cut
            keep = start + inside
            if inside:
                break
        return keep

    def offsets_past(self, commitlog_end: int) -> np.ndarray:
        """The commitlog offsets of the entries `truncate_past(commitlog_end)` would drop (oldest first)."""
        with self.lock:
            keep = self._entries_ending_by(commitlog_end)
        return self.read(keep, self.max_offset - keep)["commitlog_offset"] if keep < self.max_offset \
            else np.empty(0, dtype=np.int64)

    def truncate_past(self, commitlog_end: int) -> int:
        """Drop the entries whose message does not end by `commitlog_end` (the log was cut there); returns how
        many were dropped."""
        assert self.writable
        with self.lock:
            keep = self._entries_ending_by(commitlog_end)
            dropped = self.max_offset - keep
            if dropped:
                offset = keep
                while offset < self.max_offset:
                    index, position = self._locate(offset)
                    count = min(self.max_offset - offset, self.entries_per_file - position)
                    self.units[index][position : position + count] = np.zeros(count, dtype=UNIT)
                    self.files[index].flush(position * cqf.UNIT_SIZE_BYTES, (position + count) * cqf.UNIT_SIZE_BYTES)
                    offset += count
                # Files that now begin past the last entry kept hold nothing: delete them (a reopen refuses a
                # file that is not full before the last one).
                removed = False
                while len(self.files) > 1 and self.files[-1].base_offset // cqf.UNIT_SIZE_BYTES > keep:
                    self.units.pop()
                    self.files.pop().delete()
                    removed = True
                if removed:
                    fsync_directory(self.directory)
                self.max_offset = keep
                self.flushed_offset = min(self.flushed_offset, keep)
            return dropped

    def delete_files_below(self, commitlog_min: int) -> int:
        """Retention: delete the files whose every entry points below `commitlog_min` (the last file stays),
        then move `min_offset` to the first entry at or above it. Returns how many files were deleted."""
        assert self.writable
        removed = 0
        with self.lock:
            while len(self.files) > 1:
                last_unit = self.units[0][self.entries_per_file - 1]
                if int(last_unit["commitlog_offset"]) >= commitlog_min:
                    break
                self.units.pop(0)
                self.files.pop(0).delete()
                removed += 1
            self._correct_min_offset(commitlog_min)
        return removed

    def follow_log_min(self, commitlog_min: int) -> None:
        """A reader: once each time the log's minimum moves, list the files again (retention deleted some) and
        `correct_min_offset` (the writer corrects its queues at open and at retention; a reader does when it sees
        the minimum it follows move)."""
        if commitlog_min > self._followed_log_min:
            self._followed_log_min = commitlog_min
            self.refresh(list_files=True)  # retention may have deleted files: let go of them
            self.correct_min_offset(commitlog_min)

    def correct_min_offset(self, commitlog_min: int) -> None:
        """Move `min_offset` past entries pointing below the log's minimum (RocketMQ's correctMinOffset)."""
        with self.lock:
            self._correct_min_offset(commitlog_min)

    def _correct_min_offset(self, commitlog_min: int) -> None:
        if not self.files:
            return
        first = self.files[0].base_offset // cqf.UNIT_SIZE_BYTES
        self.min_offset = max(self.min_offset, first)
        count = min(self.entries_per_file, self.max_offset - first)
        if count <= 0:
            self.min_offset = max(self.min_offset, self.max_offset)
            return
        offsets = self.units[0][:count]["commitlog_offset"]
        self.min_offset = max(self.min_offset, first + int(np.searchsorted(offsets, commitlog_min, side="left")))

    def flush(self) -> None:
        """Write the entries written since the last flush to disk (fdatasync of their files)."""
        with self.lock:
            target = self.max_offset
            offset = self.flushed_offset
            while offset < target:
                index, position = self._locate(offset)
                count = min(target - offset, self.entries_per_file - position)
                self.files[index].flush(position * cqf.UNIT_SIZE_BYTES, (position + count) * cqf.UNIT_SIZE_BYTES)
                offset += count
            self.flushed_offset = target

    # --- reading -------------------------------------------------------------------------------------------
    def read(self, queue_offset: int, count: int) -> np.ndarray:
        """A copy of the units [queue_offset, queue_offset + count) that exist, checked."""
        start = max(queue_offset, self.min_offset)
        stop = min(queue_offset + count, self.max_offset)
        if stop <= start:
            return np.empty(0, dtype=UNIT)
        parts = []
        offset = start
        while offset < stop:
            index, position = self._locate(offset)
            take = min(stop - offset, self.entries_per_file - position)
            parts.append(self.units[index][position : position + take])
            offset += take
        result = parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
        if len(result) and (result["size"].min() <= 0 or result["commitlog_offset"].min() < 0):
            bad = int(np.argmax((result["size"] <= 0) | (result["commitlog_offset"] < 0)))
            index, position = self._locate(start + bad)
            raise CorruptionError(f"queue entry {start + bad} is not a valid unit", path=self.files[index].path,
                                  offset=position * cqf.UNIT_SIZE_BYTES, rule="consumequeue.1")
        return result

    def read_arrays(self, queue_offset: int, offsets_out: np.ndarray, sizes_out: np.ndarray) -> tuple[int, int, int]:
        """The commitlog offsets and sizes of the units from `queue_offset` that exist, up to len(offsets_out), into
        offsets_out and sizes_out (int64): (how many, least offset, greatest offset), (0, 0, -1) for none. For a
        service that reads a queue in bulk (the timer's enqueue): compiled, nothing is allocated per unit and the
        interpreter lock is kept (commitlog/csrc/timer_link.c says why). `queue_offset` must be at least
        min_offset; a unit that is not valid raises CorruptionError, as `read` reports it."""
        stop = min(queue_offset + len(offsets_out), self.max_offset)
        if stop <= queue_offset:
            return 0, 0, -1
        count = stop - queue_offset
        if self.codec is None:
            units = self.read(queue_offset, count)
            offsets_out[:count], sizes_out[:count] = units["commitlog_offset"], units["size"]
            return count, int(offsets_out[:count].min()), int(offsets_out[:count].max())
        low, high, at = INT64_MAX, -1, 0
        while at < count:
            index, position = self._locate(queue_offset + at)
            take = min(count - at, self.entries_per_file - position)
            span = self.codec.queue_arrays(self.files[index].view, position, take, offsets_out, sizes_out, at)
            if span is None:
                self.read(queue_offset, count)  # raises with the file and the position of the bad unit
                raise CorruptionError(f"queue entries from {queue_offset} changed while read", path=self.directory)
            low, high, at = min(low, span[0]), max(high, span[1]), at + take
        return count, low, high

    def read_lists(self, queue_offset: int, count: int) -> tuple[list[int], list[int], int, int]:
        """The commitlog offsets and sizes of the units [queue_offset, queue_offset + count) that exist, as lists
        (the get path: a few entries, wanted as Python ints), with the least and the greatest offset (0 and -1
        when there are none). `queue_offset` must be at least min_offset. A unit that is not valid raises
        CorruptionError, as `read` reports it."""
        stop = min(queue_offset + count, self.max_offset)
        if stop <= queue_offset:
            return [], [], 0, -1
        files = self.files  # stop > queue_offset >= min_offset: there is a file; _locate inline (every get)
        index, position = divmod(queue_offset - files[0].base_offset // cqf.UNIT_SIZE_BYTES, self.entries_per_file)
        take = min(stop - queue_offset, self.entries_per_file - position)
        if take < stop - queue_offset:  # the range crosses into the next file: rare, take the general path
            units = self.read(queue_offset, count)
            offsets = units["commitlog_offset"].tolist()
            return offsets, units["size"].tolist(), min(offsets), max(offsets)
        if self.codec is not None:
            lists = self.codec.queue_lists(files[index].view, position, take)
            if lists is not None:
                return lists
        else:
            units = self.units[index][position : position + take]
            offsets = units["commitlog_offset"].tolist()
            sizes = units["size"].tolist()
            if min(sizes) > 0 and min(offsets) >= 0:
                return offsets, sizes, min(offsets), max(offsets)
        self.read(queue_offset, count)  # raises with the file and the position of the bad unit
        raise CorruptionError(f"queue entries from {queue_offset} changed while read", path=self.directory)

    def close(self) -> None:
        with self.lock:
            self.units = []  # first: views of the files' mappings
            for mapped in self.files:
                mapped.close()
            self.files = []


def _check_units(units: np.ndarray, path: str, first_index: int) -> None:
    """Rules (2) and (3) for a run of written units read from disk."""
    if not len(units):
        return
    offsets = units["commitlog_offset"]
    if offsets.min() < 0:
        bad = int(np.argmax(offsets < 0))
        raise CorruptionError("negative commitlog offset in a queue entry", path=path,
                              offset=(first_index + bad) * cqf.UNIT_SIZE_BYTES, rule="consumequeue.2")
    if len(units) > 1:
        steps = np.diff(offsets.astype(np.int64))
        if steps.min() <= 0:
            bad = int(np.argmax(steps <= 0)) + 1
            raise CorruptionError("commitlog offsets do not increase", path=path,
                                  offset=(first_index + bad) * cqf.UNIT_SIZE_BYTES, rule="consumequeue.3")


class ConsumeQueueTable:
    """Every ConsumeQueue of a store, by (topic, queue_id), under `<root>/consumequeue`."""

    def __init__(self, directory: str, entries_per_file: int, *, writable: bool):
        self.directory = directory
        self.entries_per_file = entries_per_file
        self.writable = writable
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        self.corrupt: dict[tuple[str, int], CorruptionError] = {}  # writable only: queues that failed to load
        self.dispatched_timestamp_ms = 0  # store time of the newest message given an entry (set by the dispatcher)
        self.flushed_timestamp_ms = 0  # the same, for entries known to be on disk
        self.flush_count = 0
        try:
            self.load()
        except BaseException:
            self.close()  # the queues loaded before the bad one
            raise

    def load(self) -> None:
        """Open every queue directory not opened yet (readers call it again to find new queues)."""
        try:
            topics = os.listdir(self.directory)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreIOError(f"cannot list {self.directory}: {exc.strerror}") from exc
        for topic in topics:
            if not TOPIC_PATTERN.fullmatch(topic):
                log.warning("ignoring %s: not a valid topic name", os.path.join(self.directory, topic))
                continue
            topic_dir = os.path.join(self.directory, topic)
            if not os.path.isdir(topic_dir):
                continue
            for name in os.listdir(topic_dir):
                if not name.isdigit() or not name.isascii() or len(name) > 9:
                    continue
                key = (topic, int(name))
                if key not in self.queues and key not in self.corrupt:
                    try:
                        queue = ConsumeQueue(os.path.join(topic_dir, name), topic, int(name), self.entries_per_file,
                                             writable=self.writable)
                    except CorruptionError as exc:
                        if not self.writable:
                            raise
                        self.corrupt[key] = exc.with_traceback(None)  # the owner rebuilds it from the log
                        continue
                    with self._lock:
                        self.queues.setdefault(key, queue)

    def remove(self, topic: str, queue_id: int) -> None:
        """Delete one queue's files (to rebuild it from the CommitLog)."""
        queue = self.queues.pop((topic, queue_id), None)
        if queue is not None:
            queue.close()
        self.corrupt.pop((topic, queue_id), None)
        directory = os.path.join(self.directory, topic, str(queue_id))
        try:
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            fsync_directory(directory)  # the rebuilt queue's files must not meet the old ones after a crash
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreIOError(f"cannot remove {directory}: {exc.strerror}") from exc

    def key_of(self, directory: str | None) -> tuple[str, int] | None:
        """The (topic, queue_id) whose directory is `directory` (a queue of the table, or one about to join it),
        or None."""
        for key, queue in list(self.queues.items()):
            if queue.directory == directory:
                return key
        if directory is None or os.path.dirname(os.path.dirname(directory)) != self.directory:
            return None
        topic, queue_id = os.path.basename(os.path.dirname(directory)), os.path.basename(directory)
        return (topic, int(queue_id)) if queue_id.isdigit() else None

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            assert self.writable
            queue = ConsumeQueue(os.path.join(self.directory, topic, str(queue_id)), topic, queue_id,
                                 self.entries_per_file, writable=True)
            with self._lock:
                queue = self.queues.setdefault(key, queue)
        return queue

    def put(self, topic: str, queue_id: int, first_queue_offset: int, units: np.ndarray) -> int:
        """Write units to a queue (ConsumeQueue.put). A new queue joins the table only once it holds its first
        entries, so readers never see a queue that exists but is still empty."""
        queue = self.queues.get((topic, queue_id))
        if queue is not None:
            return queue.put(first_queue_offset, units)
        return self._put_new(topic, queue_id, ConsumeQueue.put, first_queue_offset, units)

    def put_lists(self, topic: str, queue_id: int, first_queue_offset: int, commitlog_offsets: list[int],
                  sizes: list[int], tags_codes: list[int]) -> int:
        """`put` of units given as three lists (ConsumeQueue.put_lists)."""
        queue = self.queues.get((topic, queue_id))
        if queue is not None:
            return queue.put_lists(first_queue_offset, commitlog_offsets, sizes, tags_codes)
        return self._put_new(topic, queue_id, ConsumeQueue.put_lists, first_queue_offset, commitlog_offsets, sizes,
                             tags_codes)

    def _put_new(self, topic: str, queue_id: int, put, *args) -> int:
        assert self.writable
        queue = ConsumeQueue(os.path.join(self.directory, topic, str(queue_id)), topic, queue_id,
                             self.entries_per_file, writable=True)
        written = put(queue, *args)
        with self._lock:
            self.queues.setdefault((topic, queue_id), queue)
        return written

    def topics(self) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for topic, queue_id in list(self.queues):
            result.setdefault(topic, []).append(queue_id)
        return {topic: sorted(ids) for topic, ids in sorted(result.items())}

    def max_commitlog_end(self) -> int:
        """The largest commitlog offset any queue has dispatched up to (0 when all are empty)."""
        return max((q.last_commitlog_end() for q in list(self.queues.values())), default=0)

    def dirty_bytes(self) -> int:
        """Bytes of entries written but not flushed, over every queue (the Flushable protocol)."""
        return sum(q.max_offset - q.flushed_offset for q in list(self.queues.values())) * cqf.UNIT_SIZE_BYTES

    def flush(self) -> int:
        """Flush every queue; returns how many flushes this table has done (the Flushable protocol)."""
        timestamp = self.dispatched_timestamp_ms
        for queue in list(self.queues.values()):
            queue.flush()
        self.flushed_timestamp_ms = max(self.flushed_timestamp_ms, timestamp)
        self.flush_count += 1
        return self.flush_count

    def close(self) -> None:
        for queue in list(self.queues.values()):
            queue.close()
        self.queues = {}
