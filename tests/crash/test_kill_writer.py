"""kill -9 of a writer process at random moments, many times over, each kill followed by a full verification.

A writer (tests/crash/writer_process.py) opens the store, recovering it from the previous kill, and puts
planned messages, printing an ACK line after each put returns PUT_OK and, in ASYNC mode, a FLUSHED line after
each store.flush() returns. The test kills it with SIGKILL at a random moment (during start-up and recovery,
or after a random number of acknowledgements), reads everything it printed, copies the store (the copy is
verified; the killed original is what the next writer recovers) and checks with tests/crash/checks.py:

  * SYNC: every put acknowledged by any writer so far is in the log, byte-identical, at its offsets;
  * ASYNC: every put acknowledged before a FLUSHED line is there; and since a kill leaves the page cache to the
    kernel, every acknowledged put is (the stronger rule, asserted separately);
  * the log holds nothing but planned messages (per writer thread, a run of consecutive seqs from its first), queue
    offsets are dense, every ConsumeQueue reads back as the log's messages, the index finds kept messages,
    a put after recovery works, and a second open is CLEAN.

Five series: SYNC; ASYNC with the index; ASYNC with the index and dispatch_process=True, whose dispatch child
outlives the killed writer for a moment (the next writer's open stops it before recovery, and a copy being
verified is no store of that child's); and SYNC and ASYNC with the index again with a writer putting from 4
threads, whose puts meet at the writer lock (commitlog/handoff.py: one thread appends the others' puts, each
acknowledged by its own thread). Every KILL_STORE_TRIALS trials the store starts afresh.
`MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials.
Run with `pytest -s` to see the counts.

The series come in two parts, each a module fixture the tests below read: `first` (SYNC, and ASYNC with the index
from 4 threads: both modes, the index and the writer lock's hand-off, in `make test`) and `rest` (the other three,
marked long: `make test-long`). Each series keeps its seed and its trials, so the parts together are the five
series as one run makes them.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.crash.checks import Acked, body_seq, lost_messages, verify_reopened
from tests.crash.writer_process import GENERATION_SEQ_STRIDE, THREAD_SEQ_STRIDE, kill_config

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS_PER_MODE = 200 if LONG else 10  # 5 series: the long sweep makes 1,000 kills
LONG_SWEEP_TIMEOUT_S = 3 * 3600  # the series run in a fixture, inside the first test: pytest's 600 s is for one test

pytestmark = pytest.mark.timeout(LONG_SWEEP_TIMEOUT_S if LONG else 600)
KILL_STORE_TRIALS = 10  # trials on one store before a fresh one
ACKS_BEFORE_KILL_MAX = 400
EARLY_KILL_PROBABILITY = 0.2  # kill at a random time after spawn (start-up, recovery), not after acks
WAIT_FOR_ACKS_S = 30.0
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240601"))
WRITER = Path(__file__).resolve().parent / "writer_process.py"
THREADED_WRITER_THREADS = 4  # the series whose writer puts from several threads


@dataclass
class KillSeries:
    mode: str
    index: bool
    process: bool = False  # dispatch_process=True: the writer's dispatch child survives it for a moment
    threads: int = 1  # producer threads in the writer (puts meet at the writer lock; one appends the others')
    trials: int = 0
    early_kills: int = 0
    acks: int = 0
    acked_checked: int = 0
    cases: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)  # (kind, message)

    @property
    def label(self) -> str:
        return (self.mode + ("+index" if self.index else "") + ("+dispatch process" if self.process else "")
                + (f"+{self.threads} threads" if self.threads > 1 else ""))

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for kind, _ in self.failures:
            kinds[kind] = kinds.get(kind, 0) + 1
        return (f"[kill -9 {self.label}] trials={self.trials} "
                f"early_kills={self.early_kills} acks_read={self.acks} acked_checked={self.acked_checked} "
                f"recovery_cases={dict(sorted(self.cases.items()))} failures={kinds}")


def _read_lines(stream, lines: list[str]) -> None:
    for raw in stream:
        if raw.endswith(b"\n"):
            lines.append(raw.decode().rstrip("\n"))


def _parse(lines: list[str]) -> tuple[list[Acked], int]:
    """The ACK lines as Acked, and how many of them a FLUSHED line covers (the last one's n)."""
    acked, flushed = [], 0
    for line in lines:
        parts = line.split()
        if parts[0] == "ACK":
            seq, topic, queue_id, queue_offset, offset, size = parts[1:]
            acked.append(Acked(int(seq), topic, int(queue_id), int(queue_offset), int(offset), int(size)))
        elif parts[0] == "FLUSHED":
            flushed = int(parts[1])
    return acked, flushed


def _kill_one(root: Path, series: KillSeries, generation: int, rng: random.Random, log_dir: Path):
    command = [sys.executable, str(WRITER), str(root), "--mode", series.mode, "--generation", str(generation)]
    if series.index:
        command.append("--index")
    if series.process:
        command.append("--dispatch-process")
    if series.threads > 1:
        command += ["--threads", str(series.threads)]
    if series.mode == "ASYNC":
        command += ["--flush-every", str(rng.choice((7, 20, 50)))]
    stderr_path = log_dir / f"writer-{series.mode}-{generation}.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    if rng.random() < EARLY_KILL_PROBABILITY:
        series.early_kills += 1
        time.sleep(rng.uniform(0.05, 0.6))
    else:
        wanted = rng.randint(1, ACKS_BEFORE_KILL_MAX)
        wait_until(lambda: process.poll() is not None or sum(line.startswith("ACK") for line in lines) >= wanted,
                   WAIT_FOR_ACKS_S, interval_s=0.001)  # a timeout is no failure: the kill comes all the same
        time.sleep(rng.uniform(0, 0.005))  # a random kill point after those acknowledgements
    exited = process.poll()
    if exited is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    reader.join(10)
    process.stdout.close()
    return exited, lines, stderr_path


def run_series(mode: str, index: bool, base: Path, rng: random.Random, process: bool = False,
               threads: int = 1) -> KillSeries:
    series = KillSeries(mode, index, process, threads)
    config = kill_config(mode, index, process)
    root = None
    acked_all: list[Acked] = []
    flushed_all: list[Acked] = []
    for trial in range(TRIALS_PER_MODE):
        if trial % KILL_STORE_TRIALS == 0:
            root = base / f"store-{trial}"
            acked_all, flushed_all = [], []
        generation = trial % KILL_STORE_TRIALS + 1
        exited, lines, stderr_path = _kill_one(root, series, generation, rng, base)
        series.trials += 1
        label = f"{series.label} trial={trial} generation={generation}"
        if exited is not None:
            tail = stderr_path.read_text()[-600:]
            series.failures.append(("open", f"{label}: the writer exited by itself with {exited}: {tail}"))
        acked, flushed = _parse(lines)
        series.acks += len(acked)
        acked_all += acked
        flushed_all += acked[:flushed]
        must = acked_all if mode == "SYNC" else flushed_all
        if not root.exists():  # killed before it made the store's directory
            assert not acked_all
            continue
        copy = base / f"verify-{trial}"
        shutil.copytree(root, copy)
        outcome = verify_reopened(str(copy), config, must, keys=True, rng=random.Random(trial), label=label)
        series.acked_checked += len(must)
        if outcome.case:
            series.cases[outcome.case] = series.cases.get(outcome.case, 0) + 1
        series.failures += outcome.failures
        if outcome.walk is not None:
            _check_generations(outcome.walk, series, label)
            if mode == "ASYNC":
                lost = lost_messages(outcome.walk, acked_all)
                if lost:
                    series.failures.append(("page cache", f"{label}: {len(lost)} acknowledged messages lost by a "
                                            f"kill (no power loss), first seq {lost[0].seq}"))
        shutil.rmtree(copy, ignore_errors=True)
    return series


def _check_generations(walk, series: KillSeries, label: str) -> None:
    """Each writer thread's messages in the log are consecutive seqs from its first (a thread has one put at a
    time), and writers follow each other: no message of an earlier writer after one of a later writer."""
    next_of_thread: dict[int, int] = {}
    generation = 0
    for record in walk.records:
        seq = body_seq(record.body)
        thread = seq // THREAD_SEQ_STRIDE
        expected = next_of_thread.get(thread, thread * THREAD_SEQ_STRIDE)
        if seq != expected or seq // GENERATION_SEQ_STRIDE < generation:
            series.failures.append(("log", f"{label}: message {seq} where {expected} was next of its thread "
                                    f"(writer {seq // GENERATION_SEQ_STRIDE} after writer {generation})"))
            return
        next_of_thread[thread] = seq + 1
        generation = seq // GENERATION_SEQ_STRIDE


SERIES = (  # (mode, index, dispatch process, writer threads, part); a series' seed is SEED + its place here
    ("SYNC", False, False, 1, "first"), ("ASYNC", True, False, 1, "rest"), ("ASYNC", True, True, 1, "rest"),
    ("SYNC", False, False, THREADED_WRITER_THREADS, "rest"), ("ASYNC", True, False, THREADED_WRITER_THREADS, "first"))
PARTS = [pytest.param("first"), pytest.param("rest", marks=pytest.mark.long)]


@pytest.fixture(scope="module", params=PARTS)
def kill_series(request, tmp_path_factory) -> list[KillSeries]:
    done = []
    for index, (mode, with_index, process, threads, part) in enumerate(SERIES):
        if part != request.param:
            continue
        base = tmp_path_factory.mktemp(f"kill-{mode}")
        started = time.perf_counter()
        series = run_series(mode, with_index, base, random.Random(SEED + index), process, threads)
        print(series.summary() + f" seconds={time.perf_counter() - started:.1f}")
        done.append(series)
    return done


def _failures(series_list, mode, *kinds):
    return [message for series in series_list if series.mode == mode
            for kind, message in series.failures if kind in kinds]


def _assert_none(failures):
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:6])


def test_the_kills_ran(kill_series):
    print(f"[kill -9] total: {sum(s.trials for s in kill_series)} trials, "
          f"{sum(s.acked_checked for s in kill_series)} acknowledged messages checked")
    assert {series.mode for series in kill_series} == {"SYNC", "ASYNC"}  # each part has both
    for series in kill_series:
        assert series.trials == TRIALS_PER_MODE and series.acks > 0


def test_sync_kill_loses_nothing_acknowledged(kill_series):
    _assert_none(_failures(kill_series, "SYNC", "acked"))


def test_async_kill_loses_nothing_acknowledged_before_a_completed_flush(kill_series):
    _assert_none(_failures(kill_series, "ASYNC", "acked"))


def test_async_kill_loses_nothing_the_page_cache_held(kill_series):
    _assert_none(_failures(kill_series, "ASYNC", "page cache"))


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_killed_store_reopens_consistent(kill_series, mode):
    _assert_none(_failures(kill_series, mode, "open", "log", "queues", "index", "after recovery"))
