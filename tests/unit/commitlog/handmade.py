"""CommitLog records and segments built by hand with `struct`, independently of the project's encoder.

Tests use these to put bytes on disk the engine never writes itself (v2 records, IPv6 hosts, corruption) and
to check what the engine wrote against an encoding it did not compute.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194
BORN_HOST_V6 = 0x10
STORE_HOST_V6 = 0x20

# Where the fields of a v1 record with IPv4 hosts sit (counted by hand from RocketMQ's CommitLog layout).
AT_TOTAL_SIZE = 0
AT_MAGIC = 4
AT_BODY_CRC = 8
AT_QUEUE_ID = 12
AT_QUEUE_OFFSET = 20
AT_PHYSICAL_OFFSET = 28
AT_SYS_FLAG = 36
AT_STORE_TIMESTAMP_V4 = 56
AT_BODY_LENGTH_V4 = 84
AT_BODY_V4 = 88


def host(address: str, port: int) -> bytes:
    """4 or 16 address bytes, then the port as a big-endian i32."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return socket.inet_pton(family, address) + struct.pack(">i", port)


def record(commitlog_offset: int, topic: str, body: bytes = b"", *, queue_id: int = 0, queue_offset: int = 0,
           flag: int = 0, properties: bytes = b"", v2: bool = False, born_host: str = "192.168.1.2",
           born_port: int = 50000, store_host: str = "10.0.0.7", store_port: int = 10911,
           born_timestamp_ms: int = 1_700_000_000_000, store_timestamp_ms: int = 1_700_000_000_123,
           sys_flag: int = 0, reconsume_times: int = 0, prepared_transaction_offset: int = 0,
           body_crc: int | None = None) -> bytes:
    """One message record. IPv6 host bits are set in SYSFLAG when a host address is IPv6."""
    if ":" in born_host:
        sys_flag |= BORN_HOST_V6
    if ":" in store_host:
        sys_flag |= STORE_HOST_V6
    topic_raw = topic.encode("ascii")
    crc = zlib.crc32(body) & 0x7FFFFFFF if body_crc is None else body_crc
    after_size = (
        struct.pack(">I", MAGIC_V2 if v2 else MAGIC_V1)
        + struct.pack(">iiiqqiq", crc, queue_id, flag, queue_offset, commitlog_offset, sys_flag, born_timestamp_ms)
        + host(born_host, born_port)
        + struct.pack(">q", store_timestamp_ms)
        + host(store_host, store_port)
        + struct.pack(">iqi", reconsume_times, prepared_transaction_offset, len(body))
        + body
        + (struct.pack(">H", len(topic_raw)) if v2 else struct.pack(">B", len(topic_raw)))
        + topic_raw
        + struct.pack(">h", len(properties))
        + properties
    )
    return struct.pack(">i", 4 + len(after_size)) + after_size


def blank(size: int) -> bytes:
    """An end-of-segment blank of `size` bytes: TOTALSIZE, the blank magic, then zeros."""
    return struct.pack(">iI", size, MAGIC_BLANK) + bytes(size - 8)


class SegmentWriter:
    """Lays records out in segment files of a directory the way a RocketMQ writer does (blank, then roll)."""

    def __init__(self, directory, segment_size_bytes: int):
        self.directory = os.fspath(directory)
        self.segment_size_bytes = segment_size_bytes
        self.segments: dict[int, bytearray] = {}
        self.end = 0
        self.offsets: list[int] = []

    def add(self, topic: str, body: bytes = b"", **fields) -> int:
        """Append a record (with PHYSICALOFFSET right), rolling to a new segment with a blank when needed."""
        size = len(record(0, topic, body, **fields))
        base = self.end - self.end % self.segment_size_bytes
        left = base + self.segment_size_bytes - self.end
        if size + 8 > left:
            self._segment(base)[self.end - base :] = blank(left)
            self.end = base + self.segment_size_bytes
            base = self.end
        data = record(self.end, topic, body, **fields)
        segment = self._segment(base)
        segment[self.end - base : self.end - base + len(data)] = data
        self.offsets.append(self.end)
        self.end += len(data)
        return self.offsets[-1]

    def _segment(self, base: int) -> bytearray:
        return self.segments.setdefault(base, bytearray(self.segment_size_bytes))

    def path(self, base: int) -> str:
        return os.path.join(self.directory, f"{base:020d}")

    def write(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        for base, data in self.segments.items():
            with open(self.path(base), "wb") as handle:
                handle.write(data)


def flip_bit(path, position: int, bit: int) -> None:
    """Flip one bit of the byte at `position` of a file."""
    with open(path, "r+b") as handle:
        handle.seek(position)
        value = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes((value ^ (1 << bit),)))
