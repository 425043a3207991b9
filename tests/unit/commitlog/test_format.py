"""commitlog.format: names, hosts, properties, hashes and the validity rule as `locate` applies it."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError

from tests.unit.commitlog import handmade


def test_layout_constants_match_rocketmq():
    assert (fmt.OFFSET_QUEUE_ID, fmt.OFFSET_QUEUE_OFFSET, fmt.OFFSET_PHYSICAL_OFFSET, fmt.OFFSET_SYS_FLAG) == (
        12, 20, 28, 36)
    assert (fmt.OFFSET_BORN_TIMESTAMP, fmt.OFFSET_BORN_HOST, fmt.OFFSET_STORE_TIMESTAMP, fmt.OFFSET_STORE_HOST) == (
        40, 48, 56, 64)
    assert (fmt.OFFSET_RECONSUME_TIMES, fmt.OFFSET_PREPARED_TRANSACTION_OFFSET, fmt.OFFSET_BODY_LENGTH,
            fmt.OFFSET_BODY) == (72, 76, 84, 88)
    assert fmt.RECORD_SIZE_MIN == 92  # 88 header + empty body + 1-byte topic length + 1-char topic + 2
    assert fmt.MESSAGE_MAGIC_CODE_V2 == 0xDAA320AB and fmt.END_FILE_MIN_BLANK_LENGTH == 8


@pytest.mark.parametrize("base, name", [(0, "00000000000000000000"), (1 << 30, "00000000001073741824"),
                                        (65536 * 3, "00000000000000196608")])
def test_segment_name_round_trips(base, name):
    assert fmt.segment_name(base) == name
    assert fmt.parse_segment_name(name) == base


@pytest.mark.parametrize("name", ["0000000000000000000", "000000000000000000000", "0000000000000000000x",
                                  "00000000000000000000.tmp", "lock", "٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠"])
def test_parse_segment_name_refuses_other_names(name):
    assert fmt.parse_segment_name(name) is None


def test_hosts_encode_and_decode():
    assert fmt.encode_host("10.0.0.7", 10911) == bytes.fromhex("0A000007" "00002A9F")
    assert fmt.decode_host(bytes.fromhex("0A000007" "00002A9F")) == "10.0.0.7:10911"
    assert fmt.decode_host(handmade.host("fe80::1", 8080)) == "[fe80::1]:8080"
    with pytest.raises(InvalidMessageError):
        fmt.encode_host("not-an-ip", 1)
    with pytest.raises(InvalidMessageError):
        fmt.encode_host("1.2.3.4", 65536)


def test_message_id_layout_and_parse():
    raw = fmt.encode_host("10.0.0.7", 10911)
    msg_id = fmt.message_id(raw, 0x1234)
    assert msg_id == "0A00000700002A9F0000000000001234"
    assert fmt.parse_message_id(msg_id) == (raw, 0x1234)
    assert fmt.parse_message_id(msg_id.lower()) == (raw, 0x1234)
    v6 = handmade.host("::1", 7)
    assert len(fmt.message_id(v6, 5)) == 56
    assert fmt.parse_message_id(fmt.message_id(v6, 5)) == (v6, 5)
    for bad in ("", "0A", "Z" * 32, 12345):
        with pytest.raises(InvalidMessageError):
            fmt.parse_message_id(bad)


def test_properties_encode_decode_and_lookup():
    properties = {"TAGS": "a", "KEYS": "k1 k2", "é": "ü"}
    raw = fmt.encode_properties(properties)
    assert raw == "TAGS\x01a\x02KEYS\x01k1 k2\x02é\x01ü\x02".encode("utf-8")
    assert fmt.decode_properties(raw) == properties
    assert fmt.encode_properties({}) == b"" and fmt.decode_properties(b"") == {}
    assert fmt.property_value(raw, b"KEYS") == b"k1 k2"
    assert fmt.property_value(b"XTAGS\x01no\x02TAGS\x01yes\x02", b"TAGS") == b"yes"  # a longer name is skipped
    assert fmt.property_value(raw, b"UNIQ_KEY") is None
    assert fmt.decode_properties(b"junk\x02a\x01b\x02") == {"a": "b"}  # an item without \x01 is skipped


def test_body_crc_clears_the_sign_bit():
    assert fmt.body_crc(b"hello") == 0x3610A686
    assert fmt.body_crc(b"a") == 0xE8B7BE43 & 0x7FFFFFFF  # zlib.crc32(b"a") has the top bit set


@pytest.mark.parametrize("text, expected", [
    ("", 0), ("a", 97), ("Tag4", 2598906), ("Aa", 2112), ("BB", 2112),
    ("é", 0xE9), ("日本", 0x65E5 * 31 + 0x672C),
    ("😀", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 units
    ("a😀", 97 * 31 * 31 + 0xD83D * 31 + 0xDE00),
    ("polygenelubricants", -(2**31)),  # wraps to Integer.MIN_VALUE in Java
])
def test_java_string_hash(text, expected):
    assert fmt.java_string_hash(text) == expected


def _java_hash_char_by_char(data: bytes) -> int:
    """The textbook loop, as the reference for the base-31 evaluation."""
    h = 0
    for code in data:
        h = (31 * h + code) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@pytest.mark.parametrize("length", [0, 1, 2, 30, 511, 512, 513, 1024, 1500, 5000])
def test_java_ascii_hash_matches_the_loop_at_every_chunk_boundary(length):
    rng = np.random.default_rng(length)
    for _ in range(20):
        data = rng.integers(0, 128, length, dtype=np.uint8).tobytes()
        assert fmt.java_ascii_hash(data) == _java_hash_char_by_char(data)
        assert fmt.java_string_hash(data.decode("ascii")) == _java_hash_char_by_char(data)
    edges = bytes([0, 30, 31, 32, 61, 62, 63, 92, 93, 123, 124, 127]) * (length // 12 + 1)
    assert fmt.java_ascii_hash(edges[:length]) == _java_hash_char_by_char(edges[:length])


def test_java_ascii_hash_holds_under_the_lowest_int_digit_limit():
    import sys
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        data = b"x" * 700 + b"\x7f" * 700
        assert fmt.java_ascii_hash(data) == _java_hash_char_by_char(data)
    finally:
        sys.set_int_max_str_digits(limit)


def test_tags_code_is_zero_without_tags():
    assert fmt.tags_code(None) == 0 and fmt.tags_code("") == 0 and fmt.tags_code("Tag4") == 2598906


def _located(data: bytes, offset: int = 0, remaining: int | None = None):
    return fmt.locate(data, 0, len(data) if remaining is None else remaining, offset, path="seg")


def test_locate_finds_the_parts_of_v1_v2_and_ipv6_records():
    body, props = b"payload", b"A\x01b\x02"
    layout = _located(handmade.record(0, "topic", body, properties=props))
    assert (layout.body_start, layout.body_length, layout.topic_start, layout.topic_length) == (88, 7, 96, 5)
    assert (layout.properties_start, layout.properties_length) == (103, 4) and layout.size == 107
    v2 = _located(handmade.record(0, "topic", body, properties=props, v2=True))
    assert (v2.topic_start, v2.topic_length, v2.size) == (97, 5, 108)
    v6 = _located(handmade.record(0, "t", body, born_host="::1", store_host="fe80::2"))
    assert v6.born_host == (48, 20) and v6.store_host == (76, 20) and v6.body_start == 88 + 24
    assert v6.sys_flag == handmade.BORN_HOST_V6 | handmade.STORE_HOST_V6


def _with(data: bytes, at: int, fmt_code: str, value) -> bytes:
    changed = bytearray(data)
    struct.pack_into(fmt_code, changed, at, value)
    return bytes(changed)


@pytest.mark.parametrize("change, rule", [
    (lambda r: _with(r, 4, ">I", 0x12345678), "1"),
    (lambda r: _with(r, 0, ">i", 91), "2"),
    (lambda r: _with(r, 0, ">i", 10_000), "2"),
    (lambda r: _with(r, 84, ">i", -1), "3"),
    (lambda r: _with(r, 84, ">i", 4), "3"),
    (lambda r: _with(r, 88 + 3, ">B", 0), "3"),
    (lambda r: _with(r, 28, ">q", 1), "4"),
])
def test_locate_names_the_rule_that_failed(change, rule):
    data = change(handmade.record(0, "abc", b"xyz", properties=b"k\x01v\x02"))
    with pytest.raises(CorruptionError) as raised:
        fmt.locate(data + bytes(64), 0, len(data), 0, path="seg")
    assert raised.value.rule == f"commitlog.{rule}"
    assert raised.value.path == "seg" and raised.value.offset == 0
    # what a caller may do next is a typed flag, not a rule string: rules 1 and 4 say no record starts here
    assert (raised.value.not_a_record, raised.value.length_sound) == (rule in ("1", "4"), False)


def test_a_crc_failure_leaves_the_length_sound():
    data = bytearray(handmade.record(0, "abc", b"xyz"))
    data[88] ^= 0x01  # a body byte
    layout = fmt.locate(bytes(data), 0, len(data), 0)
    with pytest.raises(CorruptionError) as raised:
        fmt.check_crcs(bytes(data), layout, 0, 0, required=False, check_crc=True)
    assert raised.value.rule == "commitlog.5" and raised.value.length_sound and not raised.value.not_a_record


def test_locate_refuses_fewer_than_eight_bytes():
    with pytest.raises(CorruptionError) as raised:
        fmt.locate(bytes(16), 0, 7, 100)
    assert raised.value.rule == "commitlog.1" and raised.value.offset == 100


def test_peek_reads_size_and_magic():
    assert fmt.peek(handmade.blank(16), 0, 16) == (16, handmade.MAGIC_BLANK)
    assert fmt.peek(bytes(16), 0, 7) == (0, 0)


def test_record_crc_present_agrees_with_record_crc_columns():
    import numpy as np

    seed = 20261122
    print("seed", seed)
    rng = np.random.default_rng(seed)
    pair = np.frombuffer(fmt.RECORD_CRC_PLACEHOLDER, dtype=np.uint8)
    data = rng.choice(np.frombuffer(b"\x01\x02ab_", dtype=np.uint8), size=64 * 400).astype(np.uint8)
    starts = np.arange(0, 64 * 400, 64, dtype=np.int64) + 4
    lengths = rng.integers(0, 60, size=len(starts))
    ends = starts + lengths
    for i in np.flatnonzero(rng.random(len(starts)) < 0.6):  # most properties end with a pair, some damaged
        if lengths[i] >= fmt.RECORD_CRC_LENGTH:
            data[ends[i] - fmt.RECORD_CRC_LENGTH:ends[i]] = pair
            data[ends[i] - rng.integers(1, fmt.RECORD_CRC_LENGTH + 2)] ^= rng.integers(0, 2) * 3
    valid = rng.random(len(starts)) < 0.9
    expected, _ = fmt.record_crc_columns(data, starts, lengths, ends, valid)
    got = fmt.record_crc_present(data, starts, lengths, ends, valid)
    assert expected.any() and not expected.all()
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("starts", [[5, 105, 205, 305], [0, 90, 200, 201 + 88], [7], [0, 100, 200, 301]],
                         ids=["evenly spaced", "irregular", "one", "last one off"])
def test_rows_at_gives_the_bytes_at_each_start(starts):
    data = np.frombuffer(bytes(range(256)) * 3, dtype=np.uint8)
    rows = fmt.rows_at(data, np.asarray(starts, dtype=np.int64), 88)
    assert rows.shape == (len(starts), 88)
    assert [bytes(row) for row in rows] == [bytes(data[start : start + 88]) for start in starts]


@pytest.mark.parametrize("length", [0, 1, 4096, fmt.CRC_SMALL_BYTES_MAX, fmt.CRC_SMALL_BYTES_MAX + 1, 8191, 8192,
                                    16384 + 7, 1 << 20])
def test_crc32_is_zlibs_for_short_and_long_inputs_of_any_buffer_type(length):
    import zlib

    data = bytes((i * 131 + length) & 0xFF for i in range(length))
    for start in (0, 0xDEADBEEF):
        expected = zlib.crc32(data, start)
        assert fmt.crc32(data, start) == expected
        assert fmt.crc32(memoryview(data), start) == expected
        assert fmt.crc32(bytearray(data), start) == expected
        assert fmt.crc32(np.frombuffer(data, dtype=np.uint8), start) == expected
    assert fmt.body_crc(data) == zlib.crc32(data) & 0x7FFFFFFF
