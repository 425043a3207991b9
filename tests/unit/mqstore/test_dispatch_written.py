"""In SYNC mode the store's dispatch thread takes single puts as the writer described them (commitlog.dispatch):
the queues and the index it writes so are byte for byte those a dispatch that reads every record from the log
writes."""

from __future__ import annotations

import os
import threading

import pytest
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.dispatch import DispatchService
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher
from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_service import IndexService

from mqstore import Message, MessageStore
from mqstore.store.config import FlushMode
from tests.unit.mqstore.conftest import config


def _messages(count: int, start: int = 0) -> list[Message]:
    return [Message(("orders", "audit")[i % 2], b"body %d " % i * (i % 50), queue_id=i % 3,
                    tags=(None, "TagA", "\u00fcber")[i % 3], keys=() if i % 4 else (f"k{i}", "shared"),
                    properties={"a": str(i)} if i % 5 == 0 else {}) for i in range(start, start + count)]


def _files(directory) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, directory)] = open(path, "rb").read()
    return out


def _rebuilt(store_dir, settings, target) -> tuple[dict, list[bytes]]:
    """The queues and index files a dispatch that parses the whole log writes into `target`."""
    log = CommitLog(str(store_dir / "commitlog"), settings.segment_size_bytes, writable=False,
                    max_message_size_bytes=settings.max_message_size_bytes,
                    max_queues_per_topic=settings.max_queues_per_topic, born_host_raw=bytes(8), store_host_raw=bytes(8))
    log.set_end(log.find_end(tolerant=False))
    table = ConsumeQueueTable(str(target / "consumequeue"), settings.consume_queue_entries_per_file, writable=True)
    index = IndexService(str(target / "index"), settings.index_slot_count, settings.index_entry_count_max)
    DispatchService(log, [ConsumeQueueDispatcher(table), IndexDispatcher(index)], log.min_offset()).dispatch_available()
    table.close()
    index.close()
    log.close()
    return _files(target / "consumequeue"), [data for _, data in sorted(_files(target / "index").items())]


def _check_same_as_rebuilt(store_dir, settings, tmp_path):
    queues, index = _rebuilt(store_dir, settings, tmp_path / "rebuilt")
    assert _files(store_dir / "consumequeue") == queues and len(queues) > 6
    assert [data for _, data in sorted(_files(store_dir / "index").items())] == index and len(index) >= 2


def test_queues_and_index_from_described_puts_are_those_a_full_parse_writes(tmp_path):
    # described puts go to the writer's dispatch thread (a dispatch process parses the log)
    settings = config(index_enabled=True, flush_mode=FlushMode.SYNC, dispatch_process=False)
    store_dir = tmp_path / "store"
    with MessageStore.open(store_dir, settings) as store:
        for index, message in enumerate(_messages(600)):
            store.put(message)
            if index % 97 == 0:
                assert store.wait_dispatched(30)  # the thread also catches up a few records at a time
        store.put_batch(_messages(40, 600))  # a batch is parsed from the log
        for message in _messages(30, 640):
            store.put(message)
        assert store.wait_dispatched(30)
        assert store._dispatch.written_records_dispatched >= 600  # most single puts went the described way
        found = store.query("orders", "shared", max_count=1000)
        assert len(found) == len([m for m in _messages(670) if m.topic == "orders" and "shared" in m.keys])
    _check_same_as_rebuilt(store_dir, settings, tmp_path)


def test_many_producers_in_sync_mode_dispatch_every_put_once(tmp_path):
    settings = config(index_enabled=True, flush_mode=FlushMode.SYNC)
    store_dir = tmp_path / "store"
    with MessageStore.open(store_dir, settings) as store:
        def produce(worker):
            for message in _messages(60, worker * 60):
                store.put(message)
        threads = [threading.Thread(target=produce, args=(worker,)) for worker in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert store.wait_dispatched(30)
        for queue_id in range(3):
            assert store.max_offset("orders", queue_id) + store.max_offset("audit", queue_id) == 160
    _check_same_as_rebuilt(store_dir, settings, tmp_path)


@pytest.mark.parametrize("settings", [dict(flush_mode=FlushMode.SYNC, check_crc_on_dispatch=True),
                                      dict(flush_mode=FlushMode.ASYNC)], ids=["sync-crc-checked", "async"])
def test_stores_that_check_crcs_on_dispatch_or_flush_async_read_every_record_from_the_log(tmp_path, settings):
    with MessageStore.open(tmp_path / "store", config(**settings)) as store:
        for message in _messages(20):
            store.put(message)
        assert store.wait_dispatched(30)
        assert store._commitlog.written_records is None and store._dispatch.written_records_dispatched == 0
        assert store.max_offset("orders", 0) + store.max_offset("audit", 0) == 7
