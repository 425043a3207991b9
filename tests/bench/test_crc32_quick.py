"""The CRC benchmark's --quick mode compiles its C program, times every function on every size and writes them.

Speed is not asserted (tests never assert on timings): only that each function this CPU can run has a positive
figure for each size (the program itself checks each value against zlib's before timing it).
"""

from __future__ import annotations

import json
import shutil

import pytest
from mqstore.commitlog import _native

from tests.bench.quick import run_quick


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build bench/crc32_compare.c")
def test_crc32_quick_times_every_path_this_cpu_has(tmp_path):
    out = tmp_path / "crc32.json"
    completed = run_quick("crc32.py", "--out", str(out), timeout_s=300)
    result = json.loads(out.read_text())
    assert result["command"] == "bench/crc32.py --quick"
    assert result["chosen"] == _native.crc32_path()
    expected = {"zlib", *(f"mq_{path}" for path in _native.crc32_paths())}
    assert expected <= set(result["functions"])
    sizes = [row["bytes"] for row in result["rows"]]
    assert {100, 1024, 4096, 1 << 20} <= set(sizes)
    for row in result["rows"]:
        for function in result["functions"]:
            assert row[f"{function}_ns"] > 0 and row[f"{function}_independent_ns"] > 0, (function, row)
    assert f"mq_crc32 takes {result['chosen']!r}" in completed.stdout
