"""mqstore: an embedded, RocketMQ-compatible message store (CommitLog, ConsumeQueue, IndexFile on numpy.memmap).

    from mqstore import MessageStore, StoreConfig, Message
    with MessageStore.open("store-dir", StoreConfig()) as store:
        store.put(Message("orders", b"hello"))
"""

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)

from mqstore.commitlog.errors import (
                              ConfigMismatchError,
                              CorruptionError,
                              FlushFailedError,
                              InvalidConfigError,
                              InvalidMessageError,
                              ReadOnlyStoreError,
                              StoreClosedError,
                              StoreError,
                              StoreIOError,
                              StoreLockedError,
)
from mqstore.commitlog.message import Message, PutResult, PutStatus, StoredMessage
from mqstore.flush.modes import FlushMode
from mqstore.store.config import StoreConfig
from mqstore.store.engine import MessageStore
from mqstore.store.reads import GetResult, GetStatus

__all__ = [
    "ConfigMismatchError",
    "CorruptionError",
    "FlushFailedError",
    "FlushMode",
    "GetResult",
    "GetStatus",
    "InvalidConfigError",
    "InvalidMessageError",
    "Message",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "ReadOnlyStoreError",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "StoredMessage",
]
