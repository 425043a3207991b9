"""StoreLockedError names the process that holds the store's lock and says how to read the store meanwhile."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqstore import MessageStore, StoreLockedError
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[3]

HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from mqstore import MessageStore
    from tests.conftest import small_config
    with MessageStore.open(sys.argv[1], small_config()):
        print("open", flush=True)
        sys.stdin.readline()  # hold the lock until told
""")


def test_the_error_names_the_holding_process_and_suggests_read_only(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(ROOT)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError) as raised:
            MessageStore.open(tmp_path, small_config())
        message = str(raised.value)
        assert f"process {holder.pid} (" in message and "-c" in message
        assert "read_only=True" in message and "open for writing elsewhere" in message
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0


def test_a_lock_held_in_this_process_is_named_so(tmp_path):
    with MessageStore.open(tmp_path, small_config()):
        with pytest.raises(StoreLockedError, match="this process"):
            MessageStore.open(tmp_path, small_config())
