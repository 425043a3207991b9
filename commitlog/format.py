"""CommitLog record format: the bytes RocketMQ 4.x writes for one message, and the segment naming rule.

Every message of every topic is appended to one log, the CommitLog, split into fixed-size segment files.
A record is self-describing; ConsumeQueues and IndexFiles only point into the log.

Record, version 1 (magic 0xDAA320A7), all integers big-endian and signed (Java):

    OFFSET  SIZE  TYPE   FIELD
    0       4     i32    TOTALSIZE            whole record in bytes, this field included
    4       4     u32    MAGICCODE            0xDAA320A7 (v1) or 0xDAA320AB (v2)
    8       4     i32    BODYCRC              zlib.crc32(body) & 0x7FFFFFFF
    12      4     i32    QUEUEID
    16      4     i32    FLAG                 opaque to the store
    20      8     i64    QUEUEOFFSET          entry number in the (topic, queue) ConsumeQueue
    28      8     i64    PHYSICALOFFSET       absolute commitlog offset of this record
    36      4     i32    SYSFLAG              bit flags, see SYS_FLAG_*
    40      8     i64    BORNTIMESTAMP        ms since the epoch, set by the producer
    48      8|20  bytes  BORNHOST             IPv4 (4) + port (i32), or IPv6 (16) + port when SYSFLAG bit 4
    56      8     i64    STORETIMESTAMP       ms since the epoch, set by the store     (offsets from here on
    64      8|20  bytes  STOREHOSTADDRESS     IPv4 + port, or IPv6 + port when bit 5    are for IPv4 hosts)
    72      4     i32    RECONSUMETIMES
    76      8     i64    PREPAREDTRANSACTIONOFFSET
    84      4     i32    BODYLENGTH
    88      n     bytes  BODY
    88+n    1|2   u8|u16 TOPICLENGTH          1 byte in v1, 2 bytes in v2
    ...     t     bytes  TOPIC                ASCII
    ...     2     i16    PROPERTIESLENGTH
    ...     p     bytes  PROPERTIES           UTF-8 'name\\x01value\\x02' pairs
                         = 91 + n + t + p bytes (v1, IPv4 hosts)

End-of-segment blank: when a record plus END_FILE_MIN_BLANK_LENGTH (8) bytes does not fit in what is left
of a segment, the writer puts TOTALSIZE = bytes left and MAGICCODE = 0xCBD43194 there and the record goes
to the start of the next segment. A segment's unwritten tail is zeros.

Validity rule. A record at absolute offset `o`, with `r` bytes left in its segment, is valid iff
    (1) r >= 8 and its MAGICCODE is 0xDAA320A7 or 0xDAA320AB;
    (2) RECORD_SIZE_MIN <= TOTALSIZE <= r;
    (3) BODYLENGTH >= 0, TOPICLENGTH >= 1, PROPERTIESLENGTH >= 0, the header, body, topic and
        properties add up to exactly TOTALSIZE, and the TOPIC is ASCII;
    (4) PHYSICALOFFSET == o;
    (5) when CRCs are checked, BODYCRC == zlib.crc32(body) & 0x7FFFFFFF;
    (6) when its PROPERTIES end with the record-CRC pair (below), the pair is well formed and, when CRCs are
        checked, its value == zlib.crc32(the record's first TOTALSIZE - 20 bytes) & 0x7FFFFFFF; a store that
        writes record CRCs requires the pair on every record from the offset it started writing them
        (`record_crc_from`), so damage anywhere in such a record is found, not only in its body.
A blank is valid iff its MAGICCODE is 0xCBD43194 and TOTALSIZE == r. Eight zero bytes (TOTALSIZE 0 and
MAGICCODE 0) mark the end of the written log. Anything else is corruption.

Record CRC (RocketMQ 5.x's enabledAppendPropCRC). BODYCRC covers the body only: a flipped bit in a header
field, the topic or the properties would go unnoticed. A record may therefore end with one more property,
written as the last 20 bytes of PROPERTIES (and of the record):

    OFFSET (from the record's end)  SIZE  FIELD
    -20                             8     '__CRC32#'            the property name (PROPERTY_RECORD_CRC)
    -12                             1     0x01                  name/value separator
    -11                             10    ASCII digits          CRC-32 of the record's first TOTALSIZE-20 bytes,
                                                                & 0x7FFFFFFF, least significant digit first,
                                                                padded with '0' (12345 -> '5432100000')
    -1                              1     0x02                  property separator
                                    = 20 bytes (RECORD_CRC_LENGTH)

It is preceded by 0x02 unless it is the only property. The writer fills the digits last, after the store has
set QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP. Readers check it and hide it from `properties`.

Segment files are named by the absolute offset of their first byte as 20 zero-padded decimal digits
(00000000001073741824 is the second 1 GiB segment).

The offset message id (`msg_id`) is 32 upper-case hex digits: store host IPv4 (4 bytes), store port
(4 bytes, i32) and commitlog offset (8 bytes, i64); 56 digits for an IPv6 store host.
"""

from __future__ import annotations

import socket
import struct

import numpy as np

try:  # Intel ISA-L's CRC-32 (the `isal` package): the same checksum as zlib.crc32, 2-7x faster per call
    from isal.isal_zlib import crc32 as crc32_small
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values, slower
    from zlib import crc32 as crc32_small

from mqstore.commitlog.errors import CorruptionError, InvalidMessageError

# isal's and zlib's crc32 let go of the GIL for inputs over 5 KiB. Under the GIL that costs a thread switch when
# another thread wants it (the dispatch thread, the flusher, other producers), about 25 us on this machine's
# cores, against about 1 us for the CRC of 16 KiB: one producer putting 16 KiB bodies (ASYNC) made 15k puts/s
# with the GIL let go twice a put, 38k with it kept. So `crc32` takes long inputs a few KiB at a time;
# `crc32_small` is the library's call, for hot paths that check the length themselves.
CRC_SMALL_BYTES_MAX = 5 * 1024  # the longest input the libraries checksum without letting go of the GIL
CRC_CHUNK_BYTES = 4096


def crc32(data, value: int = 0) -> int:
    """zlib.crc32(data, value), computed without letting go of the GIL."""
    if len(data) <= CRC_SMALL_BYTES_MAX:
        return crc32_small(data, value)
    view = memoryview(data).cast("B")
    for at in range(0, len(view), CRC_CHUNK_BYTES):
        value = crc32_small(view[at : at + CRC_CHUNK_BYTES], value)
    return value


# --- magic codes ---------------------------------------------------------------------------------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

# --- SYSFLAG bits --------------------------------------------------------------------------------------------
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_MULTI_TAGS = 0x2
SYS_FLAG_TRANSACTION_MASK = 0xC
SYS_FLAG_TRANSACTION_NOT_TYPE = 0x0
SYS_FLAG_TRANSACTION_PREPARED_TYPE = 0x4
SYS_FLAG_TRANSACTION_COMMIT_TYPE = 0x8
SYS_FLAG_TRANSACTION_ROLLBACK_TYPE = 0xC
SYS_FLAG_BORNHOST_V6 = 0x10
SYS_FLAG_STOREHOST_V6 = 0x20

# --- field offsets (v1, IPv4 hosts), each built from the previous one ------------------------------------------
OFFSET_TOTAL_SIZE = 0
OFFSET_MAGIC_CODE = OFFSET_TOTAL_SIZE + 4
OFFSET_BODY_CRC = OFFSET_MAGIC_CODE + 4
OFFSET_QUEUE_ID = OFFSET_BODY_CRC + 4
OFFSET_FLAG = OFFSET_QUEUE_ID + 4
OFFSET_QUEUE_OFFSET = OFFSET_FLAG + 4
OFFSET_PHYSICAL_OFFSET = OFFSET_QUEUE_OFFSET + 8
OFFSET_SYS_FLAG = OFFSET_PHYSICAL_OFFSET + 8
OFFSET_BORN_TIMESTAMP = OFFSET_SYS_FLAG + 4
OFFSET_BORN_HOST = OFFSET_BORN_TIMESTAMP + 8
HOST_V4_LENGTH = 8
HOST_V6_LENGTH = 20
OFFSET_STORE_TIMESTAMP = OFFSET_BORN_HOST + HOST_V4_LENGTH
OFFSET_STORE_HOST = OFFSET_STORE_TIMESTAMP + 8
OFFSET_RECONSUME_TIMES = OFFSET_STORE_HOST + HOST_V4_LENGTH
OFFSET_PREPARED_TRANSACTION_OFFSET = OFFSET_RECONSUME_TIMES + 4
OFFSET_BODY_LENGTH = OFFSET_PREPARED_TRANSACTION_OFFSET + 8
OFFSET_BODY = OFFSET_BODY_LENGTH + 4
HEADER_SIZE = OFFSET_BODY  # bytes before the body, v1 with IPv4 hosts

TOPIC_LENGTH_MAX = 127  # v1 stores the topic length in one signed byte
PROPERTIES_LENGTH_MAX = 32767  # a signed 16-bit length
RECORD_SIZE_MIN = HEADER_SIZE + 1 + 1 + 2  # empty body, one-character topic, no properties
RECORD_SIZE_FIXED = HEADER_SIZE + 1 + 2  # everything but body, topic and properties (v1, IPv4)

# The v1 IPv4 header, TOTALSIZE to BODYLENGTH. Hosts are kept as their 8 raw bytes.
HEADER_V1 = struct.Struct(">iIiiiqqiq8sq8siqi")
# The same header as one numpy record, for decoding many records at once (dispatch, the Spark decoder).
HEADER_V1_DTYPE = np.dtype([
    ("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"), ("born_timestamp", ">i8"),
    ("born_host", "V8"), ("store_timestamp", ">i8"), ("store_host", "V8"), ("reconsume_times", ">i4"),
    ("prepared_transaction_offset", ">i8"), ("body_length", ">i4"),
])
BLANK = struct.Struct(">iI")
U16 = struct.Struct(">H")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")

PROPERTY_NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_RECORD_CRC = "__CRC32#"
RECORD_CRC_PREFIX = PROPERTY_RECORD_CRC.encode("ascii") + b"\x01"  # name and separator, before the digits
RECORD_CRC_DIGITS = 10
RECORD_CRC_LENGTH = len(RECORD_CRC_PREFIX) + RECORD_CRC_DIGITS + 1
RECORD_CRC_PLACEHOLDER = RECORD_CRC_PREFIX + b"0" * RECORD_CRC_DIGITS + b"\x02"  # written before the CRC is known
KEY_SEPARATOR = " "

SEGMENT_NAME_DIGITS = 20

assert HEADER_SIZE == 88
assert RECORD_CRC_LENGTH == 20 == len(RECORD_CRC_PLACEHOLDER)
assert HEADER_V1.size == HEADER_SIZE == HEADER_V1_DTYPE.itemsize
assert HEADER_V1_DTYPE.fields["physical_offset"][1] == OFFSET_PHYSICAL_OFFSET
assert HEADER_V1_DTYPE.fields["sys_flag"][1] == OFFSET_SYS_FLAG
assert HEADER_V1_DTYPE.fields["store_timestamp"][1] == OFFSET_STORE_TIMESTAMP
assert HEADER_V1_DTYPE.fields["store_host"][1] == OFFSET_STORE_HOST
assert HEADER_V1_DTYPE.fields["body_length"][1] == OFFSET_BODY_LENGTH
assert RECORD_SIZE_FIXED == 91
assert MESSAGE_MAGIC_CODE == 0xDAA320A7 and BLANK_MAGIC_CODE == 0xCBD43194


def segment_name(segment_base_offset: int) -> str:
    """The file name of the segment that starts at `segment_base_offset`."""
    assert segment_base_offset >= 0
    return f"{segment_base_offset:0{SEGMENT_NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The base offset a segment file name encodes, or None when the name is not a segment name."""
    if len(name) != SEGMENT_NAME_DIGITS or not name.isdigit() or not name.isascii():
        return None
    return int(name)


def body_crc(body) -> int:
    """RocketMQ's body checksum: CRC-32 (zlib) with the sign bit cleared."""
    return crc32(body) & 0x7FFFFFFF


def record_crc_digits(crc: int) -> bytes:
    """The 10 ASCII digits of the record-CRC property for `crc` (least significant digit first)."""
    assert 0 <= crc <= 0x7FFFFFFF
    return (b"%010d" % crc)[::-1]


def record_crc_digit_rows(crcs: np.ndarray) -> np.ndarray:
    """`record_crc_digits` of many CRCs at once: an (n, 10) uint8 array of ASCII digits, one row per CRC."""
    return (crcs[:, None] // _DIGIT_WEIGHTS % 10 + ord("0")).astype(np.uint8)


def record_crc_value(digits: bytes) -> int | None:
    """The CRC the 10 digits of a record-CRC property hold, or None when they are not 10 ASCII digits."""
    if len(digits) != RECORD_CRC_DIGITS or not digits.isdigit() or not digits.isascii():
        return None
    return int(digits[::-1])


def has_record_crc(buf, properties_start: int, end: int) -> bool:
    """Whether the PROPERTIES bytes [properties_start, end) of `buf` end with a record-CRC pair (rule 6's shape)."""
    at = end - RECORD_CRC_LENGTH
    return (at >= properties_start and buf[end - 1] == 2 and bytes(buf[at : at + len(RECORD_CRC_PREFIX)])
            == RECORD_CRC_PREFIX and (at == properties_start or buf[at - 1] == 2))


# Java's hash of ASCII text, without a Python loop over its characters: each code c < 128 is 31 * (c // 31) +
# c % 31, so the 31-polynomial of the codes is 31 * P(high digits) + P(low digits), and int(_, 31) evaluates
# a polynomial at 31 from base-31 digit characters in C. Text is taken in chunks under int()'s lowest digit limit.
_BASE31_DIGITS = b"0123456789abcdefghijklmnopqrstu"
_HIGH_DIGIT = bytes(_BASE31_DIGITS[code // 31] for code in range(128)) + bytes(128)
_LOW_DIGIT = bytes(_BASE31_DIGITS[code % 31] for code in range(128)) + bytes(128)
_HASH_CHUNK_CHARS = 512  # sys.set_int_max_str_digits accepts no limit under 640
_HASH_CHUNK_WEIGHT = pow(31, _HASH_CHUNK_CHARS, 1 << 32)


def java_ascii_hash(data: bytes) -> int:
    """Java's String.hashCode of ASCII text given as bytes (`data.isascii()` must hold)."""
    if len(data) <= _HASH_CHUNK_CHARS:
        if not data:
            return 0
        h = (31 * int(data.translate(_HIGH_DIGIT), 31) + int(data.translate(_LOW_DIGIT), 31)) & 0xFFFFFFFF
    else:
        h = 0
        for at in range(0, len(data), _HASH_CHUNK_CHARS):
            chunk = data[at : at + _HASH_CHUNK_CHARS]
            weight = _HASH_CHUNK_WEIGHT if len(chunk) == _HASH_CHUNK_CHARS else pow(31, len(chunk), 1 << 32)
            h = (h * weight + 31 * int(chunk.translate(_HIGH_DIGIT), 31) + int(chunk.translate(_LOW_DIGIT), 31)
                 ) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (31-polynomial over UTF-16 code units, wrapping to a signed 32-bit int)."""
    if text.isascii():
        return java_ascii_hash(text.encode("ascii"))
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tag hash of a message's TAGS property (0 without tags), as RocketMQ computes it."""
    if not tags:
        return 0
    return java_string_hash(tags)


# --- hosts ---------------------------------------------------------------------------------------------------
def encode_host(host: str, port: int) -> bytes:
    """An IPv4 host and port as the 8 bytes a record stores (4 address bytes, then the port as i32)."""
    try:
        address = socket.inet_pton(socket.AF_INET, host)
    except OSError as exc:
        raise InvalidMessageError(f"not an IPv4 address: {host!r}") from exc
    if not 0 <= port <= 65535:
        raise InvalidMessageError(f"port out of range 0..65535: {port}")
    return address + I32.pack(port)


def decode_host(raw: bytes) -> str:
    """'ip:port' from the 8 (IPv4) or 20 (IPv6) bytes a record stores."""
    if len(raw) == HOST_V4_LENGTH:
        return f"{socket.inet_ntoa(raw[:4])}:{I32.unpack_from(raw, 4)[0]}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw[:16])}]:{I32.unpack_from(raw, 16)[0]}"


def message_id(store_host_raw: bytes, commitlog_offset: int) -> str:
    """RocketMQ's offset message id: store host address and port, then the commitlog offset, in hex."""
    return (store_host_raw + commitlog_offset.to_bytes(8, "big", signed=True)).hex().upper()


def parse_message_id(msg_id: str) -> tuple[bytes, int]:
    """(store host bytes, commitlog offset) from an offset message id; InvalidMessageError when malformed."""
    if not isinstance(msg_id, str) or len(msg_id) not in (32, 56):
        raise InvalidMessageError(f"a message id has 32 or 56 hex digits, got {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise InvalidMessageError(f"a message id is hexadecimal, got {msg_id!r}") from exc
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)


# --- properties ----------------------------------------------------------------------------------------------
def encode_properties(properties: dict[str, str]) -> bytes:
    """The PROPERTIES bytes for a mapping: UTF-8 'name\\x01value\\x02' for each pair, in order."""
    if not properties:
        return b""
    return "".join(f"{k}\x01{v}\x02" for k, v in properties.items()).encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    """The mapping PROPERTIES bytes hold. Items without a separator are skipped, as RocketMQ does."""
    result: dict[str, str] = {}
    if not raw:
        return result
    for item in raw.decode("utf-8", "replace").split("\x02"):
        name, sep, value = item.partition("\x01")
        if sep and "\x01" not in value:
            result[name] = value
    return result


def property_value(raw: bytes, name: bytes) -> bytes | None:
    """The raw value of one property, found without decoding the rest (a hot path of the dispatchers)."""
    start = 0
    needle = name + b"\x01"
    while True:
        i = raw.find(needle, start)
        if i < 0:
            return None
        if i == 0 or raw[i - 1] == 2:
            end = raw.find(b"\x02", i)
            return raw[i + len(needle) : end if end >= 0 else len(raw)]
        start = i + 1


# --- decoding ------------------------------------------------------------------------------------------------
class RecordLayout:
    """Where the variable parts of one record lie, found by `locate` (all positions absolute in the buffer)."""

    __slots__ = (
        "size", "magic", "sys_flag", "born_host", "store_host", "body_start", "body_length",
        "topic_start", "topic_length", "properties_start", "properties_length", "fixed",
    )


def _corrupt(rule: str, detail: str, path: str | None, commitlog_offset: int, position: int | None = None
             ) -> CorruptionError:
    """The error for a record that breaks rule `rule`: with a file path, the offset is the position in that
    file (`position`, or derived from the segment name); the commitlog offset is in the message."""
    offset = commitlog_offset
    if path is not None:
        if position is None:
            base = parse_segment_name(path.rsplit("/", 1)[-1])
            position = commitlog_offset - base if base is not None else commitlog_offset
        offset = position
    return CorruptionError(f"invalid commitlog record at commitlog offset {commitlog_offset}: {detail} "
                           f"[rule {rule}]", path=path, offset=offset, rule=f"commitlog.{rule}",
                           **_RULE_FLAGS.get(rule, {}))


# What a failure of a rule tells whoever catches it (CorruptionError's typed flags): rules 1 and 4 say no record
# starts at the position, rules 5 and 6 (a CRC) leave the record's TOTALSIZE sound.
_RULE_FLAGS = {"1": {"not_a_record": True}, "4": {"not_a_record": True},
               "5": {"length_sound": True}, "6": {"length_sound": True}}


def locate(buf, pos: int, remaining: int, commitlog_offset: int, *, path: str | None = None) -> RecordLayout:
    """Check rules (1) to (4) for the message record at `pos` and return where its parts are.

    `buf` is any buffer over the segment, `remaining` the bytes left in the segment from `pos`.
    Raises CorruptionError naming the rule that failed. Blanks and end-of-data are not messages: callers
    look at the magic code first (`peek`).
    """
    if remaining < END_FILE_MIN_BLANK_LENGTH:
        raise _corrupt("1", f"only {remaining} bytes left in the segment", path, commitlog_offset, pos)
    size, magic = BLANK.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
        raise _corrupt("1", f"magic code 0x{magic:08X}", path, commitlog_offset, pos)
    if size < RECORD_SIZE_MIN or size > remaining:
        raise _corrupt("2", f"TOTALSIZE {size} outside {RECORD_SIZE_MIN}..{remaining}", path, commitlog_offset, pos)
    layout = RecordLayout()
    layout.size = size
    layout.magic = magic
    sys_flag = I32.unpack_from(buf, pos + OFFSET_SYS_FLAG)[0]
    layout.sys_flag = sys_flag
    born_length = HOST_V6_LENGTH if sys_flag & SYS_FLAG_BORNHOST_V6 else HOST_V4_LENGTH
    store_length = HOST_V6_LENGTH if sys_flag & SYS_FLAG_STOREHOST_V6 else HOST_V4_LENGTH
    born_at = pos + OFFSET_BORN_HOST
    store_at = born_at + born_length + 8
    body_length_at = store_at + store_length + 4 + 8
    fixed = body_length_at + 4 - pos
    topic_length_bytes = 2 if magic == MESSAGE_MAGIC_CODE_V2 else 1
    if fixed + topic_length_bytes + 2 > size:
        raise _corrupt("3", f"TOTALSIZE {size} smaller than the fixed fields", path, commitlog_offset, pos)
    body_length = I32.unpack_from(buf, body_length_at)[0]
    body_start = body_length_at + 4
    if body_length < 0 or fixed + body_length + topic_length_bytes + 2 > size:
        raise _corrupt("3", f"BODYLENGTH {body_length} does not fit TOTALSIZE {size}", path, commitlog_offset, pos)
    topic_length_at = body_start + body_length
    if topic_length_bytes == 1:
        topic_length = int(buf[topic_length_at])  # an int also when buf is a numpy array (no uint8 overflow)
    else:
        topic_length = U16.unpack_from(buf, topic_length_at)[0]
    topic_start = topic_length_at + topic_length_bytes
    properties_length_at = topic_start + topic_length
    if topic_length < 1 or properties_length_at + 2 > pos + size:
        raise _corrupt("3", f"TOPICLENGTH {topic_length} does not fit TOTALSIZE {size}", path, commitlog_offset, pos)
    properties_length = I16.unpack_from(buf, properties_length_at)[0]
    properties_start = properties_length_at + 2
    if properties_length < 0 or properties_start + properties_length != pos + size:
        raise _corrupt(
            "3", f"fields add up to {properties_start + properties_length - pos} bytes, TOTALSIZE is {size}",
            path, commitlog_offset, pos,
        )
    topic = bytes(buf[topic_start:properties_length_at])
    if not topic.isascii():
        raise _corrupt("3", f"topic is not ASCII: {topic!r}", path, commitlog_offset, pos)
    physical = struct.unpack_from(">q", buf, pos + OFFSET_PHYSICAL_OFFSET)[0]
    if physical != commitlog_offset:
        raise _corrupt("4", f"PHYSICALOFFSET {physical} at offset {commitlog_offset}", path, commitlog_offset, pos)
    layout.born_host = (born_at, born_length)
    layout.store_host = (store_at, store_length)
    layout.body_start = body_start
    layout.body_length = body_length
    layout.topic_start = topic_start
    layout.topic_length = topic_length
    layout.properties_start = properties_start
    layout.properties_length = properties_length
    layout.fixed = fixed
    return layout


def check_body_crc(buf, layout: RecordLayout, pos: int, commitlog_offset: int, *, path: str | None = None) -> None:
    """Rule (5): the stored BODYCRC matches the body."""
    stored = I32.unpack_from(buf, pos + OFFSET_BODY_CRC)[0]
    actual = body_crc(buf[layout.body_start : layout.body_start + layout.body_length])
    if stored != actual:
        raise _corrupt("5", f"BODYCRC {stored} but the body's is {actual}", path, commitlog_offset, pos)


def check_record_crc(buf, layout: RecordLayout, pos: int, commitlog_offset: int, *, required: bool,
                     check_crc: bool, path: str | None = None) -> bool:
    """Rule (6) for a located record: True when it carries a record CRC (checked when `check_crc`); a record
    without one is corrupt when `required`."""
    end = pos + layout.size
    if not has_record_crc(buf, layout.properties_start, end):
        if required:
            raise _corrupt("6", "the record has no record-CRC property", path, commitlog_offset, pos)
        return False
    stored = record_crc_value(bytes(buf[end - 11 : end - 1]))
    if stored is None:
        raise _corrupt("6", "the record-CRC property does not hold 10 digits", path, commitlog_offset, pos)
    if check_crc:
        actual = crc32(buf[pos : end - RECORD_CRC_LENGTH]) & 0x7FFFFFFF
        if stored != actual:
            check_body_crc(buf, layout, pos, commitlog_offset, path=path)  # name the body when it is the damage
            raise _corrupt("6", f"record CRC {stored} but the record's is {actual} (the damage is outside the body)",
                           path, commitlog_offset, pos)
    return True


def check_crcs(buf, layout: RecordLayout, pos: int, commitlog_offset: int, *, required: bool, check_crc: bool,
               path: str | None = None) -> bool:
    """Rules (5) and (6) for a located record: its record CRC when it has one (required when `required`),
    else its body CRC (only when `check_crc`). Returns whether it has a record CRC."""
    has_crc = check_record_crc(buf, layout, pos, commitlog_offset, required=required, check_crc=check_crc, path=path)
    if check_crc and not has_crc:
        check_body_crc(buf, layout, pos, commitlog_offset, path=path)
    return has_crc


def peek(buf, pos: int, remaining: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGICCODE) at `pos`, or (0, 0) when fewer than 8 bytes are left."""
    if remaining < END_FILE_MIN_BLANK_LENGTH:
        return 0, 0
    return BLANK.unpack_from(buf, pos)


def rows_at(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """The (len(starts), width) bytes data[start : start + width] for each start (all inside `data`).

    Records of one size lie evenly spaced: then the rows are a strided view of `data` (nothing copied);
    otherwise they are gathered through an index matrix (about 0.2-0.35 us per 88-byte row here)."""
    count = len(starts)
    if count > 1:
        step = int(starts[1] - starts[0])
        first = int(starts[0])
        if step >= width and int(starts[-1]) == first + step * (count - 1) and bool(
                (np.diff(starts) == step).all()):
            return np.lib.stride_tricks.as_strided(data[first:], shape=(count, width), strides=(step, 1),
                                                   writeable=False)
    return data[starts[:, None] + np.arange(width, dtype=np.int64)]


_CRC_PREFIX_ARRAY = np.frombuffer(RECORD_CRC_PREFIX, dtype=np.uint8)
_DIGIT_WEIGHTS = 10 ** np.arange(RECORD_CRC_DIGITS, dtype=np.int64)  # least significant digit first


_CRC_NAME_WORD = np.frombuffer(PROPERTY_RECORD_CRC.encode("ascii"), dtype="<u8")[0]  # the 8-byte name as one word
assert len(PROPERTY_RECORD_CRC) == 8 and RECORD_CRC_PREFIX[8] == 1


def record_crc_present(data: np.ndarray, properties_start: np.ndarray, properties_length: np.ndarray,
                       record_end: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The first result of record_crc_columns alone (whether each record's PROPERTIES end with a record-CRC
    pair), without reading the digits: a few gathers instead of one of 20 bytes a record. `data` is a uint8
    array; rows not `valid` are False."""
    candidate = valid & (properties_length >= RECORD_CRC_LENGTH)
    at = np.where(candidate, record_end - RECORD_CRC_LENGTH, 0)
    names = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(data, 8)[at]).view("<u8").reshape(-1)
    return candidate & (names == _CRC_NAME_WORD) & (data[at + 8] == 1) & (data[at + RECORD_CRC_LENGTH - 1] == 2) & (
        (at == properties_start) | (data[np.maximum(at - 1, 0)] == 2))


def record_crc_columns(data, properties_start: np.ndarray, properties_length: np.ndarray, record_end: np.ndarray,
                       valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rule (6)'s shape for many records of `data` (a segment's bytes) at once: for each, whether its PROPERTIES
    end with a record-CRC pair, and the CRC the pair holds (-1 when its digits are not 10 ASCII digits; 0 for
    records without the pair). Rows not `valid` are not looked at (False, 0)."""
    at = record_end - RECORD_CRC_LENGTH
    candidate = valid & (properties_length >= RECORD_CRC_LENGTH)
    at = np.where(candidate, at, 0)
    tail = rows_at(data, at, RECORD_CRC_LENGTH)
    prefix = len(_CRC_PREFIX_ARRAY)
    before = data[np.maximum(at - 1, 0)]
    has = candidate & (tail[:, :prefix] == _CRC_PREFIX_ARRAY).all(axis=1) & (tail[:, -1] == 2) & (
        (at == properties_start) | (before == 2))
    digits = tail[:, prefix:-1].astype(np.int64) - ord("0")
    well_formed = ((digits >= 0) & (digits <= 9)).all(axis=1)
    value = np.where(has, np.where(well_formed, (digits * _DIGIT_WEIGHTS).sum(axis=1), -1), 0)
    return has, value
