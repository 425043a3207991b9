"""Shared test helpers: where RocketMQ's fixture store is, and small store settings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures"
ROCKETMQ_STORE = FIXTURES_DIR / "rocketmq-4.4.0-store"


@pytest.fixture(params=["python", "native"])
def codec(request, monkeypatch):
    """Each codec in turn for the stores and logs a test opens: the pure-Python reference (None) and the compiled
    core (commitlog._native), whatever MQSTORE_NATIVE says. Use it (or pytest.mark.usefixtures("codec")) in
    tests of reading, writing and damage, so that both codecs pass them."""
    import importlib

    from commitlog import native

    module = importlib.import_module("commitlog._native") if request.param == "native" else None
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
    """The settings the fixture store was written with (see shared/fixtures/README.md)."""
    from mqstore import StoreConfig

    return StoreConfig(segment_size_bytes=65536, consume_queue_entries_per_file=64, max_message_size_bytes=16384,
                       index_slot_count=64, index_entry_count_max=256)


def small_config(**overrides):
    """Small segments and queue files, so tests roll files often. No index (and so no UNIQ_KEY added to
    messages) unless asked for: the index has tests of its own."""
    from mqstore import StoreConfig

    settings = dict(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, max_message_size_bytes=8192,
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
