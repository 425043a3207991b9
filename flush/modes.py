"""Flush modes: what "acknowledged" means for a put."""

from __future__ import annotations

import enum


class FlushMode(enum.Enum):
    """SYNC: a put returns after its bytes are on disk (group commit). ASYNC: once they are in the page cache;
    a flusher thread writes them to disk every flush_interval_ms (RocketMQ's default)."""

    SYNC = "SYNC"
    ASYNC = "ASYNC"
