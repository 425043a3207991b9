"""Crash images: a store written under the FlushRecorder, crashed at many moments, each crash replayed as disks
can leave it (tests/crash/simulator.py), then reopened and verified (tests/crash/checks.py).

Each run writes with two producer threads (put and put_batch, topics x queues, bodies 0-5 KB, keys), 64 KiB
segments, small ConsumeQueue and index files (so all of them roll), short flush intervals, and a store clock
that advances a fixed step per put (so the checkpoint's times pick where recovery starts scanning). While the
producers run, the main thread takes live snapshots; a sample of them are the crash points. Each crash point
becomes one image per policy (live, lost, mixed, ordered). Then a second round: one crashed image is reopened
and written to under a new recorder, and crashed again (recovery's own writes must be durable too).

What must survive: SYNC, every put that returned PUT_OK before the crash point; ASYNC, every put acknowledged
before a store.flush() that returned before it; under the "live" policy (a process kill: the page cache
survives), every acknowledged put in both modes. Round 2 adds every message round 2's open kept.

Run with `pytest -s` to see the counts. `MQSTORE_LONG_CRASH_SWEEP=1` runs the long sweep (more crash points and
images per point, and runs added round after round until it has made IMAGES_LONG_MIN images: how many crash
points a run yields follows the writer's timing, so the count of runs does not fix the count of images; tens of
minutes). It fails, with its counts, if the machine is too slow to make them within LONG_SWEEP_SECONDS_MAX.

The sweep comes in two parts, each a module fixture the tests below read: `first` (round 0, in `make test`) and
`rest` (the later rounds, marked long: `make test-long`). A run's seed depends on its round and scenario only, so
the two parts together are the RUNS rounds of a single sweep; the long sweep adds its rounds to `rest`.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
import zlib

import pytest
from mqstore.flush.modes import FlushMode

from mqstore import MessageStore, PutStatus
from tests.conftest import StepClock, small_config
from tests.crash.checks import (
    RETENTION_OFF,
    Acked,
    body_seq,
    planned_message,
    read_segments,
    segments_from_files,
    verify_reopened,
    walk_log,
)
from tests.crash.simulator import PAGE_SIZE_BYTES, POLICIES, FlushRecorder, ImageStats, image_files, write_tree

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
RUNS = 9 if LONG else 2  # per scenario, at least (about 4 x 9 x 20 points x 8 x 2 rounds = 11,500 images when long)
QUICK_RUNS = 1  # the rounds of the `first` part, in `make test`
IMAGES_LONG_MIN = 10_000  # what the long sweep makes: it adds rounds of runs (one per scenario) until it has them
RUNS_LONG_MAX = 60  # per scenario: the long sweep's bound on rounds (a run makes 1 to 2 x 22 x 8 images)
LONG_SWEEP_SECONDS_MAX = 2.5 * 3600  # no round starts after this: the sweep then fails with its counts
OPS_PER_RUN = 600 if LONG else 320  # puts (or batches) over both producers
POINTS_PER_RUN = 20 if LONG else 6
EXTRA_MIXED_IMAGES = 4 if LONG else 1  # more "mixed" images per point, each its own random choices
FAILING_IMAGES_KEPT = 5
CLOCK_STEPS_MS = (0, 20, 100, 400)  # 0: the real clock
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20240601"))
# The sweep dispatches in the writer's thread: the recorder sees this process's flushes only (a dispatch child's
# queue flushes would be out of its sight), and recovery, which the images test, runs in the writer before any
# child starts. A writer killed with its dispatch child: tests/crash/test_kill_writer.py, tests/interop/.
IN_PROCESS = dict(dispatch_process=False)
LONG_SWEEP_TIMEOUT_S = 3 * 3600  # the sweep's fixture runs inside the first test: pytest's 600 s is for one test

pytestmark = pytest.mark.timeout(LONG_SWEEP_TIMEOUT_S if LONG else 600)


class Workload:
    """Producers putting planned messages; counts what was acknowledged and what a completed flush covers."""

    def __init__(self, seq_start: int, keys: bool):
        self.keys = keys
        self.acked: list[Acked] = []
        self.flushed_acked = 0
        self.errors: list[BaseException] = []
        self._next = seq_start
        self._lock = threading.Lock()

    def counters(self) -> tuple[int, int]:
        return len(self.acked), self.flushed_acked

    def _seqs(self, count: int) -> list[int]:
        with self._lock:
            first = self._next
            self._next += count
        return list(range(first, first + count))

    def produce(self, store, count: int, rng: random.Random, flush_every: int) -> None:
        try:
            for step in range(count):
                seqs = self._seqs(rng.randint(2, 4) if rng.random() < 0.1 else 1)
                messages = [planned_message(seq, keys=self.keys) for seq in seqs]
                results = store.put_batch(messages) if len(messages) > 1 else [store.put(messages[0])]
                for seq, message, result in zip(seqs, messages, results):
                    if result.status is PutStatus.PUT_OK:
                        self.acked.append(Acked(seq, message.topic, message.queue_id, result.queue_offset,
                                                result.commitlog_offset, result.size_bytes))
                if flush_every and step % flush_every == flush_every - 1:
                    before = len(self.acked)
                    store.flush()
                    self.flushed_acked = max(self.flushed_acked, before)
                if rng.random() < 0.05:
                    time.sleep(rng.uniform(0.001, 0.004))  # let the flush services run
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.errors.append(exc)


def run_round(root: str, config, rng: random.Random, workload: Workload):
    """Open (recovering) and write under a recorder; returns (recorder, crash points, records kept by the open)."""
    with FlushRecorder(root) as recorder:
        store = MessageStore.open(root, config)
        kept = walk_log(read_segments(root)).records
        points = [recorder.snapshot(workload.counters, "after open")]
        producers = 2
        flush_every = rng.choice((10, 25, 60)) if config.flush_mode is FlushMode.ASYNC else 0
        threads = [threading.Thread(target=workload.produce,
                                    args=(store, OPS_PER_RUN // producers, random.Random(rng.random()),
                                          flush_every if index == 0 else 0))
                   for index in range(producers)]
        for thread in threads:
            thread.start()
        sampled, seen = [], 0
        while any(thread.is_alive() for thread in threads):
            time.sleep(rng.uniform(0, 0.006))
            point = recorder.snapshot(workload.counters, f"during writes #{seen}")
            seen += 1
            if len(sampled) < POINTS_PER_RUN:
                sampled.append(point)
            elif (slot := rng.randrange(seen)) < POINTS_PER_RUN:
                sampled[slot] = point
        for thread in threads:
            thread.join()
        points += sampled
        points.append(recorder.snapshot(workload.counters, "writers idle"))
        store.close()
    if workload.errors:
        raise workload.errors[0]
    return recorder, points, kept


def _kept_as_acked(records) -> list[Acked]:
    return [Acked(body_seq(r.body), r.topic, r.queue_id, r.queue_offset, r.offset, len(r.raw)) for r in records]


class Sweep:
    """Counts and failures of one scenario, printed at the end."""

    def __init__(self, name: str, failures_dir):
        self.name = name
        self.failures_dir = failures_dir
        self.failures: list[str] = []
        self.runs = self.points = self.images = 0
        self.cases: dict[str, int] = {}
        self.choices: dict[str, int] = {}
        self.files_dropped = 0
        self.must_have = 0
        self.kept_images: list[str] = []

    def summary(self) -> str:
        return (f"[crash images {self.name}] runs={self.runs} crash_points={self.points} images={self.images} "
                f"acked_checked={self.must_have} unflushed_pages={self.choices} files_dropped={self.files_dropped} "
                f"recovery_cases={dict(sorted(self.cases.items()))} failures={self._failure_counts()}")

    def _failure_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for kind, _ in self.failures:
            counts[kind] = counts.get(kind, 0) + 1
        return counts


def verify_points(sweep: Sweep, recorder, points, config, run_seed: int, base_must: list[Acked],
                  workload: Workload, work_dir: str, round_name: str, keys: bool):
    """Build and verify the images of every crash point; returns [(point, policy, image seed, passed)]."""
    verified = []
    for point_index, point in enumerate(points):
        sweep.points += 1
        durable = recorder.durable_pages(point)
        live = walk_log(segments_from_files(point.files))
        policies = list(POLICIES) + ["mixed"] * EXTRA_MIXED_IMAGES
        for policy_index, policy in enumerate(policies):
            image_seed = zlib.crc32(f"{run_seed}/{round_name}/{point_index}/{policy_index}".encode())
            stats = ImageStats()
            files = image_files(recorder, point, durable, random.Random(image_seed), policy, stats)
            image_dir = os.path.join(work_dir, f"image-{round_name}-{point_index}-{policy_index}")
            write_tree(image_dir, files)
            if policy == "live" or config.flush_mode is FlushMode.SYNC:
                must = workload.acked[: point.acked_count]
            else:
                must = workload.acked[: point.flushed_acked_count]
            must = base_must + must
            label = (f"{sweep.name} seed={run_seed} {round_name} point={point_index} ({point.label}) "
                     f"policy={policy} image_seed={image_seed}")
            outcome = verify_reopened(image_dir, config, must, live=live, keys=keys,
                                      rng=random.Random(image_seed), label=label)
            sweep.images += 1
            sweep.must_have += len(must)
            sweep.files_dropped += stats.files_dropped
            for choice, count in stats.choices.items():
                sweep.choices[choice] = sweep.choices.get(choice, 0) + count
            if outcome.case:
                sweep.cases[outcome.case] = sweep.cases.get(outcome.case, 0) + 1
            if outcome.failures:
                kinds_seen = set()
                for kind, message in outcome.failures:  # the first of each kind: the rest follow from it
                    if kind not in kinds_seen:
                        kinds_seen.add(kind)
                        sweep.failures.append((kind, message))
                if len(sweep.kept_images) < FAILING_IMAGES_KEPT:
                    kept = os.path.join(sweep.failures_dir, os.path.basename(image_dir))
                    write_tree(kept, files)  # the image as the crash left it, before recovery touched it
                    sweep.kept_images.append(kept)
            shutil.rmtree(image_dir, ignore_errors=True)
            verified.append((point, policy, image_seed, files, not outcome.failures))
    return verified


def run_scenario(sweep: Sweep, mode: FlushMode, index: bool, run_seed: int, work_dir: str) -> None:
    rng = random.Random(run_seed)
    config = small_config(
        flush_mode=mode, index_enabled=index, consume_queue_entries_per_file=rng.choice((64, 410)),
        index_entry_count_max=rng.choice((64, 256)), preallocate_segments=rng.choice((True, False)),
        flush_interval_ms=rng.choice((1, 5, 20)), flush_least_pages=rng.choice((0, 1, 4)),
        flush_thorough_interval_ms=rng.choice((10, 200)), flush_consume_queue_interval_ms=rng.choice((1, 5, 50)),
        **RETENTION_OFF, **IN_PROCESS)
    with StepClock(rng.choice(CLOCK_STEPS_MS)):
        root = os.path.join(work_dir, "round1")
        workload = Workload(0, keys=True)
        recorder, points, _ = run_round(root, config, rng, workload)
        sweep.runs += 1
        verified = verify_points(sweep, recorder, points, config, run_seed, [], workload, work_dir, "round1", True)
        shutil.rmtree(root, ignore_errors=True)
        candidates = [entry for entry in verified if entry[4] and entry[1] in ("mixed", "ordered", "lost")]
        if not candidates:
            return
        _, _, _, files, _ = rng.choice(candidates)
        root2 = os.path.join(work_dir, "round2")
        write_tree(root2, files)
        workload2 = Workload(1_000_000, keys=True)
        recorder2, points2, kept = run_round(root2, config, rng, workload2)
        verify_points(sweep, recorder2, points2, config, run_seed, _kept_as_acked(kept), workload2, work_dir,
                      "round2", True)
        shutil.rmtree(root2, ignore_errors=True)


SCENARIOS = [(FlushMode.SYNC, False), (FlushMode.SYNC, True), (FlushMode.ASYNC, False), (FlushMode.ASYNC, True)]


done_seconds: list[float] = []  # the sweep's wall time, for test_the_sweep_ran's message


PARTS = [pytest.param(range(QUICK_RUNS), id="first"),
         pytest.param(range(QUICK_RUNS, RUNS), id="rest", marks=pytest.mark.long)]


@pytest.fixture(scope="module", params=PARTS)
def sweeps(request, tmp_path_factory) -> list[Sweep]:
    """Every scenario's runs of one part of the sweep, crash points and images, verified once; the tests below read
    the outcome. Runs go in rounds, one run of each scenario a round: the part's rounds, and when long, `rest` adds
    more until IMAGES_LONG_MIN images are made (at most RUNS_LONG_MAX rounds, none started after
    LONG_SWEEP_SECONDS_MAX)."""
    rounds = request.param
    done, bases, seconds = [], [], []
    for mode, index in SCENARIOS:
        name = f"{mode.value}{'+index' if index else ''}"
        bases.append(tmp_path_factory.mktemp(f"crash-images-{name}"))
        done.append(Sweep(name, str(bases[-1] / "failing-images")))
        seconds.append(0.0)
    started = time.perf_counter()
    run = rounds.start
    adding = LONG and rounds.start > 0
    while run < rounds.stop or (adding and sum(sweep.images for sweep in done) < IMAGES_LONG_MIN
                                and run < RUNS_LONG_MAX and time.perf_counter() - started < LONG_SWEEP_SECONDS_MAX):
        for scenario_index, (mode, index) in enumerate(SCENARIOS):
            run_started = time.perf_counter()
            run_seed = SEED * 1000 + run * 10 + scenario_index
            run_dir = bases[scenario_index] / f"run{run}"
            run_scenario(done[scenario_index], mode, index, run_seed, str(run_dir))
            shutil.rmtree(run_dir, ignore_errors=True)
            seconds[scenario_index] += time.perf_counter() - run_started
        run += 1
    for sweep, spent in zip(done, seconds):
        print(sweep.summary() + f" seconds={spent:.1f}")
        if sweep.kept_images:
            print(f"[crash images {sweep.name}] failing images kept under {sweep.failures_dir}")
    done_seconds.append(time.perf_counter() - started)
    return done


def _failures(sweeps, *kinds) -> list[str]:
    return [message for sweep in sweeps for kind, message in sweep.failures if kind in kinds]


def _assert_none(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} images fail, first ones:\n" + "\n".join(failures[:6])


def test_the_sweep_ran(sweeps, request):
    rounds = request.node.callspec.params["sweeps"]
    total = sum(sweep.images for sweep in sweeps)
    print(f"[crash images] total: {sum(s.runs for s in sweeps)} runs, {sum(s.points for s in sweeps)} crash points, "
          f"{total} images, {sum(s.must_have for s in sweeps)} acknowledged messages checked")
    assert all(sweep.runs >= len(rounds) for sweep in sweeps)
    assert total >= len(SCENARIOS) * len(rounds) * POINTS_PER_RUN
    if LONG and rounds.start > 0:
        assert total >= IMAGES_LONG_MIN, (
            f"the long sweep made {total} of its {IMAGES_LONG_MIN} images in {done_seconds[-1]:.0f} s "
            f"({sum(s.runs for s in sweeps)} runs): the machine is too slow (or too loaded) to make them within "
            f"LONG_SWEEP_SECONDS_MAX = {LONG_SWEEP_SECONDS_MAX:.0f} s or RUNS_LONG_MAX = {RUNS_LONG_MAX} rounds")
    assert all(sweep.cases.get("CRASH_TORN_TAIL") for sweep in sweeps)  # the images do tear the log


def test_the_log_is_a_prefix_of_what_was_written_and_nothing_past_its_end_is_visible(sweeps):
    _assert_none(_failures(sweeps, "log"))


def test_every_crash_image_opens_without_repair(sweeps):
    _assert_none(_failures(sweeps, "open"))


def test_acknowledged_messages_survive_byte_identical(sweeps):
    _assert_none(_failures(sweeps, "acked"))


def test_consume_queues_agree_with_the_commitlog(sweeps):
    _assert_none(_failures(sweeps, "queues"))


def test_the_store_is_writable_and_clean_after_recovery(sweeps):
    _assert_none(_failures(sweeps, "after recovery"))


def test_the_index_agrees_with_the_commitlog(sweeps):
    """Every message's keys are found after recovery: lost, stale or torn index pages in any file are cut and
    re-dispatched (rows INDEX_CUT, INDEX_INCONSISTENT), never left as keys silently missing."""
    _assert_none(_failures(sweeps, "index"))


# --- Crash images the sweep found, built on purpose --------------------------------------------------------------
# Each is one image the sweep above produced at random, made again deterministically so that it fails (or passes)
# on every run. The flush services are put to sleep (hour-long intervals): only store.flush() makes bytes durable.

def _quiet_config(**overrides):
    settings = dict(flush_mode=FlushMode.ASYNC, flush_interval_ms=3_600_000, flush_thorough_interval_ms=86_400_000,
                    flush_consume_queue_interval_ms=3_600_000, **RETENTION_OFF)
    settings.update(overrides)
    return small_config(**settings)


def _acked(store, seqs, keys=True) -> list[Acked]:
    acked = []
    for seq in seqs:
        message = planned_message(seq, keys=keys)
        result = store.put(message)
        assert result.status is PutStatus.PUT_OK
        acked.append(Acked(seq, message.topic, message.queue_id, result.queue_offset, result.commitlog_offset,
                           result.size_bytes))
    return acked


def _assert_recovers(image_dir, config, must, live_files, keys=True):
    outcome = verify_reopened(str(image_dir), config, must, live=walk_log(segments_from_files(live_files)),
                              keys=keys, label=image_dir.name)
    assert not outcome.failures, "\n".join(message for _, message in outcome.failures)


def test_found_lost_first_pages_and_an_empty_checkpoint_scan_from_the_first_segment(tmp_path):
    """Nothing was flushed yet (the checkpoint is all zeros) and the first page of segments 0 and 1 never reached
    the disk, while later pages did. The log's valid prefix is empty; recovery must start at the first segment."""
    config = _quiet_config()
    root = tmp_path / "store"
    with FlushRecorder(str(root)) as recorder:
        store = MessageStore.open(root, config)
        acked = _acked(store, range(160), keys=False)
        assert acked[-1].commitlog_offset > 2 * config.segment_size_bytes
        assert store.wait_dispatched(10)
        point = recorder.snapshot()
        store.close()
    files = dict(point.files)
    assert files["checkpoint"] == bytes(4096)
    for base in (0, config.segment_size_bytes):
        name = os.path.join("commitlog", f"{base:020d}")
        files[name] = bytes(4096) + files[name][4096:]
    write_tree(str(tmp_path / "image"), files)
    _assert_recovers(tmp_path / "image", config, [], point.files, keys=False)


def test_found_a_queue_rebuilt_by_recovery_survives_a_second_crash(tmp_path):
    """Recovery rebuilt a damaged ConsumeQueue; the process died again before the rebuilt queue was flushed. The
    checkpoint still says every queue entry up to its time is on disk, so the next recovery must not trust it for
    the rebuilt queue."""
    config = _quiet_config()
    with StepClock(100):  # 100 ms per put: the checkpoint's time lies well past the first segments
        live = tmp_path / "live"
        with MessageStore.open(live, config) as store:
            acked = _acked(store, range(240))
            assert store.wait_dispatched(10)  # before the flush: the checkpoint's queue time covers every entry
            store.flush()
            shutil.copytree(live, tmp_path / "first-crash")  # a kill: the abort marker stays
        queue_file = tmp_path / "first-crash" / "consumequeue" / "t" / "1" / f"{0:020d}"
        data = bytearray(queue_file.read_bytes())
        data[3 * 20 : 3 * 20 + 8] = (10**12).to_bytes(8, "big")  # damage: entry 3 jumps far ahead
        queue_file.write_bytes(bytes(data))
        with FlushRecorder(str(tmp_path / "first-crash")) as recorder:
            store = MessageStore.open(tmp_path / "first-crash", config)
            assert store.recovery_report.queues_rebuilt == ["t/1"]
            assert store.recovery_report.scan_start > 0
            point = recorder.snapshot()  # the second crash, before anything was flushed again
            store.close()
        files = image_files(recorder, point, recorder.durable_pages(point), random.Random(1), "lost")
        write_tree(str(tmp_path / "second-crash"), files)
        _assert_recovers(tmp_path / "second-crash", config, acked, point.files)


def test_found_an_index_file_whose_header_never_reached_the_disk_does_not_index_everything_twice(tmp_path):
    """The index rolled to a new file (its header, inherited from the full file before it, is written with
    write() and never synced) and power was lost before the next index flush: the new file is all zeros."""
    config = _quiet_config(index_enabled=True, index_entry_count_max=64)
    root = tmp_path / "store"
    with FlushRecorder(str(root)) as recorder:
        store = MessageStore.open(root, config)
        acked = _acked(store, range(100))
        assert store.wait_dispatched(10)
        store.flush()
        files_before = set(os.listdir(root / "index"))
        acked += _acked(store, range(100, 140))
        assert store.wait_dispatched(10)
        point = recorder.snapshot(lambda: (len(acked), 100))
        store.close()
    new_files = sorted(set(name for name in os.listdir(root / "index")) - files_before)
    assert new_files, "the index did not roll"
    files = image_files(recorder, point, recorder.durable_pages(point), random.Random(1), "lost")
    for name in new_files:  # their directory entries survived; their pages did not
        files[os.path.join("index", name)] = bytes(len(point.files[os.path.join("index", name)]))
    write_tree(str(tmp_path / "image"), files)
    _assert_recovers(tmp_path / "image", config, acked[:100], point.files)


def _tail_straddles(offset: int, message) -> bool:
    """Whether the record of `message` at `offset` has its body before a page boundary and properties after it."""
    properties = len(f"TAGS\x01{message.tags}\x02") if message.tags else 0
    properties += len(f"KEYS\x01{' '.join(message.keys)}\x02") if message.keys else 0
    body_end = offset + 88 + len(message.body)
    record_end = body_end + 1 + len(message.topic) + 2 + properties
    boundary = record_end // PAGE_SIZE_BYTES * PAGE_SIZE_BYTES
    return properties > 4 and body_end + 1 + len(message.topic) + 2 < boundary < record_end - 2 and \
        offset // (64 * 1024) == (record_end + 8) // (64 * 1024)


def test_found_a_record_whose_last_page_was_lost_is_not_taken_back(tmp_path):
    """A record's header and body lie in one page, its topic and properties run into the next page, which never
    reached the disk (zeros). BODYCRC covers the body only: recovery must still not keep that record."""
    config = _quiet_config()
    root = tmp_path / "store"
    with FlushRecorder(str(root)) as recorder:
        store = MessageStore.open(root, config)
        acked = _acked(store, range(30))
        store.flush()
        end = acked[-1].commitlog_offset + acked[-1].size
        seq = next(s for s in range(1000, 100_000) if _tail_straddles(end, planned_message(s)))
        torn = _acked(store, [seq])[0]
        assert torn.commitlog_offset == end
        assert store.wait_dispatched(10)
        point = recorder.snapshot()
        store.close()
    files = dict(point.files)
    boundary = (end + torn.size) // PAGE_SIZE_BYTES * PAGE_SIZE_BYTES  # the page the record's tail lies in
    name = os.path.join("commitlog", f"{end - end % config.segment_size_bytes:020d}")
    position = boundary % config.segment_size_bytes
    files[name] = files[name][:position] + bytes(PAGE_SIZE_BYTES) + files[name][position + PAGE_SIZE_BYTES:]
    write_tree(str(tmp_path / "image"), files)
    _assert_recovers(tmp_path / "image", config, acked, point.files, keys=True)
