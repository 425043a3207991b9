"""The compiled index placement (commitlog/csrc/index_core.c, `IndexService.put_messages`) against the Python path
(MQSTORE_NATIVE=0's `put_keys`): the same messages give byte-identical index files (multi-key messages, UNIQ_KEY,
non-ASCII and invalid UTF-8 keys, rollbacks, files rolling when full, replays), the same key hashes, and the same
CorruptionError for a slot or header on disk that breaks the rules, with nothing written."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from mqstore.commitlog import format as log_format
from mqstore.commitlog.dispatch import DispatchBatch, DispatchService
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.commitlog.native import NATIVE
from mqstore.indexfile import dispatcher as index_dispatcher
from mqstore.indexfile import format as fmt
from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_service import IndexService

from mqstore import Message, MessageStore
from tests.conftest import small_config

pytestmark = pytest.mark.skipif(NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")

T0 = 1_700_000_000_000
CLOCK = lambda: T0  # noqa: E731  (file names: both codecs name their files alike)
ROLLBACK = log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE


def _batch(rows) -> DispatchBatch:
    """rows: (offset, topic, keys, uniq_key, sys_flag, store_timestamp_ms)."""
    return DispatchBatch.from_rows([
        {"commitlog_offset": offset, "size": 100, "topic": topic, "store_timestamp_ms": timestamp,
         "sys_flag": sys_flag, "keys": keys, "uniq_key": uniq_key}
        for offset, topic, keys, uniq_key, sys_flag, timestamp in rows])


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def _build(directory: Path, batches, native: bool, monkeypatch, slots: int, entries: int) -> dict[str, bytes]:
    monkeypatch.setattr(index_dispatcher, "NATIVE", NATIVE if native else None)
    service = IndexService(directory, slots, entries, clock_ms=CLOCK)
    dispatcher = IndexDispatcher(service)
    for batch_rows in batches:
        dispatcher.dispatch(_batch(batch_rows))
    service.check()
    service.close()
    return _files(directory)


WORDS = [b"k1", b"order-7", "ключ".encode(), "键😀".encode(), b"\xff\xfe", b"a\xc3", b"\xed\xa0\x80",
         b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"x" * 300]


def _rows(rng: random.Random, count: int):
    rows, offset, timestamp = [], 0, T0
    for _ in range(count):
        words = [rng.choice(WORDS + [b""]) for _ in range(rng.randrange(5))]
        keys = b" ".join(words) if rng.random() < 0.7 else None
        uniq = b"U%08X" % offset if rng.random() < 0.8 else None
        flag = ROLLBACK if rng.random() < 0.05 else rng.choice([0, log_format.SYS_FLAG_TRANSACTION_COMMIT_TYPE])
        rows.append((offset, rng.choice(["t", "тема", "order#x"]), keys, uniq, flag, timestamp))
        offset += rng.randrange(1, 400)
        timestamp += rng.choice([0, 1, 999, 1000, 61_000])
    return rows


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slots, entries, batch_size", [(7, 23, 50), (5, 2, 13), (64, 4096, 700), (1, 40, 1)])
def test_both_codecs_write_the_same_index_files(tmp_path, monkeypatch, seed, slots, entries, batch_size):
    rng = random.Random(seed)
    rows = _rows(rng, 400)
    batches = [rows[at : at + batch_size] for at in range(0, len(rows), batch_size)]
    replayed = batches[:2] + batches[1:]  # a replay after a restart: the second batch again
    python = _build(tmp_path / "python", replayed, False, monkeypatch, slots, entries)
    native = _build(tmp_path / "native", replayed, True, monkeypatch, slots, entries)
    assert python == native
    keys = sum(len(index_dispatcher.message_index_keys(b"", uniq, keys)) for _, _, keys, uniq, flag, _ in rows
               if flag != ROLLBACK)
    per_file = entries - 1
    assert len(native) == max(1, -(-keys // per_file))  # the files rolled as they filled


def test_a_message_cut_between_its_keys_is_completed_alike(tmp_path, monkeypatch):
    rows = [(0, "t", b"a", None, 0, T0), (100, "t", b"x y z", b"U1", 0, T0 + 5000), (200, "t", b"x", None, 0, T0)]
    built = []
    for native in (False, True):
        directory = tmp_path / str(native)
        service = IndexService(directory, 8, 32, clock_ms=CLOCK)
        service.put_keys([b"t#a", b"t#U1", b"t#x"], [0, 100, 100], [T0, T0 + 5000, T0 + 5000])  # cut after "x"
        service.close()
        built.append(_build(directory, [rows], native, monkeypatch, 8, 32))
    assert built[0] == built[1]
    service = IndexService(tmp_path / "True", 8, 32, clock_ms=CLOCK)
    assert service.entry_count == 6 and service.query("t", "z", 10, 0, 2**62) == [100]
    service.close()


def test_the_key_hash_is_java_string_hashcode_of_strict_utf8(tmp_path):
    rng = random.Random(5)
    samples = [b"", b"t#k", "t#ключ".encode(), "t#😀".encode(), b"\xc0\x80", b"\xed\xbf\xbf", b"\xf0\x8f\xbf\xbf"]
    samples += [bytes(rng.choice(b"ab#\x00\x7f\x80\xbf\xc2\xdf\xe0\xed\xef\xf0\xf4\xf5\xff") for _ in range(8))
                for _ in range(3000)]
    samples += ["".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD800),
                                        rng.randrange(0xE000, 0x110000)])) for _ in range(6)).encode()
                for _ in range(2000)]
    for key in samples:
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            assert NATIVE.index_key_hash(key) is None, key  # the Python path hashes it (invalid bytes replaced)
        else:
            assert NATIVE.index_key_hash(key) == fmt.index_key_hash(text), key


def _one_file(tmp_path) -> IndexService:
    service = IndexService(tmp_path, 8, 32, clock_ms=CLOCK)
    service.put_keys([b"t#a", b"t#b"], [0, 100], [T0, T0])
    return service


def _place(service: IndexService, offset: int):
    return service.put_messages([b"t#"], [0], ([None], [b"a b c d e f g h"]), [offset], [T0], [0], 12, 12)


def test_a_slot_past_index_count_is_corruption_and_nothing_is_written(tmp_path):
    service = _one_file(tmp_path)
    index_file = service.files[0]
    slot = fmt.index_key_hash("t#e") % 8
    fmt.SLOT_STRUCT.pack_into(index_file._buf, fmt.slots_offset() + 4 * slot, 3)  # indexCount is 3
    before = bytes(index_file._buf)
    with pytest.raises(CorruptionError) as error:
        _place(service, 200)
    assert error.value.rule == "indexfile.4" and error.value.offset == fmt.slots_offset() + 4 * slot
    assert bytes(index_file._buf) == before
    service.close()


@pytest.mark.parametrize("field, value, rule", [
    (fmt.OFFSET_INDEX_COUNT, 33, "indexfile.2"), (fmt.OFFSET_INDEX_COUNT, -1, "indexfile.2"),
    (fmt.OFFSET_INDEX_COUNT, 2**31 - 1, "indexfile.2"), (fmt.OFFSET_BEGIN_PHY_OFFSET, -5, "indexfile.3"),
    (fmt.OFFSET_END_PHY_OFFSET, -(2**63), "indexfile.3")])
def test_a_hostile_header_is_corruption_and_nothing_is_written(tmp_path, field, value, rule):
    service = _one_file(tmp_path)
    index_file = service.files[0]
    if field == fmt.OFFSET_INDEX_COUNT:
        fmt.SLOT_STRUCT.pack_into(index_file._buf, field, value)
    else:
        fmt.struct.pack_into(">q", index_file._buf, field, value)
    before = bytes(index_file._buf)
    with pytest.raises(CorruptionError) as error:
        _place(service, 200)
    assert error.value.rule == rule
    assert bytes(index_file._buf) == before
    service.close()


def test_put_messages_refuses_offsets_out_of_log_order(tmp_path):
    service = _one_file(tmp_path)
    with pytest.raises(InvalidMessageError, match="commitlog order"):
        service.put_messages([b"t#"], [0, 0], ([b"u", b"v"], [None, None]), [300, 200], [T0, T0], [0, 0], 12, 12)
    assert service.entry_count == 2
    service.close()


def test_a_store_dispatches_the_same_index_with_both_codecs(tmp_path, monkeypatch):
    """One store's log (UNIQ_KEYs and KEYS as mqstore writes them) dispatched into a fresh index by each codec."""
    config = small_config(index_enabled=True, index_slot_count=31, index_entry_count_max=97)
    rng = random.Random(11)
    root = tmp_path / "store"
    with MessageStore.open(root, config) as store:
        for index in range(300):
            store.put(Message(rng.choice(["a", "b", "c%x"]), b"x", queue_id=index % 4,
                              keys=tuple(f"k{index % 7}-ключ{n}" for n in range(index % 4))))
    built = []
    with MessageStore.open(root, config) as store:
        for native in (False, True):
            monkeypatch.setattr(index_dispatcher, "NATIVE", NATIVE if native else None)
            index = IndexService(tmp_path / f"index-{native}", 31, 97, clock_ms=CLOCK)
            service = DispatchService(store._commitlog, [IndexDispatcher(index)], store._commitlog.min_offset())
            assert service.dispatch_available(records_max=64) == 300
            index.close()
            built.append(_files(tmp_path / f"index-{native}"))
    assert built[0] == built[1]
    assert len(built[0]) == -(-(300 + 450) // 96)  # a UNIQ_KEY each, 0+1+2+3 KEYS per 4 messages: files rolled


@pytest.mark.parametrize("seed", range(3))
def test_keys_as_spans_of_a_buffer_place_the_same_entries(tmp_path, seed):
    """`put_messages` with (buffer, spans), as the dispatcher hands it a segment's values, against (uniq_keys,
    keys) as bytes: the same files, invalid UTF-8 keys (the Python path's) included; 7 slots, 11 entries a file,
    in two calls (rows 0-49, then from row 50 of all rows)."""
    rows = _rows(random.Random(seed), 200)
    buffer, spans = bytearray(), np.full((4, len(rows)), -1, dtype=np.int64)
    for i, (_, _, keys, uniq, _, _) in enumerate(rows):
        for k, value in ((0, uniq), (2, keys)):
            if value is not None:
                buffer += b"\x02junk\x01"
                spans[k, i], spans[k + 1, i] = len(buffer), len(buffer) + len(value)
                buffer += value
    prefixes = [b"t#", "тема#".encode(), b"order#x#"]
    topic_ids = [["t", "тема", "order#x"].index(row[1]) for row in rows]
    columns = ([row[0] for row in rows], [row[5] for row in rows], [row[4] for row in rows], 0xC, ROLLBACK)
    built = []
    for name, key_columns in (("bytes", ([row[3] for row in rows], [row[2] for row in rows])),
                              ("spans", (bytes(buffer), spans))):
        service = IndexService(tmp_path / name, 7, 11, clock_ms=CLOCK)
        head = (key_columns[0][:50], key_columns[1][:50]) if name == "bytes" else (key_columns[0], spans[:, :50].copy())
        service.put_messages(prefixes, topic_ids[:50], head, *[column[:50] for column in columns[:3]], 0xC, ROLLBACK)
        service.put_messages(prefixes, topic_ids, key_columns, *columns, row=50)
        service.close()
        built.append(_files(tmp_path / name))
    assert built[0] == built[1] and len(built[0]) > 5
