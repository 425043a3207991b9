"""The put path under many producers: SYNC puts from many threads, and puts that find the writer busy."""

from __future__ import annotations

import threading

import mqstore.commitlog.handoff as handoff

from mqstore import FlushMode, GetStatus, Message, MessageStore, PutStatus, StoreClosedError
from tests.conftest import small_config, wait_until

THREADS = 8
PER_THREAD = 60


def test_sync_producers_on_many_threads_each_return_after_their_bytes_are_flushed(tmp_path):
    with MessageStore.open(tmp_path, small_config(flush_mode=FlushMode.SYNC)) as store:
        log = store._commitlog
        original = log.flush
        flushed_ends = []

        def spy():
            position = original()
            flushed_ends.append(position)
            return position

        log.flush = spy
        failures = []

        def produce(index):
            for seq in range(PER_THREAD):
                if seq % 10 == 9:
                    results = store.put_batch([Message("s", b"%d:%d:%d" % (index, seq, i)) for i in range(3)])
                else:
                    results = [store.put(Message("s", b"%d:%d" % (index, seq), queue_id=index % 2))]
                end = results[-1].commitlog_offset + results[-1].size_bytes
                durable = max(flushed_ends, default=0)
                if any(r.status is not PutStatus.PUT_OK for r in results) or durable < end:
                    failures.append((index, seq, [r.status for r in results], durable, end))

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == []
        expected = THREADS * (PER_THREAD - PER_THREAD // 10) + THREADS * (PER_THREAD // 10) * 3
        assert store.wait_dispatched(30)
        assert sum(store.max_offset("s", queue_id) for queue_id in (0, 1)) == expected
        flushes = store.stats()["flush"]["commitlog_flusher"]["flushes"]
        assert 1 <= flushes <= expected


def _parked_count(store, count):
    assert wait_until(lambda: len(store._handoff.pending) >= count, interval_s=0.001), f"{count} parked puts expected"


def test_puts_that_find_the_writer_busy_are_appended_by_the_holder_in_arrival_order(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "HAND_IN_POLL_S", 60.0)  # only the holder's release can append them
    with MessageStore.open(tmp_path, small_config()) as store:
        results = {}
        store._handoff.lock.acquire()  # another put appending, for a long time
        producers = []
        for i in range(3):
            producers.append(threading.Thread(target=lambda i=i: results.__setitem__(i, store.put(
                Message("w", b"%d" % i)))))
            producers[-1].start()
            _parked_count(store, i + 1)
        assert results == {}  # nothing appended past the holder
        store._handoff.release()
        for producer in producers:
            producer.join(10)
        assert [results[i].queue_offset for i in range(3)] == [0, 1, 2]  # in the order they arrived
        assert all(r.status is PutStatus.PUT_OK for r in results.values())
        assert store._handoff.handed_in == 3
        assert store.wait_dispatched(10)
        got = store.get("w", 0, 0)
        assert got.status is GetStatus.FOUND and [m.body for m in got.messages] == [b"0", b"1", b"2"]


def test_a_put_appends_the_puts_and_batches_parked_while_it_appended(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "HAND_IN_POLL_S", 60.0)  # only the holding put's release can append them
    with MessageStore.open(tmp_path, small_config()) as store:
        inside, go_on = threading.Event(), threading.Event()
        # What a put runs under the writer lock: the compiled put when there is one, else the append
        name = "_put_common" if store._put_common is not None else "_append_holding_lock"
        append = getattr(store, name)
        appended_on = []

        def slow_first(argument):
            appended_on.append(threading.current_thread().name)
            if len(appended_on) == 1:
                inside.set()
                go_on.wait(10)
            return append(argument)

        setattr(store, name, slow_first)
        results = {}
        holder = threading.Thread(target=lambda: results.__setitem__("holder", store.put(Message("w", b"h"))),
                                  name="holder")
        holder.start()
        assert inside.wait(10)
        parked = [threading.Thread(target=lambda: results.__setitem__("put", store.put(Message("w", b"p")))),
                  threading.Thread(target=lambda: results.__setitem__("batch", store.put_batch(
                      [Message("w", b"b1"), Message("w", b"b2")])))]
        for number, thread in enumerate(parked):
            thread.start()
            _parked_count(store, number + 1)
        go_on.set()
        for thread in (holder, *parked):
            thread.join(10)
        assert appended_on == ["holder", "holder"]  # the holder appended the parked put (the batch has its own path)
        assert results["holder"].queue_offset == 0 and results["put"].queue_offset == 1
        assert [r.queue_offset for r in results["batch"]] == [2, 3]
        assert store._handoff.handed_in == 2 and not store._handoff.pending


def test_a_put_and_a_batch_parked_behind_close_get_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "HAND_IN_POLL_S", 0.01)
    store = MessageStore.open(tmp_path, small_config())
    store.put(Message("w", b"before"))
    outcomes = {}

    def attempt(name, call):
        try:
            outcomes[name] = call()
        except StoreClosedError as exc:
            outcomes[name] = exc

    store._writer.acquire()  # a holder that does not append parked puts (the CommitLog's close, truncate)
    threads = [threading.Thread(target=attempt, args=("put", lambda: store.put(Message("w", b"p")))),
               threading.Thread(target=attempt, args=("batch", lambda: store.put_batch([Message("w", b"b")])))]
    for thread in threads:
        thread.start()
    _parked_count(store, 2)
    store._commitlog._closed = True  # what the CommitLog's close does under the lock (its segments stay open here)
    store._commitlog._use_segment(None)
    store._writer.release()
    for thread in threads:
        thread.join(10)
    assert set(outcomes) == {"put", "batch"}
    assert all(isinstance(outcome, StoreClosedError) for outcome in outcomes.values()), outcomes
    store._commitlog._closed = False
    store.close()
    with MessageStore.open(tmp_path, small_config()) as again:
        assert again.max_offset("w", 0) == 1  # only the put made before
