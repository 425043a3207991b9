"""scan() and records longer than its read chunk (scan_read.READ_CHUNK_BYTES): a hostile TOTALSIZE is reported from
the record's header and tail, before its bytes are read; a legitimate long record still scans.

Bytes are counted through scan_read.pread_segment, the one call the scan reads segments with: a record claiming
2 GiB used to be read whole (2 GiB of memory, seconds) before the CorruptionError its header already implied.
The small stores below lower READ_CHUNK_BYTES so that 12 KiB records are "long", and hold the early check to the
error the whole read gives (the check switched off) for each kind of damage, on both codecs and through the
log walk, the ConsumeQueue path and the planning walk that finds the written end.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from mqstore.commitlog import _native, arrow_decode
from mqstore.commitlog import format as fmt
from mqstore.flush.checkpoint import CHECKPOINT_DTYPE, CHECKPOINT_FILE_NAME

from mqstore import Message, MessageStore, StoreConfig
from mqstore.store import scan_end, scan_read
from mqstore.store.scan import scan_store
from tests.native.test_large_segments import GIB, _hostile_store

CODECS = {"python": None, "native": _native}
SMALL_CHUNK_BYTES = 4096
SMALL_BODY_BYTES = 12_000  # a record of about 12 KiB: longer than SMALL_CHUNK_BYTES
SMALL_RECORDS = 5
DAMAGED = 2  # the record the damage goes to


class Counted:
    """scan_read.pread_segment, counting the bytes it is asked for."""

    def __init__(self):
        self.read_bytes = 0
        self.inner = scan_read.pread_segment

    def __call__(self, fd, path, file_offset, length, *args, **kwargs):
        self.read_bytes += length
        return self.inner(fd, path, file_offset, length, *args, **kwargs)


def _outcome(call) -> tuple:
    """The rows' (commitlog offset, body), a written end, or the error's type, text, rule, file and offset."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - compared as a value
        return (type(exc).__name__, str(exc), getattr(exc, "rule", None), getattr(exc, "path", None),
                getattr(exc, "offset", None))
    if isinstance(result, tuple):  # written_end's (end, record starts)
        return ("end", result)
    return ("rows", result.column("commitlog_offset").to_pylist(), result.column("body").to_pylist())


def _scan(monkeypatch, codec: str, root: Path, **filters) -> tuple[tuple, int]:
    """(outcome, bytes read) of one scan of `root` on one codec."""
    counted = Counted()
    with monkeypatch.context() as patch:
        patch.setattr(arrow_decode, "NATIVE", CODECS[codec])
        patch.setattr(scan_read, "pread_segment", counted)
        outcome = _outcome(lambda: scan_store(str(root), **filters).read_all())
    return outcome, counted.read_bytes


# --- a record claiming 2 GiB in a sparse 4 GiB segment ------------------------------------------------------------
@pytest.mark.parametrize("filters", [{}, {"topic": "T"}], ids=["log", "consumequeue"])
def test_a_hostile_totalsize_is_reported_without_reading_the_record(tmp_path, monkeypatch, filters):
    # 0x7FFFFFFE: a ConsumeQueue unit of size 0x7FFFFFFF at offset 0 is RocketMQ's filler, which the queue path skips
    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFE)
    found = {codec: _scan(monkeypatch, codec, root, **filters) for codec in CODECS}
    for codec, (outcome, read_bytes) in found.items():
        assert outcome[0] == "CorruptionError" and outcome[2] == "commitlog.3" and outcome[4] == 0, (codec, outcome)
        assert "TOPICLENGTH 255 does not fit TOTALSIZE 2147483646" in outcome[1], (codec, outcome)
        assert outcome[3] == str(root / "commitlog" / fmt.segment_name(0))
        assert read_bytes <= 3 * scan_read.READ_CHUNK_BYTES, (codec, read_bytes)  # 2 GiB + 32 MiB before
    assert found["python"][0] == found["native"][0]


def test_the_written_end_stops_at_a_hostile_totalsize_without_reading_it(tmp_path, monkeypatch):
    # without ConsumeQueues planning walks the log from its start: the record is not a valid one. The checkpoint says
    # it was flushed, so the stop is damage (decision 0047); with that offset gone (a crash before the first flush)
    # the log ends there. Either way the record's 2 GiB are not read.
    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFF)
    shutil.rmtree(root / "consumequeue")
    for codec in CODECS:
        outcome, read_bytes = _scan(monkeypatch, codec, root)
        assert outcome[0] == "CorruptionError" and outcome[2:] == (
            "commitlog.end", str(root / "commitlog" / fmt.segment_name(0)), 0), (codec, outcome)
        assert read_bytes <= 2 * scan_read.READ_CHUNK_BYTES, (codec, read_bytes)  # 2 GiB + 16 MiB before
    with open(root / CHECKPOINT_FILE_NAME, "r+b") as checkpoint:
        checkpoint.seek(CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1])
        checkpoint.write(bytes(8))
    for codec in CODECS:
        outcome, read_bytes = _scan(monkeypatch, codec, root)
        assert outcome == ("rows", [], []), codec
        assert read_bytes <= 2 * scan_read.READ_CHUNK_BYTES, (codec, read_bytes)


# --- the early check gives the whole read's outcome, damage by damage ----------------------------------------------
def _small_store(root: Path, record_crc: bool) -> list[int]:
    """SMALL_RECORDS records of about 12 KiB in 1 MiB segments; their commitlog offsets."""
    config = StoreConfig(segment_size_bytes=1 << 20, dispatch_process=False, index_enabled=False,
                         record_crc=record_crc)
    with MessageStore.open(str(root), config) as store:
        return [store.put(Message(topic="T", body=bytes([65 + number]) * SMALL_BODY_BYTES, tags="x")).commitlog_offset
                for number in range(SMALL_RECORDS)]


def _damages(record: bytes):
    """(name, position in the record, new bytes): each breaks one of the checks the early check makes."""
    size, body_length = len(record), struct.unpack_from(">i", record, fmt.OFFSET_BODY_LENGTH)[0]
    tail_at = fmt.OFFSET_BODY + body_length
    properties_length_at = tail_at + 1 + record[tail_at]
    return [
        ("topic length 0", tail_at, b"\x00"),
        ("topic length 255", tail_at, b"\xff"),
        ("properties length -1", properties_length_at, b"\xff\xff"),
        ("properties length one more", properties_length_at,
         struct.pack(">h", struct.unpack_from(">h", record, properties_length_at)[0] + 1)),
        ("body length -5", fmt.OFFSET_BODY_LENGTH, struct.pack(">i", -5)),
        ("body length 10", fmt.OFFSET_BODY_LENGTH, struct.pack(">i", 10)),
        ("body length TOTALSIZE", fmt.OFFSET_BODY_LENGTH, struct.pack(">i", size)),
        ("TOTALSIZE one more", 0, struct.pack(">i", size + 1)),
        ("TOTALSIZE past the segment", 0, struct.pack(">i", 1 << 20)),
        ("wrong PHYSICALOFFSET", fmt.OFFSET_PHYSICAL_OFFSET + 7, b"\x01"),
        ("IPv6 born host flag", fmt.OFFSET_SYS_FLAG + 3, bytes([fmt.SYS_FLAG_BORNHOST_V6])),
        ("version 2 magic", fmt.OFFSET_MAGIC_CODE, struct.pack(">I", fmt.MESSAGE_MAGIC_CODE_V2)),
        ("topic not ASCII", tail_at + 1, b"\xc3"),
        ("body byte", fmt.OFFSET_BODY + 5, b"\x00"),
        ("a record-CRC digit", size - 5, b"x"),  # a property byte in a record without one
        ("the record-CRC separator", size - fmt.RECORD_CRC_LENGTH - 1, b"\x01"),
    ]


def _damage_names():
    return [name for name, _, _ in _damages(bytes(fmt.HEADER_SIZE + 200))]


@pytest.mark.parametrize("damage", _damage_names())
def test_the_early_check_gives_the_whole_reads_outcome(tmp_path, monkeypatch, damage):
    segment = fmt.segment_name(0)
    monkeypatch.setattr(scan_read, "READ_CHUNK_BYTES", SMALL_CHUNK_BYTES)
    for record_crc in (False, True):
        root = tmp_path / f"record-crc-{record_crc}"
        at = _small_store(root, record_crc)[DAMAGED]
        path = root / "commitlog" / segment
        data = bytearray(path.read_bytes())
        record = bytes(data[at:at + struct.unpack_from(">i", data, at)[0]])
        _, position, new = next(d for d in _damages(record) if d[0] == damage)
        data[at + position:at + position + len(new)] = new
        path.write_bytes(data)
        for filters in ({}, {"topic": "T"}):
            checked = {codec: _scan(monkeypatch, codec, root, **filters)[0] for codec in CODECS}
            with monkeypatch.context() as patch:  # the whole read, as before the early check
                patch.setattr(scan_read, "check_unread_record", lambda *args, **kwargs: None)
                whole = {codec: _scan(monkeypatch, codec, root, **filters)[0] for codec in CODECS}
            assert checked["python"] == whole["python"], (damage, record_crc, filters)
            assert checked["native"] == whole["native"], (damage, record_crc, filters)
            assert checked["python"] == checked["native"], (damage, record_crc, filters)
        shutil.rmtree(root / "consumequeue")  # planning walks the log to find its end
        checked = _outcome(lambda: scan_end.written_end(scan_read.list_segments(str(root))))
        with monkeypatch.context() as patch:
            patch.setattr(scan_read, "check_unread_record", lambda *args, **kwargs: None)
            whole = _outcome(lambda: scan_end.written_end(scan_read.list_segments(str(root))))
        assert checked == whole, (damage, record_crc)


# --- a legitimate record longer than the read chunk ---------------------------------------------------------------
def test_a_record_over_16_mib_written_with_a_larger_maximum_scans_with_the_default_config(tmp_path, monkeypatch):
    root = tmp_path / "store"
    body_bytes = scan_read.READ_CHUNK_BYTES + 12345
    config = StoreConfig(segment_size_bytes=64 << 20, max_message_size_bytes=20 << 20, dispatch_process=False,
                         index_enabled=False)
    bodies = [b"before", bytes(range(256)) * (body_bytes // 256) + b"end", b"after"]
    with MessageStore.open(str(root), config) as store:
        offsets = [store.put(Message(topic="T", body=body)).commitlog_offset for body in bodies]
    calls = []
    check = scan_read.check_unread_record
    monkeypatch.setattr(scan_read, "check_unread_record", lambda *args, **kwargs: calls.append(args[3]) or
                        check(*args, **kwargs))
    with MessageStore.open(str(root), StoreConfig(dispatch_process=False)) as store:
        assert store.config.max_message_size_bytes < len(bodies[1])
        for filters in ({}, {"topic": "T"}):
            for codec in CODECS:
                calls.clear()
                with monkeypatch.context() as patch:
                    patch.setattr(arrow_decode, "NATIVE", CODECS[codec])
                    table = store.scan(**filters).read_all()
                assert table.column("commitlog_offset").to_pylist() == offsets, (codec, filters)
                assert table.column("body").to_pylist() == bodies, (codec, filters)
                assert offsets[1] in calls, (codec, filters)  # the long record went through the early check
