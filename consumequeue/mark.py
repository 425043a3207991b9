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

MappedWords is that mapping for any number of words; the writer and its child processes (dispatch, the tier
uploader) share their control files through it, and `stop_leftover_child` kills a child a killed writer left.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import sys
import time

import numpy as np
from mqstore.commitlog.errors import StoreError, StoreIOError

log = logging.getLogger(__name__)

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


def stop_leftover_child(path: str, words: int, pid_word: int, marker: bytes, root: str, what: str,
                        timeout_s: float = 10.0) -> int | None:
    """Kill the child process of `root` whose id is word `pid_word` of the control file at `path` (of `words`
    words), when it is alive and its command line holds `marker` and `root`; wait until it is gone. Returns its
    process id, or None when there was none."""
    try:
        control = MappedWords(path, words, create=False, what=what)
    except StoreIOError:
        return None  # no control file (or not ours): nobody left running
    try:
        pid = int(control.words[pid_word])
    finally:
        control.close()
    if pid <= 0 or pid == os.getpid() or not _is_child(pid, marker, root):
        return None
    log.warning("stopping the %s %d its last writer left running on %s", what, pid, root)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + timeout_s
    while _is_child(pid, marker, root):
        if time.monotonic() > deadline:
            raise StoreError(f"the {what} {pid} of {root} does not stop")
        time.sleep(0.005)
    return pid


def package_parent() -> str:
    """The directory holding the `mqstore` package this process imported (site-packages for an installed copy),
    so that a child process started with it first on PYTHONPATH imports the same copy as its parent."""
    top = sys.modules[__name__.partition(".")[0]]
    return os.path.dirname(os.path.dirname(os.path.abspath(top.__file__)))


def child_environment() -> dict:
    """The environment of a child process the writer starts (the dispatch process, the tier uploader): this one,
    with `package_parent()` first on PYTHONPATH, and OpenBLAS held to one thread unless the user chose otherwise.
    The child does no linear algebra, and at numpy's import OpenBLAS's threads spin a core for about 0.1 s."""
    env = dict(os.environ)
    first = package_parent()
    env["PYTHONPATH"] = first + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def _is_child(pid: int, marker: bytes, root: str) -> bool:
    """Whether process `pid` is alive (not a zombie) and a child of `root` whose command line holds `marker`."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            arguments = handle.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != b"Z" and any(marker in argument for argument in arguments) and \
        os.fsencode(os.path.abspath(root)) in arguments


def log_tail(path: str) -> str:
    """The last line of a child process's log at `path` (its last 2,000 bytes read), for an error naming why it
    stopped; says so when the log is empty or missing."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 2000))
            text = handle.read().decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[-1] if text else f"nothing in {path}"
