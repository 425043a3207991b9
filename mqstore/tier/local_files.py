"""The store's local files as the tier uploader reads them: a sealed segment with pread, a ConsumeQueue file's image
(its first units, then zeros), the units of a queue file below an offset, and the queue directories. Every read
charges its CPU time to an UploadMeter's "read" phase when given one; a file shorter than asked, or that cannot
be read, raises StoreIOError.
"""

from __future__ import annotations

import os
import time

import numpy as np

from mqstore.commitlog.errors import StoreIOError
from mqstore.consumequeue import format as queue_fmt
from mqstore.tier.location import NO_METER, STREAM_CHUNK_BYTES, crc32


def pread(path: str, length: int, offset: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from exc


def file_chunks(path: str, size: int, meter=NO_METER):
    """The first `size` bytes of the file, in STREAM_CHUNK_BYTES reads (short: the file shrank, an error); `meter`
    is charged the reads."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise StoreIOError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        done = 0
        while done < size:
            began = time.thread_time()
            try:
                chunk = os.pread(fd, min(STREAM_CHUNK_BYTES, size - done), done)
            except OSError as exc:
                raise StoreIOError(f"cannot read {path} at {done}: {exc.strerror}") from exc
            if not chunk:
                raise StoreIOError(f"{path} is shorter than {size} bytes: it ends at {done}")
            meter.add("read", began, len(chunk))
            done += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def queue_image_chunks(path: str, file_bytes: int, units: int):
    """A ConsumeQueue file's image: its first `units` units, then zeros to `file_bytes`."""
    kept = units * queue_fmt.UNIT_SIZE_BYTES
    yield from file_chunks(path, kept)
    zeros = bytes(min(STREAM_CHUNK_BYTES, file_bytes - kept))
    done = kept
    while done < file_bytes:
        step = min(len(zeros), file_bytes - done)
        yield zeros[:step] if step < len(zeros) else zeros
        done += step


def file_checksum(path: str, length: int) -> int:
    checksum = 0
    for chunk in file_chunks(path, length):
        checksum = crc32(chunk, checksum)
    return checksum


def units_below(path: str, file_bytes: int, end: int) -> int:
    """How many units from the start of the ConsumeQueue file at `path` are written and point below `end` (fillers
    count: they stand for entries below the log's start)."""
    raw = pread(path, file_bytes, 0)
    count = len(raw) // queue_fmt.UNIT_SIZE_BYTES
    units = np.frombuffer(raw, dtype=queue_fmt.CONSUME_QUEUE_UNIT, count=count)
    taken = (units["size"] != 0) & (units["commitlog_offset"] < end)
    return count if taken.all() else int(np.argmin(taken))


def list_names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError(f"cannot list {directory}: {exc.strerror}") from exc


def queue_directories(root: str):
    """(topic, queue id, directory) of every ConsumeQueue directory under `root`, sorted."""
    for topic in sorted(list_names(root)):
        topic_dir = os.path.join(root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for queue_text in sorted(list_names(topic_dir)):
            if queue_text.isascii() and queue_text.isdigit() and len(queue_text) <= 7:
                yield topic, int(queue_text), os.path.join(topic_dir, queue_text)
