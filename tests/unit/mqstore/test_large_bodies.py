"""Bodies on both sides of the length where the CRC is taken a few KiB at a time (format.crc32): stored, read
back and checked the same, by put and by put_batch, and damage anywhere in a long body is found."""

from __future__ import annotations

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError

from mqstore import GetStatus, Message, MessageStore
from tests.conftest import small_config

pytestmark = pytest.mark.usefixtures("codec")  # each test with the Python and the compiled codec

LENGTHS = [fmt.CRC_SMALL_BYTES_MAX - 200, fmt.CRC_SMALL_BYTES_MAX - 99, fmt.CRC_SMALL_BYTES_MAX + 1, 20_000,
           300_000]


def _body(length: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(length))


@pytest.mark.parametrize("record_crc", [True, False])
def test_long_bodies_round_trip_through_put_and_put_batch(tmp_path, record_crc):
    config = small_config(record_crc=record_crc, segment_size_bytes=1 << 21, max_message_size_bytes=1 << 20)
    with MessageStore.open(tmp_path, config) as store:
        singles = [store.put(Message("big", _body(length, 1))) for length in LENGTHS]
        batch = store.put_batch([Message("big", _body(length, 2)) for length in LENGTHS])
        assert store.wait_dispatched(10)
        got = store.get("big", 0, 0, max_count=64)
        assert got.status is GetStatus.FOUND
        assert [m.body for m in got.messages] == [_body(n, 1) for n in LENGTHS] + [_body(n, 2) for n in LENGTHS]
        assert [m.body_crc for m in got.messages] == [fmt.body_crc(m.body) for m in got.messages]
        for result in singles + batch:
            assert store.read_at(result.commitlog_offset).size_bytes == result.size_bytes
    with MessageStore.open(tmp_path, config) as again:  # a reopen checks the records as recovery reads them
        assert again.max_offset("big", 0) == 2 * len(LENGTHS)


def test_damage_at_the_far_end_of_a_long_body_is_found(tmp_path):
    config = small_config(segment_size_bytes=1 << 21, max_message_size_bytes=1 << 20)
    with MessageStore.open(tmp_path, config) as store:
        result = store.put(Message("big", _body(300_000, 3)))
        segment = store._commitlog.segment_at(result.commitlog_offset)
        at = result.commitlog_offset - segment.base_offset + 88 + 300_000 - 5  # in the body's last chunk
        segment.array[at] ^= 0x01
        with pytest.raises(CorruptionError):
            store.read_at(result.commitlog_offset)
