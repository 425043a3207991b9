"""parse_records' two decoders (numpy over many records, record by record for a few) give the same batch and the
same error for the same bytes, damaged or not."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
from mqstore.commitlog import dispatch_batch
from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch_batch import parse_records
from mqstore.commitlog.message import Message
from mqstore.commitlog.segments import SegmentList

from tests.unit.commitlog import handmade

SEGMENT_SIZE = 65536
FLIPS = 60
RECORDS = 200


class _Log:
    """A read-only view of a log directory with the attributes parse_records looks for."""

    def __init__(self, directory, record_crc_from):
        self.segments = SegmentList(str(directory), SEGMENT_SIZE, writable=False)
        self.record_crc_from = record_crc_from

    def segment_at(self, offset):
        return self.segments.segment_at(offset)


def _write_log(directory) -> int:
    log = CommitLog(str(directory), SEGMENT_SIZE, writable=True, max_message_size_bytes=4096,
                    max_queues_per_topic=4, born_host_raw=fmt.encode_host("1.2.3.4", 0),
                    store_host_raw=fmt.encode_host("10.0.0.7", 10911), preallocate=False, record_crc=True)
    rng = random.Random(7)
    for index in range(RECORDS):
        tags = rng.choice([None, "TagA", "TagB"])
        keys = tuple(f"k{index}-{n}" for n in range(rng.randrange(3)))
        properties = {"UNIQ_KEY": f"U{index}"} if index % 5 == 0 else {}
        log.append(log.prepare(Message(rng.choice(["alpha", "beta", "g%d" % (index % 3)]), rng.randbytes(
            rng.choice([0, 1, 37, 300, 1500])), queue_id=index % 4, tags=tags, keys=keys, properties=properties)))
    end = log.readable_end()
    log.close()
    return end


def _outcome(batch) -> tuple:
    error = batch.error
    return (batch.start_offset, batch.end_offset, batch.commitlog_offsets.tolist(), batch.sizes.tolist(),
            batch.topics, batch.queue_ids.tolist(), batch.queue_offsets.tolist(), batch.tags_codes.tolist(),
            batch.store_timestamps_ms.tolist(), batch.sys_flags.tolist(), batch.keys, batch.uniq_keys,
            batch.property_values(b"TAGS"), batch.property_values(fmt.PROPERTY_RECORD_CRC.encode()),
            None if error is None else (type(error), str(error), error.rule, error.offset, error.path))


_INDEX_PROPERTIES = (fmt.PROPERTY_UNIQ_KEY.encode(), fmt.PROPERTY_KEYS.encode())


def _both(log, start: int, end: int, check_crc: bool, monkeypatch, zeros_end: bool = False) -> tuple[tuple, tuple]:
    """The outcome of each Python decoder; each is also checked against itself with the index's properties read
    in the decoding pass (not on demand). When the compiled scan is built, its outcome must be the numpy
    decoder's, both ways (the two codecs: MQSTORE_NATIVE)."""
    native = dispatch_batch.NATIVE
    monkeypatch.setattr(dispatch_batch, "NATIVE", None)
    outcomes = []
    for threshold in (0, 1 << 30):
        monkeypatch.setattr(dispatch_batch, "DECODE_FEW_RECORDS_MAX", threshold)
        outcomes.append(_outcome(parse_records(log, start, end, check_crc=check_crc, zeros_end=zeros_end)))
        eager = parse_records(log, start, end, check_crc=check_crc, properties=_INDEX_PROPERTIES, zeros_end=zeros_end)
        assert set(eager._cache) == set(_INDEX_PROPERTIES)  # read in the pass, before any lookup
        assert _outcome(eager) == outcomes[-1]
    if native is not None:
        monkeypatch.setattr(dispatch_batch, "NATIVE", native)
        assert _outcome(parse_records(log, start, end, check_crc=check_crc, zeros_end=zeros_end)) == outcomes[0]
        eager = parse_records(log, start, end, check_crc=check_crc, properties=_INDEX_PROPERTIES, zeros_end=zeros_end)
        assert _outcome(eager) == outcomes[0]
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize("check_crc", [False, True])
@pytest.mark.parametrize("required", [False, True])
def test_the_decoders_agree_on_a_sound_log_from_every_record(tmp_path, monkeypatch, check_crc, required):
    end = _write_log(tmp_path / "log")
    log = _Log(tmp_path / "log", 0 if required else None)
    whole = parse_records(log, 0, end)
    assert whole.error is None and len(whole) == RECORDS and len(log.segments.segments) > 1
    for start in whole.commitlog_offsets.tolist():
        vector, few = _both(log, start, end, check_crc, monkeypatch)
        assert vector == few
        assert vector[-1] is None


@pytest.mark.parametrize("seed", range(4))
def test_the_decoders_agree_on_damaged_logs(tmp_path, monkeypatch, seed):
    end = _write_log(tmp_path / "log")
    first_segment = tmp_path / "log" / fmt.segment_name(0)
    rng = random.Random(seed)
    errors = 0
    for trial in range(FLIPS):
        copy = tmp_path / f"copy{trial}"
        shutil.copytree(tmp_path / "log", copy)
        handmade.flip_bit(str(copy / fmt.segment_name(0)), rng.randrange(min(end, SEGMENT_SIZE)), rng.randrange(8))
        log = _Log(copy, rng.choice([None, 0]))
        check_crc = rng.random() < 0.5
        vector, few = _both(log, 0, end, check_crc, monkeypatch, zeros_end=rng.random() < 0.5)
        assert vector == few, f"trial {trial}"
        errors += vector[-1] is not None
        for segment in log.segments.segments:
            segment.close()
        shutil.rmtree(copy)
    assert first_segment.exists()
    assert errors > FLIPS // 4  # most flips land in fields the decoders check (with CRCs on, all of them)


_TOKENS = [b"TAGS", b"KEYS", b"UNIQ_KEY", b"XTAGS", b"TAG", b"\x01", b"\x02", b"a", b"bc", b"S\x01",
           b"TAGS\x01", b"\x02KEYS\x01", b"\x02UNIQ_KEY\x01", b"\x02TAGS\x01"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 40, 1])
def test_both_property_scans_find_what_property_value_finds(seed, chunk_bytes, monkeypatch):
    """Random properties bytes, damaged or not (names inside values, longer names ending in a name, a name
    cut by the record's end, repeated names, empty values, no separators): the record-by-record scan and the
    numpy scan both find, for every record, the value `format.property_value` finds in that record's bytes.
    The numpy scan takes the records in chunks of any size, down to one record each."""
    monkeypatch.setattr(dispatch_batch, "PROPERTY_SCAN_CHUNK_BYTES", chunk_bytes)
    native = dispatch_batch.NATIVE
    monkeypatch.setattr(dispatch_batch, "NATIVE", None)  # the Python scans first; the compiled one at the end
    rng = random.Random(seed)
    names = (b"TAGS", b"KEYS", b"UNIQ_KEY")
    data, starts, ends, blobs = bytearray(), [], [], []
    for _ in range(300):
        blob = b"".join(rng.choice(_TOKENS) for _ in range(rng.randrange(0, 12)))
        data += bytes(rng.choice([0, 1, 2, 7])) + rng.choice([b"", b"TAGS\x01", b"\x02"])  # bytes around it
        starts.append(len(data))
        data += blob
        ends.append(len(data))
        blobs.append(blob)
        data += rng.choice([b"", b"x\x02", b"\x01"])
    buffer = bytes(data)
    expected = [[(row, fmt.property_value(blob, name)) for row, blob in enumerate(blobs)
                 if fmt.property_value(blob, name) is not None] for name in names]
    assert all(10 < len(column) < len(blobs) for column in expected)
    assert sum(blob.count(b"\x02TAGS\x01") > 1 for blob in blobs) > 5  # a name repeated: the first one counts
    chunks = []
    scan = dispatch_batch._scan_properties
    monkeypatch.setattr(dispatch_batch, "_scan_properties", lambda data, rows, starts, lengths, *rest: (
        chunks.append(lengths.tolist()), scan(data, rows, starts, lengths, *rest)))
    for threshold in (0, 1 << 30):  # 0: the numpy scan; otherwise record by record
        monkeypatch.setattr(dispatch_batch, "DECODE_FEW_RECORDS_MAX", threshold)
        chunk = dispatch_batch._Chunk(buffer, np.frombuffer(buffer, dtype=np.uint8), np.asarray(starts),
                                      np.asarray(ends))
        found = dispatch_batch._found_properties(chunk, names)
        assert found == expected
    assert sum(map(len, chunks)) == sum(1 for blob in blobs if blob)  # every record with properties, once
    assert all(sum(chunk) <= chunk_bytes or len(chunk) == 1 for chunk in chunks)
    if native is not None:
        monkeypatch.setattr(dispatch_batch, "NATIVE", native)
        assert dispatch_batch._found_properties_native(buffer, np.asarray(starts), np.asarray(ends), names) == expected


@pytest.mark.skipif(dispatch_batch.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_scan_finds_many_names_in_one_walk(seed):
    """The compiled scan looks for every name in one walk of a record's pairs: names that are prefixes, suffixes
    and extensions of one another (TAG, TAGS, XTAGS), one letter, and names inside values all find, in random
    and damaged properties, the value `format.property_value` finds for each name alone."""
    rng = random.Random(seed)
    names = (b"TAGS", b"KEYS", b"UNIQ_KEY", b"XTAGS", b"TAG", b"a", b"bc")
    tokens = _TOKENS + [b"\x02XTAGS\x01", b"\x02TAG\x01", b"TAG\x01", b"\x02a\x01", b"a\x01", b"\x02bc\x01"]
    data, starts, ends, blobs = bytearray(), [], [], []
    for _ in range(400):
        blob = b"".join(rng.choice(tokens) for _ in range(rng.randrange(0, 16)))
        data += rng.choice([b"", b"TAG\x01", b"\x02"])
        starts.append(len(data))
        data += blob
        ends.append(len(data))
        blobs.append(blob)
    buffer = bytes(data)
    expected = [[(row, fmt.property_value(blob, name)) for row, blob in enumerate(blobs)
                 if fmt.property_value(blob, name) is not None] for name in names]
    assert all(len(column) > 10 for column in expected)
    assert dispatch_batch._found_properties_native(buffer, np.asarray(starts), np.asarray(ends), names) == expected
