"""The lease tests' store: small segments, on a ManualClock that tests move (no test sleeps for a timeout)."""

from __future__ import annotations

import pytest

from mqstore import MessageStore
from mqstore.store.clock import ManualClock
from tests.conftest import small_config


@pytest.fixture
def clock():
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def store(tmp_path, clock):
    with MessageStore.open(tmp_path / "store", small_config(), clock=clock) as opened:
        yield opened
