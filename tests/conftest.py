"""Shared test helpers: where RocketMQ's fixture store is, small store settings, waiting on a condition, and a
store clock that steps."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

FIXTURES_DIR = Path(__file__).resolve().parent / "data"  # a copy of RocketMQ-written fixtures (README.md there)
ROCKETMQ_STORE = FIXTURES_DIR / "rocketmq-4.4.0-store"
# tests/<directory> -> its tests' markers; the benchmarks' --quick runs are `long`: `make test-long` runs them
DIRECTORY_MARKERS = {"spark": ("spark",), "crash": ("crash",), "bench": ("slow", "long")}
WAIT_TIMEOUT_S = 30.0  # how long `wait_until` looks before giving up: far beyond any wait on a loaded machine
WAIT_INTERVAL_S = 0.01


def pytest_collection_modifyitems(config, items):
    """Mark the tests of a directory in DIRECTORY_MARKERS: tests/spark `spark`, tests/crash `crash`, and the
    benchmarks' --quick runs in tests/bench `slow` and `long` (the markers are registered in pyproject.toml;
    `make test-fast` leaves the first three out, `make test` leaves `long` to `make test-long`)."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            directory = item.path.resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        for marker in DIRECTORY_MARKERS.get(directory, ()):
            item.add_marker(marker)


def wait_until(condition: Callable[[], object], timeout_s: float = WAIT_TIMEOUT_S,
               interval_s: float = WAIT_INTERVAL_S) -> bool:
    """Look at `condition` every `interval_s` until it holds or `timeout_s` has passed; whether it held.

    For state another thread or process changes with no event to wait on (a dispatch error, a child's exit, a
    kernel flag). The caller asserts the result, with its own message: `assert wait_until(...), what`.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(interval_s)
    return True


class StepClock:
    """The store clock (`commitlog.commitlog._time_ns`, read once per append or batch under the writer lock),
    replaced inside a `with` block by one that moves `step_ms` at each reading: each append gets its own store
    millisecond without a sleep. A step of 0 leaves the real clock in place."""

    def __init__(self, step_ms: int = 1):
        self.step_ns = step_ms * 1_000_000
        self.now = time.time_ns()

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now

    def __enter__(self):
        from mqstore.commitlog import commitlog as commitlog_module

        self._saved = commitlog_module._time_ns
        if self.step_ns:
            commitlog_module._time_ns = self
        return self

    def __exit__(self, *exc_info):
        from mqstore.commitlog import commitlog as commitlog_module

        commitlog_module._time_ns = self._saved


@pytest.fixture
def step_clock():
    """A StepClock of 1 ms a reading, in place for the test."""
    with StepClock(1) as clock:
        yield clock


@pytest.fixture(params=["python", "native"])
def codec(request, monkeypatch):
    """Each codec in turn for the stores and logs a test opens: the pure-Python reference (None) and the compiled
    core (mqstore.commitlog._native), whatever MQSTORE_NATIVE says. Use it (or pytest.mark.usefixtures("codec")) in
    tests of reading, writing and damage, so that both codecs pass them."""
    import importlib

    from mqstore.commitlog import native

    module = importlib.import_module("mqstore.commitlog._native") if request.param == "native" else None
    monkeypatch.setattr(native, "NATIVE", module)
    return module


@pytest.fixture
def rocketmq_store_copy(tmp_path) -> Path:
    """A writable copy of the store RocketMQ 4.4.0 wrote (the original is never opened for writing)."""
    if not ROCKETMQ_STORE.is_dir():
        pytest.fail(f"the RocketMQ fixture store is missing: {ROCKETMQ_STORE}")
    target = tmp_path / "rocketmq-store"
    shutil.copytree(ROCKETMQ_STORE / "store", target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    target.chmod(0o755)
    return target


def rocketmq_manifest() -> list[dict]:
    import json

    with open(ROCKETMQ_STORE / "manifest.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def rocketmq_config():
    """The settings the fixture store was written with (see tests/data/README.md)."""
    from mqstore import StoreConfig

    return StoreConfig(segment_size_bytes=65536, consume_queue_entries_per_file=64, max_message_size_bytes=16384,
                       index_slot_count=64, index_entry_count_max=256)


def small_config(**overrides):
    """Small segments and queue files, so tests roll files often. No index (and so no UNIQ_KEY added to
    messages) unless asked for: the index has tests of its own."""
    from mqstore import StoreConfig

    # Dispatch in the writer's thread: a child process per open (the default, 0.25-0.5 s to start) would make the
    # suite's thousands of opens take several times as long. tests/unit/mqstore/test_dispatch_process.py, the
    # model test's process variant and the tests that open with StoreConfig()'s defaults run the child.
    settings = dict(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, max_message_size_bytes=8192,
                    dispatch_process=False,
                    store_host="10.0.0.7", store_port=10911, preallocate_segments=False, index_enabled=False,
                    index_slot_count=64, index_entry_count_max=256,
                    # The test machine's own disk usage must not make retention remove segments or refuse puts.
                    disk_max_used_space_ratio=1.0, disk_clean_forcibly_ratio=1.0, disk_full_ratio=1.0)
    settings.update(overrides)
    return StoreConfig(**settings)

def mapping_vm_flags(array) -> set[str]:
    """The kernel's flags of the mapping an array starts (VmFlags in /proc/self/smaps: "rr" is MADV_RANDOM)."""
    address = array.ctypes.data
    with open("/proc/self/smaps", encoding="ascii") as handle:
        inside = False
        for line in handle:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end perms ...
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise LookupError(f"no mapping at {address:#x}")
