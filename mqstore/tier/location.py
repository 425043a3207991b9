"""Where a tier lives: an object store location opened through pyarrow's filesystems.

A tier URI names a directory of a filesystem pyarrow knows (`pyarrow.fs.FileSystem.from_uri`): `s3://bucket/prefix`
(and anything S3-compatible, with `?endpoint_override=host:port&scheme=http` or pyarrow's usual AWS_* variables),
`gs://bucket/prefix`, `hdfs://...`, `file:///abs/dir`, or a plain local path. A scheme pyarrow does not know is
opened through fsspec when fsspec is installed. Credentials come from pyarrow's usual configuration (environment
variables, the credentials file, the URI's query); `redacted()` is the only form of the URI that is ever logged or
shown, with user info and secret query values removed.

Objects are written whole or not at all, as a reader sees them: on object stores (S3, GCS, Azure) a PUT or a
completed multipart upload is atomic; on a filesystem with directories (local, HDFS, fsspec) the object is written
under a temporary name beside it and renamed over it. A reader still trusts an object only as far as the tier's
manifest lists it (mqstore/tier/manifest.py).

A location's uploads and read-backs can be metered (its `meter`, an `UploadMeter`): the CPU seconds of the calling
thread (user and system, `time.thread_time`) spent in each phase, and the bytes it moved. The meter sees only the
threads that call it: an object store's own threads (pyarrow's S3 client uploads in threads of its own) are not in
it.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Iterable

from isal import isal_zlib

from mqstore.commitlog.errors import CorruptionError, InvalidConfigError, StoreIOError

# object stores: their writes are atomic (no temporary name needed), and an open input file holds no descriptor
# or connection of its own (the client pools them), only its object's name and size
OBJECT_STORE_FILESYSTEMS = frozenset({"s3", "gcs", "abfs"})
# Input files a reader may keep open (mqstore/tier/reader.py): on a filesystem each holds a file descriptor (HDFS: a
# connection); on an object store, where opening one costs a request (S3: a HEAD), under 1 KB each and no
# descriptor (S3: 860 bytes of resident memory a handle, 2,000 opened), so that a reader opens each object of a tier
# of up to this many objects once (4 TiB of 1 GiB segments, about 3.5 MB of handles).
OPEN_INPUTS_MAX_FILESYSTEM = 16
OPEN_INPUTS_MAX_OBJECT_STORE = 4096
TEMPORARY_MARK = ".mqstore-part-"  # in the name of an object still being written on a filesystem with renames
STREAM_CHUNK_BYTES = 8 * 1024 * 1024  # what one write of an upload moves
# What one range read of a verification moves: few requests an object (moto's S3 server copies the whole object
# for every range read: 0.32 s for 8 MiB of a 512 MiB object, 0.06 s of a 64 MiB one).
VERIFY_CHUNK_BYTES = 64 * 1024 * 1024
# A read-back reads into one buffer of its own, not into a new one a read (a fresh 64 MiB buffer a read costs its
# page faults and zeroing again: 0.67 CPU s/GiB read back from tmpfs, against 0.27; docs/tier.md, "What it costs").
VERIFY_READS_INTO_BUFFER = True
SECRET_QUERY_KEYS = frozenset({"access_key", "secret_key", "session_token", "password", "token", "sas_token",
                               "account_key", "credential", "credentials"})


UPLOAD_PHASES = ("read", "crc", "put", "verify_read", "verify_crc")  # what an UploadMeter counts

# pyarrow and pyarrow.fs, imported when the first location is made (_import_pyarrow), not with this module: every
# store's open imports it (recovery reads a tier's history through it), and importing pyarrow cost that open
# about 0.1 s of a store that has no tier.
pa = pafs = None


def _import_pyarrow() -> None:
    global pa, pafs
    if pafs is None:
        import pyarrow
        import pyarrow.fs

        pa, pafs = pyarrow, pyarrow.fs


class UploadMeter:
    """CPU seconds (of the thread calling `add`) and bytes, per phase of UPLOAD_PHASES; threads may share one."""

    def __init__(self):
        self._lock = threading.Lock()
        self.cpu_seconds = dict.fromkeys(UPLOAD_PHASES, 0.0)
        self.bytes = dict.fromkeys(UPLOAD_PHASES, 0)

    def add(self, phase: str, began: float, size: int) -> float:
        """Charge `phase` with the calling thread's CPU time since `began` (a time.thread_time()) and `size`
        bytes; the thread's CPU time now (the next phase's `began`)."""
        now = time.thread_time()
        with self._lock:
            self.cpu_seconds[phase] += now - began
            self.bytes[phase] += size
        return now

    def snapshot(self) -> dict:
        with self._lock:
            return {"cpu_seconds": {phase: round(value, 4) for phase, value in self.cpu_seconds.items()},
                    "bytes": dict(self.bytes)}


class _NoMeter:
    """The meter of an unmetered call: charges nothing."""

    @staticmethod
    def add(phase: str, began: float, size: int) -> float:
        return began


NO_METER = _NoMeter()


def redacted(uri: str) -> str:
    """`uri` without user info and without the values of secret query parameters: the form that is logged."""
    parts = urllib.parse.urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    shown = [(key, "***" if key.lower() in SECRET_QUERY_KEYS else value) for key, value in query]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, urllib.parse.urlencode(shown, safe="*:"),
                                    parts.fragment))


def crc32(data, value: int = 0) -> int:
    """CRC-32 (zlib's polynomial, as RocketMQ's UtilAll.crc32) of `data`, continuing from `value`."""
    return isal_zlib.crc32(data, value) & 0xFFFFFFFF


@dataclass(frozen=True)
class ObjectInfo:
    """An object found in the tier: its key (relative to the tier's root) and size."""

    key: str
    size: int


class TierLocation:
    """A tier's root directory on a filesystem; keys are relative paths with `/` (as on disk in a store)."""

    def __init__(self, filesystem: pafs.FileSystem, root: str, uri: str):
        _import_pyarrow()  # for the methods' `pa.ArrowException` and `pafs` names
        self.filesystem = filesystem
        self.root = root.rstrip("/")
        self.uri = redacted(uri)
        self.atomic_put = filesystem.type_name in OBJECT_STORE_FILESYSTEMS
        self.open_inputs_max = OPEN_INPUTS_MAX_OBJECT_STORE if self.atomic_put else OPEN_INPUTS_MAX_FILESYSTEM
        self.meter = NO_METER  # charged by put_chunks ("crc", "put") and checksum ("verify_read", "verify_crc")

    @classmethod
    def open(cls, uri: str) -> "TierLocation":
        """Open the location a tier URI (or a local path) names; InvalidConfigError when it cannot be."""
        if not isinstance(uri, str) or not uri:
            raise InvalidConfigError(f"a tier location must be a non-empty URI or path, got {uri!r}")
        if "://" not in uri:
            uri = "file://" + os.path.abspath(uri)
        _import_pyarrow()
        try:
            filesystem, root = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            if "nrecognized filesystem" not in str(exc):
                raise InvalidConfigError(f"cannot open the tier {redacted(uri)}: {exc}") from exc
            filesystem, root = _from_fsspec(uri, exc)
        except OSError as exc:
            raise StoreIOError(f"cannot open the tier {redacted(uri)}: {exc}") from exc
        return cls(filesystem, root, uri)

    def path(self, key: str) -> str:
        assert key and not key.startswith("/") and ".." not in key.split("/"), key
        return f"{self.root}/{key}" if self.root else key

    def display(self, key: str) -> str:
        """How an object is named in messages and errors: the redacted URI and the key."""
        return f"{self.uri.split('?', 1)[0].rstrip('/')}/{key}"

    # --- writing -------------------------------------------------------------------------------------------
    def put_chunks(self, key: str, chunks: Iterable) -> tuple[int, int]:
        """Write the object `key` from `chunks` (bytes-like), visible whole or not at all; (size, CRC-32). The
        location's meter is charged the CRC and the writes; the chunks' iterator charges its own reads."""
        meter = self.meter
        target = self.path(key)
        written = self.path(f"{key}{TEMPORARY_MARK}{secrets.token_hex(6)}") if not self.atomic_put else target
        size = checksum = 0
        try:
            parent = target.rsplit("/", 1)[0]
            if not self.atomic_put and parent:
                self.filesystem.create_dir(parent, recursive=True)
            with self.filesystem.open_output_stream(written, metadata={}) as stream:
                for chunk in chunks:
                    began = time.thread_time()
                    checksum = crc32(chunk, checksum)
                    began = meter.add("crc", began, len(chunk))
                    stream.write(chunk)
                    meter.add("put", began, len(chunk))
                    size += len(chunk)
            if written != target:
                self.filesystem.move(written, target)
        except (OSError, pa.ArrowException) as exc:
            if written != target:
                self._remove_quietly(written)
            raise StoreIOError(f"cannot write {self.display(key)}: {exc}") from exc
        return size, checksum

    def put_bytes(self, key: str, data: bytes) -> tuple[int, int]:
        return self.put_chunks(key, (data,))

    def delete(self, key: str) -> None:
        try:
            self.filesystem.delete_file(self.path(key))
        except FileNotFoundError:
            pass
        except (OSError, pa.ArrowException) as exc:
            raise StoreIOError(f"cannot delete {self.display(key)}: {exc}") from exc

    def _remove_quietly(self, path: str) -> None:
        try:
            self.filesystem.delete_file(path)
        except (OSError, pa.ArrowException):
            pass

    def remove_leftovers(self, directory: str) -> int:
        """Delete the temporary objects an interrupted writer left under `directory` (a key prefix); how many."""
        removed = 0
        for info in self.list(directory):
            if TEMPORARY_MARK in info.key.rsplit("/", 1)[-1]:
                self._remove_quietly(self.path(info.key))
                removed += 1
        return removed

    # --- reading -------------------------------------------------------------------------------------------
    def size(self, key: str) -> int | None:
        """The object's size, or None when there is no such object."""
        try:
            info = self.filesystem.get_file_info(self.path(key))
        except (OSError, pa.ArrowException) as exc:
            raise StoreIOError(f"cannot look up {self.display(key)}: {exc}") from exc
        return info.size if info.type == pafs.FileType.File else None

    def read_all(self, key: str) -> bytes | None:
        """The whole object, or None when there is none."""
        try:
            with self.filesystem.open_input_stream(self.path(key)) as stream:
                return stream.read()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException) as exc:
            if _not_found(exc):
                return None
            raise StoreIOError(f"cannot read {self.display(key)}: {exc}") from exc

    def open_input(self, key: str, size: int):
        """A random-access reader of an object the manifest says is `size` bytes. Opening costs a request (S3: a
        HEAD), each read_at one range read: keep the reader for the next reads."""
        try:
            return self.filesystem.open_input_file(self.path(key))
        except (OSError, pa.ArrowException) as exc:
            if _not_found(exc):
                raise CorruptionError(f"the tier object {self.display(key)} listed in the manifest is missing",
                                      path=self.display(key), offset=0, rule="tier.object-missing") from exc
            raise StoreIOError(f"cannot open {self.display(key)}: {exc}") from exc

    def read_range(self, key: str, size: int, offset: int, length: int, handle=None) -> bytes:
        """`length` bytes at `offset` of the object `key` of `size` bytes, in one range read. Fewer bytes than
        asked (the object is shorter than the manifest says) raise CorruptionError naming the object."""
        assert 0 <= offset and 0 <= length and offset + length <= size, (key, size, offset, length)
        try:
            if handle is None:
                with self.open_input(key, size) as opened:
                    data = opened.read_at(length, offset)
            else:
                data = handle.read_at(length, offset)
        except (OSError, pa.ArrowException) as exc:
            if _not_found(exc):
                raise CorruptionError(f"the tier object {self.display(key)} listed in the manifest is missing",
                                      path=self.display(key), offset=offset, rule="tier.object-missing") from exc
            raise StoreIOError(f"cannot read {self.display(key)} at {offset}: {exc}") from exc
        if len(data) != length:
            raise CorruptionError(f"the tier object {self.display(key)} ends before {offset + length}: it is "
                                  f"shorter than the {size} bytes its manifest lists", path=self.display(key),
                                  offset=offset + len(data), rule="tier.object-size")
        return data

    def checksum(self, key: str, size: int, length: int | None = None) -> tuple[int, int]:
        """(bytes read, CRC-32) of the object's first `length` bytes (all of it by default), read in chunks; the
        location's meter is charged the reads and the CRC."""
        meter = self.meter
        length = size if length is None else length
        checksum = done = 0
        buffer = memoryview(bytearray(min(VERIFY_CHUNK_BYTES, length))) if VERIFY_READS_INTO_BUFFER else None
        with self.open_input(key, size) as handle:
            while done < length:
                want = min(VERIFY_CHUNK_BYTES, length - done)
                began = time.thread_time()
                try:
                    data = handle.read_at(want, done) if buffer is None else _read_into(handle, buffer[:want], done)
                except (OSError, pa.ArrowException) as exc:
                    if _not_found(exc):
                        return done, checksum
                    raise StoreIOError(f"cannot read {self.display(key)} at {done}: {exc}") from exc
                began = meter.add("verify_read", began, len(data))
                checksum = crc32(data, checksum)
                meter.add("verify_crc", began, len(data))
                done += len(data)
                if len(data) < want:
                    break
        return done, checksum

    def list(self, directory: str = "") -> list[ObjectInfo]:
        """Every object under `directory` (a key prefix, recursively), sorted by key."""
        base = self.path(directory) if directory else self.root
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except (OSError, pa.ArrowException) as exc:
            raise StoreIOError(f"cannot list {self.display(directory)}: {exc}") from exc
        skip = len(self.root) + 1 if self.root else 0
        return sorted((ObjectInfo(info.path[skip:], info.size) for info in infos
                       if info.type == pafs.FileType.File), key=lambda info: info.key)


def _read_into(handle, buffer: memoryview, offset: int) -> memoryview:
    """Read from `offset` of the object into `buffer`; the part of it filled (shorter at the object's end)."""
    handle.seek(offset)
    return buffer[:handle.readinto(buffer)]


def _not_found(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) or "NoSuchKey" in str(exc) or "does not exist" in str(exc)


def _from_fsspec(uri: str, cause: BaseException):
    try:
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem
    except ImportError:
        raise InvalidConfigError(f"pyarrow has no filesystem for {redacted(uri)} ({cause}) and fsspec is not "
                                 "installed") from cause
    try:
        filesystem, root = fsspec.core.url_to_fs(uri)
    except (ValueError, ImportError, OSError) as exc:
        raise InvalidConfigError(f"neither pyarrow nor fsspec opens {redacted(uri)}: {exc}") from exc
    return PyFileSystem(FSSpecHandler(filesystem)), root
