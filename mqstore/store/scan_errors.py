"""The one error of reading a store in bulk: a path or option given to the Spark commitlog source or to
`MessageStore.scan()` is refused. It lives beside the options both share (mqstore/store/scan_options.py); the
rest of the error tree is in commitlog/errors.py."""

from __future__ import annotations

from mqstore.commitlog.errors import StoreError


class CommitLogSourceError(StoreError, ValueError):
    """A path or option given to the Spark commitlog source or to store.scan() is refused (the message names it)."""
