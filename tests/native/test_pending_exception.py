"""The compiled put entry (commitlog/csrc/put_entry.c) calls nothing while an exception is set: an error of the put
is put aside while it asks how many puts are parked, then raised as it was. (A call made with an exception set
aborts a debug CPython; in a release build, Python code run by such a call returns into C with the exception
still set, which CPython reports as a SystemError in place of the put's error.)"""

from __future__ import annotations

import collections

import pytest
from mqstore.commitlog import native

from mqstore import Message, MessageStore, StoreIOError
from mqstore.store.engine import MessageStore as EngineStore
from tests.conftest import small_config

pytestmark = pytest.mark.skipif(native.NATIVE is None, reason="MQSTORE_NATIVE=0: the compiled core is not loaded")


class _Pending:
    """A parked-puts queue whose length is Python code that calls a builtin (as a deque subclass's could)."""

    def __init__(self):
        self.items = collections.deque()

    def __len__(self):
        return len(self.items)


class _HandOff:
    def __init__(self):
        self.pending = _Pending()
        self.drained = 0

    def drain(self):
        self.drained += 1


def test_an_error_of_the_put_is_raised_as_it_was_past_the_parked_puts_count(tmp_path, monkeypatch):
    with MessageStore.open(tmp_path, small_config()) as store:
        codec = store._commitlog.codec
        handoff = _HandOff()
        entry = codec.PutEntry(store, store._put_common.__self__, store._writer, handoff, EngineStore.put,
                               StoreIOError, None)

        def broken(message):
            raise KeyError("a bug")

        monkeypatch.setattr(store, "_append_message_holding_lock", broken)
        with pytest.raises(KeyError, match="a bug"):
            entry.put(Message("another-topic", b"x"))  # a topic not seen yet: the Python path, which raises
        assert not store._writer.locked()
        assert handoff.drained == 0  # nothing was parked
        handoff.pending.items.append("parked")
        with pytest.raises(KeyError, match="a bug"):
            entry.put(Message("another-topic", b"x"))
        assert handoff.drained == 1
