"""Messages going in (`Message`), coming out (`StoredMessage`), and the outcome of a put (`PutResult`).

The byte layout they map to is in `commitlog.format`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from commitlog import format as fmt
from commitlog.errors import CorruptionError


@dataclass(slots=True)
class Message:
    """A message to store. `tags` and `keys` become the TAGS and KEYS properties."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str | None = None
    keys: tuple[str, ...] | list[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int | None = None


class PutStatus(enum.Enum):
    """The outcome of a put, with RocketMQ's names."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutResult(NamedTuple):
    """Where a message was stored. `msg_id` is the offset message id (see commitlog.format)."""

    status: PutStatus
    commitlog_offset: int
    queue_offset: int
    size_bytes: int
    store_timestamp_ms: int
    msg_id: str


class StoredMessage:
    """A message read back from the CommitLog, with every stored field.

    Properties, tags, keys, hosts and msg_id are decoded when first asked for.
    """

    __slots__ = (
        "topic", "queue_id", "queue_offset", "commitlog_offset", "size_bytes", "body", "flag", "sys_flag",
        "born_timestamp_ms", "store_timestamp_ms", "reconsume_times", "prepared_transaction_offset",
        "body_crc", "born_host_raw", "store_host_raw", "properties_raw", "_properties",
    )

    def __init__(
        self, topic, queue_id, queue_offset, commitlog_offset, size_bytes, body, flag, sys_flag,
        born_timestamp_ms, store_timestamp_ms, reconsume_times, prepared_transaction_offset, body_crc,
        born_host_raw, store_host_raw, properties_raw,
    ):
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commitlog_offset = commitlog_offset
        self.size_bytes = size_bytes
        self.body = body
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp_ms = born_timestamp_ms
        self.store_timestamp_ms = store_timestamp_ms
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body_crc = body_crc
        self.born_host_raw = born_host_raw
        self.store_host_raw = store_host_raw
        self.properties_raw = properties_raw
        self._properties = None

    @property
    def properties(self) -> dict[str, str]:
        """Every property, TAGS, KEYS and UNIQ_KEY included."""
        if self._properties is None:
            self._properties = fmt.decode_properties(self.properties_raw)
        return self._properties

    @property
    def tags(self) -> str | None:
        return self.properties.get(fmt.PROPERTY_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        raw = self.properties.get(fmt.PROPERTY_KEYS)
        return tuple(k for k in raw.split(fmt.KEY_SEPARATOR) if k) if raw else ()

    @property
    def born_host(self) -> str:
        return fmt.decode_host(self.born_host_raw)

    @property
    def store_host(self) -> str:
        return fmt.decode_host(self.store_host_raw)

    @property
    def msg_id(self) -> str:
        return fmt.message_id(self.store_host_raw, self.commitlog_offset)

    def __repr__(self) -> str:
        return (
            f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
            f"commitlog_offset={self.commitlog_offset}, size_bytes={self.size_bytes}, body={self.body[:32]!r}"
            f"{'...' if len(self.body) > 32 else ''}, tags={self.tags!r})"
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__[:-1])

    __hash__ = None


_HEADER = fmt.HEADER_V1
_MAGIC_V1 = fmt.MESSAGE_MAGIC_CODE
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_RECORD_SIZE_MIN = fmt.RECORD_SIZE_MIN
_I16 = fmt.I16


def decode_message(buf, pos: int, remaining: int, commitlog_offset: int, *, path: str | None = None,
                   check_crc: bool = False) -> StoredMessage:
    """Decode and check (rules 1-4, and 5 when `check_crc`) the message record at `pos` of `buf`.

    `buf` is a memoryview or bytes over one segment (or over one record, with pos 0), `remaining` the bytes
    of the segment from `pos`. Raises CorruptionError for anything that is not a valid message record.
    """
    if remaining >= fmt.HEADER_SIZE + 4:
        (size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, body_length) = _HEADER.unpack_from(buf, pos)
        if magic == _MAGIC_V1 and not sys_flag & _V6_FLAGS and _RECORD_SIZE_MIN <= size <= remaining:
            # Fast path: v1 record with IPv4 hosts; the same checks as locate(), inline.
            body_end = pos + 88 + body_length
            end = pos + size
            if 0 <= body_length and body_end + 3 <= end and physical == commitlog_offset:
                topic_length = buf[body_end]
                properties_at = body_end + 1 + topic_length
                if topic_length and properties_at + 2 <= end:
                    properties_length = _I16.unpack_from(buf, properties_at)[0]
                    if properties_at + 2 + properties_length == end and properties_length >= 0:
                        body = bytes(buf[pos + 88 : body_end])
                        if check_crc and fmt.body_crc(body) != crc:
                            raise fmt._corrupt("5", f"BODYCRC {crc} does not match the body", path,
                                               commitlog_offset)
                        topic = bytes(buf[body_end + 1 : properties_at])
                        if not topic.isascii():
                            raise CorruptionError(f"topic is not ASCII: {topic!r}", path=path,
                                                  offset=commitlog_offset, rule="3")
                        return StoredMessage(
                            topic.decode("ascii"), queue_id, queue_offset,
                            commitlog_offset, size, body, flag, sys_flag, born_ts, store_ts, reconsume,
                            prepared, crc, born_host, store_host, bytes(buf[properties_at + 2 : end]),
                        )
    return _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc)


def _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc) -> StoredMessage:
    """Any record version and host width (and the detailed error when the fast path refused a record)."""
    layout = fmt.locate(buf, pos, remaining, commitlog_offset, path=path)
    if check_crc:
        fmt.check_body_crc(buf, layout, pos, commitlog_offset, path=path)
    (size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts) = fmt.struct.unpack_from(
        ">iIiiiqqiq", buf, pos)
    born_at, born_length = layout.born_host
    store_at, store_length = layout.store_host
    store_ts = fmt.struct.unpack_from(">q", buf, store_at - 8)[0]
    reconsume, prepared = fmt.struct.unpack_from(">iq", buf, store_at + store_length)
    body_start = layout.body_start
    topic_raw = bytes(buf[layout.topic_start : layout.topic_start + layout.topic_length])
    try:
        topic = topic_raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptionError(f"topic is not ASCII: {topic_raw!r}", path=path, offset=commitlog_offset,
                              rule="3") from exc
    return StoredMessage(
        topic, queue_id, queue_offset, commitlog_offset, size,
        bytes(buf[body_start : body_start + layout.body_length]), flag, sys_flag, born_ts, store_ts,
        reconsume, prepared, crc, bytes(buf[born_at : born_at + born_length]),
        bytes(buf[store_at : store_at + store_length]),
        bytes(buf[layout.properties_start : layout.properties_start + layout.properties_length]),
    )
