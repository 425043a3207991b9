"""Golden bytes of CommitLog records, the end-of-segment blank, message ids and Java's String.hashCode.

Every expected byte below is written out by hand from RocketMQ 4.x's layout (commitlog/format.py has the table;
these stores write no record-CRC property, as RocketMQ 4.x does not, except the test that pins that property);
only the store timestamp, which the store sets, is read from the put result and packed in its place.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.format import java_string_hash

from mqstore import Message, MessageStore
from tests.conftest import small_config

T0 = 1_700_000_000_000  # 0x0000018BCFE56800


def _segment(store_dir, base: int = 0) -> bytes:
    return (store_dir / "commitlog" / f"{base:020d}").read_bytes()


def _golden(before_store_timestamp: str, store_timestamp_ms: int, after_store_timestamp: str) -> bytes:
    return bytes.fromhex(before_store_timestamp) + struct.pack(">q", store_timestamp_ms) + bytes.fromhex(
        after_store_timestamp)


def test_two_records_byte_for_byte(tmp_path):
    with MessageStore.open(tmp_path, small_config(record_crc=False)) as store:
        first = store.put(Message("TopicA", b"hello", queue_id=3, tags="Tag4", keys=("k1", "k2"),
                                  properties={"p": "v"}, flag=7, born_timestamp_ms=T0))
        second = store.put(Message("TopicA", b"", queue_id=3))
    expected_first = _golden(
        "0000007F"            # TOTALSIZE 127 = 91 + body 5 + topic 6 + properties 25
        "DAA320A7"            # MAGICCODE v1
        "3610A686"            # BODYCRC crc32(b"hello") & 0x7FFFFFFF
        "00000003"            # QUEUEID
        "00000007"            # FLAG
        "0000000000000000"    # QUEUEOFFSET
        "0000000000000000"    # PHYSICALOFFSET
        "00000000"            # SYSFLAG
        "0000018BCFE56800"    # BORNTIMESTAMP T0
        "0A000007" "00000000",  # BORNHOST 10.0.0.7 (the store host), born port 0
        first.store_timestamp_ms,
        "0A000007" "00002A9F"   # STOREHOST 10.0.0.7:10911
        "00000000"            # RECONSUMETIMES
        "0000000000000000"    # PREPAREDTRANSACTIONOFFSET
        "00000005" "68656C6C6F"  # BODYLENGTH, "hello"
        "06" "546F70696341"   # TOPICLENGTH, "TopicA"
        "0019"                # PROPERTIESLENGTH 25
        "54414753" "01" "54616734" "02"  # TAGS \x01 Tag4 \x02
        "4B455953" "01" "6B31206B32" "02"  # KEYS \x01 "k1 k2" \x02
        "70" "01" "76" "02",  # p \x01 v \x02
    )
    store_ts = struct.pack(">q", second.store_timestamp_ms)
    expected_second = (
        bytes.fromhex("00000061" "DAA320A7" "00000000"  # TOTALSIZE 97, v1, crc32(b"") = 0
                      "00000003" "00000000"              # QUEUEID 3, FLAG 0
                      "0000000000000001"                 # QUEUEOFFSET 1
                      "000000000000007F"                 # PHYSICALOFFSET 127
                      "00000000")                        # SYSFLAG
        + store_ts                                       # BORNTIMESTAMP: none given, so the store timestamp
        + bytes.fromhex("0A000007" "00000000")
        + store_ts
        + bytes.fromhex("0A000007" "00002A9F" "00000000" "0000000000000000"
                        "00000000"                       # BODYLENGTH 0
                        "06" "546F70696341" "0000")      # "TopicA", no properties
    )
    data = _segment(tmp_path)
    assert (first.commitlog_offset, first.size_bytes, second.commitlog_offset, second.size_bytes) == (0, 127, 127, 97)
    assert data[:127] == expected_first
    assert data[127:224] == expected_second
    assert data[224:] == bytes(len(data) - 224)


def test_message_ids_are_store_host_port_and_offset_in_upper_case_hex(tmp_path):
    config = small_config(store_host="192.168.0.254", store_port=10911, record_crc=False)
    with MessageStore.open(tmp_path, config) as store:
        first = store.put(Message("t", b"x" * 33))
        second = store.put(Message("t", b""))
    assert first.msg_id == "C0A800FE" "00002A9F" "0000000000000000"
    assert second.msg_id == "C0A800FE" "00002A9F" "000000000000007D"  # 91 + 33 + 1 = 125


def test_end_of_segment_blank(tmp_path):
    with MessageStore.open(tmp_path, small_config(record_crc=False)) as store:
        fill = [store.put(Message("t", b"f" * 3996)) for _ in range(16)]  # 16 records of 4088 bytes = 65408
        rolled = store.put(Message("t", b"r" * 100))  # 192 bytes + 8 > the 128 left: next segment
    assert fill[-1].commitlog_offset + fill[-1].size_bytes == 65408
    assert rolled.commitlog_offset == 65536
    first = _segment(tmp_path, 0)
    assert first[65408:65416] == bytes.fromhex("00000080" "CBD43194")  # TOTALSIZE = 128 bytes left, blank magic
    assert first[65416:] == bytes(120)
    second = _segment(tmp_path, 65536)
    assert second[:8] == bytes.fromhex("000000C0" "DAA320A7")  # 192-byte record at the next segment's start
    assert second[28:36] == bytes.fromhex("0000000000010000")  # its PHYSICALOFFSET is 65536


def _java_crc_digits(crc: int) -> bytes:
    """RocketMQ 5's MessageDecoder.createCrc32 digit loop, transcribed: ten digits, least significant first."""
    digits = bytearray()
    for _ in range(10):
        digit = 0
        if crc > 0:
            digit = crc % 10
            crc //= 10
        digits.append(ord("0") + digit)
    return bytes(digits)


def test_record_crc_property_byte_for_byte(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:  # record_crc is on by default
        first = store.put(Message("TopicA", b"hello", queue_id=3, tags="Tag4"))
        second = store.put(Message("TopicA", b"", queue_id=3))
    data = _segment(tmp_path)
    assert (first.size_bytes, second.size_bytes) == (91 + 5 + 6 + 10 + 20, 91 + 6 + 20)
    record = data[: first.size_bytes]
    assert record[-20 - 10 : -20] == b"TAGS\x01Tag4\x02"  # the user's properties come first
    assert record[-20:-11] == b"__CRC32#\x01" and record[-1:] == b"\x02"
    assert record[-11:-1] == _java_crc_digits(zlib.crc32(record[:-20]) & 0x7FFFFFFF)
    assert struct.unpack(">h", record[-20 - 10 - 2 : -20 - 10])[0] == 10 + 20  # PROPERTIESLENGTH counts it
    alone = data[first.size_bytes : first.size_bytes + second.size_bytes]
    assert alone[-22:-20] == b"\x00\x14"  # only the CRC pair: PROPERTIESLENGTH 20
    assert alone[-11:-1] == _java_crc_digits(zlib.crc32(alone[:-20]) & 0x7FFFFFFF)


@pytest.mark.parametrize("crc, digits", [(0, b"0000000000"), (12345, b"5432100000"), (0x7FFFFFFF, b"7463847412")])
def test_record_crc_digits_are_least_significant_first(crc, digits):
    assert _java_crc_digits(crc) == digits == fmt.record_crc_digits(crc)
    assert fmt.record_crc_value(digits) == crc


@pytest.mark.parametrize("text, expected", [
    ("Tag4", 2598906),
    ("", 0),
    ("TagA", 2598919),           # 84*31^3 + 97*31^2 + 103*31 + 65
    ("é", 233),                  # U+00E9, one UTF-16 unit
    ("ñandú", 225567348),        # 241*31^4 + 97*31^3 + 110*31^2 + 100*31 + 250
    ("日本", 835047),             # 0x65E5 * 31 + 0x672C
    ("😀", 1772899),              # surrogate pair D83D DE00: 0xD83D * 31 + 0xDE00
    ("a😀b", 57849694),          # ((97*31 + 0xD83D)*31 + 0xDE00)*31 + 98
    ("polygenelubricants", -2147483648),  # wraps to Integer.MIN_VALUE
])
def test_java_string_hash_code(text, expected):
    assert java_string_hash(text) == expected
