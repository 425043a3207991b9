"""max_dispatch_lag_bytes: a put waits for dispatch when it leaves more than that many log bytes undispatched."""

from __future__ import annotations

import threading
import time

from mqstore import Message, MessageStore
from tests.unit.mqstore.conftest import config

LIMIT = 16 * 1024
THREAD = dict(dispatch_process=False)  # these tests add dispatchers to the writer's own dispatch thread
BODY = b"b" * 1000


class Slow:
    """A dispatcher that takes a millisecond per batch: dispatch falls behind puts."""

    def dispatch(self, batch):
        time.sleep(0.001)


class Blocked:
    """A dispatcher that holds dispatch until released."""

    def __init__(self):
        self.release = threading.Event()

    def dispatch(self, batch):
        self.release.wait(30)


def _lag_after(store, result):
    return result.commitlog_offset + result.size_bytes - store.dispatched_offset


def test_puts_return_within_the_lag_bound(store_dir):
    with MessageStore.open(store_dir, config(max_dispatch_lag_bytes=LIMIT, **THREAD)) as store:
        store._dispatch._dispatchers.append(Slow())
        lags = [_lag_after(store, store.put(Message("t", BODY))) for _ in range(200)]
        assert max(lags) <= LIMIT  # a put past the bound waits until dispatch is within three quarters of it
        batch = store.put_batch([Message("t", BODY) for _ in range(40)])  # 40 KB: more than the bound at once
        assert _lag_after(store, batch[-1]) <= LIMIT * 3 // 4
        assert store.stats()["dispatch"]["lag_bytes"] <= LIMIT
        assert store.wait_dispatched(30)
        assert len(store.get("t", 0, 0, max_count=1000).messages) == 240


def test_without_a_bound_puts_run_ahead_of_dispatch(store_dir):
    with MessageStore.open(store_dir, config(**THREAD)) as store:
        blocked = Blocked()
        store._dispatch._dispatchers.append(blocked)
        try:
            lags = [_lag_after(store, store.put(Message("t", BODY))) for _ in range(40)]
            assert max(lags) > LIMIT  # nothing waited for the held dispatch
        finally:
            blocked.release.set()
        assert store.wait_dispatched(30)


def test_a_put_stops_waiting_when_dispatch_has_failed(store_dir):
    class Failing:
        def dispatch(self, batch):
            raise RuntimeError("dispatcher failed")

    with MessageStore.open(store_dir, config(max_dispatch_lag_bytes=LIMIT, **THREAD)) as store:
        store._dispatch._dispatchers.insert(0, Failing())
        results = [store.put(Message("t", BODY)) for _ in range(40)]  # 40 KB, past the bound: no put hangs
        assert store.stats()["dispatch"]["error"] is not None
        assert [r.queue_offset for r in results] == list(range(40))
