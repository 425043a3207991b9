"""One fixed-size file mapped into memory with numpy.memmap (RocketMQ's MappedFile).

Files are created at their full length in one step (ftruncate: `ls -l` shows the full size at once), then
mapped. Disk blocks are reserved (posix_fallocate) for the part of a file a writer is about to write, not for
all of it: `create(reserve_bytes=...)` reserves the start and `reserve(end)` extends it, so that a full disk
shows up as an error from the reservation rather than as SIGBUS on a later write into an unreserved page of the
mapping, while the disk a file takes follows what was written (docs/storage.md). Writers write through `view`
(a memoryview over the mapping); `flush()` writes the file's dirty pages to disk (fdatasync). The owner decides
what is written where: this class keeps no positions beyond how far blocks are reserved. `open(keep_lock=True)`
of a file read-only maps it with the compiled core's `map_read_keep_lock` where there is one (commitlog/csrc/
read_map.c), which keeps the interpreter lock while it maps: a reader thread then does not wait for a busy
producer at each of numpy's system calls. Its `array` is then a plain read-only array, not a memmap.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import sys
import threading

import numpy as np
from mqstore.commitlog.errors import CorruptionError, FlushFailedError, StoreClosedError, StoreIOError
from mqstore.commitlog.native import NATIVE

log = logging.getLogger(__name__)

PAGE_SIZE_BYTES = mmap.PAGESIZE
MADV_NORMAL = 0  # linux/mman.h
MADV_RANDOM = 1
MADV_POPULATE_READ = 22  # Linux 5.14+
MADV_POPULATE_WRITE = 23  # Linux 5.14+
CREATING_SUFFIX = ".creating"  # a file being made where the filesystem has no O_TMPFILE; removed after a crash


def create_unnamed(path: str) -> tuple[int, str | None]:
    """A new, empty file for `path` that no directory listing shows until `link_into_place` names it: (its
    descriptor, None) for an O_TMPFILE inode in the same directory, which a crash leaves nowhere; where the
    filesystem has none, (its descriptor, its temporary name `<path>.<pid>.creating`), which a crash leaves
    behind for the directory's owner to remove. RocketMQ parses every name in its CommitLog and ConsumeQueue
    directories as a number and loads every file in its index directory, so a crash of a writer must not
    leave a temporary name there when it can be helped."""
    try:
        return os.open(os.path.dirname(path) or ".", os.O_TMPFILE | os.O_RDWR, 0o644), None
    except (AttributeError, IsADirectoryError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    temporary = f"{path}.{os.getpid()}{CREATING_SUFFIX}"
    return os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), temporary


def link_into_place(fd: int, temporary: str | None, path: str) -> None:
    """Give the file `create_unnamed` made its name `path` (FileExistsError when `path` exists)."""
    if temporary is not None:
        os.link(temporary, path)
        return
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: open(2)'s way to name an O_TMPFILE inode
        os.link(f"/proc/self/fd/{fd}", os.path.basename(path), src_dir_fd=directory, dst_dir_fd=directory)
    finally:
        os.close(directory)


def remove_leftovers(directory: str, names: list[str]) -> list[str]:
    """Delete files a crash left half made (CREATING_SUFFIX); returns the other names."""
    kept = []
    for name in names:
        if name.endswith(CREATING_SUFFIX):
            _unlink_quietly(os.path.join(directory, name))
        else:
            kept.append(name)
    return kept


def _load_madvise():
    """libc's madvise through ctypes, which lets go of the GIL for the call (the mmap module's madvise keeps
    it, and the kernel may make the call wait for other threads' page faults); None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


madvise = _load_madvise()

_ONLY_THIS_FRAME = 2  # sys.getrefcount of a mapping only a local name refers to (the name, the argument)


class MappedFile:
    """A file of exactly `size_bytes` bytes, mapped read-write or read-only."""

    __slots__ = ("path", "base_offset", "size_bytes", "array", "view", "writable", "_closed", "_fd", "appending",
                 "reserved_bytes", "flush_error", "_fd_lock")

    def __init__(self, path: str, base_offset: int, size_bytes: int, array: np.memmap, writable: bool,
                 fd: int | None = None):
        self.path = path
        self.base_offset = base_offset
        self.size_bytes = size_bytes
        self.array = array
        self.view = memoryview(array)
        self.writable = writable
        self._closed = False
        self._fd = fd
        self.appending = False  # advised for appending (advise_appending)
        self.reserved_bytes = 0  # blocks are reserved for [0, reserved_bytes) (as far as this process knows)
        self.flush_error: FlushFailedError | None = None  # the first failed flush: every later one raises it again
        self._fd_lock = threading.Lock()  # held while `_fd` is duplicated for a flush, and while it is closed

    @classmethod
    def create(cls, path: str, base_offset: int, size_bytes: int, *, preallocate: bool = True,
               reserve_bytes: int | None = None) -> "MappedFile":
        """Create a new zero-filled file of `size_bytes` (never over an existing one) and map it read-write.

        With `preallocate`, disk blocks are reserved for its first `reserve_bytes` (all of it when None); the
        rest stays a hole until written or reserved (`reserve`). The file is made and sized unnamed
        (`create_unnamed`), then linked into place, so a reader listing the directory never sees it half made.
        """
        assert size_bytes > 0
        reserve_bytes = size_bytes if reserve_bytes is None or not preallocate else min(reserve_bytes, size_bytes)
        try:
            fd, temporary = create_unnamed(path)
        except OSError as exc:
            raise StoreIOError(f"cannot create a file beside {path}: {exc.strerror}") from exc
        try:
            try:
                os.ftruncate(fd, size_bytes)
                if preallocate:
                    _reserve(fd, 0, reserve_bytes)
                link_into_place(fd, temporary, path)
            finally:
                os.close(fd)
        except FileExistsError as exc:
            raise StoreIOError(f"refusing to create {path}: it already exists") from exc
        except OSError as exc:
            raise StoreIOError(f"cannot create {path} of {size_bytes} bytes: {exc.strerror}") from exc
        finally:
            if temporary is not None:
                _unlink_quietly(temporary)
        mapped = cls.open(path, base_offset, size_bytes, writable=True)
        mapped.reserved_bytes = reserve_bytes if preallocate else 0
        return mapped

    @classmethod
    def open(cls, path: str, base_offset: int, size_bytes: int, *, writable: bool,
             format_name: str = "commitlog", keep_lock: bool = False) -> "MappedFile":
        """Map an existing file, which must be exactly `size_bytes` long (else CorruptionError with the rule
        "<format_name>.file-size"). `keep_lock`: see the module's docstring (read-only files only)."""
        if keep_lock and not writable and size_bytes > 0 and _map_read is not None:
            try:
                mapping = _map_read(path, size_bytes)
            except OSError as exc:
                raise StoreIOError(f"cannot map {path}: {exc.strerror}") from exc
            if isinstance(mapping, int):
                raise _size_error(path, mapping, size_bytes, format_name)
            return cls(path, base_offset, size_bytes, np.frombuffer(mapping, dtype=np.uint8), False)
        try:
            actual = os.path.getsize(path)
        except OSError as exc:
            raise StoreIOError(f"cannot stat {path}: {exc.strerror}") from exc
        if actual != size_bytes:
            raise _size_error(path, actual, size_bytes, format_name)
        try:
            array = np.memmap(path, dtype=np.uint8, mode="r+" if writable else "r", shape=(size_bytes,))
            fd = os.open(path, os.O_RDWR) if writable else None
        except OSError as exc:
            raise StoreIOError(f"cannot map {path}: {exc.strerror}") from exc
        return cls(path, base_offset, size_bytes, array, writable, fd)

    def fileno(self) -> int | None:
        """The file's descriptor while open for writing (kept for fdatasync), else None."""
        return self._fd

    def flush(self, start: int = 0, end: int | None = None) -> None:
        """Make the bytes [start, end) durable and wait for it.

        This is fdatasync of the file, not msync of the range: on Linux both write back the pages a shared
        mapping dirtied, but CPython's mmap.flush holds the GIL for the whole msync (every other thread, puts
        included, stops for it), while os.fdatasync releases it. It writes every dirty page of the file,
        which is a superset of [start, end).

        A failed fdatasync is never forgotten: Linux reports a writeback error once, and may have dropped the
        pages it could not write, so a second fdatasync that returns 0 proves nothing. The first failure is kept
        in `flush_error` and every later flush raises FlushFailedError without asking the disk again. The sync
        runs on a duplicate of the descriptor, so a `close()` in another thread meanwhile cannot make it sync
        whatever file reused the number.
        """
        if self._closed:
            raise StoreClosedError(f"{self.path} is closed")
        if not self.writable:
            return
        end = self.size_bytes if end is None else end
        if end <= start:
            return
        if self.flush_error is not None:
            raise FlushFailedError(f"{self.path} is not flushed: an earlier flush of it failed ({self.flush_error})",
                                   path=self.path) from self.flush_error
        with self._fd_lock:
            if self._fd is None:
                raise StoreClosedError(f"{self.path} is closed")
            fd = os.dup(self._fd)
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self.flush_error = FlushFailedError(f"fdatasync of {self.path} failed: {exc.strerror}", path=self.path)
            raise self.flush_error from exc
        finally:
            os.close(fd)

    def reserve(self, end: int) -> None:
        """Reserve disk blocks for [reserved_bytes, end) of the file (posix_fallocate), so that writing there
        through the mapping cannot fail for want of space. StoreIOError (from the OSError, ENOSPC on a full disk)
        when they cannot be had; nothing where the file system cannot reserve (the writes then take blocks as
        they come, as on a sparse file)."""
        end = min(end, self.size_bytes)
        if end <= self.reserved_bytes:
            return
        if self._fd is None:
            raise StoreClosedError(f"{self.path} is not open for writing")
        try:
            _reserve(self._fd, self.reserved_bytes, end - self.reserved_bytes)
        except OSError as exc:
            raise StoreIOError(f"cannot reserve {end - self.reserved_bytes} bytes of disk for {self.path} at "
                               f"{self.reserved_bytes}: {exc.strerror}") from exc
        self.reserved_bytes = end

    def advise_appending(self, appending: bool) -> None:
        """Tell the kernel whether records are being appended to this mapping (madvise of the whole mapping).

        While appending: MADV_RANDOM. Without it, a write fault on a page that is not in the page cache yet
        makes the kernel read around it: `read_ahead_kb` of the file (8 MiB on this project's machine) is put
        into the page cache by the faulting thread, zero-filled from the file's unreserved or unwritten
        extents, at the 0.5 GB/s that fresh pages cost here, so the put that touched the page waited 16-40 ms
        every 8 MiB. With MADV_RANDOM each fault fills its own page (a few microseconds): no long waits, but a
        fault on every page, which costs throughput (bench/README.md, "Where long puts come from"). After
        appending: MADV_NORMAL, so that reads of the finished segment get readahead again.

        An optimisation only: where madvise is missing or refused nothing changes. The kernel changes the
        mapping's flags under the process's lock on its mappings, so the call may wait for another thread that
        pre-faults any mapping: the writer calls it only for the first segment it appends to after open and for
        one a roll had to create itself; the segment allocator advises the segments it makes, and the ones the
        writer leaves, in its own thread.
        """
        array = self.array  # keeps the mapping alive through the call, even if another thread closes the file
        if array is None or madvise is None or appending == self.appending:
            return
        if madvise(array.ctypes.data, self.size_bytes, MADV_RANDOM if appending else MADV_NORMAL) != 0:
            log.debug("madvise of %s refused: %s", self.path, os.strerror(ctypes.get_errno()))
            return
        self.appending = appending

    def close(self) -> None:
        """Drop the mapping: unmapped now when nothing else refers to it, else when the last reference goes.

        numpy arrays over a mapping hold no buffer export of it (the mmap's close() would succeed under them and
        leave them pointing at unmapped memory: a segmentation fault on the next read). So the test is the
        reference count: the mapping is referred to by the memmap array (twice) and by every view through it;
        when only this frame's name for it is left, nobody can read it any more and it is closed at once (which
        also closes the descriptor it keeps). Otherwise a reader in another thread, or a batch that looks up
        properties later, still has it, and the mapping and its descriptor go with the last of them. A compiled
        read-only mapping (map_read_keep_lock) has no descriptor and always goes with its last reference.
        """
        if self._closed:
            return
        self._closed = True
        mapping = getattr(self.array, "_mmap", None)
        self.view = None
        self.array = None
        if mapping is not None and sys.getrefcount(mapping) <= _ONLY_THIS_FRAME:
            mapping.close()
        with self._fd_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def delete(self) -> None:
        self.close()
        _unlink_quietly(self.path)

    @property
    def closed(self) -> bool:
        return self._closed


# MappedFile.flush as defined here: the compiled SYNC leader (flushwait.c) does its fdatasync itself only while the
# class still has this one (a test's recorder of flushes replaces it).
DEFINED_FLUSH = MappedFile.flush


# The compiled read-only map (commitlog/csrc/read_map.c), or None: np.memmap then, the reference.
_map_read = getattr(NATIVE, "map_read_keep_lock", None)


def _size_error(path: str, actual: int, size_bytes: int, format_name: str) -> CorruptionError:
    return CorruptionError(f"file is {actual} bytes, expected {size_bytes}", path=path,
                           offset=min(actual, size_bytes), rule=f"{format_name}.file-size")


def _reserve(fd: int, start: int, length: int) -> None:
    """posix_fallocate of [start, start + length); a file system that cannot (EOPNOTSUPP) is left as it is."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def fsync_directory(path: str) -> None:
    """Make the directory's entries durable: files created, linked or deleted in it stay so after a crash."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreIOError(f"fsync of directory {path} failed: {exc.strerror}") from exc


def write_file_atomically(path: str, data: bytes) -> None:
    """Replace the file at `path` by `data` so that a crash leaves the old file or the new one, never a part: write
    `<path>.tmp`, fsync it, rename it over `path`, fsync the directory (creating it first if needed). StoreIOError
    on any failure (a `.tmp` may be left; the next write replaces it)."""
    directory = os.path.dirname(path) or "."
    temporary = path + ".tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from exc
    fsync_directory(directory)  # the rename survives a crash


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
