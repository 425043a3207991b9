"""A small store per test (64 KiB segments, 64-entry queue files, at most 8 queues per topic)."""

from __future__ import annotations

import pytest

from mqstore import MessageStore
from tests.conftest import small_config

MAX_QUEUES = 8


def config(**overrides):
    return small_config(max_queues_per_topic=MAX_QUEUES, **overrides)


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def store(store_dir):
    with MessageStore.open(store_dir, config()) as opened:
        yield opened
