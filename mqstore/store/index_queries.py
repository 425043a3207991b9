"""The store's IndexFile side: opening (and rebuilding) the index, lookups by key, flushing it.

`IndexLookups` is mixed into MessageStore; it uses the store's `_index`, `_commitlog`, `config`, `root_dir`,
`read_only`, `_follows_queues`, `_read_log_min` and `read_at`. With a tier, the index files stay on local disk
after the segments they point into left it (mqstore/store/retention.py): a lookup reads those messages from the
tier.
"""

from __future__ import annotations

import logging
import os
import shutil

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import validate_topic
from mqstore.commitlog.errors import ConfigMismatchError, CorruptionError, InvalidMessageError, StoreIOError
from mqstore.commitlog.message import StoredMessage
from mqstore.indexfile import format as index_format
from mqstore.indexfile.index_service import IndexService
from mqstore.store.config import StoreConfig

log = logging.getLogger(__name__)

QUERY_MAX_COUNT_LIMIT = 1024  # messages one query() may return
QUERY_COLLISION_FACTOR = 2  # index entries asked for per wanted message (hash collisions are filtered after)


class IndexLookups:
    """Lookups by key, message id and UNIQ_KEY (the public part of the index), mixed into MessageStore."""

    def _open_index(self) -> IndexService:
        """The store's IndexService. Index files are derived data: a writer that finds them corrupt, or of
        another size than the config gives (cut short, or made with other sizes), deletes them and rebuilds the
        index from the CommitLog (dispatch replays the log into the empty index). A reader cannot rebuild:
        other sizes are a ConfigMismatchError for it."""
        config = self.config
        directory = os.path.join(self.root_dir, "index")
        try:
            check_index_sizes(directory, config)
            return IndexService(directory, config.index_slot_count, config.index_entry_count_max,
                                read_only=self.read_only)
        except (CorruptionError, ConfigMismatchError) as exc:
            if self.read_only:
                raise
            log.warning("rebuilding the index of %s from the CommitLog: %s", self.root_dir, exc)
            self.index_rebuilt_because = str(exc)
            try:
                shutil.rmtree(directory)
            except OSError as remove_error:
                raise StoreIOError(f"cannot remove the corrupt index {directory}: {remove_error.strerror}") \
                    from remove_error
            return IndexService(directory, config.index_slot_count, config.index_entry_count_max)

    def _index_service(self) -> IndexService:
        self._check_open()
        if self._index is None:
            raise InvalidMessageError("this store was opened with index_enabled=False: no lookups by key")
        if self._follows_queues:  # follow the process that writes it: its new keys and files
            # A writer with a dispatch process knows when files go (its own retention asks for it); a reader
            # does not, and lists the directory every time.
            self._index.refresh(list_files=self.read_only or self._index_files_trimmed)
            self._index_files_trimmed = False
        return self._index

    def query(self, topic: str, key: str, max_count: int = 32, begin_ms: int = 0,
              end_ms: int | None = None) -> list[StoredMessage]:
        """Messages of `topic` whose KEYS or UNIQ_KEY hold `key`, stored in [begin_ms, end_ms], newest first.

        Exact matches only: index entries whose key merely shares the hash are read and dropped. Each message
        once: one whose KEYS name the key twice (or name its UNIQ_KEY) has an index entry per time, and
        RocketMQ's queryMessage returns it that many times; this does not.
        """
        index = self._index_service()
        validate_topic(topic)
        if not isinstance(key, str) or not key:
            raise InvalidMessageError(f"key must be a non-empty str, got {key!r}")
        if type(max_count) is not int or not 1 <= max_count <= QUERY_MAX_COUNT_LIMIT:
            raise InvalidMessageError(f"max_count must be an int in 1..{QUERY_MAX_COUNT_LIMIT}, got {max_count!r}")
        if end_ms is None:
            end_ms = 2**63 - 1
        if type(begin_ms) is not int or type(end_ms) is not int:
            raise InvalidMessageError("begin_ms and end_ms must be ints")
        wanted = max_count
        key_hash = index_format.index_key_hash(index_format.index_key(topic, key))
        while True:
            asked = min(QUERY_MAX_COUNT_LIMIT * QUERY_COLLISION_FACTOR, wanted * QUERY_COLLISION_FACTOR)
            # Index entries keep whole seconds: ask a second wider, then filter by the exact store time.
            offsets = index.query(topic, key, asked, max(0, begin_ms - 1000), min(2**63 - 1, end_ms + 1000))
            found = []
            seen = set()
            for offset in offsets:
                if offset in seen:  # another index entry of a message already looked at
                    continue
                seen.add(offset)
                message = self._read_indexed(offset)
                if message is None:
                    continue
                if not has_key(message, topic, key):
                    _check_collision(message, key_hash, index.directory, offset)
                elif begin_ms <= message.store_timestamp_ms <= end_ms:
                    found.append(message)
            if (len(found) >= max_count or len(offsets) < asked
                    or asked >= QUERY_MAX_COUNT_LIMIT * QUERY_COLLISION_FACTOR):
                return found[:max_count]
            wanted *= 4  # many collisions: look further

    def _read_indexed(self, commitlog_offset: int) -> StoredMessage | None:
        """The message an index entry points to; None when it is below the log's minimum as reads see it (deleted;
        with a tier, below the tier's start). CorruptionError naming the index when no record starts there (the
        entry is damaged), naming the segment (or the tier's object) when the record there is damaged."""
        if commitlog_offset < self._read_log_min():
            return None
        try:
            return self.read_at(commitlog_offset)
        except InvalidMessageError as exc:  # outside the log, or no record starts there (rules 1 and 4)
            raise CorruptionError(f"an index entry points at commitlog offset {commitlog_offset}, where no record "
                                  f"starts ({exc})", path=self._index.directory, offset=commitlog_offset,
                                  rule="indexfile.entry") from exc

    def get_by_msg_id(self, msg_id: str) -> StoredMessage:
        """The message with this offset message id (the record there must have the id's store host and port)."""
        self._check_open()
        host, commitlog_offset = fmt.parse_message_id(msg_id)
        message = self.read_at(commitlog_offset)
        if message.store_host_raw != host:
            stored_by = message.store_host_raw.hex().upper()
            raise InvalidMessageError(f"message id {msg_id} names store host {host.hex().upper()}, but the message "
                                      f"at offset {commitlog_offset} was stored by {stored_by}")
        return message

    def get_by_unique_key(self, topic: str, uniq_key: str) -> StoredMessage | None:
        """The newest message of `topic` whose UNIQ_KEY property is `uniq_key`, or None."""
        for message in self.query(topic, uniq_key, max_count=QUERY_MAX_COUNT_LIMIT):
            if message.properties.get(fmt.PROPERTY_UNIQ_KEY) == uniq_key:
                return message
        return None


class IndexFlushable:
    """The IndexService seen by a flush service: dirty while entries were added since its last flush."""

    def __init__(self, service: IndexService):
        self.service = service
        self.flushed_entry_count = service.entry_count
        self.flushed_timestamp_ms = 0
        self.flushed_end = 0

    def dirty_bytes(self) -> int:
        return (self.service.entry_count - self.flushed_entry_count) * index_format.ENTRY_SIZE_BYTES

    def flush(self) -> int:
        """Flush the index; afterwards `flushed_end` is a commitlog offset below which every message's keys are
        on disk (the message at the returned position has all its keys written before the flush)."""
        files = self.service.files
        timestamp = files[-1].end_timestamp_ms if files else 0  # read first: never newer than what is flushed
        count = self.service.entry_count
        position = self.service.flush()
        self.flushed_entry_count = count
        self.flushed_timestamp_ms = max(self.flushed_timestamp_ms, timestamp)
        if count:
            self.flushed_end = max(self.flushed_end, position + 1)
        return position


def check_index_sizes(directory: str, config: StoreConfig) -> None:
    """ConfigMismatchError when a store's index file has another size than `config` makes."""
    try:
        names = sorted(n for n in os.listdir(directory) if index_format.parse_file_name(n) is not None)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreIOError(f"cannot list {directory}: {exc.strerror}") from exc
    expected = index_format.file_size_bytes(config.index_slot_count, config.index_entry_count_max)
    for name in names:
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise StoreIOError(f"cannot read {path}: {exc.strerror}") from exc
        if size == expected:
            continue
        raise ConfigMismatchError(
            f"index file {path} is {size} bytes; index_slot_count={config.index_slot_count} and "
            f"index_entry_count_max={config.index_entry_count_max} make {expected}-byte files. Open with the "
            "sizes the store was written with, or with index_enabled=False")


def _check_collision(message: StoredMessage, key_hash: int, index_directory: str, offset: int) -> None:
    """An index entry with `key_hash` led to `message`, which lacks the key asked for: fine when one of its own
    keys has that hash (two keys share it), else the entry's phyOffset is damaged (CorruptionError)."""
    properties = message.properties
    keys = [properties.get(fmt.PROPERTY_UNIQ_KEY)] + properties.get(fmt.PROPERTY_KEYS, "").split(" ")
    if not any(index_format.index_key_hash(index_format.index_key(message.topic, k)) == key_hash
               for k in keys if k):
        raise CorruptionError(f"an index entry of key hash {key_hash} points at commitlog offset {offset}, a "
                              f"message none of whose keys has that hash", path=index_directory, offset=offset,
                              rule="indexfile.entry")


def has_key(message: StoredMessage, topic: str, key: str) -> bool:
    """Whether `message` is in `topic` and holds `key` in KEYS or as its UNIQ_KEY (what the index maps)."""
    if message.topic != topic:
        return False
    properties = message.properties
    return properties.get(fmt.PROPERTY_UNIQ_KEY) == key or key in properties.get(fmt.PROPERTY_KEYS, "").split(" ")


def checkpoint_logical_flush(checkpoint, queues, index_flushable: IndexFlushable | None, *,
                             physic_ms: int | None = None) -> None:
    """After the ConsumeQueues and the index were flushed: record their times (and the log's, when given) in the
    checkpoint and write it (RocketMQ does it there). The writer's queue flusher and the dispatch process call it."""
    checkpoint.update(physic_ms=physic_ms, logics_ms=queues.flushed_timestamp_ms,
                      index_ms=index_flushable.flushed_timestamp_ms if index_flushable is not None else None,
                      index_flushed_end=index_flushable.flushed_end if index_flushable is not None else None)
    checkpoint.flush()
