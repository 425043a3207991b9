"""Fuzzing the compiled put path against Python code run in the middle of a call: a finalizer, armed to run at a
garbage collection the call's own allocations set off, replaces a field of a message being put (its topic, body,
tags, keys, properties, queue id), sets one of its properties in place (a delay, a timer, what the delayed
messages' rewrites add) or empties the batch list.

Which value a put stores then depends on when the finalizer ran, so nothing is compared with the pure-Python codec.
What must hold: the process survives (under `make fuzz-python` the sanitizer build reports any read of freed memory
or through a null pointer), a put either raises or returns results, and every record it reports stored reads back
with its CRCs checked, as some message (the old or the new value), never corrupt.

On the code before 2026-11-27's fixes it found, within seconds to a minute and a half, the null dereference of
`prepare_batch` and the use of a freed body in the compiled put (MQSTORE_FUZZ_FINALIZERS=put: single puts only).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

from mqstore.commitlog import native
from mqstore.commitlog.errors import CorruptionError
from mqstore.commitlog.message import Message

from fuzz import messages
from fuzz.provider import Input
from mqstore import MessageStore

COMPILED = native.NATIVE
STORE_REUSE_INPUTS = 100
BATCH_MESSAGES_MAX = 6
ONLY_PUT = os.environ.get("MQSTORE_FUZZ_FINALIZERS") == "put"  # single puts only
COUNTDOWN_MAX = 64  # the collection (counted from the finalizer's arming) at which the field is replaced
NEW_TOPIC = "new topic"  # stands for a topic the store has not seen
REPLACEMENTS = {
    "topic": ("t0", NEW_TOPIC, NEW_TOPIC, None, "x" * 200),
    "body": (b"", b"replaced" * 20, None, "text", bytearray(b"ba")),
    "tags": (None, "TagZ", 5),
    "keys": ((), ("k",), None),
    "properties": ({}, {"p": "v"}, None, {"TIMER_DELAY_MS": "5"}, {"DELAY": "2"}),
    "queue_id": (0, 7, 99, None),
    "property": (("TIMER_DELAY_MS", "7"), ("DELAY", "3"), ("DELAY", "0"), ("REAL_QID", "1"), ("TIMER_OUT_MS", "1"),
                 ("p", "v")),  # set in the message's properties dict, in place
}


class Finalizer:
    """Garbage in a reference cycle, so that only a collection frees it. Its `__del__` counts collections: before the
    `countdown`-th it leaves a new one behind for the next collection; at it, it replaces `field` of `message` with
    `value` (or, with message None, clears `batch`). With a generation-0 threshold of 1, every allocation of a
    tracked object collects, so the countdown walks the replacement across the call's allocation points."""

    def __init__(self, plan: dict):
        self.plan = plan
        self.cycle = self

    def __del__(self):
        plan = self.plan
        plan["countdown"] -= 1
        if plan["countdown"] > 0:
            Finalizer(plan)
        elif plan["message"] is None:
            plan["batch"].clear()
        elif plan["field"] == "property":
            properties = plan["message"].properties
            if isinstance(properties, dict):
                properties[plan["value"][0]] = plan["value"][1]
        else:
            setattr(plan["message"], plan["field"], plan["value"])


_state: dict = {}


def _store():
    if _state.get("inputs", STORE_REUSE_INPUTS) >= STORE_REUSE_INPUTS:
        close()
        directory = tempfile.mkdtemp(prefix="mqstore-fuzz-finalizers-")
        from fuzz.put_path import CONFIG

        _state.update(directory=directory, store=MessageStore.open(os.path.join(directory, "store"), CONFIG),
                      inputs=0)
    _state["inputs"] += 1
    return _state["store"]


def one_input(data: bytes) -> None:
    source = Input(data)
    store = _store()
    batch = []
    plain = source.flag()  # the common shape, which the compiled prepare and put take whole
    for _ in range(source.below(BATCH_MESSAGES_MAX) + 1):
        if plain:
            batch.append(Message(source.pick(messages.KNOWN_TOPICS[:2]), source.blob(40), queue_id=source.below(4)))
            continue
        positional, keywords = messages.arguments(source)
        try:
            batch.append(Message(*positional, **keywords))
        except TypeError:
            continue
    if not batch:
        return
    single = source.flag() or ONLY_PUT
    field = source.pick(sorted(REPLACEMENTS))
    target = None if source.below(8) == 0 and not single else batch[source.below(len(batch))]
    value = source.pick(REPLACEMENTS[field])
    if value == NEW_TOPIC:
        _state["topics"] = _state.get("topics", 0) + 1
        value = f"New{_state['topics']}"  # a topic the store has not seen
    countdown = source.below(COUNTDOWN_MAX) + 1
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1, threshold[1], threshold[2])
    Finalizer(dict(batch=batch, message=target, field=field, value=value, countdown=countdown))
    try:
        results = [store.put(batch[0])] if single else store.put_batch(list(batch) if source.flag() else batch)
    except Exception:  # noqa: BLE001 - an invalid value the finalizer put in: refused, nothing to read back
        results = []
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
    for result in results:
        if result.status.value == "PUT_OK":
            try:
                message = store.read_at(result.commitlog_offset)  # CRCs checked
            except CorruptionError as exc:
                raise AssertionError(f"a put stored a corrupt record ({field} replaced by a finalizer): {exc}") from exc
            assert message.commitlog_offset == result.commitlog_offset


def close() -> None:
    store = _state.pop("store", None)
    if store is not None:
        store.close()
        shutil.rmtree(_state.pop("directory"), ignore_errors=True)
    _state.pop("inputs", None)
