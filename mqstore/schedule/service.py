"""ScheduleService: the writer's thread that delivers delay-level messages when due (RocketMQ 4.4.0's
ScheduleMessageService, one thread for every level).

Put side (`rewrite`, the CommitLog's prepare hook): a message with DELAY = L, 1 <= L <= the level count, goes to
SCHEDULE_TOPIC_XXXX queue L - 1 with REAL_TOPIC / REAL_QID added (mqstore/schedule/format.py). A DELAY that is not
an int, or < 0, or > the level count, is InvalidMessageError with nothing written (RocketMQ clamps a level above
the maximum; mqstore's put refuses it, a RocketMQ-written store's is handled as RocketMQ does at dispatch).
A message with a DELAY level >= 1 and a timer property (TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC) is a
delay-level message: the timer properties are removed and the timer does not rewrite it (RocketMQ 5's HookUtils
checkIfTimerMessage clears them when the level is > 0); DELAY=0 leaves it to the timer's rules. The compiled put
does this rewrite itself (commitlog/csrc/put_rewrite.c, set up by the engine with `rewrite_settings`); this method
is the reference and the path of everything the compiled one hands back (bad input included, raised here).

Delivery: a pass reads each level's queue from its progress offset; for each unit whose tag code (due time) is
<= clock.now_ms() it reads the record and writes it again on REAL_TOPIC / REAL_QID (`MessageStore.reput`, which
does not run the put-side rewrite), as RocketMQ's messageTimeup does: body, flag, every property (DELAY, REAL_TOPIC
and REAL_QID included: RocketMQ encodes the properties before clearing DELAY from the map it checks), sys flag,
born timestamp, born host and reconsume times kept; the tags code comes from TAGS. Then it advances the level's
offset. A delivered copy carries DELAY and REAL_TOPIC and is never scheduled again: the re-put skips the rewrite,
and the rewrite leaves a message with REAL_TOPIC alone. The first unit not yet due ends the level's pass (the
queue is in due order: one level, one delay, store timestamps ascending). A due time more than
CLOCK_BACK_TOLERANCE_MS past now + the level's delay (the clock went back) is delivered now, as RocketMQ's
correctDeliverTimestamp does.

Crash semantics: at-least-once, as RocketMQ. A second thread (`mqstore-schedule-flush`, as the timer's) takes the
offsets every FLUSH_INTERVAL_MS of the clock, flushes the CommitLog, then writes them to config/delayOffset.json
(atomic rename), and once more when the service stops: a kill -9 redelivers what was delivered since the last
write; nothing is lost (the offsets written never pass a re-put that is not durable) and nothing is early (a unit
is delivered only once the clock passed its due time). The delivering thread does not wait for fdatasync: done
there after every pass that delivered, the flush and the file's write let go of the interpreter lock a dozen
times, and under a producer that never waits each let-go cost up to its switch interval (5 ms), so units due
meanwhile fired 50-100 ms late. docs/decisions/0053-delay-levels.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from mqstore.commitlog.errors import InvalidMessageError, StoreError
from mqstore.commitlog.message import Message, PutStatus
from mqstore.commitlog.native import NATIVE
from mqstore.schedule import format as sfmt
from mqstore.schedule import progress

log = logging.getLogger(__name__)

READ_BATCH_UNITS = 256  # units of one level read at once
POLL_INTERVAL_MS = 100  # the longest the thread sleeps between looks (RocketMQ's DELAY_FOR_A_WHILE)
FLUSH_INTERVAL_MS = 200  # the flush thread writes the offsets this often (the timer's checkpoint period)
CLOCK_BACK_TOLERANCE_MS = 60_000  # a due time this far past now + delay is taken as a clock that went back
STORED = (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)
_listdir = getattr(NATIVE, "listdir_keep_lock", None) or os.listdir  # commitlog/csrc/read_map.c, or the reference
# mqstore/timer/format.py's REQUEST_PROPERTIES (this package does not import the timer's): removed by the rewrite
TIMER_REQUEST_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC")


class ScheduleService:
    """The delay levels of one writable store."""

    def __init__(self, store, root_dir: str, clock, *, config, flush_log=None):
        self.store, self.root_dir, self.clock = store, root_dir, clock
        config_dir = os.path.join(root_dir, "config")
        os.makedirs(config_dir, exist_ok=True)
        explicit = "delay_levels" in config.explicit_fields
        self.levels_text = progress.resolve_levels(
            os.path.join(config_dir, sfmt.LEVELS_FILE_NAME), config.delay_levels, explicit,
            has_schedule_queues=os.path.isdir(os.path.join(root_dir, "consumequeue", sfmt.SCHEDULE_TOPIC)))
        self.delays = sfmt.parse_levels(self.levels_text)
        self.max_queues = config.max_queues_per_topic
        self._flush_log = flush_log if flush_log is not None else (lambda: store.flush())
        self.offsets_path = os.path.join(config_dir, sfmt.OFFSET_FILE_NAME)
        self._topic_directory = os.path.join(root_dir, "consumequeue", sfmt.SCHEDULE_TOPIC)
        self.offsets = progress.read_offsets(self.offsets_path, len(self.delays))
        self._saved = dict(self.offsets)  # what delayOffset.json holds
        self._save_lock = threading.Lock()
        self.delivered_count = 0
        self.error: BaseException | None = None
        # The compiled put holds _wake from the start (commitlog/csrc/put_rewrite.c): it is never replaced.
        self._wake, self._stop = threading.Event(), threading.Event()
        self._progress = threading.Condition()
        self._passes_started = self._pass_complete = 0
        self._thread: threading.Thread | None = None
        self._flusher: threading.Thread | None = None

    # --- the put side and dispatch ---------------------------------------------------------------------------
    def rewrite(self, message):
        """The message to store for `message` (module docstring); InvalidMessageError for a bad level."""
        if message.__class__ is not Message and not isinstance(message, Message):
            return message  # prepare reports it
        properties = message.properties
        if (not properties or sfmt.PROPERTY_DELAY not in properties or sfmt.PROPERTY_REAL_TOPIC in properties
                or message.topic == sfmt.SCHEDULE_TOPIC):
            return message
        text = properties[sfmt.PROPERTY_DELAY]
        level = sfmt.parse_java_int(text) if isinstance(text, str) else None
        if level is None or not 0 <= level <= len(self.delays):
            raise InvalidMessageError(f"DELAY must be a delay level in 0..{len(self.delays)}, got {text!r}")
        if level == 0 or not isinstance(message.topic, str) or not isinstance(message.queue_id, int):
            return message  # level 0: no delay; a bad topic or queue id: prepare reports it
        if not 0 <= message.queue_id < self.max_queues:
            raise InvalidMessageError(f"queue_id must be an int in 0..{self.max_queues - 1}, got {message.queue_id}")
        properties = dict(properties)
        for name in TIMER_REQUEST_PROPERTIES:  # a delay level wins over a timer (RocketMQ 5's checkIfTimerMessage)
            properties.pop(name, None)
        properties[sfmt.PROPERTY_REAL_TOPIC] = message.topic
        properties[sfmt.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
        if not self._wake.is_set():
            self._wake.set()
        return Message(topic=sfmt.SCHEDULE_TOPIC, body=message.body, queue_id=sfmt.queue_id_of(level),
                       tags=message.tags, keys=message.keys, properties=properties, flag=message.flag,
                       born_timestamp_ms=message.born_timestamp_ms)

    def retag(self, batch) -> None:
        """The ConsumeQueue dispatcher's hook: due times as the schedule topic's tag codes."""
        sfmt.retag_schedule_rows(batch, self.delays)

    def wake(self) -> None:
        """Look at the levels now: a message was written onto the schedule topic without `rewrite` (a re-put)."""
        self._wake.set()

    def use_clock(self, clock) -> None:
        self.clock = clock
        self._wake.set()

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="mqstore-schedule", daemon=True)
            self._flusher = threading.Thread(target=self._flush_loop, name="mqstore-schedule-flush", daemon=True)
            self._thread.start()
            self._flusher.start()

    def stop(self) -> None:
        """Stop the threads, then save the offsets of what they delivered (after a flush of the log)."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()
            self._flusher.join()
            self._thread = self._flusher = None
            try:
                self.save_offsets()
            except StoreError as exc:  # a failed flush: the log keeps it and raises it again at the store's close
                log.error("schedule offsets not saved: %s", exc)
                self.error = exc

    # --- the loop ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                wait_ms = self.run_once()
                if wait_ms > 0:
                    self.clock.wait(self._wake, wait_ms)
                    self._wake.clear()
        except BaseException as exc:  # the store goes on; stats() and wait_caught_up report it
            log.exception("the schedule service stopped")
            self.error = exc
            with self._progress:
                self._progress.notify_all()

    def run_once(self) -> int:
        """One pass over every level; the ms to wait before the next (0: more to do at once)."""
        with self._progress:
            self._passes_started += 1
            number = self._passes_started
        now = self.clock.now_ms()
        wait_ms, complete = POLL_INTERVAL_MS, True
        for level in self._levels_with_queues():
            if self._stop.is_set():
                complete = False
                break
            _, next_due, more = self._deliver_level(level, now)
            if more:
                complete, wait_ms = False, 0
            elif next_due is not None:
                wait_ms = max(0, min(wait_ms, next_due - now))
        with self._progress:
            if complete:
                self._pass_complete = number
            self._progress.notify_all()
        return wait_ms

    def _flush_loop(self) -> None:
        """The flush thread: save_offsets every FLUSH_INTERVAL_MS of the clock."""
        try:
            while not self.clock.wait(self._stop, FLUSH_INTERVAL_MS):
                self.save_offsets()
        except BaseException as exc:  # the deliveries go on, unsaved: stats() and wait_caught_up report it
            log.exception("the schedule flush thread stopped")
            self.error = exc

    def save_offsets(self) -> None:
        """Write the offsets to config/delayOffset.json, taken before a flush of the log: every re-put they pass
        was written before they were taken, so is durable after it. Nothing when they did not change."""
        with self._save_lock:  # one writer of the file (and of its .tmp) at a time
            offsets = dict(self.offsets)
            if offsets == self._saved:
                return
            self._flush_log()
            progress.write_offsets(self.offsets_path, offsets)
            self._saved = offsets

    def _levels_with_queues(self) -> list[int]:
        """The levels whose schedule queue exists, from one listing of the topic's directory: asking the store
        for a queue it does not know makes a store that follows its dispatch process reload its queue table. Listed
        by the compiled core where there is one, which keeps the interpreter lock (os.listdir lets go of it at every
        entry: under a producer that never waits, up to 5 ms each, on every pass)."""
        try:
            names = _listdir(self._topic_directory)
        except FileNotFoundError:
            return []
        queue_ids = sorted(int(name) for name in names if name.isdigit() and len(name) <= 9)
        return [queue_id + 1 for queue_id in queue_ids if queue_id < len(self.delays)]

    def _deliver_level(self, level: int, now: int) -> tuple[int, int | None, bool]:
        """Deliver level `level`'s due units: (delivered, the next due time or None, more to read at once)."""
        queue_id = sfmt.queue_id_of(level)
        offset = self.offsets[level]
        if offset >= self.store.max_offset(sfmt.SCHEDULE_TOPIC, queue_id):
            return 0, None, False
        low = self.store.min_offset(sfmt.SCHEDULE_TOPIC, queue_id)
        if offset < low:  # retention removed what was not delivered (RocketMQ skips it too)
            log.warning("schedule level %d starts at %d, past %d", level, low, offset)
            offset = self.offsets[level] = low
        units = self.store.queue_units(sfmt.SCHEDULE_TOPIC, queue_id, offset, READ_BATCH_UNITS)
        limit = now + self.delays[level - 1] + CLOCK_BACK_TOLERANCE_MS
        done = 0
        for commitlog_offset, due in zip(units["commitlog_offset"].tolist(), units["tags_code"].tolist()):
            if due > now and due <= limit:
                return done, due, False
            if not self._deliver(commitlog_offset):
                return done, None, False  # refused (a full disk): this unit again on the next pass
            done += 1
            offset += 1
            self.offsets[level] = offset
        return done, None, len(units) == READ_BATCH_UNITS

    def _deliver(self, commitlog_offset: int) -> bool:
        try:
            stored = self.store.read_at(commitlog_offset)
        except StoreError as exc:  # retention removed it, or it is damaged: nothing to deliver
            log.warning("schedule message at %d unreadable, skipped: %s", commitlog_offset, exc)
            return True
        message = self._converted(stored)
        if message is None:
            return True
        try:
            result = self.store.reput(message, self.store.reput_header(stored))
        except InvalidMessageError as exc:  # REAL_TOPIC or REAL_QID no put takes (RocketMQ 5's timer drops it;
            # RocketMQ 4.4.0 tries it again every 10 s, and its level delivers nothing more)
            log.warning("schedule message at %d cannot be delivered, skipped: %s", commitlog_offset, exc)
            return True
        if result.status not in STORED:
            return False
        self.delivered_count += 1
        return True

    @staticmethod
    def _converted(stored) -> Message | None:
        """The message to put for a due unit (RocketMQ's messageTimeup): DELAY and REAL_* kept in its bytes."""
        properties = stored.properties
        tags, keys = properties.pop("TAGS", None), tuple(properties.pop("KEYS", "").split())
        topic = properties.get(sfmt.PROPERTY_REAL_TOPIC)
        queue_id = sfmt.parse_java_int(properties.get(sfmt.PROPERTY_REAL_QUEUE_ID))
        if not topic or queue_id is None or queue_id < 0:
            log.warning("schedule message at %d has no REAL_TOPIC/REAL_QID: skipped", stored.commitlog_offset)
            return None
        return Message(topic=topic, body=stored.body, queue_id=queue_id, tags=tags, keys=keys,
                       properties=properties, flag=stored.flag, born_timestamp_ms=stored.born_timestamp_ms)

    # --- observing ---------------------------------------------------------------------------------------------
    def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until every schedule message put so far and due at the clock's now is delivered; False on timeout
        or when the service stopped with an error."""
        self.store.wait_dispatched(timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._progress:
            after = self._passes_started
            while self._pass_complete <= after:
                left = deadline - time.monotonic()
                if self.error is not None or left <= 0 or self._thread is None:
                    return False
                self._wake.set()
                self._progress.wait(min(left, 0.05))
        return self.error is None

    def pending_counts(self) -> dict[int, int]:
        """level -> units not yet delivered (only levels with some)."""
        counts = {}
        for level in self._levels_with_queues():
            pending = self.store.max_offset(sfmt.SCHEDULE_TOPIC, sfmt.queue_id_of(level)) - self.offsets[level]
            if pending > 0:
                counts[level] = pending
        return counts

    def stats(self) -> dict:
        return {"running": self._thread is not None, "delivered": self.delivered_count,
                "pending": self.pending_counts(), "error": None if self.error is None else repr(self.error)}
