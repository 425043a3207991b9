"""The `mqstore` command: put, get, tail, query, dump, recover, verify and the admin commands."""

from mqstore.cli.commands import main

__all__ = ["main"]
