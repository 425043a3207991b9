"""The timer's three files: the TimerLog (appended units), the wheel (slots, mapped) and the checkpoint.

Layouts and validity rules: mqstore/timer/format.py. The TimerLog is written and read with pwrite/pread, not
mapped, and the wheel is one fixed-size mapping: the memory they hold does not grow with the number of pending
timers (only the kernel's page cache does).
"""

from __future__ import annotations

import os
import time

import numpy as np

from mqstore.commitlog import native
from mqstore.commitlog.errors import StoreIOError
from mqstore.timer import format as tfmt

SCAN_CHUNK_UNITS = 8192  # units read at once when the TimerLog's end is looked for
CHAIN_UNITS_MAX_READ = 4096  # units read at once when a slot's list is walked


def _file_of(position: int, file_size: int) -> int:
    return position - position % file_size


class TimerLog:
    """The TimerLog files under `directory`: `append(units)` places units (positions returned), `unit_at` reads."""

    def __init__(self, directory: str, file_size_bytes: int, end_hint: int):
        assert file_size_bytes >= tfmt.UNIT_SIZE_BYTES + tfmt.BLANK_SIZE_BYTES
        self.directory = directory
        self.file_size = file_size_bytes
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        # A unit read while a slot is delivered: with the compiled core without letting go of the interpreter lock
        # (commitlog/csrc/timer_link.c says why), else os.pread.
        self._pread = os.pread if native.NATIVE is None else native.NATIVE.pread_keep_lock
        os.makedirs(directory, exist_ok=True)
        bases = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
        self.min_position = bases[0] if bases else 0
        self.end = self._find_end(max(end_hint, self.min_position), bases)

    def _fd(self, base: int, create: bool = False) -> int:
        fd = self._fds.get(base)
        if fd is None:
            path = os.path.join(self.directory, tfmt.timer_log_file_name(base))
            try:
                fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
                if create and os.fstat(fd).st_size < self.file_size:
                    os.ftruncate(fd, self.file_size)
            except OSError as exc:
                raise StoreIOError(f"cannot open the TimerLog file {path}: {exc.strerror}") from exc
            self._fds[base] = fd
        return fd

    def _find_end(self, start: int, bases: list[int]) -> int:
        """The end of the written units from `start` (the checkpoint's end): past every whole valid unit and
        blank after it (units written after the last checkpoint are kept; the wheel may link them)."""
        if not bases:
            return 0
        position = start
        while _file_of(position, self.file_size) in bases:
            base = _file_of(position, self.file_size)
            data = os.pread(self._fd(base), SCAN_CHUNK_UNITS * tfmt.UNIT_SIZE_BYTES, position - base)
            at = 0
            while at + tfmt.BLANK_SIZE_BYTES <= len(data):
                size = int.from_bytes(data[at:at + 4], "big", signed=True)
                magic = int.from_bytes(data[at + 12:at + 16], "big", signed=True)
                if magic == tfmt.BLANK_MAGIC and size == self.file_size - (position + at - base):
                    return self._find_end(base + self.file_size, bases) if base + self.file_size in bases \
                        else base + self.file_size
                if size != tfmt.UNIT_SIZE_BYTES or not tfmt.magic_valid(magic) or at + size > len(data):
                    return position + at
                at += size
            if at == 0:
                return position
            position += at
        return position

    def append(self, units: np.ndarray) -> np.ndarray:
        """Write `units` at `positions_for(len(units))` (the caller set their prev_position from those); a file
        the units leave gets its blank first. Returns the positions."""
        positions = self.positions_for(len(units))
        data = units.tobytes()
        cursor, start = self.end, 0
        while start < len(units):
            base = _file_of(int(positions[start]), self.file_size)
            stop = start + int(np.searchsorted(positions[start:], base + self.file_size))
            if _file_of(cursor, self.file_size) != base:
                self._write_blank(cursor)
            os.pwrite(self._fd(base, create=True), data[start * tfmt.UNIT_SIZE_BYTES:stop * tfmt.UNIT_SIZE_BYTES],
                      int(positions[start]) - base)
            self._dirty.add(base)
            cursor = int(positions[stop - 1]) + tfmt.UNIT_SIZE_BYTES
            start = stop
        self.end = cursor
        return positions

    def _write_blank(self, position: int) -> None:
        base = _file_of(position, self.file_size)
        fd = self._fd(base, create=True)
        os.pwrite(fd, tfmt.blank_bytes(base + self.file_size - position), position - base)
        self._dirty.add(base)

    def _runs(self, count: int) -> list[tuple[int, int]]:
        """Where the next `count` units go, as runs (first position, units) in one file each: after the end, each
        file keeping room for a blank of at least 16 bytes (timer_link.c's unit_positions follows this rule)."""
        unit, size = tfmt.UNIT_SIZE_BYTES, self.file_size
        per_file = (size - tfmt.BLANK_SIZE_BYTES) // unit
        runs, position = [], self.end
        while count > 0:
            base = _file_of(position, size)
            room = max(0, (base + size - tfmt.BLANK_SIZE_BYTES - position) // unit)
            if room == 0:
                position = base + size
                room = per_file
            take = min(room, count)
            runs.append((position, take))
            count -= take
            position += take * unit
        return runs

    def positions_for(self, count: int) -> np.ndarray:
        """Where the next `count` units go (_runs), one position per unit."""
        positions = np.empty(count, dtype=np.int64)
        done = 0
        for position, take in self._runs(count):
            positions[done:done + take] = position + tfmt.UNIT_SIZE_BYTES * np.arange(take, dtype=np.int64)
            done += take
        return positions

    def append_encoded(self, data, count: int, write) -> int:
        """`append` for `count` units already encoded in `data` (their prev_position set from positions_for's
        positions), written with `write(fd, data, offset)` (the compiled core's pwrite_keep_lock, which keeps the
        interpreter lock); returns the new end. The files and blanks are those `append` writes."""
        unit = tfmt.UNIT_SIZE_BYTES
        cursor, done = self.end, 0
        view = memoryview(data)
        for position, take in self._runs(count):
            base = _file_of(position, self.file_size)
            if _file_of(cursor, self.file_size) != base:
                self._write_blank(cursor)
            write(self._fd(base, create=True), view[done * unit:(done + take) * unit], position - base)
            self._dirty.add(base)
            cursor = position + take * unit
            done += take
        self.end = cursor
        return cursor

    def read_unit(self, position: int) -> np.void:
        """The unit at `position`, checked (rules 1-3)."""
        base = _file_of(position, self.file_size)
        if (position < self.min_position or position + tfmt.UNIT_SIZE_BYTES > self.end
                or position - base + tfmt.UNIT_SIZE_BYTES > self.file_size):
            raise tfmt.damage(self.directory, position, "1", "a TimerLog position outside the log")
        try:
            data = self._pread(self._fd(base), tfmt.UNIT_SIZE_BYTES, position - base)
        except StoreIOError as exc:
            raise tfmt.damage(self.directory, position, "1", "the TimerLog file is missing") from exc
        unit = np.frombuffer(data, dtype=tfmt.TIMER_LOG_UNIT)[0] if len(data) == tfmt.UNIT_SIZE_BYTES else None
        if unit is None or unit["size"] != tfmt.UNIT_SIZE_BYTES or not tfmt.magic_valid(int(unit["magic"])):
            raise tfmt.damage(self.directory, position, "2", "not a TimerLog unit")
        if unit["commitlog_offset"] < 0 or unit["message_size"] <= 0:
            raise tfmt.damage(self.directory, position, "3", "a unit's message position is negative")
        return unit

    def flush(self) -> None:
        """fdatasync the files written since the last flush (called from the flush thread while units are
        appended: a file written after the swap is flushed next time)."""
        dirty, self._dirty = self._dirty, set()
        for base in sorted(dirty):
            os.fdatasync(self._fds[base])

    def all_units(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, units) of every unit from min_position to the end, file by file (recovery's scan)."""
        per_file = (self.file_size - tfmt.BLANK_SIZE_BYTES) // tfmt.UNIT_SIZE_BYTES
        positions, units = [], []
        base = _file_of(self.min_position, self.file_size)
        while base < self.end:
            count = min(per_file, (self.end - base) // tfmt.UNIT_SIZE_BYTES)
            data = os.pread(self._fd(base), count * tfmt.UNIT_SIZE_BYTES, 0)
            count = len(data) // tfmt.UNIT_SIZE_BYTES
            units.append(np.frombuffer(data[:count * tfmt.UNIT_SIZE_BYTES], dtype=tfmt.TIMER_LOG_UNIT))
            positions.append(base + tfmt.UNIT_SIZE_BYTES * np.arange(count, dtype=np.int64))
            base += self.file_size
        if not units:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=tfmt.TIMER_LOG_UNIT)
        return np.concatenate(positions), np.concatenate(units)

    def delete_files_below(self, position: int) -> int:
        """Remove the files wholly below `position` (every slot that linked them has been delivered)."""
        removed = 0
        for base in sorted(int(name) for name in os.listdir(self.directory) if name.isdigit()):
            if base + self.file_size > position or base + self.file_size > _file_of(self.end, self.file_size):
                break
            fd = self._fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            os.remove(os.path.join(self.directory, tfmt.timer_log_file_name(base)))
            self.min_position = base + self.file_size
            removed += 1
        return removed

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class TimerWheel:
    """The wheel file, mapped as an array of SLOT; a slot is empty unless its time_slot matches (format.py)."""

    def __init__(self, path: str, precision_ms: int):
        self.path = path
        self.precision_ms = precision_ms
        if os.path.exists(path) and os.path.getsize(path) != tfmt.WHEEL_SIZE_BYTES:
            raise tfmt.damage(path, 0, "4", f"the wheel is {os.path.getsize(path)} bytes, "
                                           f"not {tfmt.WHEEL_SIZE_BYTES}")
        if not os.path.exists(path):
            with open(path, "wb") as handle:
                handle.truncate(tfmt.WHEEL_SIZE_BYTES)
        self.slots = np.memmap(path, dtype=tfmt.SLOT, mode="r+", shape=(tfmt.WHEEL_SLOT_COUNT,))

    def slot(self, time_ms: int) -> tuple[int, int, int]:
        """(first_position, last_position, count) of the slot for `time_ms`; (-1, -1, 0) when empty."""
        record = self.slots[tfmt.slot_index(time_ms, self.precision_ms)]
        if int(record["time_slot"]) != time_ms // self.precision_ms:
            return tfmt.NO_POSITION, tfmt.NO_POSITION, 0
        return int(record["first_position"]), int(record["last_position"]), int(record["count"])

    def put_slots(self, times_ms: np.ndarray, first: np.ndarray, last: np.ndarray, counts: np.ndarray) -> None:
        indexes = (times_ms // self.precision_ms) % tfmt.WHEEL_SLOT_COUNT
        self.slots["time_slot"][indexes] = times_ms // self.precision_ms
        self.slots["first_position"][indexes] = first
        self.slots["last_position"][indexes] = last
        self.slots["count"][indexes] = counts
        self.slots["magic"][indexes] = 0

    def next_filled(self, start_ms: int, stop_ms: int) -> int | None:
        """The first slot time in [start_ms, stop_ms) whose slot is filled, or None."""
        precision = self.precision_ms
        first, stop = start_ms // precision, -(-stop_ms // precision)
        chunk = 1 << 16
        if native.NATIVE is not None and first >= 0:  # compiled: keeps the interpreter lock (timer_link.c)
            while first < stop:
                found = native.NATIVE.timer_next_filled(self.slots, first, stop)
                if found >= 0:
                    return found * precision
                first += chunk
            return None
        while first < stop:
            times = np.arange(first, min(stop, first + chunk), dtype=np.int64)
            found = np.flatnonzero(self.slots["time_slot"][times % tfmt.WHEEL_SLOT_COUNT] == times)
            if len(found):
                return int(times[found[0]]) * precision
            first += chunk
        return None

    def pending_count(self, start_ms: int) -> int:
        """Units linked into the slots of the wheel's window from `start_ms` on (RocketMQ's getAllNum)."""
        times = start_ms // self.precision_ms + np.arange(tfmt.WHEEL_SLOT_COUNT, dtype=np.int64)
        slots = self.slots[times % tfmt.WHEEL_SLOT_COUNT]
        return int(slots["count"][slots["time_slot"] == times].sum())

    def first_position_min(self, start_ms: int) -> int | None:
        """The lowest first_position of the filled slots in the window from `start_ms` on, or None."""
        times = start_ms // self.precision_ms + np.arange(tfmt.WHEEL_SLOT_COUNT, dtype=np.int64)
        slots = self.slots[times % tfmt.WHEEL_SLOT_COUNT]
        firsts = slots["first_position"][slots["time_slot"] == times]
        return int(firsts.min()) if len(firsts) else None

    def flush(self) -> None:
        self.slots.flush()

    def close(self) -> None:
        self.slots.flush()
        self.slots._mmap.close()
        del self.slots


class TimerCheckpoint:
    """`config/timercheck`: read on open (rule 6), written after the files it vouches for are flushed."""

    def __init__(self, path: str):
        self.path = path
        self.values = np.zeros(1, dtype=tfmt.CHECKPOINT)[0]
        if os.path.exists(path):
            with open(path, "rb") as handle:
                data = handle.read(tfmt.CHECKPOINT_USED_BYTES)
            if len(data) == tfmt.CHECKPOINT_USED_BYTES:
                self.values = np.frombuffer(data, dtype=tfmt.CHECKPOINT)[0].copy()
            for field in ("read_time_ms", "timer_log_end", "queue_offset"):
                if int(self.values[field]) < 0:
                    raise tfmt.damage(path, tfmt.CHECKPOINT.fields[field][1], "6", f"{field} < 0")

    def write(self, read_time_ms: int, timer_log_end: int, queue_offset: int) -> None:
        values = self.values
        values["read_time_ms"], values["timer_log_end"] = read_time_ms, timer_log_end
        values["queue_offset"] = values["master_queue_offset"] = queue_offset
        values["version_timestamp_ms"] = time.time_ns() // 1_000_000
        values["version_counter"] += 1
        data = values.tobytes().ljust(tfmt.CHECKPOINT_FILE_SIZE_BYTES, b"\0")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)  # one page: the kernel writes it whole or not at all in practice
            os.fdatasync(fd)
        finally:
            os.close(fd)


def revise_slots_past_end(wheel: TimerWheel, timer_log: TimerLog, read_time_ms: int) -> int:
    """Relink the pending slots that point past the TimerLog's end (a power loss kept the wheel's page but not the
    units; RocketMQ's recoverAndRevise): each gets the last and first of its units that are on disk, or is emptied.
    The lost units' timers are enqueued again from the checkpoint's queue offset, which is before them. Returns the
    number of slots revised; nothing is read when no slot points past the end (kill -9 keeps every unit)."""
    precision = wheel.precision_ms
    times = read_time_ms // precision + np.arange(tfmt.WHEEL_SLOT_COUNT, dtype=np.int64)
    indexes = times % tfmt.WHEEL_SLOT_COUNT
    slots = wheel.slots[indexes]
    end = timer_log.end
    bad = (slots["time_slot"] == times) & ((slots["last_position"] >= end) | (slots["first_position"] >= end))
    if not bad.any():
        return 0
    positions, units = timer_log.all_units()
    valid = (units["size"] == tfmt.UNIT_SIZE_BYTES) & ((units["magic"] & tfmt.MAGIC_DEFAULT) != 0)
    positions, units = positions[valid], units[valid]
    unit_slots = (units["write_time_ms"] + units["delay_ms"]) // precision
    for time_slot, index in zip(times[bad], indexes[bad]):
        mine = positions[unit_slots == time_slot]
        if len(mine):
            wheel.put_slots(np.array([time_slot * precision]), mine[:1], mine[-1:], np.array([len(mine)]))
        else:
            wheel.slots["time_slot"][index] = -1  # empty: no time reads as -1
    return int(bad.sum())
