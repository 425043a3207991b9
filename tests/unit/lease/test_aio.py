"""The asyncio lease consumer (mqstore/lease/aio.py): receive awaits new messages without blocking the loop."""

from __future__ import annotations

import asyncio

import pytest

from mqstore import InvalidMessageError, Message
from mqstore.aio import AsyncLeaseConsumer, AsyncMessageStore
from mqstore.lease import LeaseExpiredError
from mqstore.store.clock import ManualClock
from tests.conftest import small_config

HANG_GUARD_S = 60.0


def run(coroutine):
    async def guarded():
        return await asyncio.wait_for(coroutine, HANG_GUARD_S)

    return asyncio.run(guarded())


def test_an_awaiting_receive_gets_a_put_and_leaves_the_loop_free(tmp_path):
    clock = ManualClock(1_700_000_000_000)

    async def main():
        async with AsyncMessageStore.open(tmp_path / "store", small_config()) as store:
            async with store.lease_consumer("workers", "jobs", clock=clock) as consumer:
                assert isinstance(consumer, AsyncLeaseConsumer)
                waiting = asyncio.ensure_future(consumer.receive(max_count=4, visibility_ms=100,
                                                                 timeout_ms=int(HANG_GUARD_S * 1000)))
                ticks = 0
                for _ in range(10):
                    await asyncio.sleep(0.01)  # the loop runs other tasks while receive waits
                    ticks += 1
                assert not waiting.done() and ticks == 10
                await store.put(Message("jobs", b"job-1", tags="t", keys=["k1"]))
                (leased,) = await waiting
                assert leased.message.body == b"job-1"
                clock.advance(100)
                with pytest.raises(LeaseExpiredError):
                    consumer.ack(leased.lease)
                (again,) = await consumer.receive(max_count=4, visibility_ms=100)
                assert again.lease.delivery_count == 2
                consumer.ack(again.lease)
                with pytest.raises(InvalidMessageError):
                    await consumer.receive(visibility_ms=0)
                assert await consumer.receive(max_count=4, visibility_ms=100, timeout_ms=20) == []
                return consumer.commit()

    assert run(main()) == {0: 1}
