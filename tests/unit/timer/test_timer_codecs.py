"""Timer messages write the same bytes through every put path: the pure-Python codec, the compiled codec
without its put, and the compiled put (which rewrites a timer message itself, commitlog/csrc/put_rewrite.c); and
the timer files the service writes from them are the same too."""

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
    for index in range(120):
        properties = {"k": str(index)}
        if index % 3 == 0:
            properties["TIMER_DELAY_MS"] = str(50 + index)
            if index % 6 == 0:
                properties["DELAY"] = "0"  # level 0: no delay level, the timer's rules apply
        elif index % 3 == 1:
            properties["TIMER_DELIVER_MS"] = str(START_MS + 2 * index + 1)
        messages.append(Message(f"topic{index % 2}", b"body%d" % index, queue_id=index % 4,
                                tags="t" if index % 5 else None, keys=("a", "b") if index % 4 else (),
                                properties=properties, born_timestamp_ms=START_MS))
    return messages


def _write(root, path: str, monkeypatch):
    monkeypatch.setattr(native, "NATIVE", None if path == "python" else _native)
    monkeypatch.setattr(commitlog_module, "_time_ns", FixedClock())
    _same_unique_keys(monkeypatch)
    clock = ManualClock(START_MS)
    config = StoreConfig(segment_size_bytes=1 << 20, timer_log_file_size_bytes=4096, index_enabled=False)
    with MessageStore.open(str(root), config, clock=clock) as store:
        assert (store._commitlog.codec is None) == (path == "python")
        if path != "compiled-put":
            store._put_common = None
        results = [store.put(message) for message in _messages()]
        assert store.timer.wait_caught_up(WAIT_S)
        clock.advance(400)
        assert store.timer.wait_caught_up(WAIT_S)
        assert store.wait_dispatched(WAIT_S)
    return results


def _files(root) -> dict:
    found = {}
    for folder in ("commitlog", "timerlog"):
        for name in sorted(os.listdir(root / folder)):
            found[f"{folder}/{name}"] = (root / folder / name).read_bytes()
    found["timerwheel"] = (root / "timerwheel").read_bytes()
    return found


@pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: only the pure-Python codec is there")
def test_timer_messages_write_the_same_bytes_on_every_put_path(tmp_path, monkeypatch):
    written = {path: (_write(tmp_path / path, path, monkeypatch), _files(tmp_path / path)) for path in PATHS}
    reference_results, reference_files = written["python"]
    assert len(reference_results) == 120 and sum(1 for name in reference_files if name.startswith("timerlog")) >= 1
    for path in PATHS[1:]:
        results, files = written[path]
        assert results == reference_results, path
        assert list(files) == list(reference_files), path
        for name in reference_files:
            assert files[name] == reference_files[name], (path, name)
