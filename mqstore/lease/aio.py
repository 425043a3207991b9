"""The asyncio form of a lease consumer: `receive` awaits without blocking the loop.

    consumer = store.lease_consumer("workers", "jobs")          # store: an AsyncMessageStore
    for leased in await consumer.receive(max_count=32, visibility_ms=30_000, timeout_ms=1000):
        ...
        consumer.ack(leased.lease)

A look at the journal and the queues runs on the loop's thread (a flock and a few reads and writes of the page
cache, as the sync API's). When there is nothing to hand out, receive awaits the store's dispatch of new entries
(the AsyncMessageStore's dispatch waiter) until the earliest lease deadline it saw (on the wall clock), for at
most RECEIVE_WAIT_SLICE_S, then looks again: nacks, a ManualClock's moves and what other processes do are noticed
by that next look (the sync receive is also woken by the first two). `ack`, `ack_many`, `extend`, `nack` and
`commit` are the sync consumer's (a write(2) each, done at once).
"""

from __future__ import annotations

import asyncio

from mqstore.lease import consumer as leases


class AsyncLeaseConsumer:
    """A LeaseConsumer whose `receive` is awaited. Build it with `AsyncMessageStore.lease_consumer`."""

    def __init__(self, store, consumer: leases.LeaseConsumer):
        self.store = store  # the AsyncMessageStore
        self.sync = consumer

    async def receive(self, max_count: int = 32, visibility_ms: int = 30_000, timeout_ms: int = 0) -> list:
        """LeaseConsumer.receive, awaiting up to `timeout_ms` for something to hand out."""
        leases.check_int("max_count", max_count, 1, leases.RECEIVE_MAX_COUNT_LIMIT)
        leases.check_int("visibility_ms", visibility_ms, 1, leases.VISIBILITY_MS_MAX)
        leases.check_int("timeout_ms", timeout_ms, 0, leases.RECEIVE_TIMEOUT_MS_MAX)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        sync_store = self.store.sync
        while True:
            seen = sync_store.dispatched_offset  # before the look: progress after it wakes us
            received = self.sync.receive_now(max_count, visibility_ms)
            remaining = deadline - loop.time()
            if received or remaining <= 0:
                return received
            wait_s = self.sync.wait_s(remaining)
            if seen is None:  # read_only: its writer dispatches in another process
                await asyncio.sleep(wait_s)
                continue
            try:
                await asyncio.wait_for(self.store._dispatched_past(seen), wait_s)
            except TimeoutError:
                pass

    def __getattr__(self, name: str):
        """The sync consumer's other methods (ack, ack_many, extend, nack, commit, prefixes, close, ...)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.sync, name)

    async def __aenter__(self) -> "AsyncLeaseConsumer":
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.sync.close()
