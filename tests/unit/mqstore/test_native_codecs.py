"""The two codecs over the same files, at the level of what the store writes and decides: dispatch builds
byte-identical ConsumeQueue and index files, and recovery after a crash makes the same decisions (report, error,
the log and queues it leaves) on sound and damaged logs."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from mqstore.commitlog import arrow_decode, dispatch_batch
from mqstore.commitlog.dispatch import DispatchService
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher
from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_service import IndexService

from mqstore import Message, MessageStore
from mqstore.store.markers import ABORT_FILE_NAME
from tests.conftest import small_config

pytestmark = pytest.mark.skipif(NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")


def _codec(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(dispatch_batch, "NATIVE", NATIVE if native else None)
    monkeypatch.setattr(arrow_decode, "NATIVE", NATIVE if native else None)


def _config():
    return small_config(index_enabled=True, index_slot_count=64, index_entry_count_max=4096)


@pytest.fixture
def store_dir(tmp_path) -> Path:
    root = tmp_path / "store"
    rng = random.Random(3)
    with MessageStore.open(root, _config()) as store:
        for index in range(600):
            store.put(Message(f"topic{index % 3}", rng.randbytes(rng.choice([0, 10, 300])), queue_id=index % 4,
                              tags=rng.choice([None, "TagA", "Tägé"]),
                              keys=tuple(f"k{index}-{n}" for n in range(rng.randrange(3)))))
    return root


def _files(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def test_dispatch_writes_the_same_queue_and_index_files(store_dir, tmp_path, monkeypatch):
    built = []
    with MessageStore.open(store_dir, _config()) as store:
        for native in (False, True):
            _codec(monkeypatch, native)
            work = tmp_path / f"dispatch-{native}"
            table = ConsumeQueueTable(str(work / "consumequeue"), 64, writable=True)
            index = IndexService(work / "index", 64, 4096, clock_ms=lambda: 1_700_000_000_000)
            service = DispatchService(store._commitlog, [ConsumeQueueDispatcher(table), IndexDispatcher(index)],
                                      store._commitlog.min_offset())
            assert service.dispatch_available(records_max=100) == 600
            table.close()
            index.close()
            built.append(_files(work))
    assert built[0] == built[1]
    assert sum(name.startswith("consumequeue") for name in built[0]) >= 12 and any(
        name.startswith("index") for name in built[0])


@pytest.mark.parametrize("seed", range(3))
def test_recovery_decides_alike_after_a_crash(store_dir, tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    segments = sorted((store_dir / "commitlog").iterdir())
    cases = set()
    for trial in range(6):
        segment_name = rng.choice(segments[-3:]).name
        at = rng.randrange(os.path.getsize(segments[0]))
        value = rng.randrange(256)
        check_crc = rng.random() < 0.7
        outcomes = []
        for native in (False, True):
            copy = tmp_path / f"copy-{trial}-{native}"
            shutil.copytree(store_dir, copy)
            (copy / ABORT_FILE_NAME).write_bytes(b"")  # a crash: the full recovery path
            if trial:  # the first trial is a sound log
                path = copy / "commitlog" / segment_name
                data = bytearray(path.read_bytes())
                data[at] ^= value or 1
                path.write_bytes(bytes(data))
            _codec(monkeypatch, native)
            try:
                with MessageStore.open(copy, small_config(index_enabled=True, index_slot_count=64,
                                                          index_entry_count_max=4096,
                                                          check_crc_on_recover=check_crc)) as store:
                    report = store.recovery_report.as_dict()
                report.pop("seconds", None)
                report = {key: value.replace(str(copy), "STORE") if isinstance(value, str) else value
                          for key, value in report.items()}  # the copies' paths differ, nothing else may
                outcome = (report, _files(copy / "commitlog"), _files(copy / "consumequeue"))
            except CorruptionError as exc:
                outcome = (type(exc), str(exc).replace(str(copy), "STORE"), exc.rule, exc.offset)
            outcomes.append(outcome)
        assert outcomes[0] == outcomes[1], trial
        cases.add(outcomes[0][0]["case"] if isinstance(outcomes[0][0], dict) else outcomes[0][2])
    assert len(cases) >= 2, cases  # the damage changed what recovery decided
