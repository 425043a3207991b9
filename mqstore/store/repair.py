"""Repair's lost+found: what `MessageStore.open(..., repair=True)` cuts from a store is moved here, never destroyed.

A repair that cuts anything creates one folder inside the store's directory, beside `commitlog/` and
`consumequeue/` (the store itself never reads it):

    repair-<UTC time>/
        README.txt              one line per file kept: where it came from and why
        config/mqstore.json     a copy of the store's settings, so the folder opens as a read-only store
        commitlog/<segment>     each segment the repair cut, as it was before the cut, and each whole segment
                                it removed (after the cut, or after a missing segment), full size and under its
                                own name: `mqstore dump <folder> <commitlog offset>` reads a message from them
        other/<segment>         a segment file found shorter than the segment size, as it was
        other/<segment>.extra-bytes
                                the bytes found past a segment's size (they were at positions size.. of it)

What the repair did with each file is in `RecoveryReport` too (`repair_dir`, `dropped_files`). The folder is the
user's: nothing deletes it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

import numpy as np

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, StoreIOError
from mqstore.commitlog.mapped_file import fsync_directory
from mqstore.store.config import CONFIG_FILE_NAME

log = logging.getLogger(__name__)

REPAIR_DIR_PREFIX = "repair-"
README_NAME = "README.txt"
COPY_CHUNK_BYTES = 1 << 20  # bytes read at once when looking for the last written byte of a file


class Salvage:
    """Keeps what one repair cuts, in `<root>/repair-<time>/` (made at the first file kept)."""

    def __init__(self, root: str):
        self.root = root
        self.directory: str | None = None
        self.lines: list[str] = []  # README lines
        self.files: list[str] = []  # the store's files the repair changed or removed, relative to root
        self.wrong_size: dict[str, int] = {}  # segment name -> its size as found (too long or too short)
        self.extra_bytes = 0  # bytes cut from past segments' size
        self.gap_after: int | None = None  # base offset of the last segment kept before a missing one
        self.moved_at_load: list[tuple[str, int]] = []  # (path in the folder, base offset): segments after a gap
        self.moved_at_load_bytes = 0  # their written bytes (to the last non-zero one)

    # --- what the commitlog package calls --------------------------------------------------------------------
    def segment_of_wrong_size(self, path: str, size_bytes: int) -> None:
        """Make a segment file `size_bytes` long: the bytes past it are kept in `other/<name>.extra-bytes`, a short
        file is kept as it was in `other/<name>` and extended with zeros (recovery then cuts the log there)."""
        actual = os.path.getsize(path)
        name = os.path.basename(path)
        self.wrong_size[name] = actual
        try:
            if actual > size_bytes:
                kept = self._path("other", name + ".extra-bytes")
                with open(path, "rb") as source, open(kept, "wb") as target:
                    source.seek(size_bytes)
                    shutil.copyfileobj(source, target)
                    target.flush()
                    os.fsync(target.fileno())
                self.extra_bytes += actual - size_bytes
                self._note(path, f"other/{name}.extra-bytes: the {actual - size_bytes} bytes past the segment size "
                                 f"{size_bytes} of {self._relative(path)} (cut from it)")
            else:
                self._copy(path, self._path("other", name))
                self._note(path, f"other/{name}: {self._relative(path)} as found, {actual} bytes of "
                                 f"{size_bytes} (extended with zeros; the log was then cut where its data ended)")
            os.truncate(path, size_bytes)
        except OSError as exc:
            raise StoreIOError(f"repair cannot resize {path}: {exc.strerror}") from exc
        log.warning("repair: %s was %d bytes, made %d", path, actual, size_bytes)

    def segments_after_gap(self, paths: list[str], last_kept_base: int) -> None:
        """Move the segments after a missing one out of the log (it ends at the gap)."""
        self.gap_after = last_kept_base
        for path in paths:
            target = self._move(path, "a segment after a missing one (the log was cut at the gap)")
            self.moved_at_load.append((target, int(os.path.basename(path))))
            self.moved_at_load_bytes += _written_bytes(target)
        log.warning("repair: a segment is missing after %020d; moved %d later segments to %s", last_kept_base,
                    len(paths), self.directory)

    def settings_damaged(self, path: str, why: str) -> None:
        """Set a damaged settings file aside, as other/<name>.damaged (the opener then takes the settings from the
        store's files and writes them anew). It leaves the store first, so that the folder does not take it
        for its own settings."""
        name = os.path.basename(path)
        aside = path + ".damaged"
        try:
            os.replace(path, aside)
            target = self._path("other", name + ".damaged")
            os.replace(aside, target)
            fsync_directory(os.path.dirname(path))
            fsync_directory(os.path.dirname(target))
        except OSError as exc:
            raise StoreIOError(f"repair cannot move {path} aside: {exc.strerror}") from exc
        self._note(path, f"other/{name}.damaged: {self._relative(path)} as found ({why}); the settings were read "
                         "again from the store's files and saved anew")
        log.warning("repair: the settings file %s is damaged (%s); set aside in %s", path, why, self.directory)

    def copy_segment(self, path: str, why: str) -> None:
        """Keep a copy of a segment before the repair changes it (the first state only)."""
        name = os.path.basename(path)
        target = self._path("commitlog", name)
        if os.path.exists(target):
            return
        self._copy(path, target)
        self._note(path, f"commitlog/{name}: {why}")

    def move_segment(self, path: str, why: str) -> None:
        self._move(path, why)

    # --- the folder --------------------------------------------------------------------------------------------
    def _move(self, path: str, why: str) -> str:
        name = os.path.basename(path)
        target = self._path("commitlog", name)
        try:
            os.replace(path, target)
            fsync_directory(os.path.dirname(target))
            fsync_directory(os.path.dirname(path))
        except OSError as exc:
            raise StoreIOError(f"repair cannot move {path} to {target}: {exc.strerror}") from exc
        self._note(path, f"commitlog/{name}: {why} (moved)")
        return target

    def _copy(self, path: str, target: str) -> None:
        try:
            shutil.copyfile(path, target)
            with open(target, "rb+") as handle:
                os.fsync(handle.fileno())
        except OSError as exc:
            raise StoreIOError(f"repair cannot copy {path} to {target}: {exc.strerror}") from exc

    def _path(self, part: str, name: str) -> str:
        folder = os.path.join(self._folder(), part)
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, name)

    def _folder(self) -> str:
        if self.directory is None:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            directory = os.path.join(self.root, REPAIR_DIR_PREFIX + stamp)
            number = 1
            while os.path.exists(directory):  # a second repair in the same second
                number += 1
                directory = os.path.join(self.root, f"{REPAIR_DIR_PREFIX}{stamp}-{number}")
            try:
                os.makedirs(directory)
                settings = os.path.join(self.root, "config", CONFIG_FILE_NAME)
                if os.path.exists(settings):
                    os.makedirs(os.path.join(directory, "config"))
                    shutil.copyfile(settings, os.path.join(directory, "config", CONFIG_FILE_NAME))
            except OSError as exc:
                raise StoreIOError(f"repair cannot create {directory}: {exc.strerror}") from exc
            self.directory = directory
            self._write_readme()
        return self.directory

    def _note(self, path: str, line: str) -> None:
        self.files.append(self._relative(path))
        self.lines.append(line)
        self._write_readme()

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def _write_readme(self) -> None:
        text = [f"What `MessageStore.open(..., repair=True)` cut from the store {self.root}, kept here: nothing cut",
                "was deleted. Files under commitlog/ are whole segments named by their base offset; open this",
                "folder read-only as a store (mqstore dump <this folder> <commitlog offset>) to read their messages.",
                ""] + [f"- {line}" for line in self.lines]
        path = os.path.join(self.directory, README_NAME)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(text) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def count_dropped(commitlog, queues, end: int, salvage) -> tuple[int, int | None, int | None]:
    """The valid records past a cut at `end` (before it is made): (count, commitlog offset of the first, of the
    last). Found walking from the cut and from the start of every later segment, at the offsets queue entries
    name there, and in the segments a repair moved away when it found one missing."""
    found: set[int] = set()
    for segment in commitlog.segments.segments:
        if segment.base_offset + segment.size_bytes <= end:
            continue
        position = max(0, end - segment.base_offset)
        found.update(_valid_records(segment.view, position, segment.size_bytes, segment.base_offset))
    for queue in list(queues.queues.values()):
        for commitlog_offset in queue.offsets_past(end).tolist():
            segment = commitlog.segments.segment_at(commitlog_offset)
            if commitlog_offset >= end and segment is not None and commitlog_offset not in found:
                position = commitlog_offset - segment.base_offset
                found.update(_valid_records(segment.view, position, segment.size_bytes, segment.base_offset,
                                            records_max=1))
    if salvage is not None:
        for path, base in salvage.moved_at_load:  # of any size: a moved file is not repaired
            size_bytes = min(os.path.getsize(path), commitlog.segment_size_bytes)
            if size_bytes:
                data = np.memmap(path, dtype=np.uint8, mode="r", shape=(size_bytes,))
                found.update(_valid_records(memoryview(data), 0, size_bytes, base))
                del data
    return len(found), (min(found) if found else None), (max(found) if found else None)


def _valid_records(view, position: int, size_bytes: int, base: int, records_max: int = 1 << 40) -> list[int]:
    """The commitlog offsets of the valid records (rules 1-6, CRCs checked) from `position` on, up to the first
    that is not one."""
    offsets = []
    while position < size_bytes and len(offsets) < records_max:  # bounded: each record takes >= RECORD_SIZE_MIN
        size, magic = fmt.peek(view, position, size_bytes - position)
        if magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2):
            break
        try:
            layout = fmt.locate(view, position, size_bytes - position, base + position)
            fmt.check_crcs(view, layout, position, base + position, required=False, check_crc=True)
        except CorruptionError:
            break
        offsets.append(base + position)
        position += size
    return offsets


def _written_bytes(path: str) -> int:
    """Just past the last non-zero byte of a file (0 for a file of zeros)."""
    data = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) else np.empty(0, np.uint8)
    high = len(data)
    while high > 0:
        low = max(0, high - COPY_CHUNK_BYTES)
        chunk = data[low:high]
        if chunk.any():
            return low + int(chunk.nonzero()[0][-1]) + 1
        high = low
    return 0
