"""Golden bytes of the lease journal (mqstore/lease/format.py), written out by hand from its table."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from mqstore.commitlog.errors import CorruptionError

from mqstore.lease import format as lfmt

LEASE_BYTES = bytes.fromhex("02" "00" "0003" "00000007" "0000000000000102" "0000000000000009"
                            "0000018bcfe56800")


def test_header_bytes():
    assert lfmt.encode_header() == bytes.fromhex("4d514c4a" "00000001" "0000000000000000")


def test_record_bytes_follow_the_table():
    raw = lfmt.record(lfmt.KIND_LEASE, 7, 0x102, 9, 1_700_000_000_000, delivery_count=3)
    assert raw == LEASE_BYTES and len(raw) == lfmt.RECORD_BYTES == 32
    unit = np.frombuffer(raw, dtype=lfmt.LEASE_RECORD)[0]
    assert (unit["kind"], unit["delivery_count"], unit["queue_id"]) == (2, 3, 7)
    assert (unit["queue_offset"], unit["value_a"], unit["value_b"]) == (0x102, 9, 1_700_000_000_000)


def test_frame_bytes():
    frame = lfmt.encode_frame([LEASE_BYTES])
    expected_head = bytes.fromhex("4c454153" "00000001") + zlib.crc32(LEASE_BYTES).to_bytes(4, "big") + bytes(4)
    assert frame == expected_head + LEASE_BYTES
    records, end = lfmt.decode_frames(frame, 16, "journal")
    assert records == [(2, 0, 3, 7, 0x102, 9, 1_700_000_000_000)] and end == 16 + 48


@pytest.mark.parametrize("cut", [1, 15, 16, 47])
def test_a_torn_frame_ends_the_journal(cut):
    frames = lfmt.encode_frame([LEASE_BYTES]) * 2
    records, end = lfmt.decode_frames(frames[:48 + cut], 16, "journal")
    assert len(records) == 1 and end == 16 + 48


def test_a_bad_crc_ends_the_journal():
    frame = bytearray(lfmt.encode_frame([LEASE_BYTES]))
    frame[-1] ^= 1
    assert lfmt.decode_frames(bytes(frame), 16, "journal") == ([], 16)


@pytest.mark.parametrize("fields, rule", [
    ((9, 0, 0, 1, 0, 0, 0), "lease.6"),
    ((3, 1, 0, 1, 0, 0, 0), "lease.6"),
    ((3, 0, 0, 1, -1, 0, 0), "lease.7"),
    ((2, 0, 0, 1, 0, 5, 0), "lease.8"),
    ((1, 0, 0, 1, 5, 4, 0), "lease.8"),
])
def test_damage_inside_a_whole_frame_is_corruption(fields, rule):
    frame = lfmt.encode_frame([lfmt.RECORD.pack(*fields)])
    with pytest.raises(CorruptionError) as caught:
        lfmt.decode_frames(frame, 16, "journal")
    assert caught.value.rule == rule and caught.value.offset == 32


def test_a_bad_header_is_corruption():
    with pytest.raises(CorruptionError) as caught:
        lfmt.check_header(bytes(16), "journal")
    assert caught.value.rule == "lease.0"


def test_a_moved_record_is_valid_and_changes_no_state():
    frame = lfmt.encode_frame([lfmt.record(lfmt.KIND_MOVED, 0, 0)])
    assert frame[16:] == bytes([6]) + bytes(31)
    records, end = lfmt.decode_frames(frame, 16, "journal")
    assert records == [(6, 0, 0, 0, 0, 0, 0)] and end == 16 + len(frame)
