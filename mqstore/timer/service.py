"""TimerService: the writer's thread that enqueues timer messages into the wheel and delivers them when due.

One thread, RocketMQ 5's TimerMessageStore services folded into one loop (enqueue-get, enqueue-put, dequeue):

1. Enqueue: read the timer topic's ConsumeQueue from `queue_offset`; for each message take TIMER_OUT_MS, append
   a TimerLog unit and link it as the last of its slot's list (the unit's prev_position is the slot's previous
   last). A timer further than the roll window from now is linked at the window's edge (or half of it) with
   MAGIC_ROLL: when that slot fires it is put again on the timer topic (TIMER_ROLL_TIMES raised) and enqueued
   anew. A timer whose slot has already been read is delivered at once.
2. Deliver: while `read_time_ms` is before now (rounded down to the precision), find the next filled slot, walk
   its list from the last unit and put each message again on REAL_TOPIC / REAL_QID (REAL_* removed,
   TIMER_ENQUEUE_MS and TIMER_DEQUEUE_MS added, as RocketMQ's convertMessage), then move `read_time_ms` past it.
3. Checkpoint, in a flush thread every FLUSH_INTERVAL_MS and at close: flush the TimerLog, the wheel and the
   CommitLog (the puts of step 2), then write `config/timercheck` (read time, TimerLog end, queue offset) as
   they were before the flush.

Crash semantics. Whatever was enqueued or delivered after the last checkpoint is done again after a crash:
a timer may be delivered twice (at-least-once), never lost, never early (a slot is read only once the clock is
past its end, and TIMER_OUT_MS never exceeds the delivery time). A message enqueued twice links two units to
one slot; the delivery of a slot skips a CommitLog offset it has already put.

Time comes from `clock` (mqstore/store/clock.py's interface: now_ms, wait); the thread waits only through it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import numpy as np

from mqstore.commitlog import native
from mqstore.commitlog.errors import ConfigMismatchError, InvalidMessageError, StoreError
from mqstore.commitlog.mapped_file import write_file_atomically
from mqstore.commitlog.message import Message, PutStatus
from mqstore.commitlog.record_values import (
    COLUMNS,
    NUMBER,
    NUMBER_OK,
    TEXT_HASH,
    TEXT_HASHED,
    TEXT_NOT_ASCII,
    TEXT_STATE,
    property_value,
    values_of,
)
from mqstore.timer import format as tfmt
from mqstore.timer import rewrite as rewrite_module
from mqstore.timer.files import TimerCheckpoint, TimerLog, TimerWheel, revise_slots_past_end

log = logging.getLogger(__name__)

ENQUEUE_BATCH_MESSAGES = 8192  # messages read from the timer topic's queue at once (about 2.5 ms of linking)
ROLL_WINDOW_SLOTS_DEFAULT = 2 * 24 * 3600  # RocketMQ's timerRollWindowSlot (slots, whatever the precision)
POLL_INTERVAL_MS = 10  # the longest the thread sleeps between looks at the timer queue
FLUSH_INTERVAL_MS = 200  # how often the flush thread checkpoints what the service has done
CLEAN_EVERY_CHECKPOINTS = 50  # TimerLog files no pending slot links are removed every this many checkpoints
STORED = (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)


_OUT_MS_NAME = b"TIMER_OUT_MS"
_REAL_TOPIC_NAME = b"REAL_TOPIC"


class TimerService:
    """The timer of one writable store (mqstore/timer/__init__.py describes its files)."""

    def __init__(self, store, root_dir: str, clock, *, config, flush_log=None,
                 roll_window_slots: int = ROLL_WINDOW_SLOTS_DEFAULT):
        precision_ms, max_delay_ms = config.timer_precision_ms, config.timer_max_delay_ms
        log_file_size_bytes = config.timer_log_file_size_bytes
        self._precision_explicit = "timer_precision_ms" in config.explicit_fields
        assert precision_ms >= 1 and max_delay_ms >= 0
        self.store, self.root_dir, self.clock = store, root_dir, clock
        # Makes the store's CommitLog durable up to its end (the deliveries' puts), before a checkpoint: only the log,
        # whose queues recovery rebuilds; a whole store.flush() would hold up dispatch, and so enqueue and delivery.
        self._flush_log = flush_log if flush_log is not None else (lambda: store.flush())
        self.precision_ms, self.max_delay_ms = precision_ms, max_delay_ms
        self.log_file_size_bytes = log_file_size_bytes
        self.roll_window_slots = min(max(2, roll_window_slots), tfmt.SLOTS_TOTAL - tfmt.BLANK_SLOTS)
        self.error: BaseException | None = None
        self.delivered_count = self.rolled_count = self.enqueued_count = 0
        # The compiled put holds _wake from the start (commitlog/csrc/put_rewrite.c): it is never replaced.
        self._wake, self._stop = threading.Event(), threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self._put_state: tuple | None = None  # _publish_put_state
        self._start_lock = threading.Lock()
        self._files_open = False
        self._topic_hashes: dict[bytes | None, int] = {}
        self._flusher: threading.Thread | None = None
        self._snapshot: tuple[int, int, int] | None = None  # (read time, TimerLog end, queue offset) done so far
        self._checkpointed: tuple[int, int, int] | None = None
        # The compiled core for the enqueue (_link_compiled), or None for the Python _link, its reference; its buffers
        # are the service's own, made once: a batch allocates nothing per message.
        self._native = native.NATIVE
        self._buffers: tuple | None = None
        settings = os.path.join(root_dir, "config", tfmt.SETTINGS_FILE_NAME)
        if os.path.exists(settings):  # the saved precision, before any put computes a TIMER_OUT_MS with it
            self._check_precision(settings)

    # --- the put side ----------------------------------------------------------------------------------------
    def rewrite(self, message):
        """The CommitLog's prepare hook: the message to store (mqstore/timer/rewrite.py); starts the thread on the
        first timer message."""
        if message.__class__ is not Message and not isinstance(message, Message):
            return message  # prepare reports it
        rewritten = rewrite_module.rewrite(message, self.clock.now_ms(), self.precision_ms, self.max_delay_ms)
        if rewritten is not message:
            if self._thread is None:
                self.start()
            if not self._wake.is_set():
                self._wake.set()
        return rewritten

    def use_clock(self, clock) -> None:
        """Take time from `clock` from now on (tests: a ManualClock)."""
        self.clock = clock
        self._publish_put_state()
        self._wake.set()

    def _publish_put_state(self) -> None:
        """What the compiled put reads of this service on a timer put, in one attribute (put_rewrite.c's
        read_timer_clock): None while the thread is not running (the Python rewrite then starts it), else
        (precision_ms, clock). Set again whenever one of them changes."""
        self._put_state = None if self._thread is None else (self.precision_ms, self.clock)

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start_if_used(self) -> None:
        """Start the thread when the store has timer files or timer messages (else on the first timer put)."""
        if (os.path.exists(os.path.join(self.root_dir, tfmt.WHEEL_FILE_NAME))
                or self.store.max_offset(tfmt.TIMER_TOPIC, tfmt.TIMER_QUEUE_ID) > 0):
            self.start()

    def start(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._open_files()
                self._snapshot = self._checkpointed = (self.read_time_ms, self.timer_log.end, self.queue_offset)
                self._thread = threading.Thread(target=self._run, name="mqstore-timer", daemon=True)
                self._thread.start()
                self._flusher = threading.Thread(target=self._flush_loop, name="mqstore-timer-flush", daemon=True)
                self._flusher.start()
                self._publish_put_state()

    def _open_files(self) -> None:
        root = self.root_dir
        os.makedirs(os.path.join(root, "config"), exist_ok=True)
        self._check_precision(os.path.join(root, "config", tfmt.SETTINGS_FILE_NAME))
        self.checkpoint = TimerCheckpoint(os.path.join(root, "config", tfmt.CHECKPOINT_FILE_NAME))
        values = self.checkpoint.values
        self.timer_log = TimerLog(os.path.join(root, tfmt.TIMER_LOG_DIRECTORY), self.log_file_size_bytes,
                                  int(values["timer_log_end"]))
        self.wheel = TimerWheel(os.path.join(root, tfmt.WHEEL_FILE_NAME), self.precision_ms)
        self.queue_offset = int(values["queue_offset"])
        self.read_time_ms = int(values["read_time_ms"])
        self._files_open = True
        if self.read_time_ms:
            revised = revise_slots_past_end(self.wheel, self.timer_log, self.read_time_ms)
            if revised:
                log.warning("timer: %d wheel slots pointed past the TimerLog's end %d: relinked", revised,
                            self.timer_log.end)

    def _check_precision(self, path: str) -> None:
        """The wheel's precision is the one it was written with (config/timer.json): a different one passed
        explicitly is ConfigMismatchError, a default one gives way to the saved one."""
        if not os.path.exists(path):
            write_file_atomically(path, json.dumps({"timer_precision_ms": self.precision_ms}).encode())
            return
        try:
            with open(path) as handle:
                saved = json.load(handle)["timer_precision_ms"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise tfmt.damage(path, 0, "settings", "not the JSON mqstore writes") from exc
        if not isinstance(saved, int) or saved < 1:
            raise tfmt.damage(path, 0, "settings", "timer_precision_ms is not a positive int")
        if saved != self.precision_ms:
            if self._precision_explicit:
                raise ConfigMismatchError(f"timer_precision_ms={self.precision_ms} but the store's timer wheel "
                                          f"was written with {saved}")
            self.precision_ms = saved

    def stop(self, checkpoint: bool = True) -> None:
        """Stop the thread, then checkpoint (the store must still take puts and flushes)."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()
            self._flusher.join()
            self._thread = self._flusher = None
            self._publish_put_state()
            if checkpoint and self.error is None:
                self._write_checkpoint()

    def close(self) -> None:
        if self._files_open:
            self.timer_log.close()
            self.wheel.close()
            self._files_open = False

    # --- the loop ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                progressed = self.run_once()
                if not progressed:
                    now = self.clock.now_ms()
                    to_next_slot = self.precision_ms - now % self.precision_ms
                    self.clock.wait(self._wake, min(to_next_slot, POLL_INTERVAL_MS))
                    self._wake.clear()
        except BaseException as exc:  # the store goes on; stats() and wait_caught_up report it
            log.exception("the timer service stopped")
            self.error = exc
            with self._progress:
                self._progress.notify_all()

    def run_once(self) -> bool:
        """One pass: enqueue a batch, deliver what is due, checkpoint when due; whether anything was done."""
        write_time = self.clock.now_ms() // self.precision_ms * self.precision_ms
        oldest = write_time - (tfmt.SLOTS_TOTAL - tfmt.BLANK_SLOTS) * self.precision_ms
        if self.read_time_ms == 0:  # never ran
            self.read_time_ms = write_time
        # Behind by more than the wheel's window (closed that long): deliver the backlog before linking anything
        # new, which could take the slot of a pending timer (RocketMQ skips the backlog instead, and loses it).
        behind = self.read_time_ms < oldest
        enqueued = 0 if behind else self._enqueue(write_time)
        self._deliver_due(write_time)
        self._snapshot = (self.read_time_ms, self.timer_log.end, self.queue_offset)  # all written before this
        with self._progress:
            self._progress.notify_all()
        return enqueued == ENQUEUE_BATCH_MESSAGES or behind

    def _flush_loop(self) -> None:
        """The flush thread (RocketMQ's TimerFlushService): a checkpoint every FLUSH_INTERVAL_MS of the clock, off
        the service's thread, whose deliveries must not wait for fdatasync."""
        try:
            rounds = 0
            while not self.clock.wait(self._stop, FLUSH_INTERVAL_MS):
                self._write_checkpoint()
                rounds += 1
                if rounds % CLEAN_EVERY_CHECKPOINTS == 0:
                    self.remove_fired_files()
        except BaseException as exc:
            log.exception("the timer flush thread stopped")
            self.error = exc

    def _write_checkpoint(self) -> None:
        """Flush the TimerLog, the wheel and the store, then record the snapshot taken before: everything it
        vouches for was written before it was taken, so is flushed now."""
        snapshot = self._snapshot
        if snapshot == self._checkpointed:
            return
        self.timer_log.flush()
        self.wheel.flush()
        self._flush_log()
        self.checkpoint.write(*snapshot)
        self._checkpointed = snapshot

    def remove_fired_files(self) -> int:
        """Remove the TimerLog files below every unit a pending slot links (their timers have all fired: the
        slots from the checkpointed read time on are the only ones still read); how many were removed."""
        read_time = self._checkpointed[0]
        lowest = self.wheel.first_position_min(read_time)
        return self.timer_log.delete_files_below(self.timer_log.end if lowest is None else lowest)

    # --- enqueue ------------------------------------------------------------------------------------------------
    def _enqueue(self, write_time: int) -> int:
        """Link a batch of the timer queue's messages into the wheel; how many messages were read."""
        start = self.queue_offset
        if self._native is not None:
            if self._buffers is None or len(self._buffers[0]) != ENQUEUE_BATCH_MESSAGES:
                batch = ENQUEUE_BATCH_MESSAGES
                self._buffers = (np.empty(batch, dtype=np.int64), np.empty(batch, dtype=np.int64),
                                 np.empty((batch, COLUMNS), dtype=np.int64), bytearray(batch * tfmt.UNIT_SIZE_BYTES),
                                 np.empty((batch, 4), dtype=np.int64))
            values = self.store.queue_values(tfmt.TIMER_TOPIC, tfmt.TIMER_QUEUE_ID, start, ENQUEUE_BATCH_MESSAGES,
                                             _OUT_MS_NAME, _REAL_TOPIC_NAME, out=self._buffers[:3])
            if values is not None:
                offsets, sizes, rows = values
                count = len(offsets)
                kept = self._link_compiled(write_time, offsets, sizes, rows, count)
                if kept is None:
                    return 0  # a put of a due timer was refused (a full disk): the whole batch again next pass
                self.queue_offset = start + count
                self.enqueued_count += kept
                return count
        else:
            values = self.store.queue_values(tfmt.TIMER_TOPIC, tfmt.TIMER_QUEUE_ID, start, ENQUEUE_BATCH_MESSAGES,
                                             _OUT_MS_NAME, _REAL_TOPIC_NAME)
        if values is not None:  # two values of each record, read in one pass without building messages
            offsets, sizes, rows = values
        else:  # no entry at `start` (get() tells why), or records in the tier: through get()
            result = self.store.get(tfmt.TIMER_TOPIC, tfmt.TIMER_QUEUE_ID, start, ENQUEUE_BATCH_MESSAGES)
            if not result.messages:
                if result.min_offset > start:  # retention removed what was not enqueued: RocketMQ skips too
                    log.warning("timer queue starts at %d, past %d", result.min_offset, start)
                    self.queue_offset = result.min_offset
                return 0
            messages = result.messages
            offsets = np.array([message.commitlog_offset for message in messages], dtype=np.int64)
            sizes = np.array([message.size_bytes for message in messages], dtype=np.int64)
            rows = np.array([values_of(message.properties_raw, _OUT_MS_NAME, _REAL_TOPIC_NAME)
                             for message in messages], dtype=np.int64).reshape(-1, COLUMNS)
            start = messages[0].queue_offset
        count = len(offsets)
        keep = rows[:, NUMBER_OK] == 1
        for index in np.flatnonzero(~keep).tolist():  # not put through the rewrite: RocketMQ cannot place it
            self._warn_skipped(int(offsets[index]))
        hashes = rows[:, TEXT_HASH].copy()  # REAL_TOPIC's Java hash; 0 without one (java_string_hash(None))
        for index in np.flatnonzero(rows[:, TEXT_STATE] == TEXT_NOT_ASCII).tolist():
            hashes[index] = self._hash_at(int(offsets[index]))
        out_ms = rows[:, NUMBER]
        if not self._link(write_time, out_ms[keep], offsets[keep], sizes[keep], hashes[keep]):
            return 0  # a put of a due timer was refused (a full disk): the whole batch again on the next pass
        self.queue_offset = start + count
        self.enqueued_count += int(keep.sum())
        return count

    @staticmethod
    def _warn_skipped(offset: int) -> None:
        log.warning("timer message at %d has no TIMER_OUT_MS the wheel can hold (ASCII digits up to 2**63-1): "
                    "skipped", offset)

    def _hash_at(self, offset: int) -> int:
        """The Java hash of the REAL_TOPIC of the record at `offset`, decoded by this service's rule."""
        return self._topic_hash(property_value(self.store.read_at(offset).properties_raw, _REAL_TOPIC_NAME))

    def _link_compiled(self, write_time: int, offsets, sizes, rows, count: int) -> int | None:
        """What _enqueue's choice of rows and _link do, by the compiled core (timer_link.c), which keeps the
        interpreter lock: the timers kept, or None when a put of a timer already due was refused (nothing linked).
        Python code runs only for the rare rows: a REAL_TOPIC not ASCII, a timer already due, one skipped."""
        _, _, _, units, slot_rows = self._buffers
        skip_due = False
        while True:
            result = self._native.timer_link(rows, offsets, sizes, count, write_time, self.read_time_ms,
                                             self.precision_ms, self.roll_window_slots, self.timer_log.end,
                                             self.timer_log.file_size, self.wheel.slots, units, slot_rows, skip_due)
            if result[0] == "hash":
                for index in result[1]:
                    rows[index, TEXT_HASH] = self._hash_at(int(offsets[index]))
                    rows[index, TEXT_STATE] = TEXT_HASHED
                continue
            if result[0] == "due":  # delivered first, as _link does
                indexes, magic = result[1], result[2]
                if self._deliver_units([int(offsets[index]) for index in indexes], magic,
                                       [write_time] * len(indexes)) < len(indexes):
                    return None
                skip_due = True
                continue
            _, linked, groups, skipped, end = result
            for index in skipped:
                self._warn_skipped(int(offsets[index]))
            if linked:
                written_end = self.timer_log.append_encoded(units, linked, self._native.pwrite_keep_lock)
                assert written_end == end, (written_end, end)
                self._native.timer_put_slots(self.wheel.slots, slot_rows, groups, self.precision_ms)  # after them
            return count - len(skipped)

    def _topic_hash(self, topic: bytes | None) -> int:
        value = self._topic_hashes.get(topic)
        if value is None:
            text = None if topic is None else topic.decode("utf-8", "replace")
            value = self._topic_hashes[topic] = tfmt.java_string_hash(text)
        return value

    def _link(self, write_time: int, out_ms, offsets, sizes, hashes) -> bool:
        """Append units for these timers and link them into their slots (module docstring, step 1); False, with
        nothing linked, when a put of a timer already due was refused."""
        precision, window = self.precision_ms, self.roll_window_slots
        slot_ms = out_ms // precision * precision
        magic = np.full(len(out_ms), tfmt.MAGIC_DEFAULT, dtype=np.int64)
        roll = slot_ms - write_time >= window * precision
        if roll.any():  # RocketMQ's doEnqueue: give the next roll enough time
            near = slot_ms - write_time - window * precision < window // 3 * precision
            slot_ms = np.where(roll, np.where(near, write_time + window // 2 * precision, write_time + window *
                                              precision), slot_ms)
            magic[roll] |= tfmt.MAGIC_ROLL
        due = slot_ms < self.read_time_ms  # its slot has been read: deliver now (RocketMQ does the same)
        if due.any() and self._deliver_units(offsets[due], magic[due], np.full(int(due.sum()), write_time)) \
                < int(due.sum()):
            return False
        linked = ~due
        count = int(linked.sum())
        if count == 0:
            return True
        slot_ms, offsets, sizes, hashes, magic = (a[linked] for a in (slot_ms, offsets, sizes, hashes, magic))
        positions = self.timer_log.positions_for(count)
        order = np.argsort(slot_ms, kind="stable")
        sorted_slots = slot_ms[order]
        starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
        ends = np.r_[starts[1:], count]
        group_slots = sorted_slots[starts]
        indexes = (group_slots // precision) % tfmt.WHEEL_SLOT_COUNT
        old = self.wheel.slots[indexes]
        filled = old["time_slot"] == group_slots // precision
        prev = np.empty(count, dtype=np.int64)
        prev[order[1:]] = positions[order[:-1]]
        prev[order[starts]] = np.where(filled, old["last_position"], tfmt.NO_POSITION)
        units = tfmt.make_units(count)
        units["prev_position"], units["magic"], units["write_time_ms"] = prev, magic, write_time
        units["delay_ms"] = slot_ms - write_time
        units["commitlog_offset"], units["message_size"], units["topic_hash"] = offsets, sizes, hashes
        self.timer_log.append(units)  # before the wheel links them
        first = np.where(filled, old["first_position"], positions[order[starts]])
        counts = np.where(filled, old["count"], 0) + (ends - starts)
        self.wheel.put_slots(group_slots, first, positions[order[ends - 1]], counts)
        return True

    # --- delivery -------------------------------------------------------------------------------------------------
    def _deliver_due(self, write_time: int) -> int:
        """Deliver every filled slot before `write_time` (module docstring, step 2); messages put."""
        delivered = 0
        while self.read_time_ms < write_time and not self._stop.is_set():
            slot_time = self.wheel.next_filled(self.read_time_ms, write_time)
            if slot_time is None:
                self.read_time_ms = write_time
                break
            self.read_time_ms = slot_time
            offsets, magic, enqueue_ms = self._slot_units(slot_time)
            done = self._deliver_units(offsets, magic, enqueue_ms)
            delivered += done
            if done < len(offsets):
                break  # a put was refused: this slot again on the next pass
            self.read_time_ms = slot_time + self.precision_ms
        return delivered

    def _slot_units(self, slot_time: int):
        """(commitlog offsets, magics, write times) of a slot's units, oldest first, each offset once (rule 5)."""
        first, last, _ = self.wheel.slot(slot_time)
        limit = (self.timer_log.end - self.timer_log.min_position) // tfmt.UNIT_SIZE_BYTES + 1
        units = []
        position = last
        while position != tfmt.NO_POSITION:
            if len(units) >= limit:
                raise tfmt.damage(self.wheel.path, tfmt.slot_index(slot_time, self.precision_ms)
                                      * tfmt.SLOT_SIZE_BYTES, "5", "a slot's list has a cycle")
            unit = self.timer_log.read_unit(position)
            units.append(unit)
            if position == first:
                break
            position = int(unit["prev_position"])
        units.reverse()
        seen: set[int] = set()
        offsets, magic, enqueue_ms = [], [], []
        for unit in units:
            offset = int(unit["commitlog_offset"])
            if offset not in seen:
                seen.add(offset)
                offsets.append(offset)
                magic.append(int(unit["magic"]))
                enqueue_ms.append(int(unit["write_time_ms"]))
        return offsets, magic, enqueue_ms

    def _deliver_units(self, offsets, magic, enqueue_ms) -> int:
        """Put these timer messages again (on their real topic, or the timer topic for a roll); how many were put
        before the first refusal."""
        done = 0
        for offset, unit_magic, enqueued in zip(offsets, magic, enqueue_ms):
            try:
                stored = self.store.read_at(int(offset))
            except StoreError as exc:  # retention removed it (or it is damaged): nothing to deliver
                log.warning("timer message at %d unreadable, skipped: %s", offset, exc)
                done += 1
                continue
            roll = bool(int(unit_magic) & tfmt.MAGIC_ROLL)
            message = self._converted(stored, int(enqueued), roll)
            if message is not None:
                try:
                    if self.store.reput(message, self.store.reput_header(stored)).status not in STORED:
                        return done
                except InvalidMessageError as exc:  # REAL_TOPIC or REAL_QID no put takes: RocketMQ 5 drops it
                    # too (TimerMessageStore: MESSAGE_ILLEGAL is PUT_NO_RETRY)
                    log.warning("timer message at %d cannot be delivered, skipped: %s", offset, exc)
                else:  # counted once put: a refused put is tried again
                    if roll:
                        self.rolled_count += 1
                    else:
                        self.delivered_count += 1
            done += 1
        return done

    def _converted(self, stored, enqueue_ms: int, roll: bool) -> Message | None:
        """The message to put for a fired unit (RocketMQ's convert / convertMessage)."""
        properties = stored.properties
        tags, keys = properties.pop("TAGS", None), tuple(properties.pop("KEYS", "").split())
        properties[tfmt.PROPERTY_ENQUEUE_MS] = str(enqueue_ms)
        properties[tfmt.PROPERTY_DEQUEUE_MS] = str(self.clock.now_ms())
        if roll:
            properties[tfmt.PROPERTY_ROLL_TIMES] = str(int(properties.get(tfmt.PROPERTY_ROLL_TIMES, "0")) + 1)
            topic, queue_id = stored.topic, stored.queue_id
        else:
            topic = properties.pop(tfmt.PROPERTY_REAL_TOPIC, None)
            queue_text = properties.pop(tfmt.PROPERTY_REAL_QUEUE_ID, None)
            if topic is None or queue_text is None or not queue_text.isdigit():
                log.warning("timer message at %d has no REAL_TOPIC/REAL_QID: skipped", stored.commitlog_offset)
                return None
            queue_id = int(queue_text)
        return Message(topic=topic, body=stored.body, queue_id=queue_id, tags=tags, keys=keys,
                       properties=properties, flag=stored.flag, born_timestamp_ms=stored.born_timestamp_ms)

    # --- observing ---------------------------------------------------------------------------------------------
    def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until every timer message put so far is enqueued and every slot due at the clock's now is
        delivered; False on timeout or when the service stopped with an error."""
        self.start()
        self.store.wait_dispatched(timeout_s)
        target_offset = self.store.max_offset(tfmt.TIMER_TOPIC, tfmt.TIMER_QUEUE_ID)
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while True:
                if self.error is not None:
                    return False
                now_slot = self.clock.now_ms() // self.precision_ms * self.precision_ms
                if self.queue_offset >= target_offset and self.read_time_ms >= now_slot:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._progress.wait(min(left, 0.05))

    def stats(self) -> dict:
        running = self._files_open
        return {
            "running": self._thread is not None,
            "queue_offset": self.queue_offset if running else 0,
            "read_time_ms": self.read_time_ms if running else 0,
            "pending": self.wheel.pending_count(self.read_time_ms) if running else 0,
            "timer_log_end": self.timer_log.end if running else 0,
            "enqueued": self.enqueued_count, "delivered": self.delivered_count, "rolled": self.rolled_count,
            "error": None if self.error is None else repr(self.error),
        }
