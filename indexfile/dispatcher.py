"""The index dispatcher: builds the IndexFiles from the CommitLog's dispatch batches (RocketMQ's buildIndex).

For each message, in log order, the UNIQ_KEY property is indexed first, then each non-empty word of the
space-separated KEYS property, each under `topic#key`. As in RocketMQ 4.4.0, only transaction rollback
messages are skipped (prepared, commit and plain messages are indexed), and messages below the index's end
(`IndexService.max_indexed_offset`) are a replay and ignored. The message at that end may have been cut
short between two of its keys: its keys already in the index are skipped, the rest are added, so a replay
neither loses nor duplicates keys (RocketMQ re-indexes that message in full).
"""

from __future__ import annotations

import numpy as np
from mqstore.commitlog import format as log_format
from mqstore.commitlog.dispatch import DispatchBatch
from mqstore.commitlog.native import NATIVE
from mqstore.indexfile import format as fmt
from mqstore.indexfile.index_service import IndexService

TOPIC_PREFIX_CACHE_MAX = 4096  # distinct topics whose `topic#` bytes are kept between batches
UNIQ_KEYS_ONLY_RECORDS_MIN = 24  # larger batches of messages with a UNIQ_KEY and no KEYS skip the per-message loop
_KEY_SEPARATOR = log_format.KEY_SEPARATOR.encode("ascii")
_INDEX_KEY_SEPARATOR = fmt.INDEX_KEY_SEPARATOR.encode("ascii")
_TRANSACTION_MASK = log_format.SYS_FLAG_TRANSACTION_MASK
_ROLLBACK = log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE
_INDEX_PROPERTIES = (log_format.PROPERTY_UNIQ_KEY.encode("ascii"), log_format.PROPERTY_KEYS.encode("ascii"))


def message_index_keys(prefix: bytes, uniq_key: bytes | None, keys: bytes | None) -> list[bytes]:
    """The index keys of one message, in the order RocketMQ puts them: UNIQ_KEY, then each KEYS word."""
    found = [] if uniq_key is None else [prefix + uniq_key]
    if keys:
        found.extend(prefix + key for key in keys.split(_KEY_SEPARATOR) if key)
    return found


class IndexDispatcher:
    """A `commitlog.dispatch.Dispatcher` that feeds an `IndexService`, one `put_keys` call per batch."""

    @property
    def properties(self) -> tuple[bytes, ...]:
        """The properties the batch decoder reads for every record (`DispatchBatch.property_values`): none for
        the compiled placement, which reads the values' spans itself (`property_span_chunks`)."""
        return () if NATIVE is not None else _INDEX_PROPERTIES

    def __init__(self, service: IndexService):
        self.service = service
        self._prefixes: dict[str, bytes] = {}

    def _prefix(self, topic: str) -> bytes:
        prefix = self._prefixes.get(topic)
        if prefix is None:
            if len(self._prefixes) >= TOPIC_PREFIX_CACHE_MAX:
                self._prefixes.clear()
            prefix = self._prefixes[topic] = topic.encode("utf-8") + _INDEX_KEY_SEPARATOR
        return prefix

    def dispatch(self, batch: DispatchBatch) -> None:
        """Index the keys of every message of `batch` not indexed yet."""
        indexed = self.service.max_indexed_offset
        if NATIVE is not None:
            self._dispatch_native(batch, indexed)
            return
        if len(batch) > UNIQ_KEYS_ONLY_RECORDS_MIN and self._put_uniq_keys_only(batch, indexed):
            return
        index_keys: list[bytes] = []
        offsets: list[int] = []
        timestamps: list[int] = []
        add_key, add_offset, add_timestamp = index_keys.append, offsets.append, timestamps.append
        prefixes = self._prefixes
        for offset, topic, sys_flag, timestamp, uniq_key, keys in zip(
                batch.commitlog_offsets.tolist(), batch.topics, batch.sys_flags.tolist(),
                batch.store_timestamps_ms.tolist(), batch.uniq_keys, batch.keys):
            if offset <= indexed or sys_flag & _TRANSACTION_MASK == _ROLLBACK:
                if offset == indexed and sys_flag & _TRANSACTION_MASK != _ROLLBACK:
                    resumed = message_index_keys(self._prefix(topic), uniq_key, keys)
                    resumed = resumed[self.service.indexed_key_count_at(offset):]
                    index_keys.extend(resumed)
                    offsets.extend([offset] * len(resumed))
                    timestamps.extend([timestamp] * len(resumed))
                continue
            if uniq_key is None and not keys:
                continue
            prefix = prefixes.get(topic)
            if prefix is None:
                prefix = self._prefix(topic)
            if uniq_key is not None:
                add_key(prefix + uniq_key)
                add_offset(offset)
                add_timestamp(timestamp)
            if keys:
                if _KEY_SEPARATOR in keys:
                    for key in keys.split(_KEY_SEPARATOR):
                        if key:
                            add_key(prefix + key)
                            add_offset(offset)
                            add_timestamp(timestamp)
                else:
                    add_key(prefix + keys)
                    add_offset(offset)
                    add_timestamp(timestamp)
        if index_keys:
            self.service.put_keys(index_keys, offsets, timestamps)

    def _dispatch_native(self, batch: DispatchBatch, indexed: int) -> None:
        """`dispatch` with the keys hashed and placed by the compiled core (`IndexService.put_messages`), from
        the values' spans in the log's own buffers (nothing sliced per message): the messages past the index's
        end in one call per segment; the message at the end, when a replay finds it partly indexed, through
        `put_keys` first (the rest of its keys)."""
        count = len(batch)
        if count == 0:
            return
        offsets = batch.commitlog_offsets
        start = int(np.searchsorted(offsets, indexed, side="right"))  # offsets ascend: rows before are a replay
        if start and int(offsets[start - 1]) == indexed and int(batch.sys_flags[start - 1]) & _TRANSACTION_MASK \
                != _ROLLBACK:
            at = start - 1
            resumed = message_index_keys(self._prefix(batch.topic_names[int(batch.topic_ids[at])]),
                                         batch.uniq_keys[at], batch.keys[at])
            resumed = resumed[self.service.indexed_key_count_at(indexed):]
            if resumed:
                timestamp = int(batch.store_timestamps_ms[at])
                self.service.put_keys(resumed, [indexed] * len(resumed), [timestamp] * len(resumed))
        if start >= count:
            return
        prefixes = [self._prefix(topic) for topic in batch.topic_names]
        chunks = batch.property_span_chunks(_INDEX_PROPERTIES)
        if chunks is None:
            self.service.put_messages(prefixes, batch.topic_ids, (batch.uniq_keys, batch.keys), offsets,
                                      batch.store_timestamps_ms, batch.sys_flags, _TRANSACTION_MASK, _ROLLBACK, start)
            return
        for buffer, first, spans in chunks:  # one per segment the batch spans
            last = first + spans.shape[1]
            if last > start:
                self.service.put_messages(prefixes, batch.topic_ids[first:last], (buffer, spans),
                                          offsets[first:last], batch.store_timestamps_ms[first:last],
                                          batch.sys_flags[first:last], _TRANSACTION_MASK, _ROLLBACK,
                                          max(start - first, 0))

    def _put_uniq_keys_only(self, batch: DispatchBatch, indexed: int) -> bool:
        """The common batch of mqstore's messages without keys, in list passes instead of the per-message loop:
        every message is past the index's end, none is a rollback, each has a UNIQ_KEY and none has KEYS (one
        key each). Returns False, having put nothing, for any other batch. (For messages with KEYS the same
        passes measured no faster than the loop.)"""
        uniq_keys = batch.uniq_keys
        if (int(batch.commitlog_offsets[0]) <= indexed or None in uniq_keys or any(batch.keys)
                or bool(((batch.sys_flags & _TRANSACTION_MASK) == _ROLLBACK).any())):
            return False
        prefixes = [self._prefix(topic) for topic in batch.topic_names]
        index_keys = list(map(bytes.__add__, [prefixes[topic_id] for topic_id in batch.topic_ids.tolist()], uniq_keys))
        self.service.put_keys(index_keys, batch.commitlog_offsets.tolist(), batch.store_timestamps_ms.tolist())
        return True
