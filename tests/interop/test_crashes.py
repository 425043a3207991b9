"""Crashes both ways: a writer killed with SIGKILL at a random moment, then both recoveries compared.

  * RocketMQ's writer (`rmq put`: one or four threads, ASYNC or SYNC flush, bodies of 0 to 4000 bytes, 64 KiB
    segments) is killed a random time after its first segment appears;
  * mqstore's writer (tests/crash/writer_process.py, ASYNC with the index, one or four producer threads) is
    killed at a random moment (during start-up and recovery, or after a random number of acknowledged puts),
    several times over on one store, each writer recovering from the previous kill;
  * the same with dispatch_process=True (its dispatch child outlives the killed writer for a moment).

After each kill the store is copied once, and that copy copied again: mqstore opens the first (its recovery)
and reads every queue with get(); `rmq read` opens the second (RocketMQ's recovery, which after a crash
re-dispatches the log from a checkpoint-chosen segment). Both must hold the same messages in the same queues
at the same offsets, field by field, and agree where the log ends. `MQSTORE_LONG_CRASH_SWEEP=1` runs more
trials, `MQSTORE_INTEROP_SEED=N` another seed; run with `pytest -s` to see the trials.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.message import decode_message

from mqstore import Message, MessageStore
from tests.conftest import small_config
from tests.crash.test_kill_writer import KillSeries, _kill_one
from tests.crash.writer_process import kill_config
from tests.interop.conftest import LONG
from tests.rocketmq import RocketMQRead, copy_store, differences, store_entries

PUT_TRIALS = 12 if LONG else 3
KILL_TRIALS = 16 if LONG else 3  # mqstore writers killed one after another on one store
PROCESS_KILL_TRIALS = 10 if LONG else 2  # the same with dispatch_process=True
PUT_SEGMENT_BYTES = 64 * 1024
PUT_MESSAGES = 10**9  # `rmq put` never finishes by itself
PUT_TOPICS, PUT_QUEUES = 3, 2
PUT_KILL_DELAY_MAX_S = 1.5  # after the first segment appears
PUT_START_TIMEOUT_S = 120.0
# `rmq put` leaves RocketMQ's defaults but for the segment size (MessageStoreConfig: 300 000 ConsumeQueue entries
# a file, 5 000 000 hash slots and 20 000 000 entries an IndexFile).
PUT_CONFIG = small_config(segment_size_bytes=PUT_SEGMENT_BYTES, consume_queue_entries_per_file=300_000,
                          index_enabled=True, index_slot_count=5_000_000, index_entry_count_max=20_000_000)


@dataclass
class Trial:
    kind: str  # "rmq put", "mqstore", "mqstore+dispatch process"
    label: str
    config: object
    ours: list[dict] = field(default_factory=list)
    root: Path | None = None  # the copy mqstore recovered; None: the writer died before it made the store
    log_end: int = 0
    case: str = ""
    theirs: RocketMQRead | None = None
    crash_image: Path | None = None  # the killed store's bytes as RocketMQ was given them (rmq reads a copy)


def _two_copies(source: Path, base: Path, name: str) -> tuple[Path, Path]:
    """A copy of the killed store, and a copy of that copy (both recoveries start from the same bytes even
    while a dispatch child still writes to the source)."""
    first, second = base / f"{name}-mqstore", base / f"{name}-rocketmq"
    copy_store(source, first)
    copy_store(first, second)
    return first, second


def _recover_with_mqstore(trial: Trial, root: Path) -> None:
    trial.root = root
    with MessageStore.open(root, trial.config) as store:
        trial.case, trial.log_end = store.recovery_report.case, store.recovery_report.log_end
        trial.ours = store_entries(store)


def _kill_rmq_put(rmq, base: Path, number: int, rng: random.Random) -> tuple[Trial, Path]:
    body, flush, threads = rng.choice((0, 100, 1000, 4000)), rng.choice(("async", "sync")), rng.choice((1, 4))
    delay = rng.uniform(0, PUT_KILL_DELAY_MAX_S)
    trial = Trial("rmq put", f"rmq put #{number} body={body} {flush} threads={threads} kill {delay:.2f}s "
                  "after the first segment", PUT_CONFIG)
    store = base / f"put-{number}"
    commitlog = store / "commitlog"
    with rmq.turn():
        process = rmq.start_put(store, PUT_SEGMENT_BYTES, PUT_MESSAGES, body, flush, PUT_TOPICS, PUT_QUEUES, threads)
        deadline = time.monotonic() + PUT_START_TIMEOUT_S
        while not (commitlog.is_dir() and os.listdir(commitlog)):
            if process.popen.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"{trial.label}: rmq put wrote no segment: {process.output()[1][-3000:]}")
            time.sleep(0.005)
        time.sleep(delay)
        process.kill()
        process.output()
    ours, theirs = _two_copies(store, base, f"put-{number}")
    shutil.rmtree(store)
    _recover_with_mqstore(trial, ours)
    return trial, theirs


def _kill_mqstore(base: Path, root: Path, series: KillSeries, generation: int, rng: random.Random):
    exited, lines, _ = _kill_one(root, series, generation, rng, base)
    acks = sum(line.startswith("ACK") for line in lines)
    trial = Trial("mqstore" + ("+dispatch process" if series.process else ""),
                  f"mqstore writer {series.label} generation {generation}: killed after {acks} acks "
                  f"(exited by itself: {exited})", kill_config(series.mode, series.index, series.process))
    if exited is not None:
        raise AssertionError(f"{trial.label}: the writer exited by itself")
    if not root.exists():  # killed before it made the store's directory: nothing to compare
        return trial, None
    ours, theirs = _two_copies(root, base, f"{root.name}-{generation}")
    _recover_with_mqstore(trial, ours)
    return trial, theirs


def _blank_last(base: Path) -> tuple[Trial, Path]:
    """A store whose writer died after writing an end-of-segment blank, before it made the next segment: a
    closed store with the later segment files removed and the `abort` marker put back."""
    trial = Trial("blank last", "end-of-segment blank last", small_config(index_enabled=True))
    root = base / "blank-last"
    segment_bytes = trial.config.segment_size_bytes
    with MessageStore.open(root, trial.config) as store:
        number = 0
        while True:
            result = store.put(Message("orders", bytes(1000) + b"%d" % number, queue_id=number % 2,
                                       keys=(f"key-{number}",)))
            number += 1
            if result.commitlog_offset >= segment_bytes:
                break
    assert result.commitlog_offset == segment_bytes  # the first message of the second segment
    for path in (root / "commitlog").iterdir():
        if int(path.name) >= segment_bytes:
            path.unlink()
    # The writer died before the next segment existed, so nothing past the blank was ever flushed: the
    # checkpoint's flushed offsets (flush/checkpoint.py, offsets 24 and 40) say no more than the first segment.
    with open(root / "checkpoint", "r+b") as checkpoint:
        for at in (24, 40):
            checkpoint.seek(at)
            flushed = struct.unpack(">q", checkpoint.read(8))[0]
            checkpoint.seek(at)
            checkpoint.write(struct.pack(">q", min(flushed, segment_bytes)))
    (root / "abort").write_bytes(b"")
    ours, theirs = _two_copies(root, base, "blank-last")
    _recover_with_mqstore(trial, ours)
    return trial, theirs


@pytest.fixture(scope="module")
def trials(rmq, interop_seed, tmp_path_factory) -> list[Trial]:
    base = tmp_path_factory.mktemp("interop-crashes")
    rng = random.Random(interop_seed + 1000)
    done: list[Trial] = []
    with ThreadPoolExecutor(rmq.parallel_calls) as pool:
        reads = []

        def read_later(trial: Trial, copy: Path) -> None:
            trial.crash_image = copy
            work = copy.parent / f"{copy.name}-read"
            work.mkdir()
            reads.append(pool.submit(lambda: setattr(trial, "theirs", rmq.read(copy, trial.config, work))))
            done.append(trial)

        read_later(*_blank_last(base))
        for number in range(PUT_TRIALS):
            read_later(*_kill_rmq_put(rmq, base, number, rng))
        for process, count in ((False, KILL_TRIALS), (True, PROCESS_KILL_TRIALS)):
            root = base / ("store-dispatch-process" if process else "store")
            for generation in range(1, count + 1):
                series = KillSeries("ASYNC", True, process, rng.choice((1, 4)))
                trial, copy = _kill_mqstore(base, root, series, generation, rng)
                if copy is None:
                    done.append(trial)
                else:
                    read_later(trial, copy)
        for future in reads:
            future.result()
    for trial in done:
        outcome = (f"mqstore {trial.case} kept {len(trial.ours)} messages to {trial.log_end}; RocketMQ read "
                   f"{trial.theirs.message_count} to {trial.theirs.max_physical_offset}" if trial.root
                   else "no store yet")
        print(f"[interop crash] seed={interop_seed} {trial.label}: {outcome}")
    return done


def _trailing_blank(trial: Trial, start: int) -> bool:
    """Whether mqstore's recovered log ends with an end-of-segment blank that starts at `start` and ends the
    segment. A writer killed after rolling to a new segment but before writing into it leaves such a blank
    last; RocketMQ's recovery then puts the log's end at the blank's start, mqstore's at the segment's end. The
    messages are the same, and both put the next one at the start of the next segment."""
    segment_bytes, end = trial.config.segment_size_bytes, trial.log_end
    base = end - segment_bytes
    if end % segment_bytes or not base <= start < end:
        return False
    with open(trial.root / "commitlog" / fmt.segment_name(base), "rb") as handle:
        handle.seek(start - base)
        size, magic = struct.unpack(">iI", handle.read(8))
    return size == end - start and magic == fmt.BLANK_MAGIC_CODE


def _torn_tail(trial: Trial) -> set[int]:
    """The commitlog offsets of RocketMQ's messages at and past mqstore's log end whose records, in the crash
    image, break mqstore's record checks: records whose last bytes the killed writer never wrote. RocketMQ
    4.4.0 checks a record's body CRC only and keeps such a record; mqstore's record CRC (format rule 6) finds
    it torn and cuts it, as it cuts any torn tail. Empty unless they are the whole of RocketMQ's excess."""
    if trial.crash_image is None or not trial.config.record_crc:
        return set()
    excess = sorted(entry["commitlog_offset"] for entry in trial.theirs.entries
                    if entry["commitlog_offset"] >= trial.log_end)
    if not excess or excess[0] != trial.log_end:
        return set()
    segment_bytes = trial.config.segment_size_bytes
    for offset in excess:
        base = offset - offset % segment_bytes
        data = (trial.crash_image / "commitlog" / fmt.segment_name(base)).read_bytes()
        try:
            decode_message(data, offset - base, len(data) - (offset - base), offset, check_crc=True,
                           record_crc_from=0)
        except CorruptionError:
            continue
        return set()  # a sound record: a real disagreement
    return set(excess)


def _assert_agree(trials: list[Trial], kind: str, count: int) -> None:
    chosen = [trial for trial in trials if trial.kind == kind]
    assert len(chosen) == count
    chosen = [trial for trial in chosen if trial.root is not None]
    failures = []
    for trial in chosen:
        torn = _torn_tail(trial)
        found = differences(trial.ours, [entry for entry in trial.theirs.entries
                                         if entry["commitlog_offset"] not in torn])
        rocketmq_end = trial.log_end if torn else trial.theirs.max_physical_offset
        if rocketmq_end != trial.log_end and not _trailing_blank(trial, rocketmq_end):
            found.insert(0, f"RocketMQ's log ends at {rocketmq_end}, mqstore's at {trial.log_end}")
        if found:
            failures.append(f"{trial.label} (mqstore {trial.case}):\n  " + "\n  ".join(found))
    assert not failures, "\n".join(failures)
    assert sum(len(trial.ours) for trial in chosen) > 0, "the writers were killed before storing anything"


def test_rmq_put_killed_both_recoveries_agree(trials):
    _assert_agree(trials, "rmq put", PUT_TRIALS)


def test_mqstore_writer_killed_both_recoveries_agree(trials):
    _assert_agree(trials, "mqstore", KILL_TRIALS)


def test_mqstore_writer_with_a_dispatch_process_killed_both_recoveries_agree(trials):
    _assert_agree(trials, "mqstore+dispatch process", PROCESS_KILL_TRIALS)


def test_a_blank_last_both_recoveries_agree_on_the_messages_and_where_the_next_one_goes(trials):
    _assert_agree(trials, "blank last", 1)
    trial = next(trial for trial in trials if trial.kind == "blank last")
    segment_bytes = trial.config.segment_size_bytes
    assert trial.log_end == segment_bytes and trial.theirs.max_physical_offset < segment_bytes
    assert _trailing_blank(trial, trial.theirs.max_physical_offset)
