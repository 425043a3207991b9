"""Running a benchmark's --quick mode from a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, *args: str, timeout_s: int = 300) -> subprocess.CompletedProcess:
    """Run `bench/<script> --quick <args>`; the run must end with exit code 0."""
    completed = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", *args],
                               capture_output=True, text=True, timeout=timeout_s)
    assert completed.returncode == 0, completed.stderr
    return completed
