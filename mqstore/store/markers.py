"""The `abort` marker: present while a writer has the store open; found at open, the last run crashed."""

from __future__ import annotations

import os

from mqstore.commitlog.errors import StoreIOError
from mqstore.commitlog.mapped_file import fsync_directory

ABORT_FILE_NAME = "abort"


def write_marker(path: str) -> None:
    """Create the abort marker durably (file and directory entry)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(os.path.dirname(path))
    except OSError as exc:
        raise StoreIOError(f"cannot create {path}: {exc.strerror}") from exc


def remove_marker(path: str) -> None:
    try:
        os.unlink(path)
        fsync_directory(os.path.dirname(path))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StoreIOError(f"cannot remove {path}: {exc.strerror}") from exc
