"""scan() refuses what read_at and get refuse, with the same CorruptionError (file, offset in that file, rule), on
both codecs.

A store of four 64 KiB segments gets one record damaged in one of the ways commitlog/format.py's validity rules
name; read_at, get and scan() then read it, in one process per codec (the codec a log and the Arrow decoder use
is chosen when they are opened: both are patched). The scan's read chunk is lowered so that the damaged record
lies in a read buffer that does not start at its file's first byte, and its segment's base is not 0: an offset
counted from the buffer, from the start of a copy or from the log's start differs from the one in the file.

Rules 5 and 6 compare CRCs "when CRCs are checked": read_at and get check them, scan() does not (a flipped body
byte is read by scan() as it is), so those cases are left out here.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from mqstore.commitlog import _native, arrow_decode, native
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import CorruptionError

from mqstore import Message, MessageStore, StoreConfig
from mqstore.store import scan_read

CODECS = {"python": None, "native": _native}
SEGMENT_BYTES = 64 * 1024
BODY_BYTES = 1000
MESSAGE_COUNT = 200  # about 220 KiB: four segments
MIDDLE = 80  # a record in the second segment, not at the start of a read chunk
TAIL = MESSAGE_COUNT - 3  # a record in the last segment, among the records the planning walk checks again
SMALL_CHUNK_BYTES = 8192


def _topic_at(record: bytes) -> int:
    return fmt.OFFSET_BODY + fmt.I32.unpack_from(record, fmt.OFFSET_BODY_LENGTH)[0] + 1


def _properties_length_at(record: bytes) -> int:
    return _topic_at(record) + record[_topic_at(record) - 1]


# Each damage: (how the record's bytes change, the rule read_at reports). Lengths stay within the segment.
DAMAGES = {
    "magic code": (lambda r: r[:4] + b"\xde\xad\xbe\xef" + r[8:], "commitlog.1"),
    "TOTALSIZE below the minimum": (lambda r: struct.pack(">i", 40) + r[4:], "commitlog.2"),
    "TOTALSIZE shorter": (lambda r: struct.pack(">i", len(r) - 45) + r[4:], "commitlog.3"),  # the chain goes astray
    "TOTALSIZE longer": (lambda r: struct.pack(">i", len(r) + 45) + r[4:], "commitlog.3"),
    "BODYLENGTH past the topic": (lambda r: r[:fmt.OFFSET_BODY_LENGTH] + struct.pack(">i", BODY_BYTES + 7)
                                  + r[fmt.OFFSET_BODY:], "commitlog.3"),
    "TOPICLENGTH 0": (lambda r: r[:_topic_at(r) - 1] + b"\0" + r[_topic_at(r):], "commitlog.3"),
    "PROPERTIESLENGTH short": (lambda r: r[:_properties_length_at(r)] + struct.pack(
        ">h", struct.unpack_from(">h", r, _properties_length_at(r))[0] - 1) + r[_properties_length_at(r) + 2:],
        "commitlog.3"),
    "topic not ASCII": (lambda r: r[:_topic_at(r)] + b"\xc3" + r[_topic_at(r) + 1:], "commitlog.3"),
    "PHYSICALOFFSET": (lambda r: r[:fmt.OFFSET_PHYSICAL_OFFSET] + struct.pack(
        ">q", struct.unpack_from(">q", r, fmt.OFFSET_PHYSICAL_OFFSET)[0] + 1) + r[fmt.OFFSET_PHYSICAL_OFFSET + 8:],
        "commitlog.4"),
    "record-CRC digit not a digit": (lambda r: r[:-11] + b"x" + r[-10:], "commitlog.6"),
    "record-CRC digit a space": (lambda r: r[:-3] + b" " + r[-2:], "commitlog.6"),
    "record-CRC name": (lambda r: r[:-20] + b"X" + r[-19:], "commitlog.6"),  # required on every record of the store
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("pristine") / "store"
    config = StoreConfig(segment_size_bytes=SEGMENT_BYTES, dispatch_process=False, index_enabled=False)
    with MessageStore.open(str(root), config) as store:
        results = [store.put(Message(topic="T", body=bytes([65 + i % 26]) * BODY_BYTES, tags="t", keys=["k"],
                                     queue_id=0)) for i in range(MESSAGE_COUNT)]
    return root, results


def _damaged(pristine, tmp_path: Path, index: int, damage: str) -> tuple[Path, object, Path, int]:
    """A copy of the pristine store with record `index` damaged: (root, its PutResult, segment, position)."""
    source, results = pristine
    root = tmp_path / "store"
    shutil.copytree(source, root)
    result = results[index]
    base = result.commitlog_offset - result.commitlog_offset % SEGMENT_BYTES
    assert base > 0
    segment = root / "commitlog" / fmt.segment_name(base)
    position = result.commitlog_offset - base
    with open(segment, "r+b") as handle:
        handle.seek(position)
        record = handle.read(result.size_bytes)
        changed = DAMAGES[damage][0](record)
        assert len(changed) == len(record) and changed != record
        handle.seek(position)
        handle.write(changed)
    return root, result, segment, position


def _outcome(call) -> tuple:
    """("ok",) or the CorruptionError's (rule, file, offset, text); read_at's "no record here" gives its cause."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - compared as a value
        error = exc if isinstance(exc, CorruptionError) else exc.__cause__
        assert isinstance(error, CorruptionError), repr(exc)
        return (error.rule, error.path, error.offset, str(error))
    return ("ok",)


def _outcomes(monkeypatch, codec: str, root: Path, result) -> dict[str, tuple]:
    with monkeypatch.context() as patch:
        patch.setattr(native, "NATIVE", CODECS[codec])
        patch.setattr(arrow_decode, "NATIVE", CODECS[codec])
        patch.setattr(scan_read, "READ_CHUNK_BYTES", SMALL_CHUNK_BYTES)
        with MessageStore.open(str(root), read_only=True) as store:
            return {
                "read_at": _outcome(lambda: store.read_at(result.commitlog_offset)),
                "get": _outcome(lambda: store.get("T", 0, result.queue_offset, 1)),
                "scan": _outcome(lambda: store.scan().read_all()),
            }


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_scan_reports_the_damage_read_at_reports(pristine, tmp_path, monkeypatch, codec, damage):
    root, result, segment, position = _damaged(pristine, tmp_path, MIDDLE, damage)
    outcomes = _outcomes(monkeypatch, codec, root, result)
    rule, path, offset, _ = outcomes["read_at"]
    assert (rule, path, offset) == (DAMAGES[damage][1], str(segment), position), outcomes
    assert outcomes["scan"] == outcomes["read_at"], outcomes
    if "TOTALSIZE" not in damage:  # get checks TOTALSIZE against its ConsumeQueue unit first
        assert outcomes["get"] == outcomes["read_at"], outcomes


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("damage", ["topic not ASCII", "record-CRC digit not a digit"])
def test_the_planning_walk_names_the_record_in_its_file(pristine, tmp_path, monkeypatch, codec, damage):
    """A damaged record among the last ones of the log, which the walk that finds the written end reads again
    (a copy of each record, read alone): its error names the record's position in the segment, not 0. Without
    ConsumeQueues no record start is known to be dispatched, so the walk covers the last segment."""
    root, result, segment, position = _damaged(pristine, tmp_path, TAIL, damage)
    shutil.rmtree(root / "consumequeue")
    outcomes = _outcomes(monkeypatch, codec, root, result)
    assert outcomes["read_at"][:3] == (DAMAGES[damage][1], str(segment), position), outcomes
    assert outcomes["scan"] == outcomes["read_at"], outcomes


RANDOM_STORES = 24  # stores with one record damaged at random, per codec
RANDOM_SEED = 20261127


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_random_damage_gives_read_ats_outcome(pristine, tmp_path, monkeypatch, codec):
    """1 to 3 bytes of one record (not in the last segment) overwritten, often in its header or tail: scan() gives
    the outcome of a read of that record without CRC checks (which scan() does not make), error for error."""
    import random

    rng = random.Random(RANDOM_SEED)
    print(f"seed {RANDOM_SEED}")
    source, results = pristine
    for trial in range(RANDOM_STORES):
        root = tmp_path / f"store-{trial}"
        shutil.copytree(source, root)
        result = results[rng.randrange(MIDDLE - 60, MIDDLE + 60)]
        base = result.commitlog_offset - result.commitlog_offset % SEGMENT_BYTES
        with open(root / "commitlog" / fmt.segment_name(base), "r+b") as handle:
            for _ in range(rng.choice((1, 1, 2, 3))):
                edge = rng.choice((rng.randrange(100), result.size_bytes - 1 - rng.randrange(40)))
                at = rng.randrange(result.size_bytes) if rng.random() < 0.3 else edge
                handle.seek(result.commitlog_offset - base + at)
                handle.write(bytes([rng.choice((0, 1, 2, 0x30, 0x39, 0x80, 0xC3, 0xFF, rng.randrange(256)))]))
        with monkeypatch.context() as patch:
            patch.setattr(native, "NATIVE", CODECS[codec])
            patch.setattr(arrow_decode, "NATIVE", CODECS[codec])
            patch.setattr(scan_read, "READ_CHUNK_BYTES", SMALL_CHUNK_BYTES)
            with MessageStore.open(str(root), read_only=True) as store:
                read = _outcome(lambda: store._commitlog.read(result.commitlog_offset, check_crc=False))
                scanned = _outcome(lambda: store.scan().read_all())
        assert scanned == read, (trial, result.commitlog_offset)
