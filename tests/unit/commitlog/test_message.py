"""decode_message: every record version and host width, CRC checks, and corruption reported, never decoded."""

from __future__ import annotations

import pytest
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.message import StoredMessage, decode_message
from mqstore.commitlog.segments import SegmentList

from tests.unit.commitlog import handmade

SEGMENT_SIZE = 4096


def _decode(data: bytes, offset: int = 0, **options) -> StoredMessage:
    return decode_message(memoryview(data), 0, len(data), offset, **options)


def test_v1_record_decodes_every_field():
    data = handmade.record(
        4242, "orders", b"hello", queue_id=3, queue_offset=17, flag=-5, sys_flag=0x8,
        properties="TAGS\x01Tag4\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02é\x01ü\x02".encode("utf-8"),
        born_host="192.168.1.2", born_port=50000, store_host="10.0.0.7", store_port=10911,
        born_timestamp_ms=1_700_000_000_000, store_timestamp_ms=1_700_000_000_123, reconsume_times=2,
        prepared_transaction_offset=99)
    message = _decode(data, 4242)
    assert (message.topic, message.queue_id, message.queue_offset, message.commitlog_offset) == ("orders", 3, 17, 4242)
    assert (message.body, message.flag, message.sys_flag, message.size_bytes) == (b"hello", -5, 0x8, len(data))
    assert (message.born_timestamp_ms, message.store_timestamp_ms) == (1_700_000_000_000, 1_700_000_000_123)
    assert (message.reconsume_times, message.prepared_transaction_offset) == (2, 99)
    assert message.body_crc == 0x3610A686
    assert message.born_host == "192.168.1.2:50000" and message.store_host == "10.0.0.7:10911"
    assert message.tags == "Tag4" and message.keys == ("k1", "k2")
    assert message.properties == {"TAGS": "Tag4", "KEYS": "k1 k2", "UNIQ_KEY": "U", "é": "ü"}
    assert message.msg_id == "0A00000700002A9F" + "%016X" % 4242


def test_v2_record_with_a_two_byte_topic_length_decodes():
    data = handmade.record(0, "v2topic", b"body", v2=True, queue_id=1, queue_offset=4,
                           properties=b"TAGS\x01x\x02", store_timestamp_ms=77)
    message = _decode(data)
    assert (message.topic, message.body, message.queue_id, message.queue_offset) == ("v2topic", b"body", 1, 4)
    assert message.tags == "x" and message.store_timestamp_ms == 77 and message.size_bytes == len(data)


def test_v2_record_with_a_topic_over_255_bytes_decodes():
    topic = "T" * 300
    message = _decode(handmade.record(0, topic, b"long topic", v2=True))
    assert message.topic == topic and message.body == b"long topic"


@pytest.mark.parametrize("born_host, store_host", [("::1", "10.0.0.7"), ("192.168.1.2", "fe80::2"),
                                                   ("2001:db8::5", "fe80::2")])
def test_ipv6_hosts_shift_the_fields_after_them(born_host, store_host):
    data = handmade.record(0, "six", b"v6 body", born_host=born_host, born_port=1234, store_host=store_host,
                           store_port=10911, store_timestamp_ms=1_700_000_000_999, reconsume_times=3,
                           prepared_transaction_offset=12, properties=b"KEYS\x01a\x02", queue_offset=8)
    message = _decode(data)
    expected_flag = (0x10 if ":" in born_host else 0) | (0x20 if ":" in store_host else 0)
    assert message.sys_flag == expected_flag
    wrap = lambda h: f"[{h}]" if ":" in h else h  # noqa: E731
    assert message.born_host == f"{wrap(born_host)}:1234" and message.store_host == f"{wrap(store_host)}:10911"
    assert (message.store_timestamp_ms, message.reconsume_times, message.prepared_transaction_offset) == (
        1_700_000_000_999, 3, 12)
    assert (message.body, message.topic, message.keys, message.queue_offset) == (b"v6 body", "six", ("a",), 8)
    assert len(message.msg_id) == (56 if ":" in store_host else 32)


def test_body_crc_is_checked_only_when_asked():
    data = handmade.record(0, "t", b"body", body_crc=12345)
    assert _decode(data).body == b"body"
    with pytest.raises(CorruptionError) as raised:
        _decode(data, check_crc=True)
    assert raised.value.rule == "commitlog.5"
    v2 = handmade.record(0, "t", b"body", body_crc=12345, v2=True)
    with pytest.raises(CorruptionError):
        _decode(v2, check_crc=True)


def test_non_ascii_topic_bytes_are_corruption():
    data = bytearray(handmade.record(0, "tx", b""))
    data[89 + 1] = 0xC3
    with pytest.raises(CorruptionError):
        _decode(bytes(data))


def test_stored_messages_compare_by_value():
    data = handmade.record(0, "t", b"same", properties=b"A\x01b\x02")
    first, second = _decode(data), _decode(data)
    assert first == second and first.properties == {"A": "b"}
    assert first != _decode(handmade.record(0, "t", b"other"))
    assert "topic='t'" in repr(first)


# --- corruption in a segment on disk --------------------------------------------------------------------------
BODY = b"\xff" * 40  # a topic length read from inside this body is 255: never consistent by accident


def _three_record_segment(tmp_path) -> tuple[SegmentList, list[int], int]:
    writer = handmade.SegmentWriter(tmp_path / "commitlog", SEGMENT_SIZE)
    for queue_offset in range(3):
        writer.add("tp", BODY, queue_offset=queue_offset)
    writer.write()
    return writer, writer.offsets, writer.end


FIELD_BITS = ([("magic", handmade.AT_MAGIC, bit) for bit in range(32)]
              + [("size", handmade.AT_TOTAL_SIZE, bit) for bit in range(32)]
              + [("body length", handmade.AT_BODY_LENGTH_V4, bit) for bit in range(32)])


@pytest.mark.parametrize("field, at, bit", FIELD_BITS, ids=[f"{f}-bit{b}" for f, _, b in FIELD_BITS])
def test_a_flipped_bit_in_magic_size_or_body_length_is_reported_with_path_and_offset(tmp_path, field, at, bit):
    writer, offsets, _ = _three_record_segment(tmp_path)
    corrupt = offsets[1]
    # big-endian field: bit k of the value is in byte 3 - k // 8
    handmade.flip_bit(writer.path(0), corrupt + at + 3 - bit // 8, bit % 8)
    segments = SegmentList(str(tmp_path / "commitlog"), SEGMENT_SIZE, writable=False)
    segment = segments.segment_at(0)
    with pytest.raises(CorruptionError) as raised:
        decode_message(segment.view, corrupt, SEGMENT_SIZE - corrupt, corrupt, path=segment.path)
    assert raised.value.path == writer.path(0) and raised.value.offset == corrupt
    # the records on either side still decode
    assert decode_message(segment.view, offsets[0], SEGMENT_SIZE, offsets[0]).queue_offset == 0
    assert decode_message(segment.view, offsets[2], SEGMENT_SIZE - offsets[2], offsets[2]).queue_offset == 2


def test_corruption_in_a_later_segment_is_reported_at_its_position_in_that_file(tmp_path):
    """CorruptionError: with a path, `offset` is the byte position inside that file (commitlog/errors.py)."""
    writer = handmade.SegmentWriter(tmp_path, SEGMENT_SIZE)
    while writer.end < SEGMENT_SIZE + 500:
        writer.add("tp", BODY)
    writer.write()
    corrupt = writer.offsets[-1]
    assert corrupt > SEGMENT_SIZE
    handmade.flip_bit(writer.path(SEGMENT_SIZE), corrupt - SEGMENT_SIZE + handmade.AT_MAGIC, 0)
    segment = SegmentList(str(tmp_path), SEGMENT_SIZE, writable=False).segment_at(SEGMENT_SIZE)
    pos = corrupt - SEGMENT_SIZE
    with pytest.raises(CorruptionError) as raised:
        decode_message(segment.view, pos, SEGMENT_SIZE - pos, corrupt, path=segment.path)
    assert raised.value.path == writer.path(SEGMENT_SIZE)
    assert raised.value.offset == pos
