"""bench/core.py's table of issue 21's targets, composed from result files: every target gets a row that names
its figure and reference, and says met, not met, or that the run lacks it (never a speed asserted here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _core():
    spec = importlib.util.spec_from_file_location("bench_core", ROOT / "bench" / "core.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_target_has_a_row_with_a_verdict_from_its_own_figures(tmp_path, monkeypatch):
    core = _core()
    monkeypatch.setattr(core, "RESULTS", str(tmp_path))
    native = {"rows": [{"case": "put 100 B", "native": {"msgs_per_s": 900e3}, "rocketmq": {"msgs_per_s": 800e3}},
                       {"case": "put 1000 B", "native": {"msgs_per_s": 250e3}, "rocketmq": {"msgs_per_s": 300e3}},
                       {"case": "put_batch 1 KB x1000, warm", "native": {"mb_per_s": 1600.0}},
                       {"case": "get 100 B, 32 per call", "native": {"msgs_per_s": 2e6}}],
              "limits": {"memcpy_prefaulted_gb_per_s": 20.0}}
    (tmp_path / "native.json").write_text(json.dumps(native))
    result = core.compose([])
    by_target = {row["target"]: row for row in result["rows"]}
    assert by_target["put 100 B, ASYNC, 1 thread >= 1.0x RocketMQ 4.4.0 putMessage"]["met"] is True
    assert by_target["put 1 KB, ASYNC, 1 thread >= 1.0x RocketMQ 4.4.0 putMessage"]["met"] is False
    assert by_target["put_batch 1 KB x1000, warm segments >= 1.5 GB/s"]["value"] == 1.6
    missing = [row for row in result["rows"] if row["met"] is None]
    assert missing and all(row["measured"] == "no result" for row in missing)  # the other files are absent
    assert result["met"] == 3 and result["not_met"] == 1


def test_the_committed_results_compose(monkeypatch):
    core = _core()
    result = core.compose([])
    assert len(result["rows"]) >= 13
    assert all(row["met"] in (True, False, None) and row["target"] for row in result["rows"])
