"""The errors every mqstore package raises, in one tree.

::

    StoreError                      base of everything mqstore raises on purpose
     +-- InvalidMessageError        (also a ValueError) a message or argument is refused; nothing was written
     |    +-- OversizedLineError    an input line of `mqstore put` is longer than a body may be (mqstore/cli/)
     +-- InvalidConfigError         (also a ValueError) a StoreConfig value is out of range
     +-- ConfigMismatchError        reopening a store with format-fixing settings that differ from its own
     +-- StoreClosedError           the store (or one of its files) was used after close()
     +-- StoreLockedError           another writer holds the store's lock
     +-- ReadOnlyStoreError         a write was attempted on a store opened read_only
     +-- CorruptionError            bytes on disk break a format rule; carries file, offset and rule
     |    +-- QueueGapError         a ConsumeQueue lacks entries the CommitLog holds (rebuild it from the log)
     |    +-- SettingsFileError     the store's settings file (config/mqstore.json) is damaged (repair rewrites it)
     +-- StoreIOError               the operating system failed a read, write, map or sync (raised from OSError)
     |    +-- SegmentWriteError     a record could not be written to its segment (a failed pwrite)
     |    +-- FlushFailedError      a flush (fdatasync) of a store file failed: every later flush of it fails too,
     |                              and the store refuses writes until it is reopened (docs/recovery.md)
     +-- SegmentFullError           internal: a record does not fit in what is left of a segment
     +-- DispatchProcessError       the dispatch process failed to start, or died (mqstore/store/dispatch_process.py)
     +-- CommitLogSourceError       (also a ValueError) a path or option given to the Spark commitlog source is bad
                                    (mqstore/store/scan_errors.py, beside the options it refuses)
     +-- LeaseError                 a lease operation is refused; nothing was written (mqstore/lease/errors.py)
          +-- UnknownLeaseError     no such lease: never handed out, or already acknowledged
          +-- LeaseExpiredError     its visibility timeout passed (the message may be handed out again)
          +-- ForeignLeaseError     handed out by a consumer of another (topic, group)

Expected outcomes (a full queue, a message not found, a flush that timed out) are not errors: they are statuses
(`PutStatus`, `GetStatus`) returned as values.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error mqstore raises on purpose."""


class InvalidMessageError(StoreError, ValueError):
    """A message or an argument was refused before anything was written."""


class InvalidConfigError(StoreError, ValueError):
    """A StoreConfig field holds a value outside its allowed range."""


class ConfigMismatchError(StoreError):
    """The store on disk was created with format-fixing settings that differ from the ones given."""


class StoreClosedError(StoreError):
    """The store, or one of its files, was used after it was closed."""


class StoreLockedError(StoreError):
    """Another writer holds the store's lock file (the message names its process when the kernel tells it)."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a store opened with read_only=True."""


class CorruptionError(StoreError):
    """Bytes read from disk break a rule of their format.

    `path` is the file, `offset` the byte position inside it (or the absolute commitlog offset when
    `path` is None), `rule` names the format and the validity rule that failed: "<format>.<rule>", as
    "commitlog.3" (rule 3 of commitlog/format.py) or "consumequeue.dense". Code never branches on `rule`
    (it is for people and reports); it reads the typed flags:

    `length_sound`: only a CRC failed (commitlog rules 5, 6): the record's TOTALSIZE holds, a walk of the
    log may go on past it. `not_a_record`: no record starts at this position (commitlog rules 1, 4: no
    magic code there, or a PHYSICALOFFSET naming another position): the caller's position, not
    necessarily the bytes, is wrong.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None, rule: str = "",
                 length_sound: bool = False, not_a_record: bool = False):
        where = ""
        if path is not None:
            where = f" (file {path}"
            where += f", offset {offset})" if offset is not None else ")"
        elif offset is not None:
            where = f" (offset {offset})"
        super().__init__(message + where)
        self.path = path
        self.offset = offset
        self.rule = rule
        self.length_sound = length_sound
        self.not_a_record = not_a_record


class QueueGapError(CorruptionError):
    """A ConsumeQueue ends before entries the CommitLog holds for it: the owner rebuilds it from the log.
    `continues_at`: the entry the log goes on with (None when the gap is inside the log's own records)."""

    def __init__(self, message: str, *, continues_at: int | None = None, **where):
        super().__init__(message, **where)
        self.continues_at = continues_at


class SettingsFileError(CorruptionError):
    """The store's settings file (config/mqstore.json) is not what mqstore writes. `repair=True` keeps it in the
    repair folder and writes the settings read from the store's own files (mqstore/store/settings.py)."""


class StoreIOError(StoreError):
    """The operating system failed an I/O call; the OSError is the __cause__."""


class SegmentWriteError(StoreIOError):
    """A record could not be written to its segment (a failed pwrite); nothing of it was published."""


class FlushFailedError(StoreIOError):
    """A flush (fdatasync) of `path` failed, or failed earlier in this process: its dirty bytes may never reach
    the disk, and a retry that succeeds proves nothing (Linux reports a writeback error once). Every later flush
    of the file raises this again, durable positions stay where they were, and the store refuses writes until it
    is reopened, when recovery checks the log again from what was durable (docs/recovery.md)."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class SegmentFullError(StoreError):
    """Internal signal: a record does not fit in what is left of the current segment."""
