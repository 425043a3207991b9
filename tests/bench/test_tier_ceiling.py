"""The CPU ceiling the tier benches report (bench/reports/tier.py, bench/spark_tier.py): the arithmetic, on
made-up figures, and the endpoint's CPU read from /proc for a process of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    """A module of bench/ (`reports.tier` as a package module), with bench/ on the path for the import only."""
    sys.path.insert(0, str(BENCH))
    try:
        if "." in name:
            return importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(f"ceiling_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_ceiling_spends_the_busy_cores_on_the_reader_alone():
    tier = load("reports.tier")
    # 1 s of wall, 0.5 s reader + 1.0 s endpoint CPU: without the endpoint, 1.5 cores would do 0.5 s in 1/3 s
    row = {"rows_per_s": 1_000_000, "reader_cpu_s": 0.5, "endpoint_cpu_s": 1.0}
    assert tier.ceiling_rows_per_s(row) == pytest.approx(3_000_000)
    assert tier.ceiling_rows_per_s({**row, "endpoint_cpu_s": 0.0}) == pytest.approx(1_000_000)
    assert tier.ceiling_rows_per_s({**row, "reader_cpu_s": 0.0}) is None


def test_the_spark_benchs_ceiling_counts_the_jvm_and_the_driver_as_the_reader():
    spark_tier = load("spark_tier")
    # (wall, JVM, driver, endpoint): reader 1.0 of 1.5 CPU s, so the wall shrinks to two thirds
    assert spark_tier.ceiling_s((0.9, 0.8, 0.2, 0.5)) == pytest.approx(0.6)
    assert spark_tier.ceiling_s((0.9, 0.0, 0.0, 0.5)) == 0.9


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this system")
def test_the_endpoints_cpu_is_read_apart_from_this_process():
    upload = load("tier_upload")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sum(range(3 * 10**7)); print('done', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"done\n"
        assert upload.process_cpu_s(child.pid) > 0.05  # its sum, not this process's CPU
    finally:
        child.communicate(b"")
    assert upload.process_cpu_s(2**22 + 12345) == 0.0  # no such process
