"""mqstore.aio: SYNC puts in flight from one event loop share flushes, are acknowledged once durable and in order;
ASYNC puts return once written; errors are the sync API's; cancellation and close never lose or hang a put; an
awaiting consumer poll is woken by dispatch, not by polling. Each test runs its coroutine with asyncio.run; the
flush-failure cases are in tests/faults/test_flush_failures.py."""

from __future__ import annotations

import asyncio

import pytest

from mqstore import FlushMode, InvalidMessageError, Message, MessageStore, PutStatus, StoreClosedError
from mqstore.aio import AsyncConsumer, AsyncMessageStore
from tests.unit.mqstore.conftest import config

pytestmark = pytest.mark.usefixtures("codec")

HANG_GUARD_S = 60.0  # an await that takes this long has hung: the test fails instead of blocking the suite


def sync_config(**overrides):
    return config(flush_mode=FlushMode.SYNC, **overrides)


def message(seq: int, topic: str = "orders") -> Message:
    return Message(topic, f"body {seq:05d}".encode() * 8, tags=f"t{seq % 3}", keys=[f"k{seq}"], queue_id=seq % 4)


def run(coroutine):
    async def guarded():
        return await asyncio.wait_for(coroutine, HANG_GUARD_S)

    return asyncio.run(guarded())


def read_back(store_dir) -> dict[bytes, int]:
    """Reopen the store and map each body found in the topic's queues to its commitlog offset."""
    found = {}
    with MessageStore.open(store_dir, sync_config()) as store:
        for queue_id in range(4):
            for stored in store.get("orders", queue_id, 0, 10_000).messages:
                found[bytes(stored.body)] = stored.commitlog_offset
    return found


def test_sync_puts_in_flight_are_durable_acknowledged_in_order_and_share_flushes(store_dir):
    tasks_count, puts_each = 50, 20
    acknowledged = []  # (offset, size) in the order the awaits returned

    async def producer(store, first: int) -> None:
        for seq in range(first, first + puts_each):
            result = await store.put(message(seq))
            assert result.status is PutStatus.PUT_OK
            group_commit = store.sync._group_commit
            assert group_commit.durable_position >= result.commitlog_offset + result.size_bytes  # on disk now
            acknowledged.append((result.commitlog_offset, result.size_bytes))

    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config()) as store:
            await asyncio.gather(*(producer(store, index * puts_each) for index in range(tasks_count)))
            return store.sync._group_commit.stats.flush_count

    flushes = run(main())
    total = tasks_count * puts_each
    assert len(acknowledged) == total
    offsets = [offset for offset, _ in acknowledged]
    assert offsets == sorted(offsets), "puts were acknowledged out of the order they were written"
    assert flushes < total, "every put had a flush of its own: the puts in flight did not share flushes"
    found = read_back(store_dir)
    assert sorted(found.values()) == offsets
    assert all(message(seq).body in found for seq in range(total))


def test_put_batch_is_acknowledged_durable(store_dir):
    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config()) as store:
            batches = [[message(batch * 10 + index) for index in range(10)] for batch in range(8)]
            results = await asyncio.gather(*(store.put_batch(batch) for batch in batches))
            durable = store.sync._group_commit.durable_position
            return [result for batch in results for result in batch], durable

    results, durable = run(main())
    assert [result.status for result in results] == [PutStatus.PUT_OK] * 80
    assert max(result.commitlog_offset + result.size_bytes for result in results) <= durable
    assert len(read_back(store_dir)) == 80


def test_async_mode_put_returns_once_written(store_dir):
    async def main():
        async with AsyncMessageStore.open(store_dir, config()) as store:
            assert store.sync.config.flush_mode is FlushMode.ASYNC
            result = await store.put(message(0))
            assert result.status is PutStatus.PUT_OK
            assert await store.wait_dispatched(HANG_GUARD_S)
            got = await store.get("orders", 0, 0)
            return result, [bytes(stored.body) for stored in got.messages]

    result, bodies = run(main())
    assert bodies == [message(0).body] and result.commitlog_offset == 0


def test_errors_are_the_sync_apis_raised_from_the_await(store_dir):
    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config()) as store:
            coroutine = store.put(Message("orders", "not bytes"))  # nothing runs before the await
            with pytest.raises(InvalidMessageError):
                await coroutine
            with pytest.raises(InvalidMessageError):
                await store.put_batch([message(0), Message("", b"x")])  # one bad one writes none
            assert store.sync.stats()["commitlog"]["max_offset"] == 0
        with pytest.raises(StoreClosedError):
            await store.put(message(1))

    run(main())


def test_a_cancelled_put_stays_written(store_dir):
    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config()) as store:
            task = asyncio.ensure_future(store.put(message(0)))
            await asyncio.sleep(0)  # the put wrote its message and awaits its flush
            assert store.sync.stats()["commitlog"]["max_offset"] > 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            later = await store.put(message(1))
            assert later.status is PutStatus.PUT_OK

    run(main())
    assert set(read_back(store_dir)) == {message(0).body, message(1).body}


def test_close_with_puts_in_flight_resolves_every_one(store_dir):
    async def main():
        store = await AsyncMessageStore.open(store_dir, sync_config())
        tasks = [asyncio.ensure_future(store.put(message(seq))) for seq in range(300)]
        await asyncio.sleep(0)  # every put wrote and awaits
        await store.close()
        assert all(task.done() for task in tasks), "close() returned with puts in flight"
        with pytest.raises(StoreClosedError):
            await store.put(message(999))
        return [task.result().status for task in tasks]

    assert run(main()) == [PutStatus.PUT_OK] * 300
    assert len(read_back(store_dir)) == 300


def test_puts_in_flight_when_the_sync_store_is_closed_underneath_fail_clearly(store_dir):
    """Someone closes the wrapped MessageStore directly: the awaiting puts end (their status, or StoreClosedError),
    they never hang."""
    async def main():
        store = await AsyncMessageStore.open(store_dir, sync_config())
        tasks = [asyncio.ensure_future(store.put(message(seq))) for seq in range(100)]
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, store.sync.close)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()
        return outcomes

    outcomes = run(main())
    assert len(outcomes) == 100
    for outcome in outcomes:
        assert isinstance(outcome, StoreClosedError) or outcome.status in (
            PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT), outcome


def test_wrapping_an_open_store(store_dir):
    sync = MessageStore.open(store_dir, sync_config())

    async def main():
        store = AsyncMessageStore(sync)
        assert store.sync is sync
        result = await store.put(message(0))
        assert await store.wait_dispatched(HANG_GUARD_S)
        assert store.max_offset("orders", 0) == 1  # reads delegate to the sync store
        await store.close()
        return result

    assert run(main()).status is PutStatus.PUT_OK
    with pytest.raises(StoreClosedError):
        sync.put(message(1))


class CountingConsumer:
    """A sync consumer that counts its looks (AsyncConsumer's calls of poll)."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.looks = 0

    def poll(self, max_count, timeout_ms):
        assert timeout_ms == 0, "AsyncConsumer must never block the loop in the sync poll"
        self.looks += 1
        return self.consumer.poll(max_count, timeout_ms)


@pytest.mark.parametrize("flush_mode", [FlushMode.SYNC, FlushMode.ASYNC])
def test_an_awaiting_poll_is_woken_by_new_messages_not_by_polling(store_dir, flush_mode):
    async def main():
        async with AsyncMessageStore.open(store_dir, config(flush_mode=flush_mode)) as store:
            consumer = store.consumer("billing", "orders", [0])
            assert isinstance(consumer, AsyncConsumer)
            counting = CountingConsumer(consumer.sync)
            consumer.sync = counting
            assert await consumer.poll(max_count=32, timeout_ms=50) == []  # nothing comes: no look after the first
            assert counting.looks == 1
            waiting = asyncio.ensure_future(consumer.poll(max_count=32, timeout_ms=int(HANG_GUARD_S * 1000)))
            for _ in range(20):
                await asyncio.sleep(0.01)  # the poll waits meanwhile without looking again
            assert not waiting.done() and counting.looks == 2
            await store.put(message(0))
            got = await waiting
            consumer.sync = counting.consumer
            committed = await consumer.commit()
            return [bytes(stored.body) for stored in got], counting.looks, committed

    bodies, looks, committed = run(main())
    assert bodies == [message(0).body]
    assert looks <= 4, f"the poll looked {looks} times for one message"
    assert committed == {0: 1}


def test_a_put_over_the_dispatch_lag_bound_awaits_dispatch(store_dir):
    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config(max_dispatch_lag_bytes=4096)) as store:
            results = await asyncio.gather(*(store.put(message(seq)) for seq in range(200)))
            end = max(result.commitlog_offset + result.size_bytes for result in results)
            assert end - store.sync.dispatched_offset <= 4096
            return [result.status for result in results]

    assert run(main()) == [PutStatus.PUT_OK] * 200


def test_a_failing_flush_waiter_fails_the_puts_in_flight_instead_of_hanging(store_dir, monkeypatch):
    from mqstore import StoreError

    async def main():
        async with AsyncMessageStore.open(store_dir, sync_config()) as store:
            def broken(position, timeout_s):
                raise RuntimeError("a bug in the wait")

            monkeypatch.setattr(store.sync._group_commit, "wait_durable", broken)
            outcomes = await asyncio.gather(*(store.put(message(seq)) for seq in range(20)), return_exceptions=True)
            monkeypatch.undo()
            return outcomes

    outcomes = run(main())
    assert all(isinstance(outcome, StoreError) and "a bug in the wait" in str(outcome) for outcome in outcomes)
    assert len(read_back(store_dir)) == 20  # written all the same, and flushed by close()
