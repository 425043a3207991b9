"""The dispatched mark: the commitlog offset below which every ConsumeQueue unit is written.

The dispatcher writes a batch's units queue by queue, so while it is at work one queue can already point past
a record that another queue does not list yet. A reader in another process (the Spark source) that took the
queues' furthest unit as "dispatched up to here" would miss that record. The writer therefore publishes, after
each batch's units are all written, the batch's end in this file: 8 bytes, a big-endian i64. 0 means "nothing
is known" (the writer sets it while recovery may cut queues). A clean close removes the file: then every
queue is complete up to its furthest unit. The file is a hint for readers, in page cache, never flushed and
never used by recovery; RocketMQ does not know it (it is one more file in `config/`).

The 8 bytes are written with one aligned 8-byte store and read with one 8-byte load, both through a shared
mapping, so a reader racing the writer sees the old value or the new one. Written byte by byte (as
`struct.pack_into` does) or read by `read()`, a reader could combine the high bytes of one value with the low
bytes of another: a value never published, possibly above the true mark (a test saw such values).
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
from mqstore.commitlog.errors import StoreIOError

MARK_FILE_NAME = "dispatched_offset"
MARK_SIZE_BYTES = 8


def _word(offset: int) -> int:
    """The native i64 whose bytes in memory are `offset` as a big-endian i64 (one store writes them all)."""
    return int.from_bytes(offset.to_bytes(MARK_SIZE_BYTES, "big", signed=True), sys.byteorder, signed=True)


def _offset(word: int) -> int:
    """The inverse of `_word`."""
    return int.from_bytes(word.to_bytes(MARK_SIZE_BYTES, sys.byteorder, signed=True), "big", signed=True)


def mark_path(root: str) -> str:
    """Where the mark of the store at `root` lives."""
    return os.path.join(root, "config", MARK_FILE_NAME)


class MappedWords:
    """`count` native 8-byte integers at the start of a file, through a shared mapping: page-aligned, so each
    word is written with one aligned store and read with one load, and another process mapping the file sees
    an old value or a new one, never half of each. Also the dispatch process's control words (mqstore)."""

    def __init__(self, path: str, count: int, *, create: bool, truncate: bool = False, what: str = "file"):
        """`create`: make the file when missing (and extend a short one); `truncate`: start from zeros. Without
        `create` the file must hold exactly `count` words."""
        self.path = path
        self._fd = self._map = self.words = None
        size = count * 8
        try:
            flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
            self._fd = os.open(path, flags, 0o644)
            actual = os.fstat(self._fd).st_size
            if not create and actual != size:
                self.close()
                raise StoreIOError(f"{path} is not a {what}: {actual} bytes, expected {size}")
            if actual < size:
                os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size)
        except OSError as exc:
            self.close()
            raise StoreIOError(f"cannot open the {what} {path}: {exc.strerror}") from exc
        self.words = np.frombuffer(self._map, dtype=np.int64, count=count)

    def close(self) -> None:
        self.words = None  # first: a view of the mapping
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class DispatchedMark:
    """The writer's side: a file it overwrites in place through a shared mapping (a publish per dispatch
    batch is then one store to memory, not a system call; readers map the same page)."""

    def __init__(self, path: str):
        self.path = path
        self._words = MappedWords(path, 1, create=True, what="dispatched mark")
        self._cell = self._words.words

    def publish(self, offset: int) -> None:
        """Say that every unit of every record below `offset` is written."""
        self._cell[0] = _word(offset)

    def remove(self) -> None:
        """At a clean close: the queues are complete, the mark has nothing to add."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._cell = None  # first: a view of the mapping
        self._words.close()


def read_mark(path: str) -> int | None:
    """The published offset; None when there is no mark file (a store no mqstore writer opened, e.g. one
    RocketMQ wrote), 0 when it is unreadable or short (nothing known)."""
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size < MARK_SIZE_BYTES:
                return 0
            with mmap.mmap(handle.fileno(), MARK_SIZE_BYTES, prot=mmap.PROT_READ) as mapped:
                cell = np.frombuffer(mapped, dtype=np.int64, count=1)
                word = int(cell[0])  # one 8-byte load
                del cell  # before the mapping closes
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0
    return max(_offset(word), 0)
