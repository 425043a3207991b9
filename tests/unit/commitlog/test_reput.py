"""Re-puts (commitlog/reput.py): header fields carried, no rewrite hook, the same bytes on both codec paths, and
records the dispatcher, the index and the record-CRC check take as any other."""

from __future__ import annotations

import mqstore.commitlog.commitlog as commitlog_module
import pytest
from mqstore.commitlog import _native, native
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import InvalidMessageError
from mqstore.commitlog.reput import ReputHeader

from mqstore import Message, MessageStore, StoreConfig
from mqstore.store.verify import verify_store
from tests.unit.commitlog.test_native_codec import FixedClock
from tests.unit.mqstore.test_compiled_put import _same_unique_keys

WAIT_S = 20.0
HOST = bytes.fromhex("0A000001") + (1234).to_bytes(4, "big")


def _reputs() -> list[tuple[Message, ReputHeader]]:
    reputs = []
    for index in range(40):
        properties = {"DELAY": "3", "REAL_TOPIC": "elsewhere"} if index % 3 == 0 else {"k": "v%d" % index}
        message = Message(f"t{index % 2}", b"body-%d" % index + b"x" * 2000, queue_id=index % 3,
                          tags="A" if index % 2 else None, keys=("key-%d" % index,), properties=properties,
                          flag=index, born_timestamp_ms=1000 + index)
        reputs.append((message, ReputHeader(index % 2 * fmt.SYS_FLAG_MULTI_TAGS, HOST, index)))
    return reputs


def _write(root, monkeypatch, module) -> list:
    monkeypatch.setattr(native, "NATIVE", module)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    _same_unique_keys(monkeypatch)
    with MessageStore.open(str(root), StoreConfig(segment_size_bytes=1 << 16)) as store:
        assert (store._commitlog.codec is None) == (module is None)
        results = []
        for message, header in _reputs():
            store.put(Message("plain", b"between"))
            results.append(store.reput(message, header))
        assert store.wait_dispatched(WAIT_S)
    return results


def _log_bytes(root) -> bytes:
    return b"".join(path.read_bytes() for path in sorted((root / "commitlog").iterdir()))


@pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")
def test_reputs_write_the_same_bytes_with_either_codec(tmp_path, monkeypatch):
    python = _write(tmp_path / "python", monkeypatch, None)
    compiled = _write(tmp_path / "native", monkeypatch, _native)
    assert python == compiled
    assert _log_bytes(tmp_path / "python") == _log_bytes(tmp_path / "native")
    assert len(_log_bytes(tmp_path / "python")) > 1 << 16  # the writes rolled into a second segment


@pytest.mark.usefixtures("codec")
def test_a_reput_keeps_its_header_fields_and_is_not_rewritten(tmp_path):
    with MessageStore.open(str(tmp_path), StoreConfig(segment_size_bytes=1 << 16)) as store:
        results = [store.reput(message, header) for message, header in _reputs()]
        assert store.wait_dispatched(WAIT_S)
        for (message, header), result in zip(_reputs(), results):
            stored = store.read_at(result.commitlog_offset)  # the record CRC checked on read
            assert (stored.topic, stored.queue_id, stored.body, stored.flag) == (
                message.topic, message.queue_id, message.body, message.flag)
            assert (stored.sys_flag, stored.born_host_raw, stored.reconsume_times, stored.born_timestamp_ms) == (
                header.sys_flag, HOST, header.reconsume_times, message.born_timestamp_ms)
            assert stored.store_host_raw == store._commitlog.store_host_raw
            assert store.get(message.topic, message.queue_id, result.queue_offset).messages[0] == stored
            assert store.query(message.topic, message.keys[0]) and stored.properties.get("DELAY") == \
                message.properties.get("DELAY")  # a DELAY re-put stays where it was put: no schedule hop
        assert store.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 0
    report = verify_store(str(tmp_path), StoreConfig(segment_size_bytes=1 << 16))  # record CRCs, queue entries
    assert report.ok and report.records == len(results), report.as_dict()


@pytest.mark.parametrize("header", [ReputHeader(fmt.SYS_FLAG_BORNHOST_V6, HOST, 0), ReputHeader(0, b"123", 0),
                                    ReputHeader(0, HOST, -1), ReputHeader(2**31, HOST, 0)])
def test_a_bad_reput_header_writes_nothing(tmp_path, header):
    with MessageStore.open(str(tmp_path), StoreConfig(segment_size_bytes=1 << 16)) as store:
        end = store._commitlog.readable_end()
        with pytest.raises(InvalidMessageError):
            store.reput(Message("t", b"x"), header)
        assert store._commitlog.readable_end() == end


def test_the_record_crc_of_a_reput_covers_its_header_fields(tmp_path):
    config = StoreConfig(segment_size_bytes=1 << 16)
    with MessageStore.open(str(tmp_path), config) as store:
        result = store.reput(Message("t", b"x"), ReputHeader(0, HOST, 7))
    [segment] = sorted((tmp_path / "commitlog").iterdir())
    data = bytearray(segment.read_bytes())
    data[result.commitlog_offset + fmt.OFFSET_RECONSUME_TIMES + 3] ^= 0x01  # 7 -> 6: a plausible count
    segment.write_bytes(bytes(data))
    report = verify_store(str(tmp_path), config)
    assert not report.ok and report.problems[0].rule == "commitlog.6"  # the record CRC, format rule 6
