"""The checkpoint file: how far each kind of file is known to be on disk (RocketMQ's StoreCheckpoint).

Crash recovery starts scanning the CommitLog from the segment whose first message is older than these times.

    OFFSET  SIZE  TYPE  FIELD
    0       8     i64   physic_msg_timestamp   store time (ms) of the last CommitLog message flushed
    8       8     i64   logics_msg_timestamp   store time of the last message whose ConsumeQueue entry is flushed
    16      8     i64   index_msg_timestamp    store time of the last message whose index entries are flushed
    24      8     i64   physic_flushed_offset  CommitLog bytes below this offset are on disk (RocketMQ 5.x keeps
                                               its masterFlushedOffset here; 4.x leaves it zero and ignores it)
    32      8     i64   (RocketMQ 5.x's confirmPhyOffset; mqstore leaves it zero)
    40      8     i64   index_flushed_end      the index entries of every message below this commitlog offset
                                               are on disk (mqstore's own; RocketMQ ignores it)
    48      4048  -     zero
                        = 4096 bytes, big-endian, file name `checkpoint` in the store root

Validity rule: (1) the file is exactly 4096 bytes; (2) each timestamp is >= 0. A zero timestamp means "nothing
flushed yet". A missing file is a store that never flushed (recovery then scans everything).
"""

from __future__ import annotations

import os
import struct

import numpy as np
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.mapped_file import MappedFile

CHECKPOINT_FILE_NAME = "checkpoint"
CHECKPOINT_DAMAGED_FILE_NAME = "checkpoint.damaged"  # marker: found damaged, no recovery completed since
CHECKPOINT_SIZE_BYTES = 4096
CHECKPOINT_DTYPE = np.dtype([("physic_msg_timestamp", ">i8"), ("logics_msg_timestamp", ">i8"),
                             ("index_msg_timestamp", ">i8"), ("physic_flushed_offset", ">i8"),
                             ("confirm_offset", ">i8"), ("index_flushed_end", ">i8")])
_I64 = struct.Struct(">q")  # one field, for raise_log (a numpy field lookup costs a SYNC put several times more)
_PHYSIC_MS_AT = CHECKPOINT_DTYPE.fields["physic_msg_timestamp"][1]
_PHYSIC_FLUSHED_AT = CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1]
RECOVERY_SAFETY_MARGIN_MS = 3000  # RocketMQ subtracts 3 s from the minimum before comparing segment times

assert CHECKPOINT_DTYPE.itemsize == 48
assert CHECKPOINT_DTYPE.fields["index_msg_timestamp"][1] == 16
assert CHECKPOINT_DTYPE.fields["physic_flushed_offset"][1] == 24
assert CHECKPOINT_DTYPE.fields["index_flushed_end"][1] == 40


class Checkpoint:
    """The mapped checkpoint file of a store."""

    def __init__(self, mapped: MappedFile):
        self._mapped = mapped
        self._fields = mapped.array[: CHECKPOINT_DTYPE.itemsize].view(np.ndarray).view(CHECKPOINT_DTYPE)
        for name in CHECKPOINT_DTYPE.names:
            if int(self._fields[name][0]) < 0:
                raise CorruptionError(f"checkpoint field {name} is negative", path=mapped.path,
                                      offset=CHECKPOINT_DTYPE.fields[name][1], rule="checkpoint.2")

    @classmethod
    def open(cls, root_dir: str, *, writable: bool) -> "Checkpoint | None":
        """The store's checkpoint; created (zeroed) when missing and writable; None when missing and read-only."""
        path = os.path.join(root_dir, CHECKPOINT_FILE_NAME)
        if not os.path.exists(path):
            if not writable:
                return None
            return cls(MappedFile.create(path, 0, CHECKPOINT_SIZE_BYTES))
        return cls(MappedFile.open(path, 0, CHECKPOINT_SIZE_BYTES, writable=writable))

    @property
    def mapped(self) -> MappedFile:
        """The mapped file (the compiled SYNC leader raises the log's two fields in it, as raise_log)."""
        return self._mapped

    def _get(self, name: str) -> int:
        return int(self._fields[name][0])

    @property
    def physic_msg_timestamp_ms(self) -> int:
        return self._get("physic_msg_timestamp")

    @property
    def logics_msg_timestamp_ms(self) -> int:
        return self._get("logics_msg_timestamp")

    @property
    def index_msg_timestamp_ms(self) -> int:
        return self._get("index_msg_timestamp")

    @property
    def physic_flushed_offset(self) -> int:
        return self._get("physic_flushed_offset")

    @property
    def index_flushed_end(self) -> int:
        return self._get("index_flushed_end")

    def update(self, *, physic_ms: int | None = None, logics_ms: int | None = None,
               index_ms: int | None = None, flushed_offset: int | None = None,
               index_flushed_end: int | None = None) -> None:
        """Raise the given fields (a checkpoint never moves back)."""
        for name, value in (("physic_msg_timestamp", physic_ms), ("logics_msg_timestamp", logics_ms),
                            ("index_msg_timestamp", index_ms), ("physic_flushed_offset", flushed_offset),
                            ("index_flushed_end", index_flushed_end)):
            if value is not None and value > self._get(name):
                self._fields[name] = value

    def raise_log(self, physic_ms: int, flushed_offset: int) -> None:
        """`update(physic_ms=..., flushed_offset=...)`, after each CommitLog flush (with SYNC, each put's)."""
        view = self._mapped.view
        if physic_ms > _I64.unpack_from(view, _PHYSIC_MS_AT)[0]:
            _I64.pack_into(view, _PHYSIC_MS_AT, physic_ms)
        if flushed_offset > _I64.unpack_from(view, _PHYSIC_FLUSHED_AT)[0]:
            _I64.pack_into(view, _PHYSIC_FLUSHED_AT, flushed_offset)

    def reset_flushed_offset(self, offset: int) -> None:
        """Lower the flushed offsets after recovery cut the log below them (the only time they move back)."""
        for name in ("physic_flushed_offset", "index_flushed_end"):
            if self._get(name) > offset:
                self._fields[name] = offset

    def lower_index_flushed_end(self, offset: int) -> None:
        """Lower index_flushed_end to `offset` after recovery cut the index below it (what it re-adds is not
        on disk until the next index flush)."""
        if self._get("index_flushed_end") > offset:
            self._fields["index_flushed_end"] = offset

    def reset_logical_times(self) -> None:
        """Forget how far the queues and index were flushed (they are being rebuilt): recovery scans from the start."""
        for name in ("logics_msg_timestamp", "index_msg_timestamp", "index_flushed_end"):
            self._fields[name] = 0

    def min_timestamp_ms(self, *, with_index: bool = False) -> int:
        """Where recovery may start: the older of the log and queue times, less the safety margin."""
        low = min(self.physic_msg_timestamp_ms, self.logics_msg_timestamp_ms)
        if with_index:
            low = min(low, self.index_msg_timestamp_ms)
        return max(0, low - RECOVERY_SAFETY_MARGIN_MS)

    def flush(self) -> None:
        self._mapped.flush(0, CHECKPOINT_SIZE_BYTES)

    def close(self) -> None:
        self._fields = None
        self._mapped.close()
