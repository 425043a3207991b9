"""Delayed messages write the same bytes through every put path: the pure-Python codec, the compiled codec without
its put, and the compiled put (which rewrites a DELAY message itself, commitlog/csrc/put_rewrite.c); the schedule
topic's ConsumeQueue (due times, set by the retag) and the deliveries are the same too."""

from __future__ import annotations

import os

import mqstore.commitlog.commitlog as commitlog_module
import pytest
from mqstore.commitlog import _native, native

from mqstore import Message, MessageStore, StoreConfig
from mqstore.store.clock import ManualClock
from tests.unit.commitlog.test_native_codec import FixedClock
from tests.unit.mqstore.test_compiled_put import PATHS, _same_unique_keys

START_MS = 1_700_000_000_000
WAIT_S = 20.0


def _messages() -> list:
    messages = []
    for index in range(90):
        properties = {"k": str(index)}
        if index % 3:
            properties["DELAY"] = str(index % 4)
        if index % 6 == 1:  # a level >= 1 (index is odd) and a timer: the level wins, the timer property goes
            properties["TIMER_DELAY_MS"] = "70"
        messages.append(Message(f"topic{index % 2}", b"body%d" % index, queue_id=index % 4,
                                tags="t" if index % 5 else None, keys=("a", "b") if index % 4 else (),
                                properties=properties, born_timestamp_ms=START_MS))
    return messages


def _write(root, path: str, monkeypatch):
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    _same_unique_keys(monkeypatch)
    clock = ManualClock(START_MS)
    config = StoreConfig(segment_size_bytes=1 << 20, index_enabled=False, delay_levels="50ms 100ms 150ms")
    with MessageStore.open(str(root), config, clock=clock) as store:
        assert (store._commitlog.codec is None) == (path == "python")
        if path != "compiled-put":
            store._put_common = None
        results = [store.put(message) for message in _messages()[:60]]
        store.put_batch(_messages()[60:])
        assert store.wait_dispatched(WAIT_S)
        clock.advance(1000)  # every store timestamp of FixedClock is within 100 ms of START_MS
        assert store.schedule.wait_caught_up(WAIT_S) and store.wait_dispatched(WAIT_S)
        delayed = sum(1 for message in _messages() if message.properties.get("DELAY", "0") != "0")
        assert store.stats()["schedule"]["delivered"] == delayed == 45
    return results


def _files(root) -> dict:
    found = {}
    for folder, _, names in sorted(os.walk(root)):
        if "commitlog" in folder or "consumequeue" in folder:
            for name in sorted(names):
                found[os.path.relpath(os.path.join(folder, name), root)] = (root / folder / name).read_bytes()
    return found


@pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")
def test_delayed_messages_write_the_same_bytes_on_every_put_path(tmp_path, monkeypatch):
    written = {path: (_write(tmp_path / path, path, monkeypatch), _files(tmp_path / path)) for path in PATHS}
    reference_results, reference_files = written["python"]
    assert any("SCHEDULE_TOPIC_XXXX" in name for name in reference_files)
    for path in PATHS[1:]:
        results, files = written[path]
        assert results == reference_results, path
        assert list(files) == list(reference_files), path
        for name in reference_files:
            assert files[name] == reference_files[name], (path, name)
