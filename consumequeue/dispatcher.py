"""The dispatcher that builds ConsumeQueues from the CommitLog (RocketMQ's CommitLogDispatcherBuildConsumeQueue).

Transaction-prepared and rolled-back messages get no entry, as in RocketMQ: they are not consumable.
"""

from __future__ import annotations

import numpy as np

from commitlog import format as fmt
from commitlog.dispatch import DispatchBatch
from commitlog.errors import CorruptionError
from consumequeue import format as cqf
from consumequeue.consume_queue import ConsumeQueueTable

_HIDDEN_TRANSACTION_TYPES = (fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE, fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE)


class ConsumeQueueDispatcher:
    """Groups a batch by (topic, queue_id) and appends each group's units with one numpy write."""

    def __init__(self, table: ConsumeQueueTable):
        self.table = table
        self.dispatched_entries = 0

    def dispatch(self, batch: DispatchBatch) -> None:
        count = len(batch)
        if not count:
            return
        codes_of: dict[tuple[str, int], int] = {}
        codes = np.fromiter(
            (codes_of.setdefault(key, len(codes_of)) for key in zip(batch.topics, batch.queue_ids)),
            dtype=np.int64, count=count)
        offsets = np.asarray(batch.commitlog_offsets, dtype=np.int64)
        sizes = np.asarray(batch.sizes, dtype=np.int64)
        tags = np.asarray(batch.tags_codes, dtype=np.int64)
        queue_offsets = np.asarray(batch.queue_offsets, dtype=np.int64)
        transaction = np.asarray(batch.sys_flags, dtype=np.int64) & fmt.SYS_FLAG_TRANSACTION_MASK
        visible = ~np.isin(transaction, _HIDDEN_TRANSACTION_TYPES)
        if len(codes_of) == 1:
            groups = [(next(iter(codes_of)), np.flatnonzero(visible) if not visible.all() else slice(None))]
        else:
            order = np.argsort(codes, kind="stable")
            order = order[visible[order]]
            sorted_codes = codes[order]
            bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
            keys = list(codes_of)
            groups = [(keys[int(sorted_codes[a])], order[a:b])
                      for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(order)]) if b > a]
        for (topic, queue_id), index in groups:
            group_offsets = queue_offsets[index]
            if not len(group_offsets):
                continue
            first = int(group_offsets[0])
            if int(group_offsets[-1]) - first != len(group_offsets) - 1 or (
                    len(group_offsets) > 1 and np.diff(group_offsets).min() != 1):
                raise CorruptionError(f"queue offsets of {topic}/{queue_id} are not consecutive in the log "
                                      f"from commitlog offset {batch.start_offset}", rule="dense")
            units = cqf.make_units(offsets[index], sizes[index], tags[index])
            self.dispatched_entries += self.table.get_or_create(topic, queue_id).put(first, units)
