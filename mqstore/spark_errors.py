"""The Spark commitlog source's own error, beside the source (the rest of the tree is in commitlog/errors.py)."""

from __future__ import annotations

from commitlog.errors import StoreError


class CommitLogSourceError(StoreError, ValueError):
    """A path or option given to the Spark commitlog data source is refused (the message names it)."""
