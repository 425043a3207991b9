"""The documentation stays true to the code: generated tables are current, README's examples run."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(relative: str):
    """A script of the repository (docs/generate.py, bench/report.py) as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_page_matches_store_config():
    generate = _load("docs/generate.py")
    assert generate.generated_settings_page() == generate.SETTINGS_PAGE.read_text(encoding="utf-8"), \
        "docs/settings.md is out of date: run `make docs`"


def test_settings_table_has_one_row_per_field_with_its_docstring():
    from mqstore import StoreConfig

    generate = _load("docs/generate.py")
    rows = [line for line in generate.settings_table().splitlines()[2:]]
    names = [re.match(r"\| `(\w+)` \|", row).group(1) for row in rows]
    assert names == [field.name for field in dataclasses.fields(StoreConfig)]
    docs = generate.field_docstrings(StoreConfig)
    assert set(docs) == set(names), "every StoreConfig field needs a docstring under it"
    assert "| `segment_size_bytes` | 1 GiB |" in rows[0]


def test_settings_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    generate = _load("docs/generate.py")
    stale = tmp_path / "settings.md"
    stale.write_text(f"intro\n{generate.BEGIN}\n| old | table |\n{generate.END}\n", encoding="utf-8")
    monkeypatch.setattr(generate, "SETTINGS_PAGE", stale)
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 1
    assert "old" in stale.read_text(encoding="utf-8")
    assert generate.main([]) == 0
    assert "`segment_size_bytes`" in stale.read_text(encoding="utf-8")
    assert generate.main(["--check"]) == 0
