"""Differential fuzzing of the timer's compiled enqueue (commitlog/csrc/timer_link.c) and of `queue_arrays`.

- `timer_link` against a model written here in plain Python (mqstore/timer/service.py's `_link` with _enqueue's
  choice of rows, one timer at a time): any rows (numbers, ok flags, text states and hashes at their boundaries),
  offsets and sizes, times, precisions, windows, TimerLog ends and file sizes in and out of their bounds, buffers
  shorter than the count, and old wheel slots that match or not. The result, the units and the slot rows must be
  the model's, or both must refuse (ValueError);
- `timer_put_slots` then writes the model's slot rows into the wheel: what is read back must be the rows, and
  `timer_next_filled` from around them must find what a scan of the wheel finds;
- `queue_arrays` against `queue_lists`, and `queue_written` against a count of the sizes, over random
  ConsumeQueue bytes;
- `pwrite_keep_lock` to a file, read back, and `pread_keep_lock` against os.pread;
- `map_read_keep_lock` (commitlog/csrc/read_map.c, the ConsumeQueue reader's map) of files of any size asked for
  at any size: the file's bytes, its actual size, or the refusal, as the file and the bounds say; and
  `listdir_keep_lock` (the schedule service's listing) of a directory of files with any names, against os.listdir.
The service-level comparison with the Python `_link` itself is tests/unit/timer/test_timer_link_compiled.py.
"""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np
from mqstore.commitlog import native

from fuzz.provider import Input
from mqstore.timer import format as tfmt

COMPILED = native.NATIVE
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
TIME_MAX, PRECISION_MAX, LOG_END_MAX, FILE_SIZE_MAX = 1 << 53, 1 << 31, 1 << 60, 1 << 40  # timer_link.c's bounds
START_MS = 1_700_000_000_000
WHEEL = bytearray(tfmt.WHEEL_SIZE_BYTES)  # one wheel for every input: the slots an input sets are zeroed after
_FILE = tempfile.NamedTemporaryFile(prefix="mqstore-fuzz-timer-")
_MAP_FILE = tempfile.NamedTemporaryFile(prefix="mqstore-fuzz-map-")
_LIST_DIRECTORY = tempfile.TemporaryDirectory(prefix="mqstore-fuzz-list-")
MAP_SIZE_MAX = 1 << 62  # read_map.c's bound


def _i64(source: Input, near: tuple) -> int:
    if source.flag():
        return source.pick(near) + source.below(5) - 2
    return int.from_bytes(source.take(8).ljust(8, b"\0"), "big", signed=True)


def _rows(source: Input, count: int, write_time: int, precision: int, window: int):
    rows = np.zeros((count, 4), dtype=np.int64)
    span = window * precision if 0 < window < 1 << 22 and 0 < precision < 1 << 32 else 1000
    near = (0, write_time, write_time - 3 * precision, write_time + span, write_time + 2 * span, INT64_MAX, 1 << 31)
    negative, not_ascii = source.below(8) == 0, source.below(4) == 0  # rows that end the call early: in some inputs
    for row in rows:
        number = _i64(source, near)
        row[0] = max(INT64_MIN, min(INT64_MAX, number if negative else abs(number)))
        row[1] = source.pick((1,) * 12 + (0, 2, -1))
        row[2] = source.pick((0, 1, 3) + ((2,) if not_ascii else ()))
        row[3] = _i64(source, (0, 1 << 31, -(1 << 31), 1 << 32))
    return rows


def _slot(out_ms: int, write_time: int, precision: int, window: int) -> tuple[int, int]:
    slot = out_ms // precision * precision
    span, magic = window * precision, tfmt.MAGIC_DEFAULT
    if slot - write_time >= span:
        near = slot - write_time - span < window // 3 * precision
        slot = write_time + (window // 2 * precision if near else span)
        magic |= tfmt.MAGIC_ROLL
    return slot, magic


def _positions(end: int, file_size: int, count: int) -> list[int]:
    unit, blank = tfmt.UNIT_SIZE_BYTES, tfmt.BLANK_SIZE_BYTES
    positions, position = [], end
    while len(positions) < count:
        base = position - position % file_size
        room = max(0, (base + file_size - blank - position) // unit)
        if room == 0:
            position, room = base + file_size, (file_size - blank) // unit
        take = min(room, count - len(positions))
        positions += [position + k * unit for k in range(take)]
        position += take * unit
    return positions


def _i32(value: int) -> bytes:
    return (value & 0xFFFFFFFF).to_bytes(4, "big")


def _model(rows, offsets, sizes, count, write_time, read_time, precision, window, end, file_size, skip_due,
           units_room, slots_room):
    """(result, units bytes, slot rows) as timer_link must give them, or ValueError."""
    if (count < 0 or count > min(len(rows), len(offsets), len(sizes), units_room, slots_room)
            or not (0 <= write_time <= TIME_MAX and 0 <= read_time <= TIME_MAX and 1 <= precision <= PRECISION_MAX
                    and 2 <= window <= tfmt.WHEEL_SLOT_COUNT and tfmt.UNIT_SIZE_BYTES + tfmt.BLANK_SIZE_BYTES
                    <= file_size <= FILE_SIZE_MAX and 0 <= end <= LOG_END_MAX)
            or any(rows[i][1] == 1 and rows[i][0] < 0 for i in range(count))):
        return ValueError
    kept = [i for i in range(count) if rows[i][1] == 1]
    hashed = [i for i in kept if rows[i][2] == 2]
    if hashed:
        return ("hash", hashed), b"", []
    slots = {i: _slot(int(rows[i][0]), write_time, precision, window) for i in kept}
    due = [i for i in kept if slots[i][0] < read_time]
    if due and not skip_due:
        return ("due", due, [slots[i][1] for i in due]), b"", []
    linked = [i for i in kept if slots[i][0] >= read_time]
    positions = _positions(end, file_size, len(linked))
    prev = [0] * len(linked)
    groups = []
    for slot_ms in sorted({slots[i][0] for i in linked}):
        members = [k for k, i in enumerate(linked) if slots[i][0] == slot_ms]
        time_slot = slot_ms // precision
        at = time_slot % tfmt.WHEEL_SLOT_COUNT * tfmt.SLOT_SIZE_BYTES
        old = np.frombuffer(WHEEL, dtype=tfmt.SLOT, count=1, offset=at)[0]
        filled = int(old["time_slot"]) == time_slot
        previous = int(old["last_position"]) if filled else -1
        for k in members:
            prev[k], previous = previous, positions[k]
        groups.append([time_slot, int(old["first_position"]) if filled else positions[members[0]], previous,
                       (int(old["count"]) if filled else 0) + len(members)])
    units = b"".join(
        _i32(tfmt.UNIT_SIZE_BYTES) + prev[k].to_bytes(8, "big", signed=True) + _i32(slots[i][1])
        + write_time.to_bytes(8, "big", signed=True) + _i32(slots[i][0] - write_time)
        + int(offsets[i]).to_bytes(8, "big", signed=True) + _i32(int(sizes[i])) + _i32(int(rows[i][3])) + bytes(8)
        for k, i in enumerate(linked))
    end_after = positions[-1] + tfmt.UNIT_SIZE_BYTES if linked else end
    skipped = [i for i in range(count) if rows[i][1] != 1]
    return ("linked", len(linked), len(groups), skipped, end_after), units, groups


def _set_old_slots(source: Input, rows, count: int, write_time: int, precision: int, window: int) -> list[int]:
    """Fill the wheel slots some rows map to with old values (their time or another); the offsets set."""
    touched = []
    if not (1 <= precision <= PRECISION_MAX and 2 <= window <= tfmt.WHEEL_SLOT_COUNT and 0 <= write_time <= TIME_MAX):
        return touched
    for i in range(count):
        if rows[i][1] != 1 or rows[i][0] < 0 or not source.flag():
            continue
        time_slot = _slot(int(rows[i][0]), write_time, precision, window)[0] // precision
        at = time_slot % tfmt.WHEEL_SLOT_COUNT * tfmt.SLOT_SIZE_BYTES
        slot = np.zeros(1, dtype=tfmt.SLOT)
        slot["time_slot"] = time_slot if source.flag() else time_slot + tfmt.WHEEL_SLOT_COUNT
        slot["first_position"], slot["last_position"] = source.below(1 << 16), _i64(source, (-1, 0))
        slot["count"] = source.pick((1, 0x7FFFFFFF, -1, 5))
        WHEEL[at:at + tfmt.SLOT_SIZE_BYTES] = slot.tobytes()
        touched.append(at)
    return touched


def _check_timer_link(source: Input) -> None:
    count = source.below(25)
    # In bounds in most inputs; in the others each bound, and its first value past it, may come.
    edges = source.below(6) == 0
    write_time = source.pick((START_MS, 7) + ((0, TIME_MAX, TIME_MAX + 1, -1) if edges else ()))
    precision = source.pick((1, 7, 1000) + ((PRECISION_MAX, 0, PRECISION_MAX + 1) if edges else ()))
    window = source.pick((2, 3, 50) + ((tfmt.WHEEL_SLOT_COUNT, 1, tfmt.WHEEL_SLOT_COUNT + 1) if edges else ()))
    read_time = source.pick((write_time, max(0, write_time - 2 * precision), write_time + 5)
                            + ((0, TIME_MAX + 1, write_time - 2 * precision) if edges else ()))
    file_size = source.pick((68, 200, 4096) + ((FILE_SIZE_MAX, 67, FILE_SIZE_MAX + 1) if edges else ()))
    end = source.pick((0, 52 * source.below(9), file_size - 20, 3 * file_size)
                      + ((LOG_END_MAX, LOG_END_MAX + 1, -1) if edges else ()))
    rows = _rows(source, count + source.below(2), write_time, precision, window)
    offsets = np.array([_i64(source, (0, 1 << 32)) for _ in range(len(rows))], dtype=np.int64)
    sizes = np.array([_i64(source, (0, 1 << 31, 100)) for _ in range(len(rows))], dtype=np.int64)
    short = (1, -1) if edges else ()
    units_room, slots_room = count + source.pick((0, 0) + short), count + source.pick((0, 0) + short)
    units_out = bytearray(max(0, units_room) * tfmt.UNIT_SIZE_BYTES)
    slots_out = np.zeros((max(0, slots_room), 4), dtype=np.int64)
    skip_due = source.flag()
    touched = _set_old_slots(source, rows, count, write_time, precision, window)
    try:
        expected = _model(rows, offsets, sizes, count, write_time, read_time, precision, window, end, file_size,
                          skip_due, max(0, units_room), max(0, slots_room))
        try:
            got = COMPILED.timer_link(rows, offsets, sizes, count, write_time, read_time, precision, window, end,
                                      file_size, WHEEL, units_out, slots_out, skip_due)
        except ValueError:
            assert expected is ValueError, f"timer_link refused what the model takes: {expected}"
            return
        except OverflowError:  # an argument past a C long long: refused before anything is read
            return
        assert expected is not ValueError, f"timer_link took what the model refuses: {got}"
        result, units, groups = expected
        assert got == result, f"timer_link: {got} != {result}"
        if got[0] == "linked":
            assert bytes(units_out[:got[1] * tfmt.UNIT_SIZE_BYTES]) == units, "timer_link: units differ"
            assert slots_out[:got[2]].tolist() == groups, "timer_link: slot rows differ"
            _check_put_slots(groups, precision)
    finally:
        for at in touched:
            WHEEL[at:at + tfmt.SLOT_SIZE_BYTES] = bytes(tfmt.SLOT_SIZE_BYTES)


def _check_put_slots(groups: list, precision: int) -> None:
    rows = np.array(groups, dtype=np.int64).reshape(-1, 4)
    COMPILED.timer_put_slots(WHEEL, rows, len(groups), precision)
    wheel = np.frombuffer(WHEEL, dtype=tfmt.SLOT)
    last_at = {time_slot % tfmt.WHEEL_SLOT_COUNT: (time_slot, first, last, units)  # two times, one slot: the last
               for time_slot, first, last, units in groups}
    try:
        for index, (time_slot, first, last, units) in last_at.items():
            slot = wheel[index]
            got = (int(slot["time_slot"]), int(slot["first_position"]), int(slot["last_position"]),
                   int(slot["count"]), int(slot["magic"]))
            wrapped = (units + (1 << 31)) % (1 << 32) - (1 << 31)
            assert got == (time_slot, first, last, wrapped, 0), f"timer_put_slots: {got}"
        for time_slot, *_ in groups[:1]:  # next_filled from around a slot just written
            for first, stop in ((time_slot - 2, time_slot + 1), (time_slot, time_slot), (time_slot + 1, time_slot + 9),
                                (time_slot - 70_000, time_slot + 5), (time_slot, INT64_MIN),
                                (INT64_MAX - 3, INT64_MAX)):
                _check_next_filled(wheel, first, stop)
    finally:
        for time_slot, *_ in groups:
            at = time_slot % tfmt.WHEEL_SLOT_COUNT * tfmt.SLOT_SIZE_BYTES
            WHEEL[at:at + tfmt.SLOT_SIZE_BYTES] = bytes(tfmt.SLOT_SIZE_BYTES)


def _check_next_filled(wheel, first: int, stop: int) -> None:
    try:
        got = COMPILED.timer_next_filled(WHEEL, first, stop)
    except ValueError:
        assert first < 0, "timer_next_filled refused a time slot >= 0"
        return
    end = min(stop, first + 65536)
    times = np.arange(first, max(first, end), dtype=np.int64)
    # np.equal, not ==: atheris traces each == of the code it instruments, and with == here the fuzzing process grew
    # by about 5 KB an input (2 GB, libFuzzer's limit, in 300 s); with np.equal it stays flat
    found = np.flatnonzero(np.equal(wheel["time_slot"][times % tfmt.WHEEL_SLOT_COUNT], times))
    expected = int(times[found[0]]) if len(found) else -1
    assert got == expected, f"timer_next_filled({first}, {stop}): {got} != {expected}"


def _check_queue_arrays(source: Input) -> None:
    data = source.blob(20 * 12)
    first, count, at = source.below(14) - 1, source.below(14) - 1, source.below(6) - 1
    offsets, sizes = np.full(source.below(16), -7, dtype=np.int64), np.full(16, -7, dtype=np.int64)
    units = len(data) // 20
    try:
        written = COMPILED.queue_written(data, first, count)
    except ValueError:
        assert not (0 <= first <= units and 0 <= count <= units - first), "queue_written refused units it has"
    else:
        sizes_read = [int.from_bytes(data[(first + k) * 20 + 8:(first + k) * 20 + 12], "big", signed=True)
                      for k in range(count)]
        expected = next((k for k, size in enumerate(sizes_read) if size <= 0), count)
        assert written == expected, f"queue_written: {written} != {expected}"
    try:
        lists = COMPILED.queue_lists(data, first, count)
    except ValueError:
        lists = ValueError
    try:
        span = COMPILED.queue_arrays(data, first, count, offsets, sizes, at)
    except ValueError:
        assert lists is ValueError or not 0 <= at <= len(offsets) - count, "queue_arrays refused what fits"
        return
    assert lists is not ValueError, "queue_arrays took units queue_lists refuses"
    if lists is None:
        assert span is None, "queue_arrays took a unit queue_lists refuses"
        return
    assert span == lists[2:], f"queue_arrays: span {span} != {lists[2:]}"
    assert offsets[at:at + count].tolist() == lists[0] and sizes[at:at + count].tolist() == lists[1], \
        "queue_arrays: values differ"


def _check_pwrite_keep_lock(source: Input) -> None:
    data, offset = source.blob(300), source.pick((0, 1, 4096, -1, INT64_MAX, INT64_MAX - 5, source.below(1 << 16)))
    fd = _FILE.fileno()
    try:
        COMPILED.pwrite_keep_lock(fd, data, offset)
    except ValueError:
        assert offset < 0 or offset > INT64_MAX - len(data), "pwrite_keep_lock refused a valid offset"
        return
    except OSError:
        assert offset + len(data) > 1 << 40, "pwrite_keep_lock failed at a small offset"
        return
    assert os.pread(fd, len(data), offset) == data, "pwrite_keep_lock: the bytes read back differ"
    length = source.pick((len(data), 0, len(data) + 7, 1 << 20, (1 << 20) + 1, -1))
    try:
        got = COMPILED.pread_keep_lock(fd, length, offset)
    except ValueError:
        assert not 0 <= length <= 1 << 20 or length > INT64_MAX - offset, "pread_keep_lock refused a valid length"
        return
    except OSError as exc:
        got = OSError, exc.errno
    try:
        expected = os.pread(fd, length, offset)
    except OSError as exc:
        expected = OSError, exc.errno
    assert got == expected, f"pread_keep_lock: {got!r:.80} where os.pread gives {expected!r:.80}"


def _check_listdir_keep_lock(source: Input) -> None:
    directory = _LIST_DIRECTORY.name
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    for _ in range(source.below(6)):
        name = source.blob(40).replace(b"/", b"_").replace(b"\0", b"_")
        if name not in (b"", b".", b".."):
            open(os.path.join(directory.encode(), name), "wb").close()
    target = source.pick((directory, directory.encode(), directory + "/missing", _MAP_FILE.name))
    try:
        got = sorted(COMPILED.listdir_keep_lock(target))
    except OSError as exc:
        got = OSError, exc.errno, exc.filename
    try:
        expected = sorted(os.fsdecode(name) for name in os.listdir(target))
    except OSError as exc:
        expected = OSError, exc.errno, exc.filename
    assert got == expected, f"listdir_keep_lock: {got!r:.120} where os.listdir gives {expected!r:.120}"


def _check_map_read_keep_lock(source: Input) -> None:
    if source.below(4) == 0:
        _check_listdir_keep_lock(source)
        return
    fd, path = _MAP_FILE.fileno(), _MAP_FILE.name
    file_size = source.pick((0, 1, 4095, 4096, 4097, source.below(1 << 16)))
    os.ftruncate(fd, file_size)
    data = source.blob(64)
    at = source.below(max(1, file_size - len(data) + 1)) if file_size >= len(data) else 0
    os.pwrite(fd, data[: max(0, file_size - at)], at)
    size = source.pick((file_size, file_size + 1, file_size - 1, 0, -1, MAP_SIZE_MAX, MAP_SIZE_MAX + 1, INT64_MAX,
                        INT64_MIN, source.below(1 << 17)))
    target = source.pick((path, path.encode(), os.path.dirname(path), path + ".missing"))
    try:
        mapping = COMPILED.map_read_keep_lock(target, size)
    except ValueError:
        assert not 0 < size <= MAP_SIZE_MAX, "map_read_keep_lock refused a valid size"
        return
    except OSError as exc:
        expected = {os.path.dirname(path): errno.EISDIR, path + ".missing": errno.ENOENT}.get(target)
        assert 0 < size <= MAP_SIZE_MAX and exc.errno == expected, f"map_read_keep_lock: {exc!r} for {target!r}"
        return
    assert target in (path, path.encode()), f"map_read_keep_lock mapped {target!r}"
    if isinstance(mapping, int):
        assert mapping == file_size != size, f"map_read_keep_lock: {mapping} for a file of {file_size} asked at {size}"
        return
    assert size == file_size and mapping.size == size, "map_read_keep_lock mapped a size the file does not have"
    view = np.frombuffer(mapping, dtype=np.uint8)
    del mapping  # the array keeps the mapping
    expected = os.pread(fd, file_size, 0)
    assert np.equal(view, np.frombuffer(expected, dtype=np.uint8)).all(), "map_read_keep_lock: the bytes differ"
    assert not view.flags.writeable, "map_read_keep_lock: a writable mapping"


def one_input(data: bytes) -> None:
    source = Input(data)
    pick = source.below(5)
    if pick <= 1:
        _check_timer_link(source)
    elif pick == 2:
        _check_queue_arrays(source)
    elif pick == 3:
        _check_pwrite_keep_lock(source)
    else:
        _check_map_read_keep_lock(source)
