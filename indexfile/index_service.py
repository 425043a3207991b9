"""The index files of a store as one index: build, query, roll, truncate, expire (RocketMQ's IndexService).

Files are kept oldest first (name order = creation order). Keys go to the newest file until it is full, then
a new file is created that inherits the previous file's end offset and end time. A query walks the files
newest first, as RocketMQ does, so results are newest first too. One lock serializes writers and readers:
the dispatch thread builds while client threads query.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from mqstore.commitlog.errors import (
    CorruptionError,
    FlushFailedError,
    InvalidConfigError,
    InvalidMessageError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
)
from mqstore.commitlog.mapped_file import CREATING_SUFFIX, fsync_directory
from mqstore.indexfile import format as fmt
from mqstore.indexfile.index_file import PLACE_DONE, PLACE_FULL, PLACE_PYTHON_KEY, IndexFile

log = logging.getLogger(__name__)

QUERY_COUNT_MAX = 1 << 20  # offsets one query may return (RocketMQ caps at maxMsgsNumBatch, 64 by default)
INDEX_KEY_SEPARATOR_BYTE = b" "  # KEYS words (commitlog/format.py KEY_SEPARATOR)
PUT_FEW_KEYS_MAX = 48  # put_keys puts this many keys or fewer one by one


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class IndexService:
    """Every index file in `directory` (the store's `index/`), as one index.

    `hash_slot_count` and `index_entry_count_max` fix the file size and must be those the files were
    written with (RocketMQ's maxHashSlotNum and maxIndexNum). `clock_ms` names new files (tests pin it).
    """

    def __init__(self, directory: str | os.PathLike, hash_slot_count: int = fmt.HASH_SLOT_COUNT_DEFAULT,
                 index_entry_count_max: int = fmt.INDEX_ENTRY_COUNT_MAX_DEFAULT, read_only: bool = False, *,
                 clock_ms: Callable[[], int] = _now_ms):
        if hash_slot_count < 1:
            raise InvalidConfigError(f"hash_slot_count must be >= 1, got {hash_slot_count}")
        if index_entry_count_max < fmt.INDEX_ENTRY_COUNT_MAX_MIN:
            raise InvalidConfigError(
                f"index_entry_count_max must be >= {fmt.INDEX_ENTRY_COUNT_MAX_MIN}, got {index_entry_count_max}")
        size = fmt.file_size_bytes(hash_slot_count, index_entry_count_max)
        if size > fmt.FILE_SIZE_BYTES_MAX:
            raise InvalidConfigError(f"an index file of {hash_slot_count} slots and {index_entry_count_max} "
                                     f"entries is {size} bytes, over RocketMQ's {fmt.FILE_SIZE_BYTES_MAX}")
        self.directory = os.fspath(directory)
        self.hash_slot_count = hash_slot_count
        self.index_entry_count_max = index_entry_count_max
        self.read_only = read_only
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._files: list[IndexFile] = []
        self._closed = False
        self.damage_found: list[str] = []  # what the last `truncate` found breaking rules (7) and (8)
        self._load()

    def _load(self) -> None:
        try:
            if not os.path.isdir(self.directory):
                if self.read_only:
                    return
                os.makedirs(self.directory, exist_ok=True)
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            raise StoreIOError(f"cannot list index directory {self.directory}: {exc}") from exc
        try:
            for name in names:
                path = os.path.join(self.directory, name)
                if name.endswith(CREATING_SUFFIX) and not self.read_only:
                    log.warning("removing %s: a file whose creation was cut short", path)
                    os.unlink(path)
                    continue
                if fmt.parse_file_name(name) is None:
                    log.warning("ignoring %s: not an index file name", path)
                    continue
                self._files.append(IndexFile.open(path, self.hash_slot_count, self.index_entry_count_max,
                                                  read_only=self.read_only))
        except OSError as exc:
            for index_file in self._files:
                index_file.close()
            raise StoreIOError(f"cannot load index directory {self.directory}: {exc}") from exc
        except BaseException:
            for index_file in self._files:
                index_file.close()
            raise

    def refresh(self, *, list_files: bool = True) -> None:
        """Read-only: follow a writer in another process. The files that were not full read their headers again
        (the newest entries); with `list_files`, or when the newest file is full (the writer starts the next one
        then) or there is none, the directory is listed: files created since are opened, files it deleted are
        dropped. Without `list_files` deletions go unseen (an owner that knows of none passes False)."""
        with self._lock:
            self._check_open()
            assert self.read_only
            for index_file in self._files:
                if not index_file.is_full:
                    index_file.refresh()
            if not list_files and self._files and not self._files[-1].is_full:
                return
            try:
                names = set(os.listdir(self.directory)) if os.path.isdir(self.directory) else set()
            except OSError as exc:
                raise StoreIOError(f"cannot list index directory {self.directory}: {exc}") from exc
            kept = []
            for index_file in self._files:
                if index_file.name in names:
                    kept.append(index_file)
                else:
                    index_file.close()  # deleted by the writer (retention, a rebuild)
            known = {index_file.name for index_file in kept}
            newest = max(known) if known else ""
            added = []
            try:
                for name in sorted(names - known):
                    if name > newest and fmt.parse_file_name(name) is not None:  # names sort by creation time
                        added.append(IndexFile.open(os.path.join(self.directory, name), self.hash_slot_count,
                                                    self.index_entry_count_max, read_only=True))
            except OSError as exc:
                for index_file in added:
                    index_file.close()
                raise StoreIOError(f"cannot load index directory {self.directory}: {exc}") from exc
            self._files = kept + added

    # --- state -------------------------------------------------------------------------------------------
    @property
    def files(self) -> list[IndexFile]:
        """The open index files, oldest first (a copy of the list)."""
        with self._lock:
            return list(self._files)

    @property
    def max_indexed_offset(self) -> int:
        """The commitlog offset of the last message indexed (the newest file's endPhyOffset), 0 when none.

        Messages below it are indexed; the message at it may be, see `indexed_key_count_at`.
        """
        with self._lock:
            for index_file in reversed(self._files):  # a new file whose header never reached the disk says 0
                if index_file.entry_count or index_file.end_phy_offset:
                    return index_file.end_phy_offset
            return 0

    @property
    def entry_count(self) -> int:
        """Keys indexed over all files."""
        with self._lock:
            return sum(index_file.entry_count for index_file in self._files)

    def indexed_key_count_at(self, commitlog_offset: int) -> int:
        """How many keys of the message at `commitlog_offset` the newest entries already hold.

        The dispatcher uses it to resume a message whose keys were only partly indexed, without duplicates.
        """
        with self._lock:
            self._check_open()
            found = 0
            for index_file in reversed(self._files):  # bounded by the file count
                tail = index_file.tail_count(commitlog_offset)
                found += tail
                if tail < index_file.entry_count:
                    break
            return found

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index service on {self.directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyStoreError(f"index service on {self.directory} is open read-only")

    # --- building ----------------------------------------------------------------------------------------
    def _writable_file(self) -> IndexFile:
        """The newest file when it has room, else a new one inheriting the newest file's end."""
        newest = self._files[-1] if self._files else None
        if newest is not None and not newest.is_full:
            return newest
        name = fmt.next_file_name(self._clock_ms(), newest.name if newest is not None else None)
        created = IndexFile.create(
            os.path.join(self.directory, name), self.hash_slot_count, self.index_entry_count_max,
            end_phy_offset=newest.end_phy_offset if newest is not None else 0,
            end_timestamp_ms=newest.end_timestamp_ms if newest is not None else 0)
        self._files.append(created)
        return created

    def put_key(self, topic: str, key: str, commitlog_offset: int, store_timestamp_ms: int) -> None:
        """Index one key of one message (the scalar path; `put_keys` is the fast one)."""
        with self._lock:
            self._check_writable()
            self._check_order(commitlog_offset, commitlog_offset)
            key_hash = fmt.index_key_hash(fmt.index_key(topic, key))
            if not self._writable_file().put_key(key_hash, commitlog_offset, store_timestamp_ms):
                put = self._writable_file().put_key(key_hash, commitlog_offset, store_timestamp_ms)
                assert put, "a file just created has room"

    def put_keys(self, index_keys: Sequence[bytes], commitlog_offsets: Sequence[int],
                 store_timestamps_ms: Sequence[int]) -> int:
        """Index a batch of keys, one row per key, rows in commitlog order; returns the rows put.

        `index_keys` are UTF-8 encoded `topic#key` strings (`format.index_key`). Rolls to new files as they
        fill; a message's keys may span two files, as in RocketMQ.
        """
        count = len(index_keys)
        assert len(commitlog_offsets) == count == len(store_timestamps_ms)
        if count == 0:
            return 0
        if count <= PUT_FEW_KEYS_MAX:  # key by key: for a few keys the numpy passes cost more than the work
            put = IndexFile.put_rows  # the bytes put_hashes writes
            hashes = [fmt.encoded_index_key_hash(key) for key in index_keys]
            offsets = [int(offset) for offset in commitlog_offsets]
            timestamps = [int(timestamp) for timestamp in store_timestamps_ms]
            out_of_order = any(later < earlier for earlier, later in zip(offsets, offsets[1:]))
        else:
            put = IndexFile.put_hashes
            hashes = fmt.index_key_hashes(index_keys)
            offsets = np.asarray(commitlog_offsets, dtype=np.int64)
            timestamps = np.asarray(store_timestamps_ms, dtype=np.int64)
            out_of_order = bool((offsets[1:] < offsets[:-1]).any())
        with self._lock:
            self._check_writable()
            if out_of_order:
                raise InvalidMessageError("index keys must come in commitlog order")
            self._check_order(int(offsets[0]), int(offsets[-1]))
            done = 0
            while done < count:  # bounded: every pass puts at least one row (a new file has room)
                done += put(self._writable_file(), hashes[done:], offsets[done:], timestamps[done:])
        return count

    def put_messages(self, prefixes: Sequence[bytes], topic_ids: np.ndarray, key_columns: tuple,
                     commitlog_offsets: np.ndarray, store_timestamps_ms: np.ndarray, sys_flags: np.ndarray,
                     skip_mask: int, skip_value: int, row: int = 0) -> int:
        """Index the keys of messages rows[row:] with the compiled core (`IndexFile.place_native`); returns the
        keys put. Requires the extension (`commitlog.native.NATIVE`).

        One row per message: `prefixes[topic_ids[i]]` is its UTF-8 `topic#`; `key_columns` is (uniq_keys, keys),
        each message's raw UNIQ_KEY and KEYS values (None when absent), or (buffer, spans), their spans in a
        buffer as `DispatchBatch.property_span_chunks` gives them. A message with `sys_flag & skip_mask ==
        skip_value` has no keys. Each message's keys are UNIQ_KEY, then each non-empty space-separated KEYS word
        (as `indexfile.dispatcher.message_index_keys`): the same entries `put_keys` writes for those keys.
        Python keeps the policy: the core fills one file and says where it stopped; this rolls to the next file
        and calls again, and hashes the rare key that is not valid UTF-8 itself.
        """
        offsets = np.ascontiguousarray(commitlog_offsets, dtype=np.int64)
        count = len(offsets)
        spans = isinstance(key_columns[1], np.ndarray)
        timestamps = np.ascontiguousarray(store_timestamps_ms, dtype=np.int64)
        columns = (tuple(prefixes), np.ascontiguousarray(topic_ids, dtype=np.int64), key_columns[0],
                   np.ascontiguousarray(key_columns[1], dtype=np.int64) if spans else key_columns[1], offsets,
                   timestamps, np.ascontiguousarray(sys_flags, dtype=np.int64), skip_mask, skip_value)
        put = 0
        if row >= count:
            return 0
        with self._lock:
            self._check_writable()
            if bool((offsets[row + 1 :] < offsets[row:-1]).any()):
                raise InvalidMessageError("index keys must come in commitlog order")
            self._check_order(int(offsets[row]), int(offsets[-1]))
            key = 0
            # the newest file even when full: a new file is created only for a key that needs it (as put_keys)
            index_file = self._files[-1] if self._files else self._writable_file()
            while True:  # bounded: every pass places a key, fills a file, or ends
                row, key, placed, status = index_file.place_native(columns, row, key, spans=spans)
                put += placed
                if status == PLACE_DONE:
                    return put
                if status == PLACE_PYTHON_KEY:
                    if spans:
                        buffer, found = key_columns[0], columns[3]
                        uniq_key, keys = (bytes(buffer[found[k, row] : found[k + 1, row]]) if found[k, row] >= 0
                                          else None for k in (0, 2))
                    else:
                        uniq_key, keys = key_columns[0][row], key_columns[1][row]
                    self._put_python_key(prefixes[int(topic_ids[row])], uniq_key, keys, key, int(offsets[row]),
                                         int(timestamps[row]))
                    put += 1
                    key += 1
                    index_file = self._files[-1]
                else:
                    assert status == PLACE_FULL and index_file.is_full, (status, index_file)
                    index_file = self._writable_file()

    def _put_python_key(self, prefix: bytes, uniq_key: bytes | None, keys: bytes | None, key: int,
                        commitlog_offset: int, store_timestamp_ms: int) -> None:
        """The `key`-th index key of one message (not valid UTF-8), hashed and put by the Python path."""
        words = [] if uniq_key is None else [uniq_key]
        if keys:
            words.extend(word for word in keys.split(INDEX_KEY_SEPARATOR_BYTE) if word)
        key_hash = fmt.encoded_index_key_hash(prefix + words[key])
        if not self._writable_file().put_key(key_hash, commitlog_offset, store_timestamp_ms):
            put = self._writable_file().put_key(key_hash, commitlog_offset, store_timestamp_ms)
            assert put, "a file just created has room"

    def _check_order(self, first_offset: int, last_offset: int) -> None:
        assert first_offset <= last_offset
        indexed = self._files[-1].end_phy_offset if self._files else 0
        if first_offset < indexed or first_offset < 0:
            raise InvalidMessageError(f"commitlog offset {first_offset} is below the indexed end {indexed}")

    # --- querying ----------------------------------------------------------------------------------------
    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commitlog offsets of messages indexed under (topic, key) and stored within [begin_ms, end_ms],
        newest first, at most `max_count` (RocketMQ's queryOffset).

        Entries are matched by key hash only: another key with the same hash matches too, and the caller
        filters by reading the messages. Like RocketMQ, the walk stops at the first file that begins
        before `begin_ms`.
        """
        assert 0 <= max_count <= QUERY_COUNT_MAX, max_count
        key_hash = fmt.index_key_hash(fmt.index_key(topic, key))
        found: list[int] = []
        if max_count <= 0 or begin_ms > end_ms:
            return found
        with self._lock:
            self._check_open()
            for index_file in reversed(self._files):  # bounded by the file count
                if index_file.is_time_matched(begin_ms, end_ms):
                    index_file.select(key_hash, begin_ms, end_ms, max_count, found)
                if index_file.begin_timestamp_ms < begin_ms or len(found) >= max_count:
                    break
        return found

    # --- maintenance -------------------------------------------------------------------------------------
    def truncate(self, commitlog_offset: int, *, crashed: bool = True) -> int:
        """Make the index a gap-free prefix of the log ending below `commitlog_offset`; returns entries dropped.

        Walks the files oldest first. A file is scanned (`IndexFile.truncate`: keep its longest valid prefix
        below the cut, rebuild its slots) when it may hold entries at or past the cut (endPhyOffset >= cut),
        when rules (7) or (8) of `indexfile.format` fail for it, and, after a crash (`crashed`), when it is the
        newest (heals a put stopped between its header and slot writes). The walk stops at the first file left
        empty (deleted, unless it is a newest file that needed no scan) or not full: every later file is
        deleted, newest first, since its entries lie after a hole that the re-dispatch from
        `max_indexed_offset` would not fill. A file below the cut that passes the O(1) checks is trusted: an
        index flush writes every file whole, so its entries were on disk. What rules (7) and (8) found is kept
        in `damage_found`, for the recovery report.
        """
        with self._lock:
            self._check_writable()
            self.damage_found = []
            dropped = 0
            previous_end = 0
            stop = len(self._files)
            for position, index_file in enumerate(self._files):  # bounded by the file count
                newest = position == len(self._files) - 1
                scan = self._scan_reason(index_file, commitlog_offset, previous_end, newest=newest,
                                         crashed=crashed)
                if scan is not None:
                    dropped += index_file.truncate(commitlog_offset, previous_end)
                if index_file.entry_count == 0:
                    stop = position + 1 if newest and scan is None else position
                    break
                previous_end = index_file.end_phy_offset
                if not index_file.is_full:
                    stop = position + 1
                    break
            cut = list(reversed(self._files[stop:]))
            for index_file in cut:  # newest first: a crash leaves a prefix
                dropped += index_file.entry_count
                self._files.remove(index_file)
                index_file.delete()
            if cut:
                fsync_directory(self.directory)
            return dropped

    def _scan_reason(self, index_file: IndexFile, commitlog_offset: int, previous_end: int, *, newest: bool,
                     crashed: bool) -> str | None:
        """Why `truncate` must scan `index_file` ("" for a routine reason, the rule broken for damage), or None."""
        try:
            index_file.check_tail()
            broken = _rule_8(index_file, previous_end, newest=newest)
        except CorruptionError as exc:
            broken = exc
        if broken is not None:
            damage = str(broken)
            log.warning("cutting the index at %s: %s", index_file.name, damage)
            self.damage_found.append(damage)
            return damage
        if index_file.end_phy_offset >= commitlog_offset or (crashed and newest):
            return ""
        return None

    def delete_files_below(self, commitlog_offset_min: int) -> int:
        """Delete the oldest files whose endPhyOffset is below the log's new minimum offset (RocketMQ's
        deleteExpiredFile): consecutive from the oldest, never the newest file. Returns the files deleted."""
        with self._lock:
            self._check_writable()
            deleted = 0
            while len(self._files) > 1 and self._files[0].end_phy_offset < commitlog_offset_min:
                oldest = self._files.pop(0)
                oldest.delete()
                deleted += 1
            return deleted

    def check(self) -> None:
        """Check every slot and entry of every file (rules 4 to 9); CorruptionError at the first break."""
        found = self.problems()
        if found:
            raise found[0]

    def problems(self) -> list[CorruptionError]:
        """What `check` checks, in every file: each file's first break of rules 4 to 7 and 9, and its break of
        rule 8, oldest file first (empty when the index is sound)."""
        found = []
        with self._lock:
            self._check_open()
            previous_end = 0
            for position, index_file in enumerate(self._files):
                try:
                    index_file.check()
                except CorruptionError as exc:
                    found.append(exc)
                broken = _rule_8(index_file, previous_end, newest=position == len(self._files) - 1)
                if broken is not None:
                    found.append(broken)
                if index_file.entry_count:
                    previous_end = index_file.end_phy_offset
        return found

    def flush(self) -> int:
        """Flush (fdatasync) every file written since the last flush; returns the `max_indexed_offset` now durable.

        `put_keys` runs under the same lock and IndexDispatcher puts all keys of a message in one call, so
        the message at the returned offset has all its keys on disk: after a power loss,
        `truncate(returned + 1)` keeps only entries that were durable.
        """
        with self._lock:
            self._check_open()
            for index_file in self._files:
                index_file.flush()
            return self._files[-1].end_phy_offset if self._files else 0

    def close(self) -> None:
        """Flush and unmap every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            files, self._files = self._files, []
            failed = None  # every file is closed (unmapped) even after one's last flush failed; then that is raised
            for index_file in files:
                try:
                    index_file.close()
                except FlushFailedError as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed

    def __enter__(self) -> IndexService:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _rule_8(index_file: IndexFile, previous_end: int, *, newest: bool) -> CorruptionError | None:
    """Rule (8) of indexfile/format.py for one file among its index's: broken (the error), or None."""
    if not newest and not index_file.is_full:
        return CorruptionError(f"index file {index_file.path} is not full but not the newest [rule 8]",
                               path=index_file.path, offset=fmt.OFFSET_INDEX_COUNT, rule="indexfile.8")
    if index_file.entry_count and index_file.begin_phy_offset < previous_end:
        return CorruptionError(f"index file {index_file.path} begins at {index_file.begin_phy_offset}, before the "
                               f"previous file's end {previous_end} [rule 8]", path=index_file.path,
                               offset=fmt.OFFSET_BEGIN_PHY_OFFSET, rule="indexfile.8")
    return None
