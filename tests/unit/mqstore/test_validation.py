"""Refused input writes nothing; a closed store refuses everything; a read-only store refuses writes."""

from __future__ import annotations

import pytest

from mqstore import (
    GetStatus,
    InvalidMessageError,
    Message,
    MessageStore,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreError,
)
from tests.unit.mqstore.conftest import MAX_QUEUES, config

MAX_BODY = config().max_message_size_bytes

BAD_MESSAGES = {
    "empty topic": Message("", b"x"),
    "topic of 128 bytes": Message("t" * 128, b"x"),
    "topic ../x": Message("../x", b"x"),
    "topic a/b": Message("a/b", b"x"),
    "topic é": Message("é", b"x"),
    "topic with a space": Message("a b", b"x"),
    "topic not a str": Message(5, b"x"),
    "topic bytes": Message(b"t", b"x"),
    "queue_id -1": Message("t", b"x", queue_id=-1),
    "queue_id max_queues": Message("t", b"x", queue_id=MAX_QUEUES),
    "queue_id bool": Message("t", b"x", queue_id=True),
    "queue_id float": Message("t", b"x", queue_id=0.0),
    "queue_id str": Message("t", b"x", queue_id="0"),
    "queue_id None": Message("t", b"x", queue_id=None),
    "body over max": Message("t", b"x" * (MAX_BODY + 1)),
    "body str": Message("t", "text"),
    "body None": Message("t", None),
    "body list": Message("t", [1, 2]),
    "properties over 32767 bytes": Message("t", b"x", properties={"p": "v" * 32765}),
    "properties over 32767 bytes with the record CRC": Message("t", b"x", properties={"p": "v" * (32765 - 20)}),
    "properties over 32767 bytes with tags": Message("t", b"x", tags="T", properties={"p": "v" * 32760}),
    "property name with x01": Message("t", b"x", properties={"a\x01b": "v"}),
    "property name with x02": Message("t", b"x", properties={"a\x02b": "v"}),
    "property value with x01": Message("t", b"x", properties={"a": "v\x01"}),
    "property value with x02": Message("t", b"x", properties={"a": "\x02"}),
    "property name empty": Message("t", b"x", properties={"": "v"}),
    "property value int": Message("t", b"x", properties={"a": 1}),
    "property name int": Message("t", b"x", properties={1: "a"}),
    "properties a list": Message("t", b"x", properties=[("a", "b")]),
    "properties a tuple": Message("t", b"x", properties=("a", "b")),
    "properties set TAGS": Message("t", b"x", properties={"TAGS": "x"}),
    "tags int": Message("t", b"x", tags=5),
    "tags empty": Message("t", b"x", tags=""),
    "tags with x02": Message("t", b"x", tags="a\x02"),
    "tags with a lone surrogate": Message("t", b"x", tags="a\ud800"),
    "key with a lone surrogate": Message("t", b"x", keys=["k\udfff"]),
    "property name with a lone surrogate": Message("t", b"x", properties={"\ud800": "v"}),
    "property value with a lone surrogate": Message("t", b"x", properties={"a": "v\udc80"}),
    "keys a str": Message("t", b"x", keys="key"),
    "keys bytes": Message("t", b"x", keys=b"key"),
    "key with a space": Message("t", b"x", keys=["a b"]),
    "key int": Message("t", b"x", keys=[5]),
    "key with x01": Message("t", b"x", keys=["a\x01"]),
    "flag over int32": Message("t", b"x", flag=2**31),
    "flag str": Message("t", b"x", flag="1"),
    "born timestamp negative": Message("t", b"x", born_timestamp_ms=-1),
    "born timestamp past int64": Message("t", b"x", born_timestamp_ms=2**63),
    "born timestamp float": Message("t", b"x", born_timestamp_ms=1.5),
    "not a Message": ("t", b"x"),
}


def _positions(store):
    stats = store.stats()
    return stats["commitlog"]["max_offset"], stats["queues"], store.topics()


@pytest.fixture
def seeded(store):
    """A store holding one message, dispatched, so that 'nothing moved' is a comparison with something."""
    store.put(Message("t", b"seed"))
    assert store.wait_dispatched(30)
    return store


@pytest.mark.parametrize("message", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_a_bad_message_is_refused_and_nothing_is_written(seeded, message):
    before = _positions(seeded)
    with pytest.raises(InvalidMessageError) as raised:
        seeded.put(message)
    assert isinstance(raised.value, StoreError) and isinstance(raised.value, ValueError)
    assert seeded.wait_dispatched(30)
    assert _positions(seeded) == before
    assert seeded.put(Message("t", b"after")).queue_offset == 1  # the refusal left no hole behind


@pytest.mark.parametrize("message", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_a_bad_message_in_the_middle_of_a_batch_writes_none_of_it(seeded, message):
    before = _positions(seeded)
    batch = [Message("t", b"ok1"), Message("t", b"ok2", queue_id=1), message, Message("new", b"ok3")]
    with pytest.raises(InvalidMessageError):
        seeded.put_batch(batch)
    assert seeded.wait_dispatched(30)
    assert _positions(seeded) == before
    assert [m.body for m in seeded.get("t", 0, 0).messages] == [b"seed"]
    assert seeded.get("new", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


@pytest.mark.parametrize("message", [
    Message("t" * 127, b""),
    Message("A-z_0%9|", b"x" * MAX_BODY, queue_id=MAX_QUEUES - 1),
    # exactly 32767 bytes: 'p' \x01 v... \x02 and the 20-byte record-CRC pair the store adds
    Message("t", b"x", properties={"p": "v" * (32764 - 20)}),
    Message("t", bytearray(b"mutable"), tags="é", keys=["ü", "k"], properties={"名": "値"}, flag=-(2**31)),
    Message("t", memoryview(b"view"), born_timestamp_ms=0),
])
def test_messages_at_the_limits_are_stored_and_read_back(store, message):
    result = store.put(message)
    assert store.wait_dispatched(30)
    stored = store.read_at(result.commitlog_offset)
    assert (stored.topic, stored.body, stored.queue_id) == (message.topic, bytes(message.body), message.queue_id)
    assert stored.tags == message.tags and stored.keys == tuple(message.keys) and stored.flag == message.flag
    assert {k: v for k, v in stored.properties.items() if k not in ("TAGS", "KEYS")} == message.properties
    assert store.get(message.topic, message.queue_id, 0).messages == [stored]


CALLS = {
    "put": lambda s: s.put(Message("t", b"x")),
    "put_batch": lambda s: s.put_batch([Message("t", b"x")]),
    "get": lambda s: s.get("t", 0, 0),
    "read_at": lambda s: s.read_at(0),
    "min_offset": lambda s: s.min_offset("t", 0),
    "max_offset": lambda s: s.max_offset("t", 0),
    "offset_for_time": lambda s: s.offset_for_time("t", 0, 0),
    "topics": lambda s: s.topics(),
    "wait_dispatched": lambda s: s.wait_dispatched(1),
    "flush": lambda s: s.flush(),
    "stats": lambda s: s.stats(),
}


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_every_method_of_a_closed_store_raises_store_closed_error(store_dir, call, read_only):
    with MessageStore.open(store_dir, config()) as writer:
        writer.put(Message("t", b"x"))
    store = MessageStore.open(store_dir, config(), read_only=read_only)
    store.close()
    with pytest.raises(StoreClosedError):
        call(store)
    store.close()  # closing again is allowed


def test_a_read_only_store_refuses_writes(store_dir):
    with MessageStore.open(store_dir, config()) as writer:
        writer.put(Message("t", b"x"))
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        for call in (CALLS["put"], CALLS["put_batch"]):
            with pytest.raises(ReadOnlyStoreError):
                call(reader)
        reader.flush()  # nothing to write: a no-op
        assert reader.max_offset("t", 0) == 1


def test_open_refuses_a_config_that_is_not_a_store_config(store_dir):
    with pytest.raises(InvalidMessageError):
        MessageStore.open(store_dir, {"segment_size_bytes": 65536})
