"""The wheel `pip wheel .` builds from the tracked files holds every module of the tree, and a writer importing
mqstore from it alone runs a store with delays, timers, leases and a file:// tier, and the demo. An editable
install (the Makefile's) reads the tree itself, so a package pyproject.toml leaves out shows only here (and in
tests/cli/test_usability.py's comparison of the two lists).

Marked long: the build compiles the extension (20-30 s on 2 cores; about a minute with the demo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.long


def _tree_modules() -> set[str]:
    """Every module of the source tree, by its installed name (the layers pyproject.toml maps into mqstore too)."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    found = set()
    for name, directory in {"mqstore": "mqstore", **settings["package-dir"]}.items():
        top = ROOT / directory
        for path in top.rglob("*.py"):
            if "__pycache__" in path.parts or not (path.parent / "__init__.py").is_file():
                continue
            parts = path.relative_to(top).with_suffix("").parts
            if parts[-1] == "__main__":
                continue  # runs the command line when imported
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.add(".".join((name, *parts)))
    return found


SMOKE = textwrap.dedent("""
    import importlib, json, os, sys, tempfile
    site, modules = sys.argv[1], json.loads(sys.argv[2])
    failed = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - reported below
            failed[name] = repr(error)
            continue
        if not os.path.realpath(module.__file__).startswith(os.path.realpath(site)):
            failed[name] = "imported from " + module.__file__
    assert not failed, failed

    from mqstore import Message, MessageStore, StoreConfig
    from mqstore.lease import open_lease_consumer
    from mqstore.schedule import with_delay_level
    from mqstore.timer import with_delay
    root = tempfile.mkdtemp()
    tier = "file://" + tempfile.mkdtemp()
    config = StoreConfig(segment_size_bytes=1 << 16, tier_uri=tier)
    with MessageStore.open(root, config) as store:
        store.put(Message("jobs", b"now", tags="T", keys=("k",)))
        store.put(with_delay(Message("later", b"in an hour"), delay_ms=3_600_000))
        store.put(with_delay_level(Message("later", b"level 3"), 3))
        assert store.wait_dispatched(30), store.stats()["dispatch"]  # query reads the index dispatch writes
        consumer = open_lease_consumer(store, "workers", "jobs")
        leased = consumer.receive(max_count=1, visibility_ms=30_000, timeout_ms=30_000)
        assert leased, ("nothing leased in 30 s", store.max_offset("jobs", 0), store.stats()["dispatch"])
        consumer.ack(leased[0].lease)
        consumer.close()
        body = leased[0].message.body.decode()
        print(body, store.query("jobs", "k")[0].body.decode(), store.stats()["tier"] is not None)
""")


def test_a_wheel_of_the_tree_holds_every_module_and_runs_a_store(tmp_path):
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(built), str(source)], check=True, timeout=600, capture_output=True)
    wheel, = built.glob("mqstore-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    modules = sorted(_tree_modules())
    assert "mqstore.timer" in modules and "mqstore.commitlog.commitlog" in modules
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-c", SMOKE, str(site), json.dumps(modules)], env=environment,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["now", "now", "True"]
    demo = subprocess.run([sys.executable, "-m", "mqstore", "demo", "--messages", "3000", "--store", "demo"],
                          env=environment, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-4000:]
    assert "3,000" in demo.stdout or "3000" in demo.stdout, demo.stdout
