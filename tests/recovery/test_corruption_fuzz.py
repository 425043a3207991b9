"""A seeded corruption fuzz of whole stores: damage a copy of a store, open it plainly, then with repair=True.

Two base stores of BASE_MESSAGES messages of two topics in random queues, in 64 KiB segments: one stopped
cleanly, one copied while its writer ran after a flush (a crash). Each trial damages a copy with 1-3 random
corruptions of random files (bit flips, truncation, a zeroed page, an overwritten range, a deleted file,
appended garbage, two ConsumeQueue files swapped (often two of the same name: entries naming another queue's
records), the saved settings damaged, the checkpoint damaged); in a third of the crashed base's trials the
checkpoint is damaged too, so that a crash meets a checkpoint that cannot tell how far the log was flushed.
It asserts:

- opening raises nothing but `StoreError`s, plainly or with repair (a hang is stopped by pytest's timeout);
- no message is ever returned with bytes other than the ones put, nor by a get of another queue;
- a plain open that succeeds keeps every message whose record bytes are intact (`read_at` returns it): no
  damage is taken for the end of the log, whatever happened to the checkpoint;
- a repaired store keeps every intact message below its new end, reopens with a plain open and case CLEAN
  (nothing left to rebuild), takes puts and reopens CLEAN again; its report counts no more messages than lay
  past the cut and at least those a walk from a segment's start reaches, and names the last of them;
- nothing cut by repair is destroyed: every intact message past the cut is in the repair folder, byte for
  byte at its place.

`MQSTORE_LONG_CRASH_SWEEP=1` runs FUZZ_TRIALS_LONG trials instead of FUZZ_TRIALS; MQSTORE_FUZZ_SEED picks the
seed (printed).
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil

import pytest

from mqstore import Message, MessageStore, StoreError
from mqstore.store.recovery import RecoveryCase
from tests.conftest import small_config

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
FUZZ_TRIALS = 40  # per base store, in the default run (about 30 s for both)
FUZZ_TRIALS_LONG = 1500
SEED = int(os.environ.get("MQSTORE_FUZZ_SEED", "20261125"))
BASE_MESSAGES = 1500
TOPICS = ("t", "u")
QUEUES = 3
CHECKPOINT_DAMAGE_SHARE = 1 / 3  # of the crashed base's trials: the checkpoint is damaged as well
CHECKPOINT_DAMAGES = ("truncate", "overwrite", "bit flips", "delete", "append")
SEGMENT = 64 * 1024
PAGE = 4096
DAMAGES = ("bit flips", "truncate", "zero page", "overwrite", "delete", "append", "swap queue files", "settings",
           "checkpoint")

pytestmark = pytest.mark.timeout(3 * 3600 if LONG else 600)


def _config():
    return small_config()


def _body(number: int) -> bytes:
    return b"%05d|" % number + bytes([97 + number % 26]) * (40 + number * 7 % 700)


class Base:
    """A base store and what was put in it: number -> (commitlog offset, record bytes)."""

    def __init__(self, root: pathlib.Path, crashed: bool):
        self.root = root
        self.crashed = crashed
        self.records: dict[int, tuple[int, bytes]] = {}
        self.queues: dict[int, tuple[str, int]] = {}  # number -> (topic, queue id)


def _make_base(root: pathlib.Path, crashed: bool) -> Base:
    base = Base(root, crashed)
    live = root.parent / (root.name + "-live")
    store = MessageStore.open(live, _config())
    try:
        rng = random.Random(BASE_MESSAGES)  # the same placement in both bases
        base.queues = {i: (rng.choice(TOPICS), rng.randrange(QUEUES)) for i in range(BASE_MESSAGES)}
        results = store.put_batch([Message(base.queues[i][0], _body(i), queue_id=base.queues[i][1])
                                   for i in range(BASE_MESSAGES)])
        if crashed:
            store.flush()
            assert store.wait_dispatched(30)
            shutil.copytree(live, root)  # the writer still has it open: an `abort` marker, a crash
    finally:
        store.close()
    if not crashed:
        shutil.copytree(live, root)
    for number, result in enumerate(results):
        segment = root / "commitlog" / f"{result.commitlog_offset - result.commitlog_offset % SEGMENT:020d}"
        with open(segment, "rb") as handle:
            handle.seek(result.commitlog_offset % SEGMENT)
            base.records[number] = (result.commitlog_offset, handle.read(result.size_bytes))
    return base


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz-bases")
    return [_make_base(directory / "clean", False), _make_base(directory / "crashed", True)]


def _files(root: pathlib.Path, part: str) -> list[pathlib.Path]:
    return sorted(p for p in (root / part).rglob("*") if p.is_file())


def _damage(root: pathlib.Path, rng: random.Random, checkpoint: bool = False) -> list[str]:
    """1-3 random corruptions of random files (and one of the checkpoint first, if asked); what was done, for
    the failure message."""
    done = []
    if checkpoint:
        done.append(_damage_file(root, root / "checkpoint", rng.choice(CHECKPOINT_DAMAGES), rng))
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(DAMAGES)
        files = _files(root, "commitlog") + _files(root, "consumequeue")
        if not files:
            break
        path = root / "checkpoint" if kind == "checkpoint" else rng.choice(files)
        if kind == "checkpoint":
            kind = rng.choice(CHECKPOINT_DAMAGES)
        done.append(_damage_file(root, path, kind, rng))
    return done


def _damage_file(root: pathlib.Path, path: pathlib.Path, kind: str, rng: random.Random) -> str:
    """One corruption of one file. A checkpoint is never zeroed whole: all zeros is a valid checkpoint (nothing
    flushed yet, as after a crash before the first flush), which no reader can tell from damage."""
    if not path.exists():
        return f"{kind} {path.relative_to(root)} (missing)"
    size = path.stat().st_size
    if kind == "bit flips" and size:
        data = bytearray(path.read_bytes())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(size)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    elif kind == "truncate":
        os.truncate(path, rng.randrange(size + 1))
    elif kind == "zero page" and size:
        start = rng.randrange(0, size, PAGE)
        with open(path, "r+b") as handle:
            handle.seek(start)
            handle.write(bytes(min(PAGE, size - start)))
    elif kind == "overwrite" and size:
        start = rng.randrange(size)
        with open(path, "r+b") as handle:
            handle.seek(start)
            handle.write(rng.randbytes(min(rng.randint(1, 2 * PAGE), size - start)))
    elif kind == "delete":
        path.unlink()
    elif kind == "append":
        with open(path, "ab") as handle:
            handle.write(rng.randbytes(rng.randint(1, 100)))
    elif kind == "swap queue files":
        queue_files = _files(root, "consumequeue")
        by_name: dict[str, list[pathlib.Path]] = {}
        for queue_file in queue_files:
            by_name.setdefault(queue_file.name, []).append(queue_file)
        shared = [files for files in by_name.values() if len(files) >= 2]
        if shared and rng.random() < 0.5:  # the same file of two queues: entries naming the other's records
            queue_files = rng.choice(shared)
        if len(queue_files) >= 2:
            first, second = rng.sample(queue_files, 2)
            a, b = first.read_bytes(), second.read_bytes()
            first.write_bytes(b)
            second.write_bytes(a)
            path = first
    elif kind == "settings":
        path = root / "config" / "mqstore.json"
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
    return f"{kind} {path.relative_to(root)}"


def _intact(root: pathlib.Path, base: Base) -> dict[int, tuple[int, bytes]]:
    """The messages whose record bytes are still in the damaged store, unchanged, at their place."""
    intact = {}
    opened: dict[int, bytes | None] = {}
    for number, (offset, raw) in base.records.items():
        segment = offset - offset % SEGMENT
        if segment not in opened:
            path = root / "commitlog" / f"{segment:020d}"
            opened[segment] = path.read_bytes() if path.exists() else None
        data = opened[segment]
        position = offset - segment
        if data is not None and data[position : position + len(raw)] == raw:
            intact[number] = (offset, raw)
    return intact


def _check_returned(store, base: Base, failures: list[str], label: str) -> None:
    """No message comes back with other bytes than were put (a get may report damage: a StoreError)."""
    for topic, queue_id in [(topic, queue_id) for topic in TOPICS for queue_id in range(QUEUES)]:
        offset = store.min_offset(topic, queue_id)
        while offset < store.max_offset(topic, queue_id):
            try:
                result = store.get(topic, queue_id, offset, max_count=256)
            except StoreError:
                offset += 1
                continue
            for message in result.messages:
                number = int(message.body[:5])
                if message.body != _body(number) or base.records[number][0] != message.commitlog_offset:
                    failures.append(f"{label}: get returned message {number} with wrong bytes or place")
                elif base.queues[number] != (topic, queue_id):
                    failures.append(f"{label}: get of {topic}/{queue_id} returned message {number} of "
                                    f"{base.queues[number]}")
            if result.next_offset <= offset:
                break
            offset = result.next_offset


def _check_kept(store, intact, below: int, failures: list[str], label: str) -> None:
    for number, (offset, raw) in intact.items():
        if offset + len(raw) > below:
            continue
        try:
            message = store.read_at(offset)
        except StoreError as exc:
            failures.append(f"{label}: intact message {number} at {offset} is lost: {exc}")
            continue
        if message.body != _body(number):
            failures.append(f"{label}: read_at({offset}) returned wrong bytes for message {number}")


def _reachable(intact, base: Base, cut: int) -> list[int]:
    """Commitlog offsets of the intact messages past `cut` that a walk from their segment's start reaches
    (every message before them in their segment is intact)."""
    reachable = []
    broken: set[int] = set()
    for number in sorted(base.records):
        offset = base.records[number][0]
        segment = offset - offset % SEGMENT
        if number not in intact or segment <= cut - cut % SEGMENT:
            broken.add(segment)
        elif offset >= cut and segment not in broken:
            reachable.append(offset)
    return reachable


def _check_repaired(image: pathlib.Path, work: pathlib.Path, base: Base, intact, failures: list[str],
                    label: str) -> str:
    shutil.copytree(image, work)
    try:
        store = MessageStore.open(work, _config(), repair=True)
    except StoreError as exc:
        return f"repair refused: {type(exc).__name__} {exc.rule if hasattr(exc, 'rule') else ''}"
    try:
        report = store.recovery_report
        cut = report.log_end
        _check_returned(store, base, failures, label + " repaired")
        _check_kept(store, intact, cut, failures, label + " repaired")
    finally:
        store.close()
    past = [offset for offset, _ in base.records.values() if offset >= cut]
    reachable = _reachable(intact, base, cut)
    if not len(reachable) <= report.dropped_messages <= len(past):
        failures.append(f"{label}: the report drops {report.dropped_messages} messages; {len(reachable)} intact "
                        f"ones were reachable past the cut at {cut}, {len(past)} lay past it")
    last = max(base.records.values())[0]
    if last in reachable and report.dropped_offset_last != last:
        failures.append(f"{label}: the report's last dropped message is {report.dropped_offset_last}, not {last}")
    for number, (offset, raw) in intact.items():  # nothing cut is destroyed
        if offset < cut:
            continue
        kept = pathlib.Path(report.repair_dir or work) / "commitlog" / f"{offset - offset % SEGMENT:020d}"
        position = offset % SEGMENT
        if not kept.exists() or kept.read_bytes()[position : position + len(raw)] != raw:
            failures.append(f"{label}: intact message {number} at {offset} was cut and not kept in the repair folder")
            break
    try:
        with MessageStore.open(work, _config()) as store:
            if store.recovery_report.cases() != [RecoveryCase.CLEAN]:
                failures.append(f"{label}: the repaired store reopens as {store.recovery_report.cases()}")
            store.put(Message("t", _body(99_999)))
        with MessageStore.open(work, _config()) as store:
            if store.recovery_report.cases() != [RecoveryCase.CLEAN]:
                failures.append(f"{label}: after a put the repaired store reopens as {store.recovery_report.cases()}")
    except StoreError as exc:
        failures.append(f"{label}: the repaired store does not reopen: {exc!r}")
    return f"repaired {report.case}"


def _trial(base: Base, seed: int, work: pathlib.Path, failures: list[str]) -> str:
    rng = random.Random(seed)
    image = work / "image"
    shutil.copytree(base.root, image)
    done = _damage(image, rng, checkpoint=base.crashed and rng.random() < CHECKPOINT_DAMAGE_SHARE)
    label = f"{'crashed' if base.crashed else 'clean'} seed={seed} damage={done}"
    intact = _intact(image, base)
    plain = work / "plain"
    shutil.copytree(image, plain)
    try:
        store = MessageStore.open(plain, _config())
    except StoreError:
        return _check_repaired(image, work / "repaired", base, intact, failures, label)
    try:
        _check_returned(store, base, failures, label)
        _check_kept(store, intact, 1 << 62, failures, label)
        return f"opened {store.recovery_report.case}"
    finally:
        store.close()


@pytest.mark.parametrize("which", ["clean", "crashed"])
def test_damaged_stores_report_or_repair_and_never_lose_intact_messages_silently(bases, tmp_path, which):
    base = bases[["clean", "crashed"].index(which)]
    trials = FUZZ_TRIALS_LONG if LONG else FUZZ_TRIALS
    failures: list[str] = []
    outcomes: dict[str, int] = {}
    for number in range(trials):
        seed = SEED * 10_000 + number * 2 + (which == "crashed")
        work = tmp_path / f"trial{number}"
        outcome = _trial(base, seed, work, failures)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        shutil.rmtree(work, ignore_errors=True)
    print(f"[corruption fuzz {which}] seed={SEED} trials={trials} outcomes={dict(sorted(outcomes.items()))} "
          f"failures={len(failures)}")
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:8])
    assert any(o.startswith("repaired") for o in outcomes) and any(o.startswith("opened") for o in outcomes)
