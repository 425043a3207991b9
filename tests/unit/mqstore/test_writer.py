"""The put path under many producers: SYNC puts from many threads, and a put that finds the writer busy."""

from __future__ import annotations

import threading

import mqstore.engine as engine
from mqstore import FlushMode, GetStatus, Message, MessageStore, PutStatus
from tests.conftest import small_config

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


def test_a_put_that_finds_the_writer_busy_waits_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "WRITER_BACKOFF_TRIES_MAX", 3)  # so it also ends up blocking on the lock
    with MessageStore.open(tmp_path, small_config()) as store:
        results = []
        store._writer.acquire()  # another put appending, for a long time
        producers = [threading.Thread(target=lambda i=i: results.append(store.put(Message("w", b"%d" % i))))
                     for i in range(3)]
        for producer in producers:
            producer.start()
        threading.Event().wait(0.05)
        assert results == []  # nothing appended past the holder
        store._writer.release()
        for producer in producers:
            producer.join(10)
        assert sorted(r.queue_offset for r in results) == [0, 1, 2]
        assert all(r.status is PutStatus.PUT_OK for r in results)
        assert store.wait_dispatched(10)
        got = store.get("w", 0, 0)
        assert got.status is GetStatus.FOUND and sorted(m.body for m in got.messages) == [b"0", b"1", b"2"]
