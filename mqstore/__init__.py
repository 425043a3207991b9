"""mqstore: an embedded, RocketMQ-compatible message store (CommitLog, ConsumeQueue, IndexFile on numpy.memmap).

    from mqstore import MessageStore, StoreConfig, Message
    with MessageStore.open("store-dir", StoreConfig()) as store:
        store.put(Message("orders", b"hello"))
"""

import importlib
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from mqstore.store.engine import MessageStore
    from mqstore.store.reads import GetResult, GetStatus

# Imported at their first use, not with the package: a child process the store starts (the dispatch process, the
# tier uploader) imports a module of mqstore, and so this file, and needs neither (measured: 0.3 s of its start).
_LAZY = {"MessageStore": "mqstore.store.engine", "GetResult": "mqstore.store.reads", "GetStatus": "mqstore.store.reads"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mqstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later uses find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
