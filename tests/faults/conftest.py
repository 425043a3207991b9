"""Builds the fault-injecting double of fdatasync (fdatasync_fault.c) once per test session, with the C compiler
that builds mqstore's own extension, and runs tests/faults/scenarios.py with it preloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
SCENARIO_TIMEOUT_S = 180.0


@pytest.fixture(scope="session")
def fault_double(tmp_path_factory) -> Path:
    """The shared object of fdatasync_fault.c, built for this session."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0]
    if shutil.which(compiler) is None:
        compiler = "cc"
    built = tmp_path_factory.mktemp("fault-double") / "fdatasync_fault.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(built),
                    str(HERE / "fdatasync_fault.c"), "-ldl"], check=True)
    return built


@pytest.fixture
def run_scenario(fault_double):
    """run_scenario(name, root, mode, *arguments, native=True) -> the scenario's report (a dict)."""

    def run(name: str, root: Path, mode: str, *arguments: str, native: bool = True) -> dict:
        env = dict(os.environ, LD_PRELOAD=str(fault_double), MQSTORE_NATIVE="1" if native else "0")
        env.pop("MQFAULT_PATTERN", None)
        done = subprocess.run([sys.executable, "-m", "tests.faults.scenarios", name, str(root), mode, *arguments],
                              cwd=PROJECT, env=env, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        assert done.returncode == 0, f"scenario {name} failed:\n{done.stderr[-4000:]}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run
