"""Messages going in (`Message`), coming out (`StoredMessage`), and the outcome of a put (`PutResult`).

The byte layout they map to is in `commitlog.format`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from mqstore.commitlog import format as fmt
from mqstore.commitlog import native
from mqstore.commitlog.errors import CorruptionError


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


ReferenceMessage = Message  # the dataclass: the definition of the fields, and `Message` without the compiled core
if native.NATIVE is not None:
    # The compiled Message: the same fields, defaults, repr and ==, built in about a tenth of the time (its
    # `properties` dict is made when first read). dataclasses.fields() and replace() work on it through these.
    native.NATIVE.Message.__dataclass_fields__ = ReferenceMessage.__dataclass_fields__
    native.NATIVE.Message.__dataclass_params__ = ReferenceMessage.__dataclass_params__
    Message = native.NATIVE.Message  # noqa: F811


class PutStatus(enum.Enum):
    """The outcome of a put, with RocketMQ's names."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # SYNC: stored, not yet durable when the timeout ended
    FLUSH_DISK_FAILED = "FLUSH_DISK_FAILED"  # SYNC: stored, but its flush failed; the store now refuses writes
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    DISK_FULL = "DISK_FULL"  # refused: disk usage is over disk_full_ratio until retention frees space
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutResult(NamedTuple):
    """Where a message was stored. `msg_id` is the offset message id (see commitlog.format)."""

    status: PutStatus
    commitlog_offset: int
    queue_offset: int
    size_bytes: int
    store_timestamp_ms: int
    msg_id: str


try:  # the C descriptor of namedtuple's fields (CPython 3.8+): an item read without a property's function call
    from collections import _tuplegetter
except ImportError:  # another Python: a property of itemgetter, the same values
    def _tuplegetter(index: int, doc: str | None):
        return property(itemgetter(index), doc=doc)


def _field(index: int, doc: str | None = None):
    """StoredMessage's field at `index`, read-only."""
    return _tuplegetter(index, doc)


class StoredMessage(tuple):
    """A message read back from the CommitLog, with every stored field (read-only).

    It is a tuple of the record's fields in log order (TOTALSIZE .. BODYLENGTH, then body, topic and the raw
    PROPERTIES bytes), so decoding one costs a single struct unpack; use the named attributes. `properties`,
    `tags`, `keys`, the hosts and `msg_id` are decoded from the raw bytes on each access.
    """

    __slots__ = ()

    size_bytes = _field(0, "the whole record's TOTALSIZE")
    magic_code = _field(1)
    body_crc = _field(2)
    queue_id = _field(3)
    flag = _field(4)
    queue_offset = _field(5)
    commitlog_offset = _field(6, "the record's PHYSICALOFFSET (checked against where it was read)")
    sys_flag = _field(7)
    born_timestamp_ms = _field(8)
    born_host_raw = _field(9)
    store_timestamp_ms = _field(10)
    store_host_raw = _field(11)
    reconsume_times = _field(12)
    prepared_transaction_offset = _field(13)
    body = _field(15)
    topic = _field(16)
    properties_raw = _field(17)

    @property
    def properties(self) -> dict[str, str]:
        """Every property, TAGS, KEYS and UNIQ_KEY included; the record-CRC pair is checked on read and left out
        (a new dict on each access)."""
        return fmt.decode_properties(self[17])

    @property
    def tags(self) -> str | None:
        """the TAGS property (None without one)"""
        return stored_tags(self)

    @property
    def keys(self) -> tuple[str, ...]:
        """the words of the KEYS property"""
        return stored_keys(self)

    @property
    def born_host(self) -> str:
        return fmt.decode_host(self[9])

    @property
    def store_host(self) -> str:
        return fmt.decode_host(self[11])

    @property
    def msg_id(self) -> str:
        return fmt.message_id(self[11], self[6])

    def __repr__(self) -> str:
        body = self[15]
        return (f"StoredMessage(topic={self[16]!r}, queue_id={self[3]}, queue_offset={self[5]}, "
                f"commitlog_offset={self[6]}, size_bytes={self[0]}, body={body[:32]!r}"
                f"{'...' if len(body) > 32 else ''}, tags={self.tags!r})")


def stored_tags(message: StoredMessage) -> str | None:
    """StoredMessage.tags: the TAGS property of its raw properties (UTF-8, errors replaced), None without one."""
    raw = fmt.property_value(message[17], b"TAGS") if message[17] else None
    return None if raw is None else raw.decode("utf-8", "replace")


def stored_keys(message: StoredMessage) -> tuple[str, ...]:
    """StoredMessage.keys: the words of the KEYS property of its raw properties, () without one."""
    raw = fmt.property_value(message[17], b"KEYS") if message[17] else None
    return tuple(k for k in raw.decode("utf-8", "replace").split(fmt.KEY_SEPARATOR) if k) if raw else ()


if native.NATIVE is not None:
    # The same two functions in C (commitlog/csrc/read_path.c; a test compares them on any bytes): a get whose
    # caller reads the tags and keys of every message spent most of its time in them.
    # As descriptors of their own (StoredField): a read calls them without a property's function call.
    StoredMessage.tags = native.NATIVE.StoredField("tags", StoredMessage.tags.__doc__)
    StoredMessage.keys = native.NATIVE.StoredField("keys", StoredMessage.keys.__doc__)

_new_tuple = tuple.__new__
_crc32 = fmt.crc32_small  # for inputs up to fmt.CRC_SMALL_BYTES_MAX (else fmt.crc32)
_CRC_SMALL = fmt.CRC_SMALL_BYTES_MAX
_HEADER = fmt.HEADER_V1
_MAGIC_V1 = fmt.MESSAGE_MAGIC_CODE
_V6_FLAGS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_RECORD_SIZE_MIN = fmt.RECORD_SIZE_MIN
_I16 = fmt.I16
_CRC_PREFIX = fmt.RECORD_CRC_PREFIX
_NEVER = 1 << 63  # a record_crc_from no offset reaches
# decode_records copies a record out of the mapping before checking it when it is at most this long; a longer
# one (an index may claim up to 2 GiB) is checked in the mapping first, so that a hostile size costs no copy.
_COPY_BYTES_MAX = 1 << 20


def decode_message(buf, pos: int, remaining: int, commitlog_offset: int, *, path: str | None = None,
                   check_crc: bool = False, record_crc_from: int | None = None) -> StoredMessage:
    """Decode and check (rules 1-4 and 6, and the CRCs of 5 and 6 when `check_crc`) the message record at `pos`.

    `buf` is a memoryview or bytes over one segment (or over one record, with pos 0), `remaining` the bytes
    of the segment from `pos`. A record at or past `record_crc_from` must carry a record CRC (rule 6); a
    record CRC that matches stands for the body CRC too (it covers BODYCRC and the body). The record-CRC
    property is not part of the returned properties. Raises CorruptionError for anything that is not a valid
    message record.
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
                        properties_end = end
                        if fmt.has_record_crc(buf, properties_at + 2, end):
                            stored = fmt.record_crc_value(bytes(buf[end - 11 : end - 1]))
                            if stored is None or (check_crc and stored != fmt.crc32(buf[pos : end - 20]) & 0x7FFFFFFF):
                                return _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc,
                                                       record_crc_from)
                            properties_end = end - 20
                        elif record_crc_from is not None and commitlog_offset >= record_crc_from:
                            return _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc,
                                                   record_crc_from)
                        elif check_crc and fmt.body_crc(body) != crc:
                            raise fmt._corrupt("5", f"BODYCRC {crc} does not match the body", path,
                                               commitlog_offset, pos)
                        topic = bytes(buf[body_end + 1 : properties_at])
                        if not topic.isascii():
                            raise fmt._corrupt("3", f"topic is not ASCII: {topic!r}", path, commitlog_offset, pos)
                        return _new_tuple(StoredMessage, (
                            size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host,
                            store_ts, store_host, reconsume, prepared, body_length, body, topic.decode("ascii"),
                            bytes(buf[properties_at + 2 : properties_end])))
    return _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc, record_crc_from)


def decode_records(segments, commitlog_offsets: list[int], sizes: list[int], *,
                   record_crc_from: int | None = None, queue: tuple[str, int, list[int]] | None = None
                   ) -> list[StoredMessage]:
    """Decode the records at `commitlog_offsets` whose TOTALSIZE an index says is `sizes`. `segments(offset)`
    returns the MappedFile holding an offset. Each record (up to _COPY_BYTES_MAX) is copied out of the mapping
    once and checked as decode_message checks it, CRCs included (a record whose size differs from the index's
    is corrupt): damaged bytes are reported, never returned as a message. With `queue` = (topic, queue_id,
    queue offsets), the ConsumeQueue entries they came from, each record must belong to that entry."""
    required = _NEVER if record_crc_from is None else record_crc_from
    if queue is not None:
        expect_topic, expect_queue_id, expect_offsets = queue
        expect_raw = expect_topic.encode("ascii")
    else:
        expect_topic = expect_queue_id = expect_raw = None
        expect_offsets = [None] * len(commitlog_offsets)
    messages = []
    append = messages.append
    unpack = _HEADER.unpack_from
    segment = view = None
    segment_start = segment_end = 0
    for offset, expected_size, expected_queue_offset in zip(commitlog_offsets, sizes, expect_offsets):
        if not segment_start <= offset < segment_end:
            segment = segments(offset)
            view = segment.view
            segment_start = segment.base_offset
            segment_end = segment_start + segment.size_bytes
        pos = offset - segment_start
        if expected_size < _RECORD_SIZE_MIN or offset + expected_size > segment_end:
            raise CorruptionError(f"an index gives size {expected_size} for the record at offset {offset}",
                                  path=segment.path, offset=pos, rule="consumequeue.matches-log")
        # a record over _COPY_BYTES_MAX is checked in place (below), not copied first: an index's size is untrusted
        raw = view[pos : pos + (expected_size if expected_size <= _COPY_BYTES_MAX else fmt.HEADER_SIZE)].tobytes()
        (size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, body_length) = unpack(raw)
        body_end = 88 + body_length
        if (magic == _MAGIC_V1 and not sys_flag & _V6_FLAGS and size == len(raw) and physical == offset
                and 0 <= body_length and body_end + 3 <= size):
            topic_length = raw[body_end]
            properties_at = body_end + 1 + topic_length
            if topic_length and properties_at + 2 <= size and properties_at + 2 + (
                    (raw[properties_at] << 8) | raw[properties_at + 1]) == size and raw[properties_at] < 0x80:
                topic = raw[body_end + 1 : properties_at]
                body = raw[88:body_end]
                crc_at = size - 20
                crc32 = _crc32 if size <= _CRC_SMALL else fmt.crc32
                if raw[-1] == 2 and raw.startswith(_CRC_PREFIX, crc_at) and crc_at - properties_at >= 2 and (
                        crc_at - properties_at == 2 or raw[-21] == 2):
                    digits = raw[crc_at + 9 : -1]
                    ok = digits.isdigit() and int(digits[::-1]) == crc32(raw[:crc_at]) & 0x7FFFFFFF
                    properties = raw[properties_at + 2 : crc_at]
                else:
                    ok = offset < required and crc32(body) & 0x7FFFFFFF == crc
                    properties = raw[properties_at + 2 :]
                if ok and expect_raw is not None and topic == expect_raw and queue_id == expect_queue_id \
                        and queue_offset == expected_queue_offset:
                    append(_new_tuple(StoredMessage, (
                        size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host,
                        store_ts, store_host, reconsume, prepared, body_length, body, expect_topic, properties)))
                    continue
                if ok and expect_raw is None and topic.isascii():
                    append(_new_tuple(StoredMessage, (
                        size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host,
                        store_ts, store_host, reconsume, prepared, body_length, body, topic.decode("ascii"),
                        properties)))
                    continue
        entry = None if expect_raw is None else (expect_topic, expect_queue_id, expected_queue_offset)
        append(_decode_indexed_record(segment, pos, offset, expected_size, record_crc_from, entry))
    return messages


def _decode_indexed_record(segment, pos: int, offset: int, expected_size: int, record_crc_from: int | None,
                           queue_entry: tuple[str, int, int] | None) -> StoredMessage:
    """`decode_records`' path for a record its inline checks did not take: decode_message's checks with their
    precise error, then the index's word against the record's: its size and, with `queue_entry` = (topic,
    queue_id, queue_offset), the ConsumeQueue entry it must belong to."""
    message = decode_message(segment.view, pos, segment.size_bytes - pos, offset, path=segment.path,
                             check_crc=True, record_crc_from=record_crc_from)
    if message[0] != expected_size:
        raise CorruptionError(f"an index gives size {expected_size}, the record has {message[0]}",
                              path=segment.path, offset=pos, rule="consumequeue.matches-log")
    if queue_entry is not None and (message[16], message[3], message[5]) != queue_entry:
        topic, queue_id, queue_offset = queue_entry
        raise CorruptionError(
            f"queue entry {queue_offset} of {topic}/{queue_id} points to a record of "
            f"{message[16]}/{message[3]} entry {message[5]}", path=segment.path, offset=offset,
            rule="consumequeue.matches-log")
    return message


def decode_records_native(codec, segments, commitlog_offsets: list[int], sizes: list[int], *,
                          record_crc_from: int | None = None, queue: tuple[str, int, list[int]] | None = None
                          ) -> list[StoredMessage]:
    """`decode_records` through the compiled codec (`codec`, mqstore.commitlog._native): the same messages, the same
    errors. The codec decodes the records of one segment at a time; a record it does not accept (another
    version or host width, or damage) goes through `decode_records` alone, which decodes it or raises."""
    count = len(commitlog_offsets)
    if commitlog_offsets.__class__ is not list:
        commitlog_offsets = list(commitlog_offsets)
    if sizes.__class__ is not list:
        sizes = list(sizes)
    required = -1 if record_crc_from is None else record_crc_from
    if queue is not None:
        topic, queue_id, entries = queue
        topic_raw = topic.encode("ascii")
        if entries.__class__ is range and entries.step == 1:
            first_entry = entries.start
            entries = None
        else:
            entries = list(entries)
            first_entry = None
    else:
        topic = topic_raw = queue_id = entries = first_entry = None
    messages: list[StoredMessage] = []
    done = 0
    while done < count:
        segment = segments(commitlog_offsets[done])
        view = segment.view
        if view is not None:
            # consecutive entries are given as the entry of commitlog_offsets[done]
            expect = entries if entries is not None else None if topic is None else first_entry + done
            done = codec.decode_run(view, segment.base_offset, commitlog_offsets, sizes, done, required, topic,
                                    topic_raw, queue_id, expect, messages, StoredMessage)
            if done == count:
                break
        single = None if queue is None else (
            topic, queue_id, [entries[done] if entries is not None else first_entry + done])
        messages.extend(decode_records(segments, commitlog_offsets[done : done + 1], sizes[done : done + 1],
                                       record_crc_from=record_crc_from, queue=single))
        done += 1
    return messages


def _decode_general(buf, pos, remaining, commitlog_offset, path, check_crc, record_crc_from=None) -> StoredMessage:
    """Any record version and host width (and the detailed error when the fast path refused a record)."""
    layout = fmt.locate(buf, pos, remaining, commitlog_offset, path=path)
    required = record_crc_from is not None and commitlog_offset >= record_crc_from
    has_crc = fmt.check_crcs(buf, layout, pos, commitlog_offset, required=required, check_crc=check_crc, path=path)
    properties_length = layout.properties_length - (fmt.RECORD_CRC_LENGTH if has_crc else 0)
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
                              rule="commitlog.3") from exc
    return _new_tuple(StoredMessage, (
        size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts,
        bytes(buf[born_at : born_at + born_length]), store_ts, bytes(buf[store_at : store_at + store_length]),
        reconsume, prepared, layout.body_length, bytes(buf[body_start : body_start + layout.body_length]), topic,
        bytes(buf[layout.properties_start : layout.properties_start + properties_length])))
