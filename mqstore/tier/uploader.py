"""The tier's uploader: copies what the store has finished to the tier, from a process of its own (the default:
mqstore/tier/upload_process.py runs this class there) or from a thread of the writer's (tier_upload_process=False).

Each round (every `tier_upload_interval_ms`, and at once after a failure's backoff) it uploads, in order:
  1. the sealed CommitLog segments after the tier's end: a segment is sealed when the log's written end, its
     flushed position and its dispatched offset are all past it (never the segment being written);
  2. when the tier's end has moved `tier_queue_refresh_bytes` past the queues' (the manifest's queues_end), the
     ConsumeQueue files holding entries below the new end, each as a full-size image of the file with only those
     entries (the rest zeros, as RocketMQ's files are), where that is more than the tier holds; while the queue
     files are behind the log, the tier holds RocketMQ's `abort` marker, so that RocketMQ loading a copy of the tier
     recovers as after a crash and dispatches the records the queue files lack, for every queue;
  3. the IndexFiles the store has finished (not the newest) whose entries all point below the new end;
then writes the manifest that lists them. Every object is read back and its CRC-32 compared with what was sent
before the manifest lists it (`tier_verify_uploads`); the read-back of one object runs while the next uploads. A
kill -9 at any moment leaves objects the manifest does not list, invisible to readers; the next open's uploader
starts again after the manifest's end and writes them over.

Failures (the object store down, slow, refusing) are counted, logged at WARNING with the tier's redacted URI, and
retried with exponential backoff from TIER_BACKOFF_FIRST_S up to `tier_backoff_max_ms`; puts go on meanwhile, into
local disk, until `disk_full_ratio` makes them return DISK_FULL (retention never deletes a segment the manifest
does not list). The uploader refuses (stops, with the reason in stats()) a tier whose manifest belongs to another
store: other format settings, a segment whose checksum differs from the local one, or a gap between the tier's end
and the local log's start.

What it costs (docs/tier.md, "What it costs"): a segment is read with pread in 8 MiB chunks and its
CRC-32 taken chunk by chunk as the chunk is sent (one pass); a read-back reads into one buffer of its own; both
threads run UPLOADER_NICE nicer than the writer's. The location's meter (stats()["tier"]["upload_cost"]) counts
the CPU seconds of each phase.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, StoreError, StoreIOError
from mqstore.consumequeue import format as queue_fmt
from mqstore.indexfile import format as index_fmt
from mqstore.tier import local_files
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation, UploadMeter
from mqstore.tier.manifest import Manifest, TierIndexFile, TierQueueFile, TierSegment

log = logging.getLogger(__name__)

ABORT_KEY = "abort"  # RocketMQ's marker of a store not shut down cleanly: its next load re-dispatches the log
TIER_BACKOFF_FIRST_S = 0.5  # the first wait after a failed round; it doubles up to tier_backoff_max_ms
TIER_ROUND_SEGMENTS_MAX = 64  # segments one round uploads before it writes the manifest
TIER_STOP_WAIT_S = 30.0  # how long close() waits for an object upload in flight (it is never cut short)
ERROR_TEXT_MAX = 500  # of an error's text kept in stats()
# What the uploader does to cost the writer less (docs/tier.md, "What it costs"; bench/tier_upload.py measures
# each against its absence in the same run):
UPLOADER_NICE = 10  # the uploader's and verifier's threads run this much nicer than the writer's (0: as nice)
# each cut: (module, setting, its value when on); the value when off is the type's zero (False, 0)
UPLOAD_CUTS = {"nicer threads": ("mqstore.tier.uploader", "UPLOADER_NICE", UPLOADER_NICE),
               "read-back into one buffer": ("mqstore.tier.location", "VERIFY_READS_INTO_BUFFER", True)}


class TierRefused(Exception):
    """Internal: the tier's manifest does not belong to this store (the reason is in stats()["tier"]["refused"])."""


class TierUploader:
    """Uploads one writable store's finished files to its tier (module docstring)."""

    def __init__(self, store, location: TierLocation):
        self._store = store
        self._config = store.config
        self.location = location
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self.run, name="mqstore-tier-uploader", daemon=True)
        self._lock = threading.Lock()  # guards the figures stats() reads
        self.manifest: Manifest | None = None  # the tier's, as last read or written
        self.rounds = 0
        self.objects_uploaded = 0
        self.bytes_uploaded = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.last_upload_ms: int | None = None
        self.refused: str | None = None
        self.leftovers_removed = 0
        self._abort_marked = False  # whether the tier holds RocketMQ's `abort` marker (read at the first round)
        # Read-backs run on one thread of their own, each while the next object uploads; a round waits for them
        # all before its manifest lists anything.
        self._verifier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqstore-tier-verify",
                                            initializer=_lower_priority)
        self._pending: list = []
        self.meter = location.meter = UploadMeter()  # CPU seconds of the upload's phases (stats()["tier"])
        self._thread_cpu_seconds = {"uploader": 0.0, "verifier": 0.0}  # each thread's whole CPU time so far
        # Called (no argument) after each round, failure, refusal and uploaded object: the uploader process
        # (mqstore/tier/upload_process.py) publishes its figures to the writer from it.
        self.on_change = None

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(TIER_STOP_WAIT_S)
            if self._thread.is_alive():
                log.warning("the tier uploader of %s is still writing an object to %s after %.0f s; the store "
                            "closes without it (the object is not listed, the next open uploads it again)",
                            self._store.root_dir, self.location.uri, TIER_STOP_WAIT_S)

    def request_stop(self) -> None:
        """Have the round in flight end after its object (nothing more is listed) and the loop return."""
        self._stopping.set()
        self._wake.set()
        self._verifier.shutdown(wait=False, cancel_futures=True)

    def nudge(self) -> None:
        """Start a round now rather than at the next interval."""
        self._wake.set()

    def verified_end(self) -> int | None:
        """The tier's end: every record below it is uploaded, verified and listed (None before the manifest is
        read, or with an empty tier)."""
        manifest = self.manifest
        return None if manifest is None else manifest.end

    def run(self) -> None:
        """The uploader's loop (its thread's, or the uploader process's main thread): rounds until stopped or
        refused."""
        _lower_priority()
        interval = self._config.tier_upload_interval_ms / 1000.0
        wait = 0.0
        while not self._stopping.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.run_round()
                wait = interval
            except TierRefused:
                self._changed()
                return  # logged and kept in stats(); nothing more is uploaded
            except Exception as exc:  # noqa: BLE001 - every failure is kept in stats() and retried
                if self._stopping.is_set():  # the store closes under a round (its read-backs stopped): not a failure
                    log.info("the tier uploader of %s stopped in a round (%s: %s); nothing of it is listed, the "
                             "next open uploads it again", self._store.root_dir, type(exc).__name__, exc)
                    return
                if not isinstance(exc, (StoreError, OSError)):  # not the object store down, slow or refusing: a bug
                    log.exception("the tier uploader's round failed")
                wait = self._failed(exc)
                self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _failed(self, exc: BaseException) -> float:
        with self._lock:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_MAX]
            failures = self.consecutive_failures
        backoff_max = self._config.tier_backoff_max_ms / 1000.0
        wait = min(backoff_max, TIER_BACKOFF_FIRST_S * 2 ** min(failures - 1, 30)) * random.uniform(0.8, 1.0)
        log.warning("uploading to the tier %s failed (%d in a row; next try in %.1f s): %s", self.location.uri,
                    failures, wait, self.last_error)
        return wait

    # --- one round -----------------------------------------------------------------------------------------
    def run_round(self) -> int:
        """Upload what is sealed and not in the tier yet, then write the manifest; how many segments it added.
        Raises on failure (the caller backs off), TierRefused for a tier of another store."""
        store = self._store
        if self.manifest is None:
            self._load_manifest()
        manifest = self.manifest
        assert manifest is not None
        sealed = self._sealed_segments()
        if manifest.end is not None:
            sealed = [segment for segment in sealed if segment.base_offset >= manifest.end]
            if sealed and sealed[0].base_offset != manifest.end:
                self._refuse(f"the tier ends at commitlog offset {manifest.end} and the local log's next sealed "
                             f"segment starts at {sealed[0].base_offset}: the segments between are in neither")
        sealed = sealed[:TIER_ROUND_SEGMENTS_MAX]
        if not sealed:
            self._round_done(0)
            return 0
        self._verified(raise_first=False)  # read-backs a failed round left running
        written = manifest.next_generation()
        for segment in sealed:
            checksum = self._upload_file(manifest_module.segment_key(segment.base_offset), segment.path,
                                         segment.size_bytes)
            written.segments.append(TierSegment(segment.base_offset, checksum))
        if written.queues_end is None or written.end - written.queues_end >= self._config.tier_queue_refresh_bytes:
            self._upload_queue_images(written)
            written.queues_end = written.end
        elif not self._abort_marked:  # queue files behind the log: a copy must re-dispatch as after a crash
            self.location.put_bytes(ABORT_KEY, b"")
            self._abort_marked = True
        self._upload_index_files(written)
        self._verified()
        if self._stopping.is_set():
            return 0  # stop() gave up waiting: leave the objects unlisted, the next open lists them
        manifest_module.save(self.location, written)
        self.manifest = written
        log.info("tier %s now holds the log up to commitlog offset %d (%d objects, generation %d)",
                 self.location.uri, written.end, written.object_count(), written.generation)
        store_end = store._commitlog.readable_end()
        self._round_done(len(sealed))
        if store_end - written.end > self._config.segment_size_bytes:
            self._wake.set()  # more sealed segments wait: go on without the interval
        return len(sealed)

    def _round_done(self, segments: int) -> None:
        self._thread_cpu_seconds["uploader"] = time.thread_time()  # run_round runs on the uploader's thread
        with self._lock:
            self.rounds += 1
            self.consecutive_failures = 0
            if segments:
                self.last_upload_ms = time.time_ns() // 1_000_000
        self._changed()

    def _load_manifest(self) -> None:
        """Read the tier's manifest (or start an empty one) and check that it belongs to this store."""
        store = self._store
        block = manifest_module.store_block(self._config, store._commitlog.record_crc_from)
        found = manifest_module.load(self.location)
        self._abort_marked = self.location.size(ABORT_KEY) is not None
        if found is None:
            self.leftovers_removed += self._remove_leftovers()
            self.manifest = Manifest(store=block)
            return
        theirs = {name: found.store.get(name) for name in manifest_module.STORE_FIELDS}
        ours = {name: block[name] for name in manifest_module.STORE_FIELDS}
        if theirs != ours:
            self._refuse(f"the tier's manifest was written for other format settings: {theirs}, this store has "
                         f"{ours}")
        if found.store.get("record_crc_from_offset") != block["record_crc_from_offset"]:
            self._refuse(f"the tier's record_crc_from_offset is {found.store.get('record_crc_from_offset')!r}, this "
                         f"store's is {block['record_crc_from_offset']!r}")
        self._check_same_log(found)
        self.leftovers_removed += self._remove_leftovers()
        self._rewrite_torn_queue_images(found)
        self.manifest = found

    def _rewrite_torn_queue_images(self, found: Manifest) -> None:
        """A queue file's image is written again over its listed key as the queue grows: an object store that
        keeps part of a PUT a crash cut (some S3-compatible servers do) leaves it short. Each listed image whose
        object has the wrong size is uploaded again from the local file (one listing of the queues' objects)."""
        file_bytes = self._config.consume_queue_entries_per_file * queue_fmt.UNIT_SIZE_BYTES
        sizes = {info.key: info.size for info in self.location.list("consumequeue")}
        root = os.path.join(self._store.root_dir, "consumequeue")
        for (topic, queue_id), files in found.queues.items():
            for queue_file in files[-1:]:  # only the last file of a queue is ever written again
                key = manifest_module.queue_key(topic, queue_id, queue_file.name)
                if sizes.get(key) == file_bytes:
                    continue
                path = os.path.join(root, topic, str(queue_id), queue_file.name)
                length = queue_file.entries * queue_fmt.UNIT_SIZE_BYTES
                if not os.path.exists(path) or local_files.file_checksum(path, length) != queue_file.crc32:
                    log.error("the tier object %s is %s bytes, not %d, and no local copy matches it: `mqstore tier "
                              "verify` reports it", self.location.display(key), sizes.get(key), file_bytes)
                    continue
                log.warning("writing the tier object %s again: it is %s bytes, not %d (a write a crash cut)",
                            self.location.display(key), sizes.get(key), file_bytes)
                self._upload_file(key, path, file_bytes, queue_file.entries)
        self._verified()

    def _check_same_log(self, found: Manifest) -> None:
        """The tier must continue this store's log: the local log reaches the tier's end, and the last segment both
        hold is the same bytes in both (one segment's checksum, read once per open)."""
        if not found.segments:
            return
        commitlog = self._store._commitlog
        if commitlog.readable_end() < found.end:
            self._refuse(f"the tier holds the log up to commitlog offset {found.end}, past this store's end "
                         f"{commitlog.readable_end()}: it is another store's log (or this store is an older copy)")
        common = [segment for segment in list(commitlog.segments.segments)
                  if found.segment_at(segment.base_offset) is not None]
        if not common:
            if commitlog.min_offset() > found.end:
                self._refuse(f"the tier ends at commitlog offset {found.end}, below the local log's start "
                             f"{commitlog.min_offset()}: the segments between are in neither")
            return
        segment = common[-1]
        listed = found.segment_at(segment.base_offset).crc32
        if local_files.file_checksum(segment.path, segment.size_bytes) != listed:
            self._refuse(f"the tier's segment {fmt.segment_name(segment.base_offset)} differs from the local one: "
                         "the tier holds another store's log")

    def _remove_leftovers(self) -> int:
        if self.location.atomic_put:
            return 0
        return sum(self.location.remove_leftovers(directory) for directory in ("commitlog", "consumequeue", "index",
                                                                               "tier"))

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.refused = reason
        log.error("the tier uploader of %s stops: %s (tier %s)", self._store.root_dir, reason, self.location.uri)
        raise TierRefused(reason)

    def _sealed_segments(self) -> list:
        """The local segments that are finished: written, flushed and dispatched past their end."""
        store = self._store
        commitlog = store._commitlog
        dispatched = store._dispatch.dispatched_offset if store._dispatch is not None else 0
        safe_end = min(commitlog.readable_end(), commitlog.flushed_position, dispatched)
        return [segment for segment in list(commitlog.segments.segments)
                if segment.base_offset + segment.size_bytes <= safe_end]

    # --- objects -------------------------------------------------------------------------------------------
    def _upload_file(self, key: str, path: str, size: int, image_units: int | None = None) -> int:
        """Upload the local file at `path` (`size` bytes) as `key`, read it back when verifying; its CRC-32."""
        if image_units is None:
            chunks = local_files.file_chunks(path, size, self.meter)  # pread: no mapping (docs/tier.md)
        else:
            chunks = local_files.queue_image_chunks(path, size, image_units)
        sent_size, checksum = self.location.put_chunks(key, chunks)
        if sent_size != size:
            raise StoreIOError(f"{path} changed size while it was uploaded as {self.location.display(key)}")
        if self._config.tier_verify_uploads:  # read back on the verifier thread while the next object goes up
            self._pending.append(self._verifier.submit(self._verify, key, size, checksum))
        with self._lock:
            self.objects_uploaded += 1
            self.bytes_uploaded += size
        self._changed()
        return checksum

    def _verify(self, key: str, size: int, checksum: int) -> None:
        read_size, read_checksum = self.location.checksum(key, size)
        self._thread_cpu_seconds["verifier"] = time.thread_time()
        if (read_size, read_checksum) != (size, checksum):
            raise CorruptionError(f"the tier object {self.location.display(key)} read back differs from what was "
                                  f"sent ({read_size} bytes, CRC-32 {read_checksum:#010x}; sent {size}, "
                                  f"{checksum:#010x})", path=self.location.display(key), rule="tier.verify")

    def _verified(self, *, raise_first: bool = True) -> None:
        """Wait for the read-backs of the objects uploaded since the last call; the first failure is raised (the
        round fails, and nothing it uploaded is listed)."""
        pending, self._pending = self._pending, []
        failure = None
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - the first is raised once all are done
                failure = failure or exc
        if failure is not None and raise_first:
            raise failure

    def _upload_queue_images(self, written: Manifest) -> None:
        """Upload every ConsumeQueue file that holds more entries below the tier's end than the tier has."""
        end = written.end
        entries_per_file = self._config.consume_queue_entries_per_file
        file_bytes = entries_per_file * queue_fmt.UNIT_SIZE_BYTES
        root = os.path.join(self._store.root_dir, "consumequeue")
        for topic, queue_id, directory in local_files.queue_directories(root):
            known = written.queues.get((topic, queue_id), [])
            last_known = known[-1].name if known else None
            names = sorted(n for n in local_files.list_names(directory) if queue_fmt.parse_file_name(n) is not None
                           and (last_known is None or n >= last_known))
            for name in names:
                path = os.path.join(directory, name)
                units = local_files.units_below(path, file_bytes, end)
                if units == 0:
                    break  # this file and the later ones hold nothing below the tier's end yet
                held = written.queue_file(topic, queue_id, name)
                if held is not None and held.entries >= units:
                    continue
                self._upload_file(manifest_module.queue_key(topic, queue_id, name), path, file_bytes, units)
                checksum = local_files.file_checksum(path, units * queue_fmt.UNIT_SIZE_BYTES)
                files = [f for f in written.queues.get((topic, queue_id), []) if f.name != name]
                files.append(TierQueueFile(name, units, checksum))
                written.queues[(topic, queue_id)] = sorted(files, key=lambda f: f.name)
                if units < entries_per_file:
                    break

    def _upload_index_files(self, written: Manifest) -> None:
        """Upload the finished IndexFiles whose entries all point below the tier's end."""
        directory = os.path.join(self._store.root_dir, "index")
        names = sorted(n for n in local_files.list_names(directory) if index_fmt.parse_file_name(n) is not None)
        held = {f.name for f in written.index}
        size = index_fmt.file_size_bytes(self._config.index_slot_count, self._config.index_entry_count_max)
        for name in names[:-1]:  # the newest is still written
            if name in held or (written.index and name < written.index[-1].name):
                continue
            path = os.path.join(directory, name)
            header = local_files.pread(path, index_fmt.HEADER_SIZE_BYTES, 0)
            _, _, _, end_offset, _, _ = index_fmt.HEADER_STRUCT.unpack(header)
            if os.path.getsize(path) != size or end_offset >= written.end:
                break
            checksum = self._upload_file(manifest_module.index_key(name), path, size)
            written.index.append(TierIndexFile(name, size, checksum, end_offset))

    # --- figures -------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        figures = tier_lag(self._store, self.manifest)
        figures.update(self.counters())
        return figures

    def counters(self) -> dict:
        """What this uploader counted and holds: the part of stats() an uploader process publishes."""
        manifest = self.manifest
        with self._lock:
            return {
                "uri": self.location.uri,
                "segments": len(manifest.segments) if manifest is not None else 0,
                "objects": manifest.object_count() if manifest is not None else 0,
                "manifest_generation": manifest.generation if manifest is not None else 0,
                "rounds": self.rounds,
                "objects_uploaded": self.objects_uploaded,
                "bytes_uploaded": self.bytes_uploaded,
                "failures": self.failures,
                "retrying": self.consecutive_failures > 0,
                "consecutive_failures": self.consecutive_failures,
                "last_error": self.last_error,
                "last_upload_ms": self.last_upload_ms,
                "refused": self.refused,
                "upload_cost": self._upload_cost(),
            }

    def _upload_cost(self) -> dict:
        """The uploader's CPU seconds by phase (reading local files, CRC, handing bytes to the tier, the read-back
        and its CRC) and the two threads' whole CPU time so far (the phases plus their Python around them)."""
        cost = self.meter.snapshot()
        cost["thread_cpu_seconds"] = {name: round(value, 4) for name, value in self._thread_cpu_seconds.items()}
        return cost


def tier_lag(store, manifest: Manifest | None) -> dict:
    """How far the tier (`manifest`, None before it is known) is behind the writer `store`'s log: its start and
    end, the bytes and sealed segments not in it yet, and how long the oldest of those has waited."""
    commitlog = store._commitlog
    end = commitlog.readable_end()
    tier_end = manifest.end if manifest is not None else None
    waiting = [s for s in list(commitlog.segments.segments)
               if s.base_offset + s.size_bytes <= end and (tier_end is None or s.base_offset >= tier_end)]
    lag_seconds = 0.0
    if waiting and waiting[0].base_offset + waiting[0].size_bytes < end:
        try:
            lag_seconds = max(0.0, time.time() - os.path.getmtime(waiting[0].path))
        except OSError:
            lag_seconds = 0.0
    return {
        "start_offset": manifest.start if manifest is not None else None,
        "uploaded_end": tier_end,
        "lag_bytes": max(0, end - (tier_end if tier_end is not None else commitlog.min_offset())),
        "lag_seconds": round(lag_seconds, 3),
        "sealed_segments_waiting": len(waiting),
    }


def _lower_priority() -> None:
    """Make the calling thread UPLOADER_NICE nicer (Linux: a thread's nice value is its own), so that on a busy
    machine the writer's threads run first; where that cannot be done the thread runs as it is."""
    if UPLOADER_NICE <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + UPLOADER_NICE)
    except OSError as exc:
        log.debug("the tier uploader runs at the writer's priority: %s", exc)
