"""The dispatched mark: the commitlog offset below which every ConsumeQueue unit is written.

The dispatcher writes a batch's units queue by queue, so while it is at work one queue can already point past
a record that another queue does not list yet. A reader in another process (the Spark source) that took the
queues' furthest unit as "dispatched up to here" would miss that record. The writer therefore publishes, after
each batch's units are all written, the batch's end in this file: 8 bytes, a big-endian i64. 0 means "nothing
is known" (the writer sets it while recovery may cut queues). A clean close removes the file: then every
queue is complete up to its furthest unit. The file is a hint for readers, in page cache, never flushed and
never used by recovery; RocketMQ does not know it (it is one more file in `config/`).
"""

from __future__ import annotations

import mmap
import os
import struct

from commitlog.errors import StoreIOError

MARK_FILE_NAME = "dispatched_offset"
_MARK = struct.Struct(">q")


def mark_path(root: str) -> str:
    """Where the mark of the store at `root` lives."""
    return os.path.join(root, "config", MARK_FILE_NAME)


class DispatchedMark:
    """The writer's side: a file it overwrites in place through a shared mapping (a publish per dispatch
    batch is then a store to memory, not a system call; readers' read() sees the same page)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = self._map = None
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size < _MARK.size:
                os.ftruncate(self._fd, _MARK.size)
            self._map = mmap.mmap(self._fd, _MARK.size)
        except OSError as exc:
            self.close()
            raise StoreIOError(f"cannot open the dispatched mark {path}: {exc.strerror}") from exc

    def publish(self, offset: int) -> None:
        """Say that every unit of every record below `offset` is written."""
        _MARK.pack_into(self._map, 0, offset)

    def remove(self) -> None:
        """At a clean close: the queues are complete, the mark has nothing to add."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_mark(path: str) -> int | None:
    """The published offset; None when there is no mark file (a store no mqstore writer opened, e.g. one
    RocketMQ wrote), 0 when it is unreadable or short (nothing known)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MARK.size)
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    if len(raw) < _MARK.size:
        return 0
    return max(_MARK.unpack(raw)[0], 0)
