"""IndexFile format: a hash index from message keys to CommitLog offsets (RocketMQ's IndexFile).

A message's UNIQ_KEY property and each space-separated word of its KEYS property are indexed under the
index key `topic + "#" + key`, so that a client can find messages by key within a time range. One index
file is a fixed-size hash table with chaining: a header, `S` hash slots, and room for `N` entries appended
in CommitLog order. Each slot holds the number of the newest entry whose key falls in it; each entry holds
the number of the previous entry of the same slot, so a slot is the head of a newest-first chain.

File layout (S = hash_slot_count, N = index_entry_count_max), all integers big-endian and signed (Java):

    +--------------------+---------------------------+-----------------------------+
    | header (40 bytes)  | S slots x 4 bytes         | N entries x 20 bytes        |
    +--------------------+---------------------------+-----------------------------+
    = 40 + 4*S + 20*N bytes   (RocketMQ's defaults S = 5 000 000, N = 20 000 000: 420 000 040 bytes)

Header:

    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   beginTimestamp     store time (ms) of the first entry
    8       8     i64   endTimestamp       store time (ms) of the last entry
    16      8     i64   beginPhyOffset     commitlog offset of the first entry
    24      8     i64   endPhyOffset       commitlog offset of the last entry
    32      4     i32   hashSlotCount      despite RocketMQ's name: the number of keys put (indexCount - 1)
    36      4     i32   indexCount         number of the next entry to write; entries are numbered from 1
                        = 40 bytes

Slot s (at 40 + 4*s): i32, the number of the newest entry with keyHash % S == s, or 0 when the slot is empty.

Entry i (at 40 + 4*S + 20*i, 1 <= i < indexCount; entry 0 is never written):

    OFFSET  SIZE  TYPE  FIELD
    0       4     i32   keyHash            index_key_hash(topic + "#" + key), never negative
    4       8     i64   phyOffset          commitlog offset of the message
    12      4     i32   timeDiff           (storeTimestamp - beginTimestamp) // 1000 s, clamped to 0..2**31-1
    16      4     i32   prevIndex          previous entry of the same slot, 0 at the end of the chain
                        = 20 bytes

The key hash is Java's `String.hashCode` of the index key, made non-negative with `Math.abs`, and 0 for
Integer.MIN_VALUE (whose Java abs is still negative). The slot is keyHash % S.

Two RocketMQ quirks are part of the format. A new file inherits the previous file's endTimestamp and
endPhyOffset as its begin and end values until its first put, and that first put's timeDiff is computed
against the inherited beginTimestamp (0 when it is 0 or less) before beginTimestamp is reset to its own
store time. A freshly created file has indexCount 0 on disk, read as 1 (empty).

Validity rule. An index file read from disk is valid iff
    (1) its size is exactly 40 + 4*S + 20*N for the S and N it is opened with;
    (2) 0 <= indexCount <= N (0 means 1: created, never written);
    (3) beginPhyOffset >= 0 and endPhyOffset >= 0;
a slot read is valid iff
    (4) 0 <= value < indexCount;
and an entry i reached from a slot or a prevIndex link is valid iff
    (5) 0 <= prevIndex < i (chains strictly descend, so every walk ends within indexCount steps);
    (6) timeDiff >= 0;
    (9) the entries of the chain of slot s have keyHash >= 0 and keyHash % S = s (RocketMQ's slot of the
        hash it stores);
the header agrees with the entries it counts iff
    (7) with entries (indexCount > 1): entry 1's phyOffset is beginPhyOffset, entry indexCount-1's is
        endPhyOffset, that last entry is the head of its slot (the newest entry always is) and keeps (5), (6),
        and its prevIndex, when not 0, names an entry of the same slot; without entries: beginPhyOffset =
        endPhyOffset and beginTimestamp = endTimestamp (a file created by a roll inherits both, a new one is
        zero);
and the files of one index agree iff
    (8) every file but the newest is full (indexCount = N: a file rolls only when full), and a file's entries
        point at or past the previous file's endPhyOffset (entries are in CommitLog order).
Rules (7) and (8) cost O(1) per file and catch a file whose end was zeroed or never written back under a
header that counts it (keys silently missing otherwise); they are checked at every writable open.
RocketMQ silently treats an out-of-range slot or link as "empty" and a negative timeDiff as "end of chain";
here they are corruption (`CorruptionError`), healed by `IndexService.truncate` after an unclean shutdown.
Rule (9) is checked on the chains a query walks, on every chain by `IndexFile.check` (and so
`IndexService.check`), and by the entry-by-entry check of recovery (against the links and the slot table on
disk, before the slots are rebuilt): it finds a damaged keyHash whenever the damage
changes the hash's slot (every one-bit flip when S has an odd factor, as RocketMQ's 5 000 000 does; with S a
power of two, flips of the bits above log2(S) go unseen) and a damaged prevIndex that leads into another
slot's chain. The store checks each phyOffset by reading the message there, which must hold a key of that
hash. A damaged timeDiff, or a prevIndex that stays inside its own chain, is not detected: the query may miss
keys. The hashSlotCount field is informational and not checked.

Files live in `<store>/index/` and are named by their creation time in local time, `yyyyMMddHHmmssSSS`
(17 digits, RocketMQ's UtilAll.timeMillisToHumanString), so name order is creation order. A name that is
not greater than the newest existing one is replaced by that name plus 1 (names only need to sort).
A new file starts when the current one is full (indexCount >= N).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

import numpy as np
from mqstore.commitlog.format import java_ascii_hash, java_string_hash

# --- sizes and limits ----------------------------------------------------------------------------------------
HEADER_SIZE_BYTES = 40
SLOT_SIZE_BYTES = 4
ENTRY_SIZE_BYTES = 20
HASH_SLOT_COUNT_DEFAULT = 5_000_000
INDEX_ENTRY_COUNT_MAX_DEFAULT = 20_000_000
INDEX_ENTRY_COUNT_MAX_MIN = 2  # entry 0 is never used, so a file needs room for 2 to hold one key
FILE_SIZE_BYTES_MAX = 2**31 - 1  # RocketMQ computes the file size in a Java int
INVALID_INDEX = 0  # an empty slot, the end of a chain
TIME_DIFF_MAX = 2**31 - 1
INDEX_KEY_SEPARATOR = "#"

# --- header field offsets, each built from the previous one --------------------------------------------------
OFFSET_BEGIN_TIMESTAMP = 0
OFFSET_END_TIMESTAMP = OFFSET_BEGIN_TIMESTAMP + 8
OFFSET_BEGIN_PHY_OFFSET = OFFSET_END_TIMESTAMP + 8
OFFSET_END_PHY_OFFSET = OFFSET_BEGIN_PHY_OFFSET + 8
OFFSET_HASH_SLOT_COUNT = OFFSET_END_PHY_OFFSET + 8
OFFSET_INDEX_COUNT = OFFSET_HASH_SLOT_COUNT + 4

# --- entry field offsets -------------------------------------------------------------------------------------
OFFSET_KEY_HASH = 0
OFFSET_PHY_OFFSET = OFFSET_KEY_HASH + 4
OFFSET_TIME_DIFF = OFFSET_PHY_OFFSET + 8
OFFSET_PREV_INDEX = OFFSET_TIME_DIFF + 4

INDEX_HEADER = np.dtype([
    ("begin_timestamp_ms", ">i8"),
    ("end_timestamp_ms", ">i8"),
    ("begin_phy_offset", ">i8"),
    ("end_phy_offset", ">i8"),
    ("hash_slot_count", ">i4"),
    ("index_count", ">i4"),
])
INDEX_ENTRY = np.dtype([
    ("key_hash", ">i4"),
    ("phy_offset", ">i8"),
    ("time_diff", ">i4"),
    ("prev_index", ">i4"),
])
SLOT = np.dtype(">i4")
HEADER_STRUCT = struct.Struct(">qqqqii")
ENTRY_STRUCT = struct.Struct(">iqii")
SLOT_STRUCT = struct.Struct(">i")

FILE_NAME_DIGITS = 17

assert OFFSET_INDEX_COUNT + 4 == HEADER_SIZE_BYTES
assert OFFSET_PREV_INDEX + 4 == ENTRY_SIZE_BYTES
assert INDEX_HEADER.itemsize == HEADER_SIZE_BYTES == HEADER_STRUCT.size
assert INDEX_ENTRY.itemsize == ENTRY_SIZE_BYTES == ENTRY_STRUCT.size
assert SLOT.itemsize == SLOT_SIZE_BYTES == SLOT_STRUCT.size
assert INDEX_HEADER.fields["index_count"][1] == OFFSET_INDEX_COUNT
assert INDEX_HEADER.fields["hash_slot_count"][1] == OFFSET_HASH_SLOT_COUNT
assert INDEX_ENTRY.fields["prev_index"][1] == OFFSET_PREV_INDEX
assert INDEX_ENTRY.fields["time_diff"][1] == OFFSET_TIME_DIFF
assert (HEADER_SIZE_BYTES + SLOT_SIZE_BYTES * HASH_SLOT_COUNT_DEFAULT
        + ENTRY_SIZE_BYTES * INDEX_ENTRY_COUNT_MAX_DEFAULT) == 420_000_040 <= FILE_SIZE_BYTES_MAX


def file_size_bytes(hash_slot_count: int, index_entry_count_max: int) -> int:
    """The exact size of an index file with `hash_slot_count` slots and room for `index_entry_count_max`."""
    return HEADER_SIZE_BYTES + SLOT_SIZE_BYTES * hash_slot_count + ENTRY_SIZE_BYTES * index_entry_count_max


def slots_offset() -> int:
    """Byte position of slot 0."""
    return HEADER_SIZE_BYTES


def entries_offset(hash_slot_count: int) -> int:
    """Byte position of entry 0 (never written: entries are numbered from 1)."""
    return HEADER_SIZE_BYTES + SLOT_SIZE_BYTES * hash_slot_count


# --- key hash ------------------------------------------------------------------------------------------------
def index_key(topic: str, key: str) -> str:
    """The string RocketMQ hashes for (topic, key): `topic#key`."""
    return topic + INDEX_KEY_SEPARATOR + key


def java_abs_hash(java_hash: int) -> int:
    """RocketMQ's indexKeyHashMethod on a hashCode: Math.abs, then 0 for Integer.MIN_VALUE (abs stays negative)."""
    return 0 if java_hash == -(2**31) else abs(java_hash)


def index_key_hash(key: str) -> int:
    """The keyHash of an index key (`topic#key`), in 0..2**31-1."""
    return java_abs_hash(java_string_hash(key))


def encoded_index_key_hash(key: bytes) -> int:
    """`index_key_hash` of a UTF-8 encoded index key (invalid UTF-8 replaced, as Java decodes it)."""
    key = bytes(key)
    if key.isascii():
        return java_abs_hash(java_ascii_hash(key))
    return index_key_hash(key.decode("utf-8", "replace"))


HASH_CHUNK_BYTES_MAX = 1 << 18  # bytes hashed per vector pass; sizes the power tables (2 x 1 MiB)
_MODULUS = 1 << 32
_DESCENDING_POW31: np.ndarray | None = None  # [i] = 31**(HASH_CHUNK_BYTES_MAX - i) mod 2**32
_INV_POW31: np.ndarray | None = None  # [i] = 31**-i mod 2**32 (31 is odd, hence invertible modulo 2**32)


def _power_tables() -> tuple[np.ndarray, np.ndarray]:
    global _DESCENDING_POW31, _INV_POW31
    if _DESCENDING_POW31 is None:
        powers = np.full(HASH_CHUNK_BYTES_MAX + 1, 31, dtype=np.uint32)
        powers[0] = 1
        inverse = np.full(HASH_CHUNK_BYTES_MAX + 1, pow(31, -1, _MODULUS), dtype=np.uint32)
        inverse[0] = 1
        _INV_POW31 = np.cumprod(inverse, dtype=np.uint32)
        _DESCENDING_POW31 = np.ascontiguousarray(np.cumprod(powers, dtype=np.uint32)[::-1])
        assert int(_DESCENDING_POW31[-3]) == 961
        assert (int(_DESCENDING_POW31[-8]) * int(_INV_POW31[7])) % _MODULUS == 1
    return _DESCENDING_POW31, _INV_POW31


def index_key_hashes(keys: Sequence[bytes]) -> np.ndarray:
    """keyHash of many UTF-8 encoded index keys at once, as an int64 array (the batch path of the builder).

    Java hashes UTF-16 code units; for ASCII keys those are the bytes, hashed here in vector passes: byte j of
    a chunk of `T` joined bytes is weighted 31**(T-1-j), the weighted bytes of each key are summed modulo 2**32,
    and each sum is divided (multiplied by the inverse power) by 31**(T-end of key). Non-ASCII keys are decoded
    (invalid UTF-8 replaced, as Java does) and hashed one by one.
    """
    count = len(keys)
    result = np.zeros(count, dtype=np.int64)
    if count == 0:
        return result
    descending_pow31, inv_pow31 = _power_tables()
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)
    ends_all = np.cumsum(lengths)
    first = 0
    while first < count:  # bounded: each pass takes at least one key
        base = int(ends_all[first] - lengths[first])
        last = int(np.searchsorted(ends_all, base + HASH_CHUNK_BYTES_MAX, side="right"))
        if last == first:  # one key longer than a chunk
            result[first] = encoded_index_key_hash(keys[first])
            first += 1
            continue
        joined = b"".join(keys[first:last])
        total = len(joined)
        ends = ends_all[first:last] - base
        starts = ends - lengths[first:last]
        nonempty = starts < ends
        codes = np.frombuffer(joined, dtype=np.uint8)
        weighted = codes * descending_pow31[HASH_CHUNK_BYTES_MAX + 1 - total :]  # byte j: 31**(total-1-j)
        sums = np.zeros(last - first, dtype=np.uint32)
        if total:
            sums[nonempty] = np.add.reduceat(weighted, starts[nonempty], dtype=np.uint32)
        hashes = (sums * inv_pow31[total - ends]).view(np.int32)
        positive = np.abs(hashes).astype(np.int64)  # abs(MIN_VALUE) wraps to MIN_VALUE ...
        positive[positive < 0] = 0  # ... which RocketMQ maps to 0
        result[first:last] = positive
        if not joined.isascii():
            for i in range(first, last):
                if not keys[i].isascii():
                    result[i] = encoded_index_key_hash(keys[i])
        first = last
    return result


# --- time ----------------------------------------------------------------------------------------------------
def time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """The timeDiff RocketMQ stores: whole seconds since beginTimestamp, 0 when there is none, clamped."""
    if begin_timestamp_ms <= 0:
        return 0
    diff = (store_timestamp_ms - begin_timestamp_ms) // 1000  # floor vs Java's truncation: both clamp to 0
    return 0 if diff < 0 else min(diff, TIME_DIFF_MAX)


# --- file names ----------------------------------------------------------------------------------------------
def file_name(timestamp_ms: int) -> str:
    """`yyyyMMddHHmmssSSS` in local time, RocketMQ's UtilAll.timeMillisToHumanString."""
    local = time.localtime(timestamp_ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", local) + f"{timestamp_ms % 1000:03d}"


def parse_file_name(name: str) -> int | None:
    """The number an index file name spells (its sort key), or None when `name` is not an index file name."""
    if len(name) != FILE_NAME_DIGITS or not name.isascii() or not name.isdigit():
        return None
    return int(name)


def next_file_name(timestamp_ms: int, newest_name: str | None) -> str:
    """The name for a file created at `timestamp_ms`, kept strictly greater than the newest existing name."""
    name = file_name(timestamp_ms)
    if newest_name is not None and name <= newest_name:
        name = f"{int(newest_name) + 1:0{FILE_NAME_DIGITS}d}"
    assert parse_file_name(name) is not None and (newest_name is None or name > newest_name)
    return name
