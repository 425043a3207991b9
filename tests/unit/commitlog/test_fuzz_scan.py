"""A short pass of the scan fuzzer (`make fuzz-scan`): the compiled scans under AddressSanitizer and
UndefinedBehaviorSanitizer, fed mutated segments of real stores. A bad read, undefined behaviour or a broken
invariant (a record outside the segment, a span outside its record) fails the run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FUZZ_SECONDS = 3


@pytest.mark.skipif(shutil.which("make") is None or not (shutil.which("clang") or shutil.which("gcc")),
                    reason="the fuzz target needs make and a C compiler (clang or gcc)")
def test_a_short_fuzz_pass_finds_nothing(tmp_path):
    result = subprocess.run(
        ["make", "-s", "-C", str(REPO), "fuzz-scan", f"SECONDS={FUZZ_SECONDS}", f"FUZZ_DIR={tmp_path}",
         f"FUZZ_PYTHON={sys.executable}"], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "seeds in" in output
    assert "no error" in output or "Done" in output, output[-2000:]
    assert not (tmp_path / "crash-input").exists()
