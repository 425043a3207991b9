"""The tier's uploader in a process of its own (`StoreConfig.tier_upload_process=True`).

Run as a thread of the writer, the uploader cost puts a quarter of their rate, while the same reads, CRCs and
writes of the same segments done by another process cost them nothing measurable (docs/tier.md, "What it costs";
bench/results/tier_upload_long.md). So the writer starts this module's `main` in a new interpreter, which runs the
same TierUploader (mqstore/tier/uploader.py) over the store's files: rounds, read-backs, manifest, retries. The
child opens no part of the store; it lists the CommitLog's segment files and preads them, as the thread does.

The two processes talk through `config/tier_upload_process`, WORDS native 8-byte integers both map (see
consumequeue/mark.py; each word written by one side only):
- the writer publishes every PUBLISH_S how far the log is sealed (written, flushed and dispatched: SEALED_END) and
  its readable end, and raises NUDGE to have a round start now (seal_segment, wait_tiered) and STOP at close;
- the child publishes the manifest's generation after each round that wrote one. The writer then loads that
  manifest from the tier, once a generation, for its reads and retention: nothing leaves local disk that the
  tier's own manifest does not list;
- the child writes its figures (stats()["tier"]: objects, bytes, failures, the last error, a refusal, CPU by
  phase) to `config/tier_upload_status.json`, replaced whole, and raises STATUS each time.

The tier's URI, which may carry credentials, reaches the child on its standard input, never its command line.
The child stops when the writer asks (after the object in flight; nothing of an unfinished round is listed), or
by itself within WATCH_S when the writer's process is gone; the next writer to open the store kills a child a
killed writer left behind before recovery (as for the dispatch process). A child that dies is started again
after the uploader's backoff, and counted as a failure; one that refused the tier (another store's) stays
stopped, with the reason in stats().
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import StoreError, StoreIOError
from mqstore.consumequeue.mark import MappedWords, child_environment, log_tail, stop_leftover_child
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.manifest import Manifest
from mqstore.tier.uploader import ERROR_TEXT_MAX, TIER_BACKOFF_FIRST_S, TIER_STOP_WAIT_S, TierUploader, tier_lag

log = logging.getLogger(__name__)

CONTROL_FILE_NAME = "tier_upload_process"
STATUS_FILE_NAME = "tier_upload_status.json"
LOG_FILE_NAME = "tier_upload_process.log"
WORDS = 10
# The words (index: meaning; who writes it).
CHILD_PID = 0  # the child's process id; the child
STATE = 1  # STARTING, RUNNING, STOPPED, FAILED or REFUSED; the child
SEALED_END = 2  # every segment ending at or below it is written, flushed and dispatched; the writer
READABLE_END = 3  # the log's readable end; the writer
NUDGE = 4  # raised by one for each round asked for now; the writer
STOP = 5  # 1: end after the object in flight and exit; the writer
GENERATION = 6  # the generation of the manifest last written (or found) in the tier; the child
STATUS = 7  # raised by one each time the status file is replaced; the child
FAILURES = 8  # failed rounds so far (as in the status file); the child

STARTING, RUNNING, STOPPED, FAILED, REFUSED = 0, 1, 2, 3, 4
EXIT_STOPPED, EXIT_FAILED, EXIT_CANNOT_OPEN, EXIT_WRITER_GONE, EXIT_REFUSED = 0, 1, 2, 3, 4

CHILD_PROGRAM = "import sys; from mqstore.tier.upload_process import main; sys.exit(main())"  # `python -c` of it
CHILD_MARKER = b"mqstore.tier.upload_process"  # in its command line: how a leftover child is recognised
PUBLISH_S = 0.05  # how often the writer publishes the sealed end and looks at the child
WATCH_S = 0.01  # how often the child looks for a stop, a nudge or the writer gone
STATUS_MIN_INTERVAL_S = 0.2  # the child replaces the status file at most this often for an uploaded object
MANIFEST_RETRY_S = 1.0  # after the writer failed to load a published manifest, how long before it tries again
STOP_GRACE_S = 5.0  # beyond TIER_STOP_WAIT_S, how long close() waits for the child to exit before killing it
CARRIED = ("rounds", "objects_uploaded", "bytes_uploaded", "failures")  # counts that go on over a child's restart
# what of StoreConfig the child's uploader reads
CHILD_SETTINGS = ("segment_size_bytes", "consume_queue_entries_per_file", "index_slot_count", "index_entry_count_max",
                  "tier_upload_interval_ms", "tier_backoff_max_ms", "tier_queue_refresh_bytes", "tier_verify_uploads")


def control_path(root: str) -> str:
    return os.path.join(root, "config", CONTROL_FILE_NAME)


def status_path(root: str) -> str:
    return os.path.join(root, "config", STATUS_FILE_NAME)


def stop_leftover(root: str) -> int | None:
    """A writer opening `root`: kill an uploader process its last writer left running, so that two uploaders
    never write one tier's manifest. Returns the process id it stopped, or None."""
    return stop_leftover_child(control_path(root), WORDS, CHILD_PID, CHILD_MARKER, root, "tier uploader process")


class ProcessUploader:
    """The writer's side: starts the child and answers what the store asks of its uploader (the part of
    TierUploader the store, its reader and retention use) from the shared words and the status file."""

    def __init__(self, store, location: TierLocation, uri: str):
        self._store = store
        self.root = store.root_dir
        self.location = location
        self._uri = uri
        self._settings = {name: getattr(store.config, name) for name in CHILD_SETTINGS}
        self._settings["record_crc_from"] = store._commitlog.record_crc_from
        self._backoff_max_s = store.config.tier_backoff_max_ms / 1000.0
        self._words: MappedWords | None = None  # mapped at start()
        self._control = None
        self._log_path = os.path.join(self.root, "config", LOG_FILE_NAME)
        self._status_path = status_path(self.root)
        self._process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._manifest_lock = threading.Lock()
        self._manifest: Manifest | None = None
        self._generation = 0  # of _manifest
        self._manifest_failed_at: float | None = None
        self._status: dict = {}
        self._status_seen = 0
        self._failures_seen = 0
        self._refusal_logged = False
        self._spawn_status = 0  # the STATUS word when the running child was started
        self._carried = dict.fromkeys(CARRIED, 0)  # the counts of the children before the running one
        self.child_exits = 0  # children that died (not stopped as asked), each started again
        self.last_child_exit: str | None = None
        self.starts = 0

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._remove(self._status_path)  # a killed writer's: not this child's
        self._words = MappedWords(control_path(self.root), WORDS, create=True, truncate=True,
                                  what="tier upload control file")
        self._control = self._words.words
        self._publish()
        self._spawn()
        self._monitor = threading.Thread(target=self._watch, name="mqstore-tier-upload-watch", daemon=True)
        self._monitor.start()

    def _spawn(self) -> None:
        """Start a child; it reads its settings and the URI from its standard input."""
        env = child_environment()
        self._control[STATE] = STARTING
        self._control[STOP] = 0
        self._spawn_status = int(self._control[STATUS])
        try:
            with open(self._log_path, "ab") as log_file:
                process = subprocess.Popen(
                    [sys.executable, "-c", CHILD_PROGRAM, os.path.abspath(self.root), str(os.getpid())],
                    stdin=subprocess.PIPE, stdout=log_file, stderr=log_file, env=env, close_fds=True)
        except OSError as exc:
            raise StoreIOError(f"cannot start the tier uploader process of {self.root}: "
                                         f"{exc.strerror}") from exc
        try:
            process.stdin.write(json.dumps({"uri": self._uri, "settings": self._settings}).encode())
            process.stdin.close()
        except OSError:  # the child died at once: the monitor sees it exit and starts another
            pass
        self._process = process
        self.starts += 1

    def stop(self) -> None:
        """Ask the child to stop after the object in flight; kill it if it does not in time."""
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join()
            self._monitor = None
        process = self._process
        if process is None:
            self._close_words()
            return
        if self._control[STATE] == STARTING:  # nothing done yet: nothing to finish
            process.kill()
        self._control[STOP] = 1
        try:
            process.wait(TIER_STOP_WAIT_S + STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("the tier uploader process of %s is still writing an object to %s after %.0f s: killed "
                        "(the object is not listed, the next open uploads it again)", self.root, self.location.uri,
                        TIER_STOP_WAIT_S + STOP_GRACE_S)
            process.kill()
            process.wait()
        self._read_status()
        self._process = None
        self._close_words()

    def _close_words(self) -> None:
        if self._words is None:
            return
        self._control = None
        try:
            self._words.close()
        except BufferError:  # a reader's thread holds the view for a moment: the mapping goes with its last user
            log.debug("the tier upload control file of %s is unmapped by its last reader", self.root)
        self._words = None
        for path in (control_path(self.root), self._status_path):
            self._remove(path)
        try:
            if os.path.getsize(self._log_path) == 0:  # a log with something in it stays
                os.unlink(self._log_path)
        except OSError:
            pass

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _watch(self) -> None:
        """The writer's thread: publish the sealed end, relay the child's failures to the log, start a child
        again after it died."""
        restart_at = None
        deaths = 0
        while not self._stopping.wait(PUBLISH_S):
            self._publish()
            self._relay()
            process = self._process
            if restart_at is not None:
                if time.monotonic() >= restart_at:
                    restart_at = None
                    try:
                        self._spawn()
                    except StoreIOError as exc:
                        self._child_died(str(exc))
                        restart_at = time.monotonic() + self._backoff(deaths)
                continue
            if process is None or process.poll() is None:
                if deaths and self._control[STATUS] > self._spawn_status and self._read_status().get("rounds"):
                    deaths = 0  # this child has done a round: the next death backs off from the start
                continue
            if process.returncode == EXIT_REFUSED or self._control[STATE] == REFUSED:
                self._relay()
                return  # the reason is in stats(); nothing is uploaded until the next open
            deaths += 1
            self._control[STATE] = FAILED  # the dead child's word (it cannot write it), until the next starts
            self._child_died(f"exit status {process.returncode}: {self._log_tail()}")
            restart_at = time.monotonic() + self._backoff(deaths)

    def _backoff(self, deaths: int) -> float:
        return min(self._backoff_max_s, TIER_BACKOFF_FIRST_S * 2 ** min(deaths - 1, 30))

    def _child_died(self, why: str) -> None:
        if self._control[STATUS] > self._spawn_status:  # what the dead child did counts on
            status = self._read_status()
            for name in CARRIED:
                self._carried[name] += status.get(name, 0)
        self._failures_seen = 0  # the next child counts its failures from 0
        self.child_exits += 1
        self.last_child_exit = why[:ERROR_TEXT_MAX]
        log.error("the tier uploader process of %s stopped (%s); it starts again after a backoff", self.root, why)

    def _publish(self) -> None:
        """What the child uploads up to: the end of what is written, flushed and dispatched."""
        store = self._store
        commitlog = store._commitlog
        dispatch = store._dispatch
        dispatched = dispatch.dispatched_offset if dispatch is not None else 0
        readable = commitlog.readable_end()
        self._control[READABLE_END] = readable
        self._control[SEALED_END] = min(readable, commitlog.flushed_position, dispatched)

    def _relay(self) -> None:
        """Log, in the writer, the child's failed rounds and a refusal, as the uploader thread logs them."""
        failures = self._control[FAILURES]
        if failures > self._failures_seen:
            status = self._read_status()
            self._failures_seen = failures
            log.warning("uploading to the tier %s failed (%d in a row): %s", self.location.uri,
                        status.get("consecutive_failures", 0), status.get("last_error"))
        if self._control[STATE] == REFUSED and not self._refusal_logged:
            status = self._read_status()
            self._refusal_logged = True
            log.error("the tier uploader of %s stops: %s (tier %s)", self.root, status.get("refused"),
                      self.location.uri)

    def _log_tail(self) -> str:
        return log_tail(self._log_path)

    # --- what the store asks -------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def nudge(self) -> None:
        control = self._control
        if control is not None:
            control[NUDGE] = int(control[NUDGE]) + 1

    @property
    def manifest(self) -> Manifest | None:
        """The manifest the child last published (loaded from the tier once a generation)."""
        generation = self._word(GENERATION, self._generation)
        if generation == self._generation:
            return self._manifest
        with self._manifest_lock:
            failed_at = self._manifest_failed_at
            if generation != self._generation and (failed_at is None
                                                   or time.monotonic() - failed_at >= MANIFEST_RETRY_S):
                try:
                    found = manifest_module.load(self.location)
                except StoreError as exc:  # the tier's end known before stays: nothing is removed beyond it
                    self._manifest_failed_at = time.monotonic()
                    log.warning("cannot read the manifest of the tier %s (generation %d): %s", self.location.uri,
                                generation, exc)
                else:
                    self._manifest_failed_at = None
                    if found is not None and found.generation >= generation:
                        self._manifest, self._generation = found, found.generation
        return self._manifest

    def _word(self, index: int, otherwise: int) -> int:
        """Word `index` of the control file, or `otherwise` once it is closed (readers on other threads)."""
        control = self._control
        return otherwise if control is None else int(control[index])

    def verified_end(self) -> int | None:
        manifest = self.manifest
        return None if manifest is None else manifest.end

    @property
    def refused(self) -> str | None:
        if self._word(STATE, REFUSED) != REFUSED:
            return None
        return self._read_status().get("refused")

    def _read_status(self) -> dict:
        """The child's figures (the status file, read again only when the child replaced it)."""
        seen = self._word(STATUS, self._status_seen)
        if seen != self._status_seen:
            try:
                with open(self._status_path, encoding="utf-8") as handle:
                    status = json.load(handle)
            except (OSError, ValueError):
                return self._status  # being replaced, or gone: the last one read
            self._status = status
            self._status_seen = seen
        return self._status

    def stats(self) -> dict:
        figures = tier_lag(self._store, self.manifest)
        status = dict(self._read_status())
        for name in ("segments", "objects", "manifest_generation", "rounds", "objects_uploaded", "bytes_uploaded",
                     "failures", "consecutive_failures"):
            status.setdefault(name, 0)
        status.setdefault("retrying", False)
        for name in ("last_error", "last_upload_ms", "refused"):
            status.setdefault(name, None)
        if self._word(STATUS, self._status_seen) > self._spawn_status:  # the running child's, plus the dead ones'
            for name in CARRIED:
                status[name] += self._carried[name]
        else:  # the running child has published nothing yet: the dead ones' counts alone
            status.update(self._carried)
        status["uri"] = self.location.uri
        figures.update(status)
        process = self._process
        running = self._word(STATE, STOPPED) == RUNNING and process is not None and process.poll() is None
        figures["process"] = {"pid": self.pid, "running": running, "starts": self.starts,
                              "exits": self.child_exits, "last_exit": self.last_child_exit}
        return figures


# --- the child ---------------------------------------------------------------------------------------------
class _SealedLog:
    """The writer's CommitLog as the uploader sees it from here: its segment files, and the ends the writer
    published."""

    def __init__(self, root: str, settings: dict, control):
        self._directory = os.path.join(root, "commitlog")
        self._segment_size = settings["segment_size_bytes"]
        self._control = control
        self.record_crc_from = settings["record_crc_from"]

    def readable_end(self) -> int:
        return int(self._control[READABLE_END])

    @property
    def flushed_position(self) -> int:
        return int(self._control[SEALED_END])

    @property
    def segments(self):
        try:
            names = os.listdir(self._directory)
        except OSError as exc:
            raise StoreIOError(f"cannot list {self._directory}: {exc.strerror}") from exc
        bases = sorted(base for base in map(fmt.parse_segment_name, names) if base is not None)
        return SimpleNamespace(segments=[
            SimpleNamespace(base_offset=base, size_bytes=self._segment_size,
                            path=os.path.join(self._directory, fmt.segment_name(base))) for base in bases])

    def min_offset(self) -> int:
        segments = self.segments.segments
        return segments[0].base_offset if segments else 0


class _StoreView:
    """The part of a store the uploader reads: its settings, root, log and dispatched offset."""

    def __init__(self, root: str, settings: dict, control):
        self.root_dir = root
        self.config = SimpleNamespace(**{name: settings[name] for name in CHILD_SETTINGS})
        self._commitlog = _SealedLog(root, settings, control)
        self._dispatch = _Dispatched(control)


class _Dispatched:
    """The writer's dispatched offset, as far as the uploader needs it: the sealed end covers it."""

    def __init__(self, control):
        self._control = control

    @property
    def dispatched_offset(self) -> int:
        return int(self._control[SEALED_END])


class _Publisher:
    """The child's side of the status file: the uploader's counters, replaced whole, then STATUS raised."""

    def __init__(self, root: str, control, uploader: TierUploader):
        self._path = status_path(root)
        self._control = control
        self._uploader = uploader
        self._lock = threading.Lock()
        self._published_at = 0.0
        self._settled = None  # rounds + failures + refusal at the last publication
        self._write_failed = False  # the last status file write failed (logged once)

    def changed(self) -> None:
        """After an uploaded object (at most every STATUS_MIN_INTERVAL_S), a round, a failure, a refusal."""
        uploader = self._uploader
        now = time.monotonic()
        settled = uploader.rounds + uploader.failures + (uploader.refused is not None)
        if now - self._published_at < STATUS_MIN_INTERVAL_S and settled == self._settled:
            return
        self._settled = settled
        self.publish()

    def publish(self) -> None:
        uploader, control = self._uploader, self._control
        with self._lock:
            counters = uploader.counters()
            temporary = f"{self._path}.{os.getpid()}.tmp"
            try:
                with open(temporary, "w", encoding="utf-8") as handle:
                    json.dump(counters, handle)
                os.replace(temporary, self._path)
            except OSError as exc:  # a full disk: the figures wait, the uploads (which free it) go on
                if not self._write_failed:
                    log.warning("cannot write the uploader's figures to %s: %s", self._path, exc.strerror)
                self._write_failed = True
            else:
                self._write_failed = False
            self._published_at = time.monotonic()
            manifest = uploader.manifest
            if manifest is not None and manifest.generation > control[GENERATION]:
                control[GENERATION] = manifest.generation
            control[FAILURES] = counters["failures"]
            if counters["refused"] is not None:
                control[STATE] = REFUSED
            control[STATUS] = int(control[STATUS]) + 1


def run_child(root: str, parent_pid: int, given: dict) -> int:
    """The child's work, until the writer asks it to stop, is gone, or the tier is refused. Returns the exit
    status (EXIT_*)."""
    words = MappedWords(control_path(root), WORDS, create=False, what="tier upload control file")
    control = words.words
    control[CHILD_PID] = os.getpid()
    try:
        settings = given["settings"]
        uploader = TierUploader(_StoreView(root, settings, control), TierLocation.open(given["uri"]))
    except BaseException:
        log.exception("the tier uploader process of %s could not start", root)
        control[STATE] = FAILED
        return EXIT_CANNOT_OPEN
    publisher = _Publisher(root, control, uploader)
    uploader.on_change = publisher.changed
    outcome = {}

    def watch():
        nudges = int(control[NUDGE])
        while True:
            if control[STOP]:
                outcome["why"] = EXIT_STOPPED
                break
            if os.getppid() != parent_pid:
                log.warning("the writer of %s is gone: the tier uploader process stops", root)
                outcome["why"] = EXIT_WRITER_GONE
                break
            if int(control[NUDGE]) != nudges:
                nudges = int(control[NUDGE])
                uploader.nudge()
            time.sleep(WATCH_S)
        uploader.request_stop()

    watcher = threading.Thread(target=watch, name="mqstore-tier-upload-stop", daemon=True)
    control[STATE] = RUNNING
    watcher.start()
    try:
        uploader.run()
    except BaseException:
        log.exception("the tier uploader process of %s failed", root)
        control[STATE] = FAILED
        return EXIT_FAILED
    publisher.publish()
    if uploader.refused is not None:
        control[STATE] = REFUSED
        return EXIT_REFUSED
    watcher.join()
    control[STATE] = STOPPED
    return outcome.get("why", EXIT_STOPPED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mqstore's tier uploader process (started by the store, not by "
                                                 "hand)")
    parser.add_argument("root")
    parser.add_argument("parent_pid", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the writer's terminal is the writer's to handle
    given = json.loads(sys.stdin.buffer.read())
    return run_child(args.root, args.parent_pid, given)


if __name__ == "__main__":
    sys.exit(main())
