"""ConsumeQueueDispatcher: one entry per visible message, grouped by queue, replays ignored, gaps refused."""

from __future__ import annotations

import pytest
from mqstore.commitlog import format as log_format
from mqstore.commitlog.dispatch import DispatchBatch
from mqstore.commitlog.errors import CorruptionError
from mqstore.consumequeue import dispatcher as dispatcher_module
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.dispatcher import ConsumeQueueDispatcher

PREPARED = log_format.SYS_FLAG_TRANSACTION_PREPARED_TYPE
COMMIT = log_format.SYS_FLAG_TRANSACTION_COMMIT_TYPE
ROLLBACK = log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE


@pytest.fixture(autouse=True, params=["numpy", "python"])
def grouping(request, monkeypatch):
    """Every test runs with each way the dispatcher groups a batch: numpy (large batches), Python (a few records)."""
    monkeypatch.setattr(dispatcher_module, "DISPATCH_FEW_RECORDS_MAX", 0 if request.param == "numpy" else 1 << 30)
    return request.param


def _batch(rows) -> DispatchBatch:
    """rows: (commitlog_offset, topic, queue_id, queue_offset, tags_code, sys_flag); every record is 100 bytes."""
    return DispatchBatch.from_rows([
        {"commitlog_offset": offset, "size": 100, "topic": topic, "queue_id": queue_id, "queue_offset": queue_offset,
         "tags_code": tags_code, "sys_flag": sys_flag}
        for offset, topic, queue_id, queue_offset, tags_code, sys_flag in rows])


def _entries(table, topic, queue_id):
    queue = table.get(topic, queue_id)
    units = queue.read(0, queue.max_offset)
    return list(zip(units["commitlog_offset"].tolist(), units["size"].tolist(), units["tags_code"].tolist()))


def test_interleaved_queues_are_grouped_in_log_order(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    dispatcher = ConsumeQueueDispatcher(table)
    dispatcher.dispatch(_batch([
        (0, "a", 0, 0, 11, 0), (100, "b", 0, 0, 0, 0), (200, "a", 1, 0, 0, 0), (300, "a", 0, 1, 12, 0),
        (400, "b", 0, 1, 0, 0), (500, "a", 0, 2, -13, 0),
    ]))
    assert table.topics() == {"a": [0, 1], "b": [0]}
    assert _entries(table, "a", 0) == [(0, 100, 11), (300, 100, 12), (500, 100, -13)]
    assert _entries(table, "a", 1) == [(200, 100, 0)]
    assert _entries(table, "b", 0) == [(100, 100, 0), (400, 100, 0)]
    assert dispatcher.dispatched_entries == 6
    table.close()


def test_prepared_and_rolled_back_messages_get_no_entry(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    ConsumeQueueDispatcher(table).dispatch(_batch([
        (0, "t", 0, 0, 0, 0), (100, "t", 0, 0, 0, PREPARED), (200, "t", 0, 1, 0, COMMIT),
        (300, "t", 0, 0, 0, ROLLBACK), (400, "t", 0, 2, 0, log_format.SYS_FLAG_MULTI_TAGS),
    ]))
    assert [entry[0] for entry in _entries(table, "t", 0)] == [0, 200, 400]
    table.close()


def test_a_replayed_batch_adds_nothing(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    dispatcher = ConsumeQueueDispatcher(table)
    rows = [(i * 100, "t", 0, i, 0, 0) for i in range(6)]
    dispatcher.dispatch(_batch(rows[:4]))
    dispatcher.dispatch(_batch(rows[:4]))
    dispatcher.dispatch(_batch(rows[2:]))
    assert [entry[0] for entry in _entries(table, "t", 0)] == [i * 100 for i in range(6)]
    assert dispatcher.dispatched_entries == 6
    table.close()


@pytest.mark.parametrize("queue_offsets", [[0, 2], [0, 0], [1, 0]])
def test_queue_offsets_that_are_not_consecutive_are_corruption(tmp_path, queue_offsets):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    with pytest.raises(CorruptionError) as raised:
        ConsumeQueueDispatcher(table).dispatch(_batch([(i * 100, "t", 0, q, 0, 0)
                                                      for i, q in enumerate(queue_offsets)]))
    assert raised.value.rule == "consumequeue.dense"
    table.close()


def test_a_batch_continuing_past_the_queue_end_is_corruption(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    dispatcher = ConsumeQueueDispatcher(table)
    dispatcher.dispatch(_batch([(0, "t", 0, 0, 0, 0)]))
    with pytest.raises(CorruptionError):
        dispatcher.dispatch(_batch([(100, "t", 0, 5, 0, 0)]))
    assert table.get("t", 0).max_offset == 1
    table.close()


def test_an_empty_batch_is_ignored(tmp_path):
    table = ConsumeQueueTable(str(tmp_path), 4, writable=True)
    dispatcher = ConsumeQueueDispatcher(table)
    dispatcher.dispatch(DispatchBatch(0))
    assert table.topics() == {} and dispatcher.dispatched_entries == 0
    table.close()


def _table_contents(table) -> dict:
    return {(topic, queue_id): _entries(table, topic, queue_id)
            for topic, queue_ids in table.topics().items() for queue_id in queue_ids}


@pytest.mark.parametrize("seed", range(20))
def test_both_groupings_write_the_same_entries_and_refuse_the_same_gaps(tmp_path, monkeypatch, seed):
    import random

    rng = random.Random(seed)
    next_offset: dict[tuple[str, int], int] = {}
    rows = []
    for index in range(rng.randrange(1, 40)):
        key = (rng.choice("abc"), rng.randrange(3))
        queue_offset = next_offset.get(key, 0)
        if rng.random() < 0.03:
            queue_offset += rng.choice([-1, 1])  # a gap or a repeat: corruption
        sys_flag = rng.choice([0, 0, 0, PREPARED, COMMIT, ROLLBACK])
        if sys_flag not in (PREPARED, ROLLBACK):
            next_offset[key] = queue_offset + 1
        rows.append((index * 100, key[0], key[1], queue_offset, rng.randrange(-5, 5), sys_flag))
    outcomes = []
    for name, threshold in (("numpy", 0), ("python", 1 << 30)):
        monkeypatch.setattr(dispatcher_module, "DISPATCH_FEW_RECORDS_MAX", threshold)
        table = ConsumeQueueTable(str(tmp_path / name), 64, writable=True)
        dispatcher = ConsumeQueueDispatcher(table)
        try:
            dispatcher.dispatch(_batch(rows))
            error = None
        except CorruptionError as exc:
            error = (str(exc).replace(str(tmp_path / name), "<table>"), exc.rule)
        outcomes.append((_table_contents(table), dispatcher.dispatched_entries, error))
        table.close()
    assert outcomes[0] == outcomes[1]
