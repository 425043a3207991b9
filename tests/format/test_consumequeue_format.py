"""Golden bytes of ConsumeQueue files: 20-byte units (i64 commitlog offset, i32 size, i64 tags code), big-endian."""

from __future__ import annotations

from mqstore.consumequeue import format as cqf

from mqstore import Message, MessageStore
from tests.conftest import small_config


def test_unit_dtype_is_twenty_big_endian_bytes():
    assert cqf.CONSUME_QUEUE_UNIT.itemsize == 20
    assert [cqf.CONSUME_QUEUE_UNIT.fields[name][1] for name in cqf.CONSUME_QUEUE_UNIT.names] == [0, 8, 12]
    assert all(cqf.CONSUME_QUEUE_UNIT.fields[name][0].byteorder == ">" for name in cqf.CONSUME_QUEUE_UNIT.names)
    units = cqf.make_units([0x0102030405060708], [0x0A0B0C0D], [-2])
    assert units.tobytes() == bytes.fromhex("0102030405060708" "0A0B0C0D" "FFFFFFFFFFFFFFFE")


def test_queue_file_units_byte_for_byte(tmp_path):
    with MessageStore.open(tmp_path, small_config(record_crc=False)) as store:
        store.put(Message("TopicA", b"hello", queue_id=3, tags="Tag4", keys=("k1", "k2"), properties={"p": "v"}))
        store.put(Message("TopicA", b"", queue_id=3))
        store.put(Message("TopicA", b"", queue_id=3, tags="polygenelubricants"))
    data = (tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000").read_bytes()
    assert len(data) == 64 * 20
    assert data[:60] == bytes.fromhex(
        "0000000000000000" "0000007F" "000000000027A7FA"   # offset 0, 127 bytes, hash("Tag4") = 2598906
        "000000000000007F" "00000061" "0000000000000000"   # offset 127, 97 bytes, no tags: 0
        "00000000000000E0" "00000079" "FFFFFFFF80000000"   # offset 224, 121 bytes, hash = Integer.MIN_VALUE
    )
    assert data[60:] == bytes(64 * 20 - 60)


def test_queue_files_are_named_by_the_byte_offset_of_their_first_unit(tmp_path):
    with MessageStore.open(tmp_path, small_config(record_crc=False)) as store:
        store.put_batch([Message("t", b"", queue_id=0) for _ in range(130)])
    names = sorted(path.name for path in (tmp_path / "consumequeue" / "t" / "0").iterdir())
    assert names == ["00000000000000000000", "00000000000000001280", "00000000000000002560"]  # 64 units per file
    third = (tmp_path / "consumequeue" / "t" / "0" / "00000000000000002560").read_bytes()
    # entries 128 and 129: records of 92 bytes (empty body, topic "t") at 128 * 92 and 129 * 92
    assert third[:40] == bytes.fromhex("0000000000002E00" "0000005C" "0000000000000000"
                                       "0000000000002E5C" "0000005C" "0000000000000000")
    assert third[40:] == bytes(len(third) - 40)
