"""The lease state of one (topic, group) and the journal file that holds it (format: mqstore/lease/format.py).

`LeaseJournal.locked()` takes the flock, reads what other consumers appended since this one last looked (or the
whole file again when compaction replaced it), truncates a torn tail, and yields the `LeaseState`; `append`
writes one frame and applies its records to the state, so the state in memory always equals the replay of the
file up to `position`. Writes go through write(2): once `append` returns, the frame survives a kill -9 of any
process (it is in the page cache). With `sync=True` it is also fdatasynced before `append` returns, and so
survives a power loss. `ack_one` is `locked()` + `append` of one ACK for the hot path of `LeaseConsumer.ack`.

Whether to read at all is decided by one `lseek(SEEK_END)` against `position`: a compaction appends a MOVED
frame to the file it replaces before the rename, so growth is the only sign a consumer needs.
"""

from __future__ import annotations

import fcntl
import heapq
import os

from mqstore.commitlog.errors import StoreIOError
from mqstore.commitlog.mapped_file import write_file_atomically
from mqstore.lease import format as fmt

LEASE_DIR_NAME = "lease"
JOURNAL_SUFFIX = ".journal"
LOCK_SUFFIX = ".lock"
COMPACT_BYTES = 8 << 20  # a journal longer than this is replaced by a snapshot
EXPIRY_HEAP_SLACK = 4096  # stale expiry entries kept before the heap is rebuilt from the live leases

_flock = fcntl.flock
_lseek = os.lseek
_SEEK_END = os.SEEK_END
_MOVED = fmt.KIND_MOVED
_SEQUENCE = fmt.KIND_SEQUENCE
assert fmt.KIND_MOVED > fmt.KIND_SEQUENCE > max(fmt.KIND_BASE, fmt.KIND_LEASE, fmt.KIND_ACK, fmt.KIND_DEAD)
_os_write = os.write
_LOCK_EX = fcntl.LOCK_EX
_LOCK_UN = fcntl.LOCK_UN
_pack_record = fmt.RECORD.pack
_pack_frame = fmt.FRAME.pack
_crc32 = fmt.crc32
_ACK = fmt.KIND_ACK
_LEASE = fmt.KIND_LEASE
_BASE = fmt.KIND_BASE
_DEAD = fmt.KIND_DEAD
_FRAME_MAGIC = fmt.FRAME_MAGIC
_ACK_FRAME_BYTES = fmt.FRAME_BYTES + fmt.RECORD_BYTES


class QueueLeases:
    """One queue's lease state. `leases`: queue offset -> (lease_id, deadline_ms, delivery_count)."""

    __slots__ = ("base", "next", "leases", "acked")

    def __init__(self, base: int):
        self.base = base  # every entry below it is acknowledged
        self.next = base  # no entry at or past it was handed out yet
        self.leases: dict[int, tuple[int, int, int]] = {}
        self.acked: set[int] = set()  # acknowledged entries above `base`


class LeaseState:
    """The replay of a journal: the queues, the last lease id, and a heap of (deadline_ms, queue, offset, id)."""

    def __init__(self):
        self.queues: dict[int, QueueLeases] = {}
        self.last_lease_id = 0
        self.expiry: list[tuple[int, int, int, int]] = []
        self.live_count = 0

    def apply(self, records) -> None:
        """Apply records (tuples as format.RECORD unpacks them) in order."""
        queues = self.queues
        push = heapq.heappush
        expiry = self.expiry
        for kind, _, delivery_count, queue_id, queue_offset, value_a, value_b in records:
            if kind >= _SEQUENCE:  # SEQUENCE, MOVED: no queue's record
                if kind == _SEQUENCE and value_a > self.last_lease_id:
                    self.last_lease_id = value_a
                continue
            queue = queues.get(queue_id)
            if queue is None:
                queue = queues[queue_id] = QueueLeases(queue_offset if kind == _BASE else 0)
            if kind == _LEASE:
                if queue_offset >= queue.next:  # a first delivery (no lease or ack is at or past `next`)
                    queue.next = queue_offset + 1
                    self.live_count += 1
                elif queue_offset < queue.base or queue_offset in queue.acked:
                    continue
                elif queue_offset not in queue.leases:
                    self.live_count += 1
                queue.leases[queue_offset] = (value_a, value_b, delivery_count)
                if value_a > self.last_lease_id:
                    self.last_lease_id = value_a
                push(expiry, (value_b, queue_id, queue_offset, value_a))
            elif kind == _ACK or kind == _DEAD:
                self.acknowledge(queue, queue_offset)
            else:  # BASE
                self._move_base(queue, queue_offset, value_a)
        if len(expiry) > 2 * self.live_count + EXPIRY_HEAP_SLACK:
            self._rebuild_expiry()

    def acknowledge(self, queue: QueueLeases, queue_offset: int) -> None:
        """Apply one ACK (or DEAD) record to `queue`, one of `queues`."""
        if queue.leases.pop(queue_offset, None) is not None:
            self.live_count -= 1
        if queue_offset >= queue.next:
            queue.next = queue_offset + 1
        if queue_offset == queue.base:
            base = queue_offset + 1
            acked = queue.acked
            while base in acked:
                acked.remove(base)
                base += 1
            queue.base = base
        elif queue_offset > queue.base:
            queue.acked.add(queue_offset)

    def _move_base(self, queue: QueueLeases, base: int, next_offset: int) -> None:
        if base > queue.base:
            dropped = [offset for offset in queue.leases if offset < base]
            for offset in dropped:
                del queue.leases[offset]
            self.live_count -= len(dropped)
            queue.acked = {offset for offset in queue.acked if offset >= base}
            queue.base = base
            while queue.base in queue.acked:
                queue.acked.remove(queue.base)
                queue.base += 1
        queue.next = max(queue.next, next_offset, queue.base)

    def _rebuild_expiry(self) -> None:
        self.expiry = [(deadline, queue_id, offset, lease_id) for queue_id, queue in self.queues.items()
                       for offset, (lease_id, deadline, _) in queue.leases.items()]
        heapq.heapify(self.expiry)

    def snapshot_records(self) -> list[bytes]:
        """The records of a journal that replays to this state."""
        records = [fmt.record(fmt.KIND_SEQUENCE, 0, 0, self.last_lease_id)]
        for queue_id, queue in sorted(self.queues.items()):
            records.append(fmt.record(fmt.KIND_BASE, queue_id, queue.base, queue.next))
            for offset, (lease_id, deadline, count) in sorted(queue.leases.items()):
                records.append(fmt.record(fmt.KIND_LEASE, queue_id, offset, lease_id, deadline, count))
            for offset in sorted(queue.acked):
                records.append(fmt.record(fmt.KIND_ACK, queue_id, offset, 0))
        return records


def journal_paths(root_dir, topic: str, group: str) -> tuple[str, str]:
    """(journal path, lock path) of a (topic, group) in the store under `root_dir`."""
    base = os.path.join(os.fspath(root_dir), LEASE_DIR_NAME, f"{topic}@{group}")
    return base + JOURNAL_SUFFIX, base + LOCK_SUFFIX


class LeaseJournal:
    """One consumer's handle on the shared journal of a (topic, group). Not thread-safe: the caller locks."""

    def __init__(self, root_dir, topic: str, group: str, *, sync: bool = False,
                 compact_bytes: int = COMPACT_BYTES):
        self.path, self.lock_path = journal_paths(root_dir, topic, group)
        self.sync = sync
        self.compact_bytes = compact_bytes
        self.state = LeaseState()
        self.position = 0  # the file position up to which `state` is the replay
        self._fd: int | None = None
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreIOError(f"cannot open {self.lock_path}: {exc.strerror}") from exc

    def locked(self) -> "_Locked":
        """A context manager: holds the flock and yields the state, caught up with the file."""
        return _Locked(self)

    def catch_up(self) -> None:
        """Apply what was appended since `position` (the caller holds the flock).

        One fstat answers both questions: was the journal replaced (compaction renamed a snapshot over it, so
        our file has no name left: st_nlink 0; or it was deleted) and did it grow.
        """
        if self._fd is not None and _lseek(self._fd, 0, _SEEK_END) == self.position != 0:
            return  # the common case: nobody appended since we looked (a compaction appends MOVED first)
        if self._fd is None:
            self._reopen()
        try:
            status = os.fstat(self._fd)
        except OSError as exc:
            raise StoreIOError(f"cannot stat {self.path}: {exc.strerror}") from exc
        if status.st_nlink == 0:
            self._reopen()
            status = os.fstat(self._fd)
        size = status.st_size
        if size == self.position != 0:  # the common case: nobody appended since we looked
            return
        if self.position == 0:
            self._read_header(size)
        if size > self.position:
            raw = os.pread(self._fd, size - self.position, self.position)
            records, end = fmt.decode_frames(raw, self.position, self.path)
            self.state.apply(records)
            self.position = end
            if end < size:  # a torn tail: its writer died inside write(), or a failed write of ours
                os.ftruncate(self._fd, end)
            if any(record[0] == _MOVED for record in records) and self._replaced():
                self._reopen()
                self.catch_up()

    def append(self, records: list[tuple]) -> None:
        """Write one frame of `records` (tuples in format.RECORD's order) and apply them (the flock is held)."""
        pack = fmt.RECORD.pack
        frame = fmt.encode_frame([pack(*fields) for fields in records])
        self._write(frame)
        self.position += len(frame)
        self.state.apply(records)

    def ack_one(self, queue_id: int, queue_offset: int, lease_id: int, now_ms) -> int | None:
        """Append one ACK if that lease is live, all under the flock: `now_ms()` (read under it), or None.

        The hot path of `LeaseConsumer.ack`: the same catch-up, check and write as `locked()` + `append`, with
        the frame packed directly and nothing else. None means nothing was written: the caller looks again
        with `locked()` to say why.
        """
        lock_fd = self._lock_fd
        if lock_fd is None:
            raise StoreIOError(f"the lease journal {self.path} is closed")
        _flock(lock_fd, _LOCK_EX)
        try:
            fd = self._fd
            if fd is None or _lseek(fd, 0, _SEEK_END) != self.position:
                self.catch_up()
                fd = self._fd
            now = now_ms()
            state = self.state
            queue = state.queues.get(queue_id)
            entry = None if queue is None else queue.leases.get(queue_offset)
            if entry is None or entry[0] != lease_id or entry[1] <= now:
                return None
            body = _pack_record(_ACK, 0, 0, queue_id, queue_offset, lease_id, 0)
            frame = _pack_frame(_FRAME_MAGIC, 1, _crc32(body), 0) + body
            if self.sync:
                self._write(frame)
            else:
                try:
                    written = _os_write(fd, frame)
                except OSError as exc:
                    raise StoreIOError(f"cannot write {self.path}: {exc.strerror}") from exc
                if written != _ACK_FRAME_BYTES:
                    self._write(frame[written:])  # a short write: the rest follows it
            self.position += _ACK_FRAME_BYTES
            state.acknowledge(queue, queue_offset)
            return now
        finally:
            _flock(lock_fd, _LOCK_UN)

    def needs_compaction(self) -> bool:
        return self.position > self.compact_bytes

    def compact(self) -> None:
        """Replace the journal by a snapshot of the state (the flock is held).

        A MOVED frame goes to the old file first: the others' check for growth then sees it (format.py).
        """
        data = fmt.encode_header() + fmt.encode_frame(self.state.snapshot_records())
        self._write(fmt.encode_frame([fmt.record(fmt.KIND_MOVED, 0, 0)]))
        write_file_atomically(self.path, data)
        os.close(self._fd)
        self._fd = None
        self._open_file()
        self.position = len(data)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None

    def _replaced(self) -> bool:
        """Whether the path names another file than the one open (after a MOVED record)."""
        try:
            return os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return True
        except OSError as exc:
            raise StoreIOError(f"cannot stat {self.path}: {exc.strerror}") from exc

    def _reopen(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._open_file()
        self.state = LeaseState()
        self.position = 0

    def _open_file(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StoreIOError(f"cannot open {self.path}: {exc.strerror}") from exc

    def _read_header(self, size: int) -> None:
        if size < fmt.HEADER_BYTES:  # new, or its creation was torn: nothing can follow a torn header
            os.ftruncate(self._fd, 0)
            self._write(fmt.encode_header())
        else:
            fmt.check_header(os.pread(self._fd, fmt.HEADER_BYTES, 0), self.path)
        self.position = fmt.HEADER_BYTES

    def _write(self, data: bytes) -> None:
        """Write all of `data` at the end (fdatasync it with `sync`); StoreIOError on failure."""
        fd = self._fd
        try:
            written = _os_write(fd, data)
            while written < len(data):  # a short write: the rest follows it
                written += _os_write(fd, data[written:])
            if self.sync:
                os.fdatasync(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot write {self.path}: {exc.strerror}") from exc


class _Locked:
    __slots__ = ("journal",)

    def __init__(self, journal: LeaseJournal):
        self.journal = journal

    def __enter__(self) -> LeaseState:
        journal = self.journal
        if journal._lock_fd is None:
            raise StoreIOError(f"the lease journal {journal.path} is closed")
        fcntl.flock(journal._lock_fd, fcntl.LOCK_EX)
        try:
            journal.catch_up()
        except BaseException:
            fcntl.flock(journal._lock_fd, fcntl.LOCK_UN)
            raise
        return journal.state

    def __exit__(self, *exc_info) -> None:
        fcntl.flock(self.journal._lock_fd, fcntl.LOCK_UN)
