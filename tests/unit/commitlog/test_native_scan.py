"""The compiled scan (commitlog/csrc/scan_core.c) against the Python decoders: for the same segment bytes,
sound or damaged, parse_records gives the same batch and the same CorruptionError with either codec.

Records here are built by hand (tests/unit/commitlog/handmade.py): version-2 records, IPv6 hosts, non-ASCII
tags, more topics than the scan names at once, blanks and record-CRC pairs, which the store's own writer
does not all produce.
"""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from mqstore.commitlog import dispatch_batch
from mqstore.commitlog import format as fmt
from mqstore.commitlog.dispatch_batch import parse_records
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.segments import SegmentList

from tests.unit.commitlog import handmade
from tests.unit.commitlog.test_dispatch_batch_decoders import _outcome

pytestmark = pytest.mark.skipif(NATIVE is None, reason="MQSTORE_NATIVE=0: the pure-Python codec alone is tested")

SEGMENT_SIZE = 16384


class _Log:
    def __init__(self, directory, record_crc_from=None, segment_size=SEGMENT_SIZE):
        self.segments = SegmentList(str(directory), segment_size, writable=False)
        self.record_crc_from = record_crc_from

    def segment_at(self, offset):
        return self.segments.segment_at(offset)

    def close(self):
        for segment in self.segments.segments:
            segment.close()


def _fill_record_crcs(writer: handmade.SegmentWriter) -> None:
    """Write the CRC digits of every record whose properties end with a record-CRC pair (rule 6)."""
    size_bytes = writer.segment_size_bytes
    for offset in writer.offsets:
        data = writer.segments[offset - offset % size_bytes]
        at = offset % size_bytes
        size = fmt.I32.unpack_from(data, at)[0]
        end = at + size
        if data[end - fmt.RECORD_CRC_LENGTH : end - 11] == fmt.RECORD_CRC_PREFIX:
            data[end - 11 : end - 1] = fmt.record_crc_digits(zlib.crc32(data[at : end - fmt.RECORD_CRC_LENGTH])
                                                             & 0x7FFFFFFF)


def _properties(rng: random.Random, index: int) -> bytes:
    pairs = []
    kind = rng.randrange(6)
    if kind == 1:
        pairs.append(("TAGS", rng.choice(["TagA", "TagB", "x"])))
    elif kind == 2:
        pairs.append(("TAGS", rng.choice(["标签", "café", "Ω"])))  # hashed by the Python path
    elif kind == 3:
        pairs += [("KEYS", f"k{index} k{index + 1}"), ("TAGS", "")]
    elif kind == 4:
        pairs += [("UNIQ_KEY", f"U{index}"), ("XTAGS", "no"), ("TAGS", "T2")]
    raw = "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode("utf-8")
    if rng.random() < 0.3:
        raw += fmt.RECORD_CRC_PLACEHOLDER  # its digits are filled once the record is laid out
    return raw


def _write(directory, seed: int, topics: int = 5, count: int = 400, segment_size: int = SEGMENT_SIZE
           ) -> handmade.SegmentWriter:
    rng = random.Random(seed)
    writer = handmade.SegmentWriter(directory, segment_size)
    queue_offsets: dict = {}
    for index in range(count):
        topic = f"T{index % topics}"
        queue_id = rng.randrange(3)
        queue_offset = queue_offsets.get((topic, queue_id), 0)
        queue_offsets[(topic, queue_id)] = queue_offset + 1
        writer.add(topic, rng.randbytes(rng.choice([0, 1, 20, 300])), queue_id=queue_id, queue_offset=queue_offset,
                   properties=_properties(rng, index), v2=rng.random() < 0.1,
                   born_host=rng.choice(["192.168.1.2", "::1"]), store_host=rng.choice(["10.0.0.7", "fe80::2"]),
                   sys_flag=rng.choice([0, 0, 0, 0x4, 0x8]), store_timestamp_ms=1_700_000_000_000 + index)
    _fill_record_crcs(writer)
    writer.write()
    return writer


def _compare(log, start, end, monkeypatch, **options) -> tuple:
    monkeypatch.setattr(dispatch_batch, "NATIVE", None)
    expected = _outcome(parse_records(log, start, end, properties=(b"KEYS", b"UNIQ_KEY"), **options))
    monkeypatch.setattr(dispatch_batch, "NATIVE", NATIVE)
    actual = _outcome(parse_records(log, start, end, properties=(b"KEYS", b"UNIQ_KEY"), **options))
    assert actual == expected
    return expected


def test_the_scan_writes_the_columns_python_names():
    assert NATIVE.scan_columns() == len(dispatch_batch.NATIVE_COLUMNS)


@pytest.mark.parametrize("topics, segment_size", [(5, SEGMENT_SIZE), (300, 1 << 20)])  # 300 in one segment: more
def test_both_codecs_decode_a_sound_log_alike(tmp_path, monkeypatch, topics, segment_size):  # than a scan names
    writer = _write(tmp_path / "log", 1, topics=topics, count=600, segment_size=segment_size)
    log = _Log(tmp_path / "log", segment_size=segment_size)
    for check_crc in (False, True):
        for records_max in (1, 7, 8192):
            outcome = _compare(log, 0, writer.end, monkeypatch, check_crc=check_crc, records_max=records_max)
            assert outcome[-1] is None and len(outcome[2]) == min(records_max, len(writer.offsets))
    whole = _compare(log, 0, writer.end, monkeypatch)
    assert len(whole[2]) == len(writer.offsets) and len(set(whole[4])) == topics
    assert sum(code != 0 for code in whole[7]) > 100  # tags were hashed (non-ASCII ones included)
    for start in writer.offsets[::37]:
        _compare(log, start, writer.end, monkeypatch, check_crc=True)
    # a record CRC required from a point: the records without one after it are refused alike
    log.record_crc_from = writer.offsets[50]
    assert _compare(log, 0, writer.end, monkeypatch)[-1][2] == "commitlog.6"
    log.close()


def test_both_codecs_find_the_same_end_of_a_log(tmp_path, monkeypatch):
    writer = _write(tmp_path / "log", 2)
    log = _Log(tmp_path / "log")
    last = log.segments.segments[-1]
    for end in (writer.end, writer.end - 5, writer.end + 100, last.base_offset + SEGMENT_SIZE):
        outcome = _compare(log, 0, end, monkeypatch, zeros_end=True, check_crc=True)
        assert outcome[-1] is None
        _compare(log, 0, end, monkeypatch, zeros_end=False)
    log.close()


# (seed, CRC path): every seed on the CPU's best path, one seed on each slower path (crc32.c's)
_BEST_CRC_PATH = NATIVE.crc32_path() if NATIVE is not None else "zlib"
CRC_PATH_CASES = [(seed, _BEST_CRC_PATH) for seed in range(3)] + [
    (0, path) for path in (NATIVE.crc32_paths() if NATIVE is not None else ()) if path != _BEST_CRC_PATH]


@pytest.fixture
def crc_path(request):
    """The CRC path the scans take for one test, the CPU's best again after it."""
    NATIVE.crc32_use(request.param)
    yield request.param
    NATIVE.crc32_use(None)


@pytest.mark.parametrize("seed, crc_path", CRC_PATH_CASES, indirect=["crc_path"])
def test_both_codecs_refuse_damaged_bytes_alike(tmp_path, monkeypatch, seed, crc_path):
    """Bit flips, overwritten runs, zeroed tails and huge lengths, each on a fresh copy of the log; the compiled
    scan's CRCs by each path."""
    assert NATIVE.crc32_path() == crc_path
    writer = _write(tmp_path / "log", seed)
    rng = random.Random(seed)
    errors = 0
    for trial in range(80):
        segments = {base: bytearray(data) for base, data in writer.segments.items()}
        base = rng.choice(sorted(segments))
        data = segments[base]
        at = rng.randrange(SEGMENT_SIZE)
        kind = rng.randrange(4)
        if kind == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[at : at + 4] = rng.randbytes(4)
        elif kind == 2:
            data[at:] = bytes(SEGMENT_SIZE - at)
        else:
            offset = rng.choice(writer.offsets)
            data = segments[offset - offset % SEGMENT_SIZE]
            field = rng.choice([0, 84, 36, 28])
            data[offset % SEGMENT_SIZE + field : offset % SEGMENT_SIZE + field + 4] = rng.choice(
                [b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\x00\x5c", b"\xff\xff\xff\xff"])
        directory = tmp_path / f"copy{trial}"
        directory.mkdir()
        for segment_base, segment_data in segments.items():
            (directory / fmt.segment_name(segment_base)).write_bytes(segment_data)
        log = _Log(directory, rng.choice([None, 0, writer.offsets[len(writer.offsets) // 2]]))
        outcome = _compare(log, 0, writer.end, monkeypatch, check_crc=rng.random() < 0.6,
                           zeros_end=rng.random() < 0.3)
        errors += outcome[-1] is not None
        log.close()
    assert errors > 20


def test_the_scan_holds_the_segment_and_checks_its_arguments(tmp_path):
    writer = _write(tmp_path / "log", 3, count=20)
    data = bytes(writer.segments[0])
    columns = np.empty((NATIVE.scan_columns(), 64), dtype=np.int64)
    count, stop, error, blank, topic_rows, _ = NATIVE.scan_segment(data, len(data), 0, 0, writer.end, 64, False,
                                                                   True, 1 << 62, columns)
    assert (count, stop, error, blank) == (20, writer.end, 0, 0)
    assert columns[0, :count].tolist() == writer.offsets
    topic = [data[columns[2, row] : columns[2, row] + columns[3, row]] for row in range(count)]
    assert len(topic_rows) == len(set(topic)) > 1  # one first row per distinct topic, ids in first-seen order
    assert all(topic[row] == topic[topic_rows[columns[13, row]]] for row in range(count))
    with pytest.raises(ValueError):
        NATIVE.scan_segment(data, len(data) + 1, 0, 0, 10, 64, False, True, 0, columns)
    with pytest.raises(TypeError):
        NATIVE.scan_segment(data, len(data), 0, 0, 10, 64, False, True, 0, columns.astype(np.int32))
    with pytest.raises(ValueError):
        NATIVE.property_spans(data, np.array([0]), np.array([len(data) + 1]), (b"TAGS",), np.empty(2, np.int64))
    assert zlib.crc32(data) == NATIVE.crc32(data)


@pytest.mark.parametrize("seed", range(2))
def test_both_codecs_locate_the_same_records_in_a_read_buffer(tmp_path, monkeypatch, seed):
    """arrow_decode.locate_records (the Spark source's and store.scan()'s record walk over a pread buffer)."""
    from mqstore.commitlog import arrow_decode

    writer = _write(tmp_path / "log", seed)
    rng = random.Random(seed)
    outcomes = 0
    for trial in range(150):
        base = rng.choice(sorted(writer.segments))
        data = bytearray(writer.segments[base])
        if trial % 3:
            at = rng.randrange(SEGMENT_SIZE)
            data[at : at + 4] = rng.choice([rng.randbytes(4), b"\x00\x00\x00\x5c", bytes(4), b"\xda\xa3\x20\xa7"])
        start = rng.choice([0] + [o - base for o in writer.offsets if base <= o < base + SEGMENT_SIZE])
        length = rng.randrange(0, SEGMENT_SIZE - start + 1)
        buf = np.frombuffer(bytes(data[start : start + length]) + bytes(arrow_decode.BUFFER_PAD_BYTES), dtype=np.uint8)
        results = []
        for module in (None, NATIVE):
            monkeypatch.setattr(arrow_decode, "NATIVE", module)
            try:
                positions, following, state = arrow_decode.locate_records(
                    buf, length, base + start, base + SEGMENT_SIZE, lenient=trial % 2 == 0, path="seg")
                results.append((positions.tolist(), following, state))
            except CorruptionError as exc:
                results.append((str(exc), exc.offset, exc.rule))
        assert results[0] == results[1], trial
        outcomes += bool(results[0][0])
    assert outcomes > 50
