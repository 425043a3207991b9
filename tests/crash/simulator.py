"""A crash simulator: which bytes of which file reached the disk, and the disk images a crash can leave.

`FlushRecorder` wraps the only two places the store makes bytes durable, `MappedFile.flush(start, end)`
(CommitLog segments, ConsumeQueue files, the checkpoint) and `IndexFile.flush` (index files, which sync their
own numpy.memmap), and the places files are created (`MappedFile.create`, `IndexFile.create`). After each real
flush it copies the flushed pages (4 KiB) of [start, end) into an event log; a file's *durable* content at any
moment is its content when recording started (zeros for a file created since, even under the name of a file
deleted since: a new inode) overlaid with the pages of every flush event of it before that moment. Only
[start, end) counts, the flush's contract, even though the implementation (fdatasync) happens to write every
dirty page of the file: the engine may rely on no more.

`FlushRecorder.snapshot()` takes a `CrashPoint`: the live content of every file (what the page cache holds,
as after kill -9) and how many flush events had completed. Reads go in an order that makes a consistent
crash state out of a non-atomic copy while writers run: the checkpoint first (every flushed offset and time
it claims was made durable before it was written), then the counters (acknowledged puts, flush events),
then index files, ConsumeQueues and CommitLog segments in ascending order (each is written after the one
before it in that list, so a later read only sees more).

`build_image()` turns a crash point into a post-crash store directory. For each 4 KiB page whose live
content differs from its durable content (an unflushed page) a policy picks one of

    live      the page reached the disk after all (kill -9, or the kernel wrote it back in time)
    lost      the disk still holds the last flushed content (zeros for a page never flushed)
    garbled   the bytes that changed since the last flush are random (a torn write of unknown content),
              and so is the rest of their 512-byte sector where it was zero
    torn      each 512-byte sector independently live or lost

Flushed bytes are never changed. Files are kept whole or not at all:

  * a file that existed when recording started, or that was flushed at least once, survives;
  * a file created but never flushed may or may not survive (its directory entry was never synced). A
    journaling file system commits metadata in order, so if a later-created file survives, every earlier one
    does: the simulator drops a random suffix, in creation order, of the files no flush anchors;
  * the checkpoint's fields (its first 48 bytes) share one 512-byte sector, which disks write atomically (RocketMQ and
    PostgreSQL's pg_control rely on the same): it is live or lost, never garbled (bit flips in it are
    covered by tests/crash/test_bit_flips.py);
  * unlinks (recovery deleting segments and queue files) are taken as durable.

Temporary files (`*.creating`) are left out of images: the store ignores or removes them.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field, replace

from mqstore.commitlog.mapped_file import MappedFile
from mqstore.indexfile.index_file import IndexFile

PAGE_SIZE_BYTES = 4096
SECTOR_SIZE_BYTES = 512
CHECKPOINT_PATH = "checkpoint"
TEMPORARY_SUFFIX = ".creating"
POLICIES = ("live", "lost", "mixed", "ordered")
# Weights of the per-page choices under the "mixed" policy.
MIXED_WEIGHTS = {"live": 0.4, "lost": 0.3, "garbled": 0.15, "torn": 0.15}


def read_tree(root: str) -> dict[str, bytes]:
    """Every regular file under `root`, by path relative to it (temporary files left out)."""
    files: dict[str, bytes] = {}
    for directory, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(TEMPORARY_SUFFIX):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as handle:
                    files[os.path.relpath(path, root)] = handle.read()
            except FileNotFoundError:
                continue  # removed while we listed
    return files


def _read_group(root: str, relative_dir: str, files: dict[str, bytes]) -> None:
    """Read the files under one subdirectory, in sorted (creation) order."""
    directory = os.path.join(root, relative_dir)
    for path in sorted(_walk_files(directory)):
        if path.endswith(TEMPORARY_SUFFIX):
            continue
        try:
            with open(path, "rb") as handle:
                files[os.path.relpath(path, root)] = handle.read()
        except FileNotFoundError:
            continue


def _walk_files(directory: str):
    for current, _, names in os.walk(directory):
        for name in names:
            yield os.path.join(current, name)


@dataclass
class CrashPoint:
    """The live files at one moment, with the count of flush events and creations completed before it."""

    files: dict[str, bytes]
    event_count: int
    creations: list[str]
    acked_count: int = 0  # puts acknowledged before the moment (the workload's own counter)
    flushed_acked_count: int = 0  # ASYNC: puts acknowledged before a store.flush() that completed
    label: str = ""
    created_after_events: dict = field(default_factory=dict)  # path -> flush events before its latest creation
    extra: dict = field(default_factory=dict)


class FlushRecorder:
    """Records flushes and creations of files under `root` while installed (a context manager)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._prefix = self.root + os.sep
        self._lock = threading.Lock()
        self.events: list[tuple[str, int, bytes]] = []  # (relative path, first page, page bytes)
        self.creations: list[tuple[str, int]] = []  # (relative path, flush events before it), in creation order
        self.base: dict[str, bytes] = {}
        self._saved = None

    def _relative(self, path: str) -> str | None:
        path = os.path.abspath(path)
        return path[len(self._prefix):] if path.startswith(self._prefix) else None

    def _record(self, path: str, first_page: int, data: bytes) -> None:
        relative = self._relative(path)
        if relative is not None:
            with self._lock:
                self.events.append((relative, first_page, data))

    def _created(self, path: str) -> None:
        relative = self._relative(path)
        if relative is not None:
            with self._lock:
                self.creations.append((relative, len(self.events)))

    def __enter__(self) -> "FlushRecorder":
        self.base = read_tree(self.root) if os.path.isdir(self.root) else {}
        recorder = self
        mapped_flush, mapped_create = MappedFile.flush, MappedFile.create.__func__
        index_flush, index_create = IndexFile.flush, IndexFile.create.__func__
        self._saved = (mapped_flush, MappedFile.create, index_flush, IndexFile.create)

        def flush(mapped, start=0, end=None):
            mapped_flush(mapped, start, end)
            array = mapped.array
            if not mapped.writable or array is None:
                return
            stop = mapped.size_bytes if end is None else min(end, mapped.size_bytes)
            first = start // PAGE_SIZE_BYTES
            last = -(-stop // PAGE_SIZE_BYTES)
            if last > first:
                recorder._record(mapped.path, first,
                                 bytes(array[first * PAGE_SIZE_BYTES : min(last * PAGE_SIZE_BYTES, mapped.size_bytes)]))

        def create(cls, path, *args, **kwargs):
            made = mapped_create(cls, path, *args, **kwargs)
            recorder._created(path)
            return made

        def flush_index(index_file):
            dirty = index_file._dirty and not index_file.read_only
            index_flush(index_file)
            if dirty and index_file._map is not None:
                recorder._record(index_file.path, 0, bytes(index_file._map))

        def create_index(cls, path, *args, **kwargs):
            made = index_create(cls, path, *args, **kwargs)
            recorder._created(path)
            return made

        MappedFile.flush = flush
        MappedFile.create = classmethod(create)
        IndexFile.flush = flush_index
        IndexFile.create = classmethod(create_index)
        return self

    def __exit__(self, *exc_info) -> None:
        MappedFile.flush, MappedFile.create, IndexFile.flush, IndexFile.create = self._saved

    def snapshot(self, counters=lambda: (0, 0), label: str = "") -> CrashPoint:
        """The live files now; `counters()` returns (acked_count, flushed_acked_count) of the workload."""
        files: dict[str, bytes] = {}
        checkpoint = os.path.join(self.root, CHECKPOINT_PATH)
        try:
            with open(checkpoint, "rb") as handle:
                files[CHECKPOINT_PATH] = handle.read()
        except FileNotFoundError:
            pass
        acked, flushed_acked = counters()
        with self._lock:
            event_count = len(self.events)
        for group in ("index", "consumequeue", "commitlog"):
            _read_group(self.root, group, files)
        for relative, data in read_tree(self.root).items():  # config, abort marker, lock: written durably
            files.setdefault(relative, data)
        # Creations are taken after the files: a file the reads found (re)created while they ran (the allocator
        # making the next segment) is a new inode, whatever a file of that name held when recording started.
        with self._lock:
            creations = list(self.creations)
        latest = {relative: events_before for relative, events_before in creations}
        last_index = {relative: index for index, (relative, _) in enumerate(creations)}
        order = [relative for index, (relative, _) in enumerate(creations) if last_index[relative] == index]
        return CrashPoint(files, event_count, order, acked, flushed_acked, label, latest)

    def durable_pages(self, point: CrashPoint) -> dict[str, dict[int, bytes]]:
        """For each file flushed before `point`: page number -> the content of its last flush (flushes of an
        earlier file of the same name, deleted since, do not count)."""
        pages: dict[str, dict[int, bytes]] = {}
        for number, (relative, first, data) in enumerate(self.events[: point.event_count]):
            if number < point.created_after_events.get(relative, 0):
                continue
            file_pages = pages.setdefault(relative, {})
            for index in range(0, len(data), PAGE_SIZE_BYTES):
                file_pages[first + index // PAGE_SIZE_BYTES] = data[index : index + PAGE_SIZE_BYTES]
        return pages


@dataclass
class ImageStats:
    """What build_image chose, for the printed summary."""

    pages_dirty: int = 0
    choices: dict = field(default_factory=dict)
    files_dropped: int = 0


def _surviving_creations(point: CrashPoint, anchored: set[str], rng: random.Random, policy: str) -> set[str]:
    """Creations whose directory entry is on disk: all up to the last anchored one, then a random prefix."""
    creations = point.creations
    last_anchor = max((i for i, path in enumerate(creations) if path in anchored), default=-1)
    cut = len(creations) if policy == "live" else rng.randint(last_anchor + 1, len(creations))
    return set(creations[:cut])


def _garble(durable: bytes, live: bytes, rng: random.Random) -> bytes:
    """Random bytes where the page changed since its last flush, and over the zeros after them in their sector."""
    page = bytearray(live)
    changed = [i for i in range(len(live)) if live[i] != durable[i]]
    for i in changed:
        page[i] = rng.randrange(256)
    if changed:
        last = changed[-1]
        sector_end = min(len(page), (last // SECTOR_SIZE_BYTES + 1) * SECTOR_SIZE_BYTES)
        if not any(live[last + 1 : sector_end]) and not any(durable[last + 1 : sector_end]):
            page[last + 1 : sector_end] = rng.randbytes(sector_end - last - 1)
    return bytes(page)


def _torn(durable: bytes, live: bytes, rng: random.Random) -> bytes:
    page = bytearray(durable)
    for start in range(0, len(live), SECTOR_SIZE_BYTES):
        if rng.random() < 0.5:
            page[start : start + SECTOR_SIZE_BYTES] = live[start : start + SECTOR_SIZE_BYTES]
    return bytes(page)


def _choose(policy: str, rng: random.Random, page_number: int, cut_page: int) -> str:
    if policy == "live":
        return "live"
    if policy == "lost":
        return "lost"
    if policy == "ordered":  # writeback in file order stopped somewhere
        return "live" if page_number < cut_page else "lost"
    return rng.choices(list(MIXED_WEIGHTS), weights=list(MIXED_WEIGHTS.values()))[0]


def image_files(recorder: FlushRecorder, point: CrashPoint, durable: dict[str, dict[int, bytes]],
                rng: random.Random, policy: str, stats: ImageStats | None = None) -> dict[str, bytes]:
    """The files a crash at `point` leaves on disk under `policy` (one of POLICIES)."""
    assert policy in POLICIES, policy
    stats = stats if stats is not None else ImageStats()
    late = sorted(relative for relative in point.files if _is_data_file(relative)
                  and relative not in recorder.base and relative not in point.creations)
    if late:  # created after the counters were read: the newest creations of all
        point = replace(point, creations=point.creations + late)
    created = set(point.creations)
    anchored = set(durable) | (set(recorder.base) - created)
    surviving = _surviving_creations(point, anchored, rng, policy)
    result: dict[str, bytes] = {}
    for relative, live in point.files.items():
        if relative in created and relative not in anchored and relative not in surviving:
            stats.files_dropped += 1
            continue
        if not _is_data_file(relative):
            result[relative] = live  # config, abort marker, lock: written durably or content-free
            continue
        base = None if relative in created else recorder.base.get(relative)  # a created file is a new inode
        content = bytearray(base if base is not None and len(base) == len(live) else bytes(len(live)))
        for page_number, data in durable.get(relative, {}).items():
            start = page_number * PAGE_SIZE_BYTES
            content[start : start + len(data)] = data
        cut_page = rng.randint(0, max(1, len(live) // PAGE_SIZE_BYTES))
        for start in range(0, len(live), PAGE_SIZE_BYTES):
            old, new = bytes(content[start : start + PAGE_SIZE_BYTES]), live[start : start + PAGE_SIZE_BYTES]
            if old == new:
                continue
            stats.pages_dirty += 1
            choice = _choose(policy, rng, start // PAGE_SIZE_BYTES, cut_page)
            if relative == CHECKPOINT_PATH and choice in ("garbled", "torn"):
                choice = rng.choice(("live", "lost"))  # one sector: written atomically
            stats.choices[choice] = stats.choices.get(choice, 0) + 1
            if choice == "live":
                content[start : start + len(new)] = new
            elif choice == "garbled":
                content[start : start + len(new)] = _garble(old, new, rng)
            elif choice == "torn":
                content[start : start + len(new)] = _torn(old, new, rng)
        result[relative] = bytes(content)
    return result


def _is_data_file(relative: str) -> bool:
    """Whether the store writes this file through a mapping (the files the recorder tracks)."""
    return relative == CHECKPOINT_PATH or relative.split(os.sep, 1)[0] in ("commitlog", "consumequeue", "index")


def write_tree(root: str, files: dict[str, bytes]) -> None:
    """Write `files` (relative path -> bytes) under a new directory `root`, with the store's directories."""
    for directory in ("commitlog", "consumequeue"):
        os.makedirs(os.path.join(root, directory), exist_ok=True)
    for relative, data in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
