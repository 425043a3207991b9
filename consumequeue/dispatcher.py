"""The dispatcher that builds ConsumeQueues from the CommitLog (RocketMQ's CommitLogDispatcherBuildConsumeQueue).

Transaction-prepared and rolled-back messages get no entry, as in RocketMQ: they are not consumable.
"""

from __future__ import annotations

import numpy as np
from mqstore.commitlog import format as fmt
from mqstore.commitlog.dispatch import DispatchBatch
from mqstore.commitlog.errors import QueueGapError
from mqstore.consumequeue import format as cqf
from mqstore.consumequeue.consume_queue import ConsumeQueueTable
from mqstore.consumequeue.mark import DispatchedMark

_HIDDEN_TRANSACTION_TYPES = (fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE, fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE)
DISPATCH_FEW_RECORDS_MAX = 24  # batches up to this size are grouped in plain Python, larger ones with numpy


class ConsumeQueueDispatcher:
    """Groups a batch by (topic, queue_id) and appends each group's units with one numpy write; then, when it
    has a `mark`, publishes the batch's end there (every queue is complete below it)."""

    def __init__(self, table: ConsumeQueueTable, mark: DispatchedMark | None = None, retag=None):
        self.table = table
        self.mark = mark
        # A callable(batch) that rewrites some rows' tags codes before they are written (mqstore/schedule: the due
        # time of a SCHEDULE_TOPIC_XXXX unit), or None.
        self.retag = retag
        self.dispatched_entries = 0

    def dispatch(self, batch: DispatchBatch) -> None:
        count = len(batch)
        if not count:
            return
        if self.retag is not None:
            self.retag(batch)
        if count <= DISPATCH_FEW_RECORDS_MAX:
            self._dispatch_few(batch)
        else:
            self._dispatch_many(batch)
        self.table.dispatched_timestamp_ms = max(self.table.dispatched_timestamp_ms,
                                                 int(batch.store_timestamps_ms.max()))
        if self.mark is not None:
            self.mark.publish(batch.end_offset)

    def _dispatch_many(self, batch: DispatchBatch) -> None:
        transaction = batch.sys_flags & fmt.SYS_FLAG_TRANSACTION_MASK
        visible = ~np.isin(transaction, _HIDDEN_TRANSACTION_TYPES)
        queue_ids = batch.queue_ids
        codes = batch.topic_ids * (int(queue_ids.max()) + 1) + queue_ids
        order = np.argsort(codes, kind="stable")
        if not visible.all():
            order = order[visible[order]]
        sorted_codes = codes[order]
        bounds = (np.flatnonzero(np.diff(sorted_codes)) + 1).tolist()
        names = batch.topic_names
        for start, stop in zip([0] + bounds, bounds + [len(order)]):
            if stop <= start:
                continue
            index = order[start:stop]
            first_row = int(index[0])
            topic, queue_id = names[int(batch.topic_ids[first_row])], int(queue_ids[first_row])
            group_offsets = batch.queue_offsets[index]
            first = int(group_offsets[0])
            if int(group_offsets[-1]) - first != len(index) - 1 or (
                    len(index) > 1 and int(np.diff(group_offsets).min()) != 1):
                raise self._not_dense(topic, queue_id, batch)
            units = cqf.make_units(batch.commitlog_offsets[index], batch.sizes[index], batch.tags_codes[index])
            self.dispatched_entries += self.table.put(topic, queue_id, first, units)

    def _dispatch_few(self, batch: DispatchBatch) -> None:
        """`_dispatch_many` in plain Python: the same groups, in the same order, with the same checks, each
        group's units packed one by one (its dozen numpy calls, and a unit array a group, cost more than the work
        for a few records)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for row, (topic_id, queue_id, sys_flag) in enumerate(zip(
                batch.topic_ids.tolist(), batch.queue_ids.tolist(), batch.sys_flags.tolist())):
            if sys_flag & fmt.SYS_FLAG_TRANSACTION_MASK not in _HIDDEN_TRANSACTION_TYPES:
                groups.setdefault((topic_id, queue_id), []).append(row)
        queue_offsets = batch.queue_offsets.tolist()
        offsets, sizes, codes = batch.commitlog_offsets.tolist(), batch.sizes.tolist(), batch.tags_codes.tolist()
        names = batch.topic_names
        for (topic_id, queue_id), rows in sorted(groups.items()):
            first = queue_offsets[rows[0]]
            if any(queue_offsets[row] != first + step for step, row in enumerate(rows)):
                raise self._not_dense(names[topic_id], queue_id, batch)
            self.dispatched_entries += self.table.put_lists(
                names[topic_id], queue_id, first, [offsets[row] for row in rows], [sizes[row] for row in rows],
                [codes[row] for row in rows])

    @staticmethod
    def _not_dense(topic: str, queue_id: int, batch: DispatchBatch) -> QueueGapError:
        return QueueGapError(f"queue offsets of {topic}/{queue_id} are not consecutive in the log from commitlog "
                               f"offset {batch.start_offset}", rule="consumequeue.dense")
