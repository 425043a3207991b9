"""RocketMQ 4.4.0 in the test suite: the `rmq` runner (tests are skipped, with the reason, where it cannot run)
and the seed of the randomised interop tests."""

from __future__ import annotations

import os

import pytest

from tests.rocketmq import Rmq, require_rmq

SEED = int(os.environ.get("MQSTORE_INTEROP_SEED", "20261125"))
LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"  # the crash tests' long-sweep flag: more trials here too


@pytest.fixture(scope="session")
def rmq() -> Rmq:
    return require_rmq()


@pytest.fixture(scope="session")
def interop_seed() -> int:
    print(f"[interop] MQSTORE_INTEROP_SEED={SEED}")
    return SEED
