"""The checkpoint file: RocketMQ's 4 KiB layout, monotonic updates, corruption reported."""

from __future__ import annotations

import struct

import pytest
from mqstore.commitlog.errors import CorruptionError
from mqstore.flush.checkpoint import CHECKPOINT_SIZE_BYTES, RECOVERY_SAFETY_MARGIN_MS, Checkpoint


def test_a_new_checkpoint_is_4_kib_of_zeros_and_reads_back_updates(tmp_path):
    checkpoint = Checkpoint.open(str(tmp_path), writable=True)
    assert (tmp_path / "checkpoint").read_bytes() == bytes(CHECKPOINT_SIZE_BYTES)
    checkpoint.update(physic_ms=1_700_000_000_123, logics_ms=1_700_000_000_100, index_ms=1_700_000_000_050)
    checkpoint.update(physic_ms=5)  # never moves back
    checkpoint.flush()
    checkpoint.close()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert struct.unpack_from(">qqq", raw) == (1_700_000_000_123, 1_700_000_000_100, 1_700_000_000_050)
    reopened = Checkpoint.open(str(tmp_path), writable=False)
    assert reopened.min_timestamp_ms() == 1_700_000_000_100 - RECOVERY_SAFETY_MARGIN_MS
    assert reopened.min_timestamp_ms(with_index=True) == 1_700_000_000_050 - RECOVERY_SAFETY_MARGIN_MS
    reopened.close()


def test_rocketmqs_checkpoint_reads(tmp_path):
    from tests.conftest import ROCKETMQ_STORE

    (tmp_path / "checkpoint").write_bytes((ROCKETMQ_STORE / "store" / "checkpoint").read_bytes())
    checkpoint = Checkpoint.open(str(tmp_path), writable=False)
    assert checkpoint.physic_msg_timestamp_ms == 0x000001A201E63D91
    assert checkpoint.logics_msg_timestamp_ms == 0x000001A201E63E45
    assert checkpoint.index_msg_timestamp_ms == 0x000001A201E63E44
    checkpoint.close()


def test_a_missing_checkpoint_is_none_for_a_reader(tmp_path):
    assert Checkpoint.open(str(tmp_path), writable=False) is None


def test_bad_checkpoints_are_corruption(tmp_path):
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqq", -1, 0, 0) + bytes(CHECKPOINT_SIZE_BYTES - 24))
    with pytest.raises(CorruptionError) as error:
        Checkpoint.open(str(tmp_path), writable=False)
    assert error.value.offset == 0
    (tmp_path / "checkpoint").write_bytes(bytes(100))
    with pytest.raises(CorruptionError):
        Checkpoint.open(str(tmp_path), writable=False)


def test_index_flushed_end_is_lowered_only_downwards(tmp_path):
    checkpoint = Checkpoint.open(str(tmp_path), writable=True)
    checkpoint.update(index_flushed_end=5000)
    checkpoint.lower_index_flushed_end(7000)
    assert checkpoint.index_flushed_end == 5000
    checkpoint.lower_index_flushed_end(1200)
    assert checkpoint.index_flushed_end == 1200
    checkpoint.close()


def test_raise_log_writes_the_log_fields_as_update_does_and_never_lowers_them(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    through_update = Checkpoint.open(str(tmp_path / "a"), writable=True)
    through_raise = Checkpoint.open(str(tmp_path / "b"), writable=True)
    for physic_ms, flushed in ((1_700_000_000_123, 4096), (1_700_000_000_100, 8192), (1_700_000_000_200, 100)):
        through_update.update(physic_ms=physic_ms, flushed_offset=flushed)
        through_raise.raise_log(physic_ms, flushed)
    assert (through_raise.physic_msg_timestamp_ms, through_raise.physic_flushed_offset) == (1_700_000_000_200, 8192)
    for checkpoint in (through_update, through_raise):
        checkpoint.flush()
        checkpoint.close()
    assert (tmp_path / "a" / "checkpoint").read_bytes() == (tmp_path / "b" / "checkpoint").read_bytes()
