"""Dispatch in a process of its own (`StoreConfig.dispatch_process=True`).

The dispatch thread shares the producers' interpreter lock: a producer flat out leaves dispatch seconds behind,
and a SYNC producer whose fdatasync returns while the thread holds the lock waits for it (bench/README.md, the
dispatch-process probe). With this option the writer's process only writes the log, and a child process (this
module's `main`, in a new interpreter) follows the log's end and builds the ConsumeQueues and the index with the same
dispatchers, batches and flush service the thread would use. Files and formats do not change; recovery runs in
the writer, before the child starts, as always.

The two processes talk through `config/dispatch_process`, a small file both map: CONTROL_WORDS native 8-byte
integers at aligned places, each written by one side only with one 8-byte store and read with one load, so a
reader sees an old value or a new one, never half of each (see consumequeue/mark.py). The writer publishes the
log's end after every append (one store to memory); the child publishes how far it dispatched after every batch.
Requests (stop, flush, trim) are counters or offsets the writer raises and the child acknowledges.

The writer's reads follow the queues and the index the child writes, as a read_only store follows another
process's: a get lists a queue's new entries, a lookup by key re-reads the index headers.

The child stops when the writer asks (at close, after dispatching to the end and flushing), and by itself when
the writer's process is gone (a crash: the next open recovers as after any crash). When the child dies, dispatch
has stopped: `stats()` says why, `wait_dispatched()` returns False, and puts go on being stored (the next open
dispatches them), as when the dispatch thread stops on an error. A failed flush of a queue or index file is more:
the child raises FLUSH_FAILED and stops, and a watcher thread of the writer's hands the failure to the store,
which refuses writes from then on, as after a failed flush of its own (docs/recovery.md).
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

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch import DISPATCH_BATCH_RECORDS_MAX, DISPATCH_SMALL_BATCH_RECORDS, DispatchService
from mqstore.commitlog.errors import FlushFailedError, StoreError
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher
from mqstore.consumequeue.mark import (
    DispatchedMark,
    MappedWords,
    child_environment,
    log_tail,
    mark_path,
    stop_leftover_child,
)
from mqstore.flush.checkpoint import Checkpoint
from mqstore.flush.services import IntervalFlusher
from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_service import IndexService
from mqstore.schedule.format import parse_levels, retag_schedule_rows
from mqstore.store.index_queries import IndexFlushable, checkpoint_logical_flush

log = logging.getLogger(__name__)

CONTROL_FILE_NAME = "dispatch_process"
LOG_FILE_NAME = "dispatch_process.log"
CONTROL_WORDS = 17
# The words (index: meaning; who writes it).
END = 0  # the log's readable end; the writer
DISPATCHED = 1  # everything below is in the queues and the index; the child
RECORDS = 2  # records dispatched since the child started; the child
STATE = 3  # STARTING, RUNNING, STOPPED or FAILED; the child
STOP = 4  # 1: dispatch to the end, flush, exit; the writer
FLUSH_REQUESTED = 5  # raised by one for each flush the writer asks for; the writer
FLUSH_DONE = 6  # the last FLUSH_REQUESTED value whose flush is done; the child
TRIM_TO = 7  # retention: drop queue and index files below this commitlog offset; the writer
TRIM_DONE = 8  # the last TRIM_TO value done; the child
QUEUE_FILES_TRIMMED = 9  # queue files deleted by trims so far; the child
INDEX_FILES_TRIMMED = 10  # index files deleted by trims so far; the child
FLUSHES = 11  # flushes of a queue or the index so far (the interval flusher's and the asked-for ones); the child
LAST_FLUSH_US = 12  # how long the last one took; the child
CHILD_PID = 13  # the child's process id; the child
FLUSH_TARGET = 14  # the flush asked for covers the log below this offset; the writer (before FLUSH_REQUESTED)
MAX_FLUSH_US = 15  # the longest flush so far; the child
FLUSH_FAILED = 16  # 1 once a flush of a queue or index file failed (the child stops); the child

STARTING, RUNNING, STOPPED, FAILED = 0, 1, 2, 3

CHILD_PROGRAM = "import sys; from mqstore.store.dispatch_process import main; sys.exit(main())"  # `python -c` of it
START_TIMEOUT_S = 120.0  # the child's imports and the opening of every queue and index file
POLL_S = 0.0005  # how often the writer first looks at the child's words while it waits for them ...
POLL_MAX_S = 0.005  # ... then less and less often, down to this (a consumer may wait for new messages for long)
IDLE_WAIT_S = 0.001  # the child's sleep when it has caught up (the dispatch thread's DISPATCH_IDLE_WAIT_S)
PARENT_CHECK_S = 0.1  # how often the child checks that the writer is alive while it is busy
WATCH_INTERVAL_S = 0.1  # how often the writer's watcher looks for a failed flush in the child


def control_path(root: str) -> str:
    return os.path.join(root, "config", CONTROL_FILE_NAME)


class ControlWords:
    """The shared words: a file of CONTROL_WORDS native int64s, mapped (see consumequeue.mark.MappedWords)."""

    def __init__(self, path: str, *, create: bool):
        self.path = path
        self._mapped = MappedWords(path, CONTROL_WORDS, create=create, truncate=create,
                                   what="dispatch control file")
        self.words = self._mapped.words

    def __getitem__(self, index: int) -> int:
        return int(self.words[index])

    def __setitem__(self, index: int, value: int) -> None:
        self.words[index] = value

    def close(self) -> None:
        self.words = None  # first: a view of the mapping
        self._mapped.close()


def stop_leftover(root: str, timeout_s: float = 10.0) -> int | None:
    """A writer opening `root`: stop a dispatch process its last writer left running (that writer was killed
    and the child has not noticed yet), so that nothing else writes the queues while recovery works on them.
    Returns the process id it stopped, or None."""
    return stop_leftover_child(control_path(root), CONTROL_WORDS, CHILD_PID, b"mqstore.store.dispatch_process", root,
                               "dispatch process", timeout_s)


class DispatchProcessError(StoreError):
    """The dispatch process failed to start, or died."""


class ProcessDispatch:
    """The writer's side: starts the child and answers what the store asks of its dispatch (the part of
    `commitlog.dispatch.DispatchService` the store uses), from the shared words."""

    written_records_dispatched = 0  # the child parses every record from the log

    def __init__(self, root: str, settings: dict, start_offset: int, end_offset: int):
        self.root = root
        self._settings = settings
        self._control = ControlWords(control_path(root), create=True)
        self._control[END] = end_offset
        self._control[DISPATCHED] = start_offset
        self.end_word = self._control.words  # the CommitLog stores its end in word 0 after every append
        self._process: subprocess.Popen | None = None
        self._failure: DispatchProcessError | None = None
        self._requests = threading.Lock()  # flush requests from several threads: target, then number
        self._log_path = os.path.join(root, "config", LOG_FILE_NAME)
        self._flush_failure: FlushFailedError | None = None
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the child and wait until it has opened everything (a child that cannot start is an error now,
        not a silent stop later)."""
        env = child_environment()
        try:
            with open(self._log_path, "ab") as log_file:
                self._process = subprocess.Popen(
                    [sys.executable, "-c", CHILD_PROGRAM, os.path.abspath(self.root), json.dumps(self._settings),
                     str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env, close_fds=True)
        except OSError as exc:
            raise DispatchProcessError(f"cannot start the dispatch process of {self.root}: {exc.strerror}") from exc
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._control[STATE] == STARTING:
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._kill()
                raise DispatchProcessError(f"the dispatch process of {self.root} did not start: {self._log_tail()}")
            time.sleep(0.005)
        if self._control[STATE] != RUNNING:
            self._kill()
            raise DispatchProcessError(f"the dispatch process of {self.root} did not start: {self._log_tail()}")

    def watch(self, on_flush_failed) -> None:
        """Call `on_flush_failed(FlushFailedError)` from a thread of this process, within WATCH_INTERVAL_S, when the
        child reports a failed flush (once; the thread ends then, or at stop or close)."""
        def run():
            while not self._watch_stop.wait(WATCH_INTERVAL_S):
                failure = self.flush_failure
                if failure is not None:
                    on_flush_failed(failure)
                    return
        self._watcher = threading.Thread(target=run, name="mqstore-dispatch-watch", daemon=True)
        self._watcher.start()

    def _stop_watching(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        self._watcher = None

    @property
    def flush_failure(self) -> FlushFailedError | None:
        """The child's failed flush of a queue or index file (FlushFailedError naming its log), or None."""
        if self._flush_failure is None and self._control.words is not None and self._control[FLUSH_FAILED]:
            self._flush_failure = FlushFailedError(
                f"the dispatch process of {self.root} failed to flush a consume queue or index file: "
                f"{self._log_tail()}", path=self._log_path)
        return self._flush_failure

    def stop(self, timeout_s: float = 300.0) -> bool:
        """Ask the child to dispatch to the end, flush and exit; wait for it. True when it stopped cleanly."""
        self._stop_watching()
        process = self._process
        if process is None:
            return False
        self._control[STOP] = 1
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the dispatch process of %s did not stop in %.0f s: killed", self.root, timeout_s)
            self._kill()
        clean = self._control[STATE] == STOPPED and process.returncode == 0
        if not clean:
            self._note_failure()
        self._process = None
        return clean

    def close(self) -> None:
        self._stop_watching()
        if self._process is not None:
            self._kill()
            self._process = None
        self.end_word = None
        self._control.close()
        for path in (control_path(self.root), self._log_path):
            try:
                if path != self._log_path or os.path.getsize(path) == 0:  # a log with something in it stays
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    # --- what the store asks -------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def dispatched_offset(self) -> int:
        return self._control[DISPATCHED]

    @property
    def dispatched_records(self) -> int:
        return self._control[RECORDS]

    @property
    def error(self) -> DispatchProcessError | None:
        if self._failure is None and self._process is not None and self._process.poll() is not None \
                and not (self._control[STATE] == STOPPED and self._process.returncode == 0):
            self._note_failure()
        return self._failure

    def _note_failure(self) -> None:
        if self._failure is None:
            code = None if self._process is None else self._process.returncode
            self._failure = DispatchProcessError(
                f"the dispatch process of {self.root} stopped (exit status {code}): {self._log_tail()}")
            log.error("%s", self._failure)

    def _log_tail(self) -> str:
        return log_tail(self._log_path)

    def wake(self) -> None:
        pass

    def wait_dispatched(self, timeout_s: float | None = None, target: int | None = None) -> bool:
        """Block until everything up to `target` (default: the log's end now) is dispatched."""
        if target is None:
            target = self._control[END]
        return self._wait(lambda: self._control[DISPATCHED] >= target, timeout_s)

    def wait_past(self, after_offset: int, timeout_s: float) -> int:
        """Block until dispatch passes `after_offset` or `timeout_s` ends; the dispatched offset then. Raises the
        failure instead of waiting when the child died."""
        if self.error is not None:
            raise StoreError(f"dispatch stopped, no new messages will arrive: {self.error}") from self.error
        self._wait(lambda: self._control[DISPATCHED] > after_offset, timeout_s)
        return self._control[DISPATCHED]

    def flush(self, timeout_s: float) -> bool:
        """Have the child dispatch to the log's end now and flush the queues and the index; wait for it."""
        with self._requests:
            target = self._control[END]
            self._control[FLUSH_TARGET] = max(target, self._control[FLUSH_TARGET])
            request = self._control[FLUSH_REQUESTED] + 1
            self._control[FLUSH_REQUESTED] = request
        return self._wait(lambda: self._control[FLUSH_DONE] >= request and self._control[DISPATCHED] >= target,
                          timeout_s)

    def trim(self, commitlog_min: int, timeout_s: float) -> tuple[int, int]:
        """Retention: have the child delete the queue and index files below `commitlog_min`; how many of each."""
        queue_files, index_files = self._control[QUEUE_FILES_TRIMMED], self._control[INDEX_FILES_TRIMMED]
        if commitlog_min > self._control[TRIM_TO]:
            self._control[TRIM_TO] = commitlog_min
        if not self._wait(lambda: self._control[TRIM_DONE] >= commitlog_min, timeout_s):
            raise StoreError(f"the dispatch process did not trim the queues below {commitlog_min}: "
                             f"{self.error or 'timed out'}")
        return self._control[QUEUE_FILES_TRIMMED] - queue_files, self._control[INDEX_FILES_TRIMMED] - index_files

    def flush_stats(self) -> dict:
        """The child's queue and index flushes, as the writer's own flush services report theirs (FlushStats)."""
        return {"flushes": self._control[FLUSHES], "last_ms": self._control[LAST_FLUSH_US] / 1000.0,
                "max_ms": self._control[MAX_FLUSH_US] / 1000.0,
                "error": None if self.error is None else repr(self.error)}

    def _wait(self, done, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        polls = 0
        pause = POLL_S
        while not done():
            polls += 1
            if polls % 16 == 0:
                if self.error is not None:
                    return done()
                pause = min(POLL_MAX_S, pause * 2)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause)
        return True


# --- the child ---------------------------------------------------------------------------------------------
class _FollowedLog:
    """The writer's log as the child's DispatchService reads it: its end is the one the writer published."""

    def __init__(self, commitlog, control: ControlWords):
        self._log = commitlog
        self._control = control
        self.record_crc = commitlog.record_crc
        self.record_crc_from = commitlog.record_crc_from

    def readable_end(self) -> int:
        return self._control[END]

    def segment_at(self, offset: int):
        return self._log.segment_at(offset)


class _Child:
    """What the child works with: the writer's log (read-only, its end the published one), the queues and the
    mark, the index, the checkpoint, the dispatch service and the queues' interval flusher."""

    def __init__(self, root: str, settings: dict, control: ControlWords):
        self.control = control
        self.parts = []  # closed in reverse at the end
        try:
            commitlog = self._keep(CommitLog(
                os.path.join(root, "commitlog"), settings["segment_size_bytes"], writable=False,
                max_message_size_bytes=settings["max_message_size_bytes"],
                max_queues_per_topic=settings["max_queues_per_topic"], born_host_raw=bytes(8), store_host_raw=bytes(8),
                record_crc=settings["record_crc"], record_crc_from=settings["record_crc_from"]))
            self.table = self._keep(ConsumeQueueTable(os.path.join(root, "consumequeue"),
                                                      settings["consume_queue_entries_per_file"], writable=True))
            delays = parse_levels(settings["delay_levels"])  # the schedule topic's due times (mqstore/schedule/)
            dispatchers = [ConsumeQueueDispatcher(self.table, self._keep(DispatchedMark(mark_path(root))),
                                                  lambda batch: retag_schedule_rows(batch, delays))]
            self.index = self.index_flushable = None
            if settings["index_enabled"]:
                self.index = self._keep(IndexService(os.path.join(root, "index"), settings["index_slot_count"],
                                                     settings["index_entry_count_max"]))
                dispatchers.append(IndexDispatcher(self.index))
                self.index_flushable = IndexFlushable(self.index)
            self.checkpoint = self._keep(Checkpoint.open(root, writable=True))
        except BaseException:
            self.close()
            raise
        self.flushables = [self.table] + ([self.index_flushable] if self.index is not None else [])
        self.flusher = IntervalFlusher(self.flushables, interval_ms=settings["flush_consume_queue_interval_ms"],
                                       least_pages=settings["consume_queue_flush_least_pages"],
                                       thorough_interval_ms=settings["consume_queue_flush_thorough_interval_ms"],
                                       name="mqstore-dispatch-process-flush", on_flushed=self.flushed,
                                       on_failed=self.flush_failed)
        self.failure: FlushFailedError | None = None  # the first failed flush: the child stops on it
        self.service = DispatchService(_FollowedLog(commitlog, control), dispatchers, control[DISPATCHED],
                                       check_crc=settings["check_crc_on_dispatch"])
        # Batches as large as the catch-up's: the dispatch thread keeps its batches small so that producers get the
        # interpreter between them (commitlog/dispatch.py), and this process shares no interpreter with them. A
        # batch's fixed cost is then paid once for up to 8,192 records when it is behind, not once for 512 (or 16).
        self.tail_batch = DISPATCH_BATCH_RECORDS_MAX

    def _keep(self, part):
        self.parts.append(part)
        return part

    def flushed(self) -> None:
        """After queues or the index were flushed: the checkpoint, and the flush figures for the writer."""
        checkpoint_logical_flush(self.checkpoint, self.table, self.index_flushable)
        stats, control = self.flusher.stats, self.control
        control[LAST_FLUSH_US] = int(stats.last_duration_ms * 1000)
        control[MAX_FLUSH_US] = int(stats.max_duration_ms * 1000)
        control[FLUSHES] = stats.flush_count

    def flush_failed(self, error: FlushFailedError) -> None:
        """A queue or index file failed to flush: tell the writer (FLUSH_FAILED) and stop dispatching."""
        if self.failure is None:
            self.failure = error
            log.error("a flush failed, the dispatch process stops: %s", error)
        self.control[FLUSH_FAILED] = 1

    def flush_now(self) -> None:
        """A flush the writer asked for, of everything dirty (as the writer's own `flush()` does)."""
        try:
            for flushable in self.flushables:
                started = time.perf_counter()
                flushable.flush()
                self.flusher.stats.record(time.perf_counter() - started)
        except FlushFailedError as exc:
            self.flush_failed(exc)
            raise
        self.flushed()

    def trim(self, commitlog_min: int) -> None:
        """Retention: delete the queue and index files wholly below `commitlog_min`; count them for the writer."""
        control = self.control
        removed = sum(queue.delete_files_below(commitlog_min) for queue in list(self.table.queues.values()))
        control[QUEUE_FILES_TRIMMED] = control[QUEUE_FILES_TRIMMED] + removed
        if self.index is not None:
            removed = self.index.delete_files_below(commitlog_min)
            control[INDEX_FILES_TRIMMED] = control[INDEX_FILES_TRIMMED] + removed
        control[TRIM_DONE] = commitlog_min

    def close(self) -> None:
        for part in reversed(self.parts):
            try:
                part.close()
            except FlushFailedError as exc:  # a file whose last flush failed (reported already): close the rest
                log.error("closing after a failed flush: %s", exc)
        self.parts = []


def run_child(root: str, settings: dict, parent_pid: int) -> int:
    """The child's work, until the writer asks it to stop or is gone. Returns the exit status: 0 stopped as
    asked, 1 dispatch failed, 2 could not open the store, 3 the writer is gone."""
    control = ControlWords(control_path(root), create=False)
    control[CHILD_PID] = os.getpid()
    try:
        child = _Child(root, settings, control)
    except BaseException:
        log.exception("the dispatch process of %s could not open the store", root)
        control[STATE] = FAILED
        control.close()
        return 2
    child.flusher.start()
    control[STATE] = RUNNING
    try:
        status = _follow(child, parent_pid)
    except BaseException:
        log.exception("dispatch of %s stopped at offset %d", root, child.service.dispatched_offset)
        status = 1
    child.flusher.stop()
    if status == 0:  # the writer asked to stop: everything is dispatched, now flushed too
        child.flush_now()
        control[FLUSH_DONE] = control[FLUSH_REQUESTED]
    control[STATE] = STOPPED if status == 0 else FAILED
    child.close()
    control.close()
    return status


def _follow(child: _Child, parent_pid: int) -> int:
    """Dispatch what the writer publishes and answer its requests, until it asks to stop (0, everything
    dispatched) or its process is gone (3)."""
    control, service = child.control, child.service
    checked_parent_at = time.monotonic()
    while True:
        if child.failure is not None:
            raise child.failure
        done = service.dispatch_available(child.tail_batch)
        control[RECORDS] = service.dispatched_records
        control[DISPATCHED] = service.dispatched_offset
        if control[TRIM_TO] > control[TRIM_DONE]:
            child.trim(control[TRIM_TO])
        request = control[FLUSH_REQUESTED]  # read before its target: the writer stores the target first
        if request > control[FLUSH_DONE] and service.dispatched_offset >= control[FLUSH_TARGET]:
            child.flush_now()
            control[FLUSH_DONE] = request
        if control[STOP]:
            if service.dispatched_offset >= control[END]:
                return 0
            if not done:
                time.sleep(IDLE_WAIT_S)
            continue
        now = time.monotonic()
        if done < DISPATCH_SMALL_BATCH_RECORDS or now - checked_parent_at > PARENT_CHECK_S:
            if os.getppid() != parent_pid:
                log.warning("the writer is gone: the dispatch process stops")
                return 3
            checked_parent_at = now
        if done < DISPATCH_SMALL_BATCH_RECORDS:
            time.sleep(IDLE_WAIT_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mqstore's dispatch process (started by the store, not by hand)")
    parser.add_argument("root")
    parser.add_argument("settings")
    parser.add_argument("parent_pid", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the writer's terminal is the writer's to handle
    return run_child(args.root, json.loads(args.settings), args.parent_pid)


if __name__ == "__main__":
    sys.exit(main())
