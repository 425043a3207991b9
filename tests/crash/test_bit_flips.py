"""Bit flips and truncated tails in flushed files: a clean recovery with correct data, or a CorruptionError that
names the file and the offset (after which repair=True opens), never a wrong message.

Two reference stores are built once from planned messages (tests/crash/checks.py) with 64 KiB segments, small
ConsumeQueue and index files, and everything flushed: one closed cleanly, one copied while its writer still
had it open (an `abort` marker, so the open runs crash recovery). Each trial copies one, damages one file:

    flip      one random bit: 85% of trials inside the file's written part, the rest anywhere
    truncate  the file is cut short at a random length (shorter than its fixed size)
    zero-tail the file keeps its size, but from a random offset inside its written part on it holds zeros

and then checks, by `_check_trial`:

  * the writable open without repair succeeds, or raises CorruptionError with `path` and `offset` set; in
    that case the open with repair=True must succeed;
  * every message any get() returns is, field for field, the message stored at that commitlog offset (the
    reference store's record read back), in its queue at its queue offset: never a wrong message;
  * a get() may raise CorruptionError instead (it must name file and offset); otherwise, after an open that
    raised nothing, every message is there and the index finds every key sampled (a clean recovery with correct
    data); after a repair, every message below the cut is there.

Run with `pytest -s` to see the counts: per test, outcomes and where the damage landed.
`MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials. Each case's trials come in two parts: `first` (its first
QUICK_TRIALS, in `make test`) and `rest` (marked long, in `make test-long`); the damage of every trial is drawn from
the case's one random sequence, so the two parts together are the TRIALS trials of a single run.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mqstore.commitlog import format as fmt

from mqstore import CorruptionError, FlushMode, MessageStore, StoreConfig
from tests.crash.checks import RETENTION_OFF, body_seq, planned_message, read_segments, walk_log

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 300 if LONG else 12  # per (target, damage, store) case
QUICK_TRIALS = 2  # a case's first trials run in `make test`; the rest are marked long (`make test-long`)
LONG_SWEEP_TIMEOUT_S = 3 * 3600  # a test's 300 trials may take longer than pytest's 600 s on a busy machine

pytestmark = pytest.mark.timeout(LONG_SWEEP_TIMEOUT_S if LONG else 600)
MESSAGE_COUNT = 360
IN_WRITTEN_PART_PROBABILITY = 0.85
GET_CHUNK_ENTRIES = 500
INDEX_SAMPLE_COUNT = 8
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240601"))
# 100 hash slots: like RocketMQ's 5 000 000 (and unlike a power of two), a count with an odd factor, so that
# every one-bit flip of an entry's keyHash moves it out of its slot's chain (index format rule 9).
CONFIG = StoreConfig(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, max_message_size_bytes=8192,
                     store_host="10.0.0.7", store_port=10911, preallocate_segments=False, index_enabled=True,
                     index_slot_count=100, index_entry_count_max=128, flush_mode=FlushMode.ASYNC, **RETENTION_OFF)

# Record regions of a v1 IPv4 record, for the histogram of where a flip landed.
HEADER_FIELDS = [(fmt.OFFSET_TOTAL_SIZE, "TOTALSIZE"), (fmt.OFFSET_MAGIC_CODE, "MAGICCODE"),
                 (fmt.OFFSET_BODY_CRC, "BODYCRC"), (fmt.OFFSET_QUEUE_ID, "QUEUEID"), (fmt.OFFSET_FLAG, "FLAG"),
                 (fmt.OFFSET_QUEUE_OFFSET, "QUEUEOFFSET"), (fmt.OFFSET_PHYSICAL_OFFSET, "PHYSICALOFFSET"),
                 (fmt.OFFSET_SYS_FLAG, "SYSFLAG"), (fmt.OFFSET_BORN_TIMESTAMP, "BORNTIMESTAMP"),
                 (fmt.OFFSET_BORN_HOST, "BORNHOST"), (fmt.OFFSET_STORE_TIMESTAMP, "STORETIMESTAMP"),
                 (fmt.OFFSET_STORE_HOST, "STOREHOST"), (fmt.OFFSET_RECONSUME_TIMES, "RECONSUMETIMES"),
                 (fmt.OFFSET_PREPARED_TRANSACTION_OFFSET, "PREPAREDTRANSACTIONOFFSET"),
                 (fmt.OFFSET_BODY_LENGTH, "BODYLENGTH"), (fmt.OFFSET_BODY, "BODY")]


@dataclass
class Reference:
    root: Path
    messages: dict  # commitlog offset -> StoredMessage as read from the undamaged store
    queues: dict  # (topic, queue_id) -> [commitlog offsets in queue order]
    records: list  # walk_log records
    written: dict  # relative path -> bytes of the written part (for choosing offsets)


def _build(root: Path, crashed: bool) -> Reference:
    store = MessageStore.open(root / "live" if crashed else root, CONFIG)
    for seq in range(MESSAGE_COUNT):
        store.put(planned_message(seq))
    assert store.wait_dispatched(30)
    store.flush()
    if crashed:
        shutil.copytree(root / "live", root / "store")
        store.close()
        shutil.rmtree(root / "live")
        root = root / "store"
        assert (root / "abort").exists()
    else:
        store.close()
    with MessageStore.open(root, CONFIG, read_only=True) as reader:
        queues, messages = {}, {}
        for topic, ids in reader.topics().items():
            for queue_id in ids:
                found = reader.get(topic, queue_id, 0, max_count=GET_CHUNK_ENTRIES).messages
                queues[(topic, queue_id)] = [m.commitlog_offset for m in found]
                messages.update({m.commitlog_offset: m for m in found})
    assert len(messages) == MESSAGE_COUNT
    records = walk_log(read_segments(str(root))).records
    written = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name not in ("lock", "abort") and path.parent.name != "config":
            data = path.read_bytes()
            written[str(path.relative_to(root))] = len(data.rstrip(b"\x00"))
    return Reference(root, messages, queues, records, written)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Reference]:
    base = tmp_path_factory.mktemp("bit-flip-references")
    return {"clean": _build(base / "clean", crashed=False), "crashed": _build(base / "crashed", crashed=True)}


def _targets(reference: Reference, target: str) -> list[str]:
    def kind(relative):
        top = relative.split(os.sep, 1)[0]
        return {"commitlog": "segment", "consumequeue": "queue", "index": "index"}.get(top, top)
    return [relative for relative in reference.written if kind(relative) == target and reference.written[relative]]


def _region(reference: Reference, target: str, relative: str, position: int) -> str:
    """Where in its file a damaged byte lies (for the printed histogram)."""
    if target == "segment":
        base = int(os.path.basename(relative))
        offset = base + position
        for record in reference.records:
            if record.offset <= offset < record.offset + len(record.raw):
                inside = offset - record.offset
                body_end = fmt.OFFSET_BODY + len(record.body)
                if inside >= body_end:
                    return "topic" if inside <= body_end + len(record.topic) else "properties"
                return [name for start, name in HEADER_FIELDS if start <= inside][-1]
        return "blank or past the end"
    if target == "queue":
        return ("commitlog_offset", "commitlog_offset", "size", "tags_code")[min(3, (position % 20) // 4)] \
            if position < reference.written[relative] else "past the last entry"
    if target == "index":
        slots_end = 40 + 4 * CONFIG.index_slot_count
        return "header" if position < 40 else "slots" if position < slots_end else "entries"
    return ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
            "physic_flushed_offset")[position // 8] if position < 32 else "padding"


def _plan_damage(reference: Reference, target: str, damage: str, rng: random.Random) -> tuple[str, int, int]:
    """The next trial's damage, drawn from `rng`: (relative path, position, bit to flip or 0)."""
    relative = rng.choice(_targets(reference, target))
    size = (reference.root / relative).stat().st_size
    written = reference.written[relative]
    if damage == "flip":
        inside = rng.random() < IN_WRITTEN_PART_PROBABILITY
        position = rng.randrange(written if inside else size)
        return relative, position, rng.randrange(8)
    return relative, rng.randrange(size if damage == "truncate" else written), 0


def _damage(root: Path, damage: str, relative: str, position: int, bit: int) -> None:
    """Damage one file of the store at `root` as planned."""
    path = root / relative
    if damage == "truncate":
        os.truncate(path, position)
        return
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[position] ^= 1 << bit
    else:
        data[position:] = bytes(len(data) - position)
    path.write_bytes(bytes(data))


@dataclass
class Trial:
    outcome: str = ""
    problems: list[str] = field(default_factory=list)
    errors_naming_damaged_file: int = 0
    errors: int = 0


def _note_error(trial: Trial, exc: CorruptionError, damaged: Path, where: str) -> None:
    trial.errors += 1
    if exc.path is None or exc.offset is None:
        trial.problems.append(f"{where}: CorruptionError without file and offset: {exc}")
    elif os.path.abspath(exc.path) == os.path.abspath(damaged) or damaged.name in str(exc.path):
        trial.errors_naming_damaged_file += 1


def _check_trial(root: Path, reference: Reference, damaged: Path) -> Trial:
    trial = Trial()
    repaired = False
    try:
        store = MessageStore.open(root, CONFIG)
        trial.outcome = "opened"
    except CorruptionError as exc:
        _note_error(trial, exc, damaged, "open")
        trial.outcome = "CorruptionError at open"
        try:
            store = MessageStore.open(root, CONFIG, repair=True)
            repaired = True
        except Exception as repair_exc:  # noqa: BLE001 - the finding
            trial.problems.append(f"open with repair=True raised {type(repair_exc).__name__}: {repair_exc} "
                                  f"(after {exc})")
            return trial
    except Exception as exc:  # noqa: BLE001 - any other failure to open is a finding
        trial.problems.append(f"open raised {type(exc).__name__} (not CorruptionError): {exc}")
        return trial
    try:
        seen, read_errors = _read_everything(store, reference, trial, damaged)
        if read_errors:
            trial.outcome += ", CorruptionError on read"
        elif not repaired:
            missing = sorted(set(reference.messages) - seen)
            if missing:
                trial.problems.append(f"{len(missing)} messages are gone without any error (first at commitlog "
                                      f"offset {missing[0]}; recovery {store.recovery_report.case})")
            else:
                _check_index(store, reference, trial, damaged)
        else:
            end = store.recovery_report.log_end
            missing = sorted(offset for offset in reference.messages if offset < end and offset not in seen)
            if missing:
                trial.problems.append(f"after repair, {len(missing)} messages below the cut at {end} are gone "
                                      f"(first at {missing[0]})")
    finally:
        store.close()
    return trial


def _read_everything(store, reference: Reference, trial: Trial, damaged: Path) -> tuple[set, int]:
    """Read every queue from 0; compare each message with the reference. Returns (offsets seen, read errors)."""
    seen: set[int] = set()
    read_errors = 0
    keys = set(reference.queues) | {(t, q) for t, ids in store.topics().items() for q in ids}
    for topic, queue_id in sorted(keys):
        expected = reference.queues.get((topic, queue_id), [])
        offset, high = 0, store.max_offset(topic, queue_id)
        if high > len(expected):
            trial.problems.append(f"{topic}/{queue_id} has {high} entries, {len(expected)} were stored")
        while offset < high:
            try:
                messages = store.get(topic, queue_id, offset, max_count=GET_CHUNK_ENTRIES).messages
            except CorruptionError:
                try:  # find the entry that fails, report it, read on after it
                    messages = store.get(topic, queue_id, offset, max_count=1).messages
                except CorruptionError as exc:
                    _note_error(trial, exc, damaged, f"get({topic}/{queue_id}, {offset})")
                    read_errors += 1
                    offset += 1
                    continue
            if not messages:
                offset += 1
                continue
            for message in messages:
                stored = reference.messages.get(message.commitlog_offset)
                if stored is None or tuple(message) != tuple(stored) or message.queue_offset != offset or \
                        offset >= len(expected) or expected[offset] != message.commitlog_offset:
                    trial.problems.append(_wrong(message, stored, topic, queue_id, offset))
                else:
                    seen.add(message.commitlog_offset)
                offset += 1
    return seen, read_errors


def _wrong(message, stored, topic, queue_id, offset) -> str:
    if stored is None:
        return f"get({topic}/{queue_id}, {offset}) returned a message at {message.commitlog_offset}, where none was"
    names = ("size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "commitlog_offset", "sys_flag",
             "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
             "prepared_transaction_offset", "body_length", "body", "topic", "properties")
    differing = [name for name, a, b in zip(names, message, stored) if a != b]
    return (f"WRONG MESSAGE: get({topic}/{queue_id}, {offset}) returned the message at {message.commitlog_offset} "
            f"(seq {body_seq(message.body)}) with {', '.join(differing) or 'another position'} changed")


def _check_index(store, reference: Reference, trial: Trial, damaged: Path) -> None:
    rng = random.Random(len(reference.messages))
    for offset in rng.sample(sorted(reference.messages), INDEX_SAMPLE_COUNT):
        stored = reference.messages[offset]
        seq = body_seq(stored.body)
        try:
            found = [m.commitlog_offset for m in store.query(stored.topic, f"k{seq}", max_count=4)]
        except CorruptionError as exc:
            _note_error(trial, exc, damaged, f"query({stored.topic}, k{seq})")
            trial.outcome += ", CorruptionError on query"
            return
        if found != [offset]:
            trial.problems.append(f"query({stored.topic}, k{seq}) gives {found}, the message is at {offset}")
            return


ALL_CASES = [(target, damage, variant) for target in ("segment", "queue", "index", "checkpoint")
             for damage in ("flip", "truncate", "zero-tail") for variant in ("clean", "crashed")]
CASES = ALL_CASES
PARTS = [pytest.param(range(QUICK_TRIALS), id="first"),
         pytest.param(range(QUICK_TRIALS, TRIALS), id="rest", marks=pytest.mark.long)]


@pytest.mark.parametrize("target, damage, variant", CASES, ids=["-".join(case) for case in CASES])
@pytest.mark.parametrize("trials", PARTS)
def test_damage_is_recovered_or_reported_never_returned(references, tmp_path, target, damage, variant, trials):
    reference = references[variant]
    rng = random.Random(f"{SEED}/{target}/{damage}/{variant}")
    plans = [_plan_damage(reference, target, damage, rng) for _ in range(trials.stop)]  # the earlier parts' too
    outcomes, regions, failures = Counter(), Counter(), []
    naming = errors = 0
    for number in trials:
        root = tmp_path / f"trial-{number}"
        shutil.copytree(reference.root, root)
        relative, position, bit = plans[number]
        _damage(root, damage, relative, position, bit)
        region = _region(reference, target, relative, position)
        trial = _check_trial(root, reference, root / relative)
        outcomes[trial.outcome or "open failed"] += 1
        regions[region] += 1
        naming += trial.errors_naming_damaged_file
        errors += trial.errors
        if trial.problems:
            failures.append(f"trial {number}: {damage} of {relative} at byte {position} ({region}): "
                            + " | ".join(trial.problems[:3]))
        shutil.rmtree(root, ignore_errors=True)
    print(f"[bit flips {target}-{damage} {variant}] trials={trials.start}-{trials.stop - 1} outcomes={dict(outcomes)} "
          f"damaged={dict(regions)} corruption_errors={errors} naming_the_damaged_file={naming} "
          f"failures={len(failures)}")
    assert not failures, f"{len(failures)} of {len(trials)} trials fail, first ones:\n" + "\n".join(failures[:6])
