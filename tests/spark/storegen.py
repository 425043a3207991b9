"""Writes RocketMQ 4.x stores for the Spark tests and benchmark, without the engine.

`StoreWriter` appends records to `<store>/commitlog/<20-digit base offset>` segments with `commitlog.format`
(blank at the end of each full segment, zeros after the written end) and, unless `dispatch=False`, their
ConsumeQueue units to `<store>/consumequeue/<topic>/<queue_id>/<20-digit byte offset>`. It is a test double:
one writer, no lock, no flush policy (bytes go to the page cache through os.pwrite).

`put` writes one record (any version and host width, for the rare-path tests); `put_bulk` writes many records
of one shape with numpy (for the benchmark). Reopening a directory continues where the last writer stopped.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from pathlib import Path

import numpy as np
from mqstore.commitlog import format as fmt
from mqstore.consumequeue import format as cqfmt

BORN_HOST = ("10.1.2.3", 41234)
STORE_HOST = ("192.168.7.9", 10911)
BORN_TIMESTAMP_MS = 1_700_000_000_000
QUEUE_ENTRIES_PER_FILE = 64
HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def encode_host(host: str, port: int) -> bytes:
    """8 bytes for an IPv4 host, 20 for an IPv6 one."""
    if ":" in host:
        return socket.inet_pton(socket.AF_INET6, host) + fmt.I32.pack(port)
    return fmt.encode_host(host, port)


def encode_record(*, commitlog_offset: int, topic: str, body: bytes, queue_id: int, queue_offset: int,
                  properties: dict[str, str], flag: int = 0, sys_flag: int = 0, born_timestamp_ms: int,
                  store_timestamp_ms: int, born_host=BORN_HOST, store_host=STORE_HOST, reconsume_times: int = 0,
                  prepared_transaction_offset: int = 0, version: int = 1) -> bytes:
    """One message record. IPv6 hosts set the SYSFLAG host bits; version 2 has a 2-byte topic length."""
    born = encode_host(*born_host)
    store = encode_host(*store_host)
    if len(born) == fmt.HOST_V6_LENGTH:
        sys_flag |= fmt.SYS_FLAG_BORNHOST_V6
    if len(store) == fmt.HOST_V6_LENGTH:
        sys_flag |= fmt.SYS_FLAG_STOREHOST_V6
    topic_raw = topic.encode("ascii")
    properties_raw = fmt.encode_properties(properties)
    magic = fmt.MESSAGE_MAGIC_CODE if version == 1 else fmt.MESSAGE_MAGIC_CODE_V2
    topic_length = bytes([len(topic_raw)]) if version == 1 else fmt.U16.pack(len(topic_raw))
    tail = (struct.pack(">iq", reconsume_times, prepared_transaction_offset) + fmt.I32.pack(len(body)) + body
            + topic_length + topic_raw + fmt.I16.pack(len(properties_raw)) + properties_raw)
    head_size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born) + 8 + len(store)
    total = head_size + len(tail)
    head = (struct.pack(">iIiiiqqiq", total, magic, fmt.body_crc(body), queue_id, flag, queue_offset,
                        commitlog_offset, sys_flag, born_timestamp_ms)
            + born + struct.pack(">q", store_timestamp_ms) + store)
    record = head + tail
    assert len(record) == total
    return record


class StoreWriter:
    """Appends records to a store directory (created when missing). Not thread-safe; one writer per store."""

    def __init__(self, directory, *, segment_size_bytes: int = 64 * 1024,
                 queue_entries_per_file: int = QUEUE_ENTRIES_PER_FILE, dispatch: bool = True):
        self.directory = Path(directory)
        self.segment_size_bytes = segment_size_bytes
        self.queue_entries_per_file = queue_entries_per_file
        self.dispatch = dispatch
        self.commitlog_dir = self.directory / "commitlog"
        self.queue_dir = self.directory / "consumequeue"
        self.commitlog_dir.mkdir(parents=True, exist_ok=True)
        self.queue_dir.mkdir(parents=True, exist_ok=True)
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.store_timestamp_ms = BORN_TIMESTAMP_MS + 1000
        self.end_offset = self._recover()
        self._fd = None
        self._fd_base = -1

    # --- reopening -----------------------------------------------------------------------------------------
    def _recover(self) -> int:
        """The written end of the log (walking the last segment) and each queue's next entry number."""
        bases = sorted(int(p.name) for p in self.commitlog_dir.iterdir() if fmt.parse_segment_name(p.name) is not None)
        end = 0
        for base in bases:
            data = (self.commitlog_dir / fmt.segment_name(base)).read_bytes()
            pos = 0
            while pos + 8 <= len(data):
                size, magic = fmt.BLANK.unpack_from(data, pos)
                if magic == fmt.BLANK_MAGIC_CODE:
                    pos = len(data)
                    break
                if size <= 0 or magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2):
                    break
                self.store_timestamp_ms = max(self.store_timestamp_ms, struct.unpack_from(">q", data, pos + 56)[0])
                pos += size
            end = base + pos
            if pos < len(data):
                break
        for topic_dir in self.queue_dir.iterdir():
            for queue_dir in topic_dir.iterdir():
                count = 0
                for name in sorted(p.name for p in queue_dir.iterdir()):
                    units = np.fromfile(queue_dir / name, dtype=cqfmt.CONSUME_QUEUE_UNIT)
                    written = np.flatnonzero(units["size"] <= 0)
                    count = int(name) // cqfmt.UNIT_SIZE_BYTES + (written[0] if len(written) else len(units))
                self.queue_offsets[(topic_dir.name, int(queue_dir.name))] = int(count)
        return end

    # --- files ---------------------------------------------------------------------------------------------
    def _segment_fd(self, base: int) -> int:
        if self._fd_base != base:
            self.close()
            path = self.commitlog_dir / fmt.segment_name(base)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size < self.segment_size_bytes:
                os.ftruncate(fd, self.segment_size_bytes)
            self._fd, self._fd_base = fd, base
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._fd_base = None, -1

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _room(self, size: int) -> int:
        """The offset where a record of `size` bytes goes, writing the blank that ends a full segment."""
        assert size + fmt.END_FILE_MIN_BLANK_LENGTH <= self.segment_size_bytes
        base = self.end_offset - self.end_offset % self.segment_size_bytes
        left = base + self.segment_size_bytes - self.end_offset
        if size + fmt.END_FILE_MIN_BLANK_LENGTH > left:
            os.pwrite(self._segment_fd(base), fmt.BLANK.pack(left, fmt.BLANK_MAGIC_CODE), self.end_offset - base)
            self.end_offset = base + self.segment_size_bytes
        return self.end_offset

    def _write(self, offset: int, data: bytes) -> None:
        base = offset - offset % self.segment_size_bytes
        os.pwrite(self._segment_fd(base), data, offset - base)
        self.end_offset = offset + len(data)

    def _dispatch(self, topic: str, queue_id: int, first_queue_offset: int, units: np.ndarray) -> None:
        """Write ConsumeQueue units for entries first_queue_offset.. of (topic, queue_id)."""
        directory = self.queue_dir / topic / str(queue_id)
        directory.mkdir(parents=True, exist_ok=True)
        per_file = self.queue_entries_per_file
        done = 0
        while done < len(units):
            entry = first_queue_offset + done
            file_first = entry - entry % per_file
            take = min(len(units) - done, file_first + per_file - entry)
            path = directory / cqfmt.file_name(file_first)
            with open(path, "r+b" if path.exists() else "w+b") as handle:
                if os.fstat(handle.fileno()).st_size < per_file * cqfmt.UNIT_SIZE_BYTES:
                    handle.truncate(per_file * cqfmt.UNIT_SIZE_BYTES)
                handle.seek((entry - file_first) * cqfmt.UNIT_SIZE_BYTES)
                handle.write(units[done:done + take].tobytes())
            done += take

    # --- appending -----------------------------------------------------------------------------------------
    def put(self, topic: str, body: bytes, *, queue_id: int = 0, tags: str | None = None, keys=(),
            properties: dict[str, str] | None = None, flag: int = 0, sys_flag: int = 0,
            born_timestamp_ms: int | None = None, store_timestamp_ms: int | None = None,
            born_host=BORN_HOST, store_host=STORE_HOST, reconsume_times: int = 0, version: int = 1) -> int:
        """Append one message; returns its commitlog offset."""
        props = {}
        if tags is not None:
            props[fmt.PROPERTY_TAGS] = tags
        if keys:
            props[fmt.PROPERTY_KEYS] = fmt.KEY_SEPARATOR.join(keys)
        props.update(properties or {})
        # RocketMQ 4.4.0 (CommitLog.doAppend) gives a transaction-prepared or rolled-back record QUEUEOFFSET 0 and
        # no entry number: it gets no ConsumeQueue unit, and numbering it would leave a hole in the queue.
        numbered = sys_flag & fmt.SYS_FLAG_TRANSACTION_MASK in (0, fmt.SYS_FLAG_TRANSACTION_COMMIT_TYPE)
        queue_offset = self.queue_offsets.get((topic, queue_id), 0) if numbered else 0
        if store_timestamp_ms is None:
            self.store_timestamp_ms += 1
            store_timestamp_ms = self.store_timestamp_ms
        fields = dict(topic=topic, body=body, queue_id=queue_id, queue_offset=queue_offset, properties=props,
                      flag=flag, sys_flag=sys_flag, born_timestamp_ms=born_timestamp_ms or store_timestamp_ms - 5,
                      store_timestamp_ms=store_timestamp_ms, born_host=born_host, store_host=store_host,
                      reconsume_times=reconsume_times, version=version)
        size = len(encode_record(commitlog_offset=0, **fields))
        offset = self._room(size)
        record = encode_record(commitlog_offset=offset, **fields)
        self._write(offset, record)
        if numbered:
            self.queue_offsets[(topic, queue_id)] = queue_offset + 1
        if self.dispatch and numbered:
            self._dispatch(topic, queue_id, queue_offset,
                           cqfmt.make_units([offset], [size], [fmt.tags_code(tags)]))
        return offset

    def put_bulk(self, topic: str, count: int, body_size_bytes: int, *, queue_count: int = 4, tag: str = "TagA",
                 seed: int = 0) -> None:
        """Append `count` messages of one shape (random body, TAGS, KEYS and UNIQ_KEY), round-robin over queues.

        Vectorized: a template record is copied `count` times and its per-record fields patched with numpy.
        """
        rng = np.random.default_rng(seed)
        uniq_placeholder = "0" * 32
        props = {fmt.PROPERTY_TAGS: tag, fmt.PROPERTY_KEYS: "order-1 order-2", fmt.PROPERTY_UNIQ_KEY: uniq_placeholder}
        template = np.frombuffer(encode_record(
            commitlog_offset=0, topic=topic, body=bytes(body_size_bytes), queue_id=0, queue_offset=0,
            properties=props, born_timestamp_ms=0, store_timestamp_ms=0), dtype=np.uint8)
        size = len(template)
        uniq_at = size - 33  # the 32 hex digits, then the final \x02
        tags_hash = fmt.tags_code(tag)
        done = 0
        while done < count:
            offset = self._room(size)
            base = offset - offset % self.segment_size_bytes
            fit = (base + self.segment_size_bytes - offset - fmt.END_FILE_MIN_BLANK_LENGTH) // size
            n = min(count - done, max(fit, 1), 65536)
            records = np.tile(template, (n, 1))
            offsets = offset + np.arange(n, dtype=np.int64) * size
            queue_ids = ((done + np.arange(n)) % queue_count).astype(np.int32)
            queue_offsets = np.empty(n, dtype=np.int64)
            for q in range(queue_count):
                rows = np.flatnonzero(queue_ids == q)
                first = self.queue_offsets.get((topic, q), 0)
                queue_offsets[rows] = first + np.arange(len(rows))
            timestamps = self.store_timestamp_ms + 1 + np.arange(n, dtype=np.int64) // 64
            self.store_timestamp_ms = int(timestamps[-1])
            bodies = rng.integers(0, 256, size=(n, body_size_bytes), dtype=np.uint8)
            records[:, fmt.OFFSET_BODY:fmt.OFFSET_BODY + body_size_bytes] = bodies
            crcs = np.fromiter((zlib.crc32(row) & 0x7FFFFFFF for row in bodies), dtype=np.int64, count=n)
            self._patch(records, fmt.OFFSET_BODY_CRC, crcs, ">i4")
            self._patch(records, fmt.OFFSET_QUEUE_ID, queue_ids, ">i4")
            self._patch(records, fmt.OFFSET_QUEUE_OFFSET, queue_offsets, ">i8")
            self._patch(records, fmt.OFFSET_PHYSICAL_OFFSET, offsets, ">i8")
            self._patch(records, fmt.OFFSET_BORN_TIMESTAMP, timestamps - 3, ">i8")
            self._patch(records, fmt.OFFSET_STORE_TIMESTAMP, timestamps, ">i8")
            serial = (self.end_offset + np.arange(n, dtype=np.int64)).astype(">u8").view(np.uint8).reshape(n, 8)
            digits = np.empty((n, 16), dtype=np.uint8)
            digits[:, 0::2] = HEX_DIGITS[serial >> 4]
            digits[:, 1::2] = HEX_DIGITS[serial & 15]
            records[:, uniq_at + 16:uniq_at + 32] = digits
            self._write(offset, records.tobytes())
            for q in range(queue_count):
                rows = np.flatnonzero(queue_ids == q)
                if len(rows) == 0:
                    continue
                first = self.queue_offsets.get((topic, q), 0)
                self.queue_offsets[(topic, q)] = first + len(rows)
                if self.dispatch:
                    self._dispatch(topic, q, first, cqfmt.make_units(offsets[rows], np.full(len(rows), size),
                                                                     np.full(len(rows), tags_hash)))
            done += n

    @staticmethod
    def _patch(records: np.ndarray, at: int, values: np.ndarray, dtype: str) -> None:
        width = np.dtype(dtype).itemsize
        records[:, at:at + width] = np.asarray(values).astype(dtype).view(np.uint8).reshape(len(records), width)
