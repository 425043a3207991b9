"""A short pass of the codec fuzz target (make fuzz-codec): the record decoder and writer under AddressSanitizer and
UndefinedBehaviorSanitizer, seeded from real records, for a few seconds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FUZZ_SECONDS = 3


@pytest.mark.skipif(shutil.which("make") is None or (shutil.which("cc") is None and shutil.which("clang") is None),
                    reason="no make or C compiler to build the fuzz target with")
def test_a_short_fuzz_pass_finds_nothing(tmp_path):
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "fuzz-codec", f"SECONDS={FUZZ_SECONDS}", f"FUZZ_DIR={tmp_path}",
         f"FUZZ_PYTHON={sys.executable}"], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "seeds in" in output
    assert "no error" in output or "Done" in output, output[-4000:]
