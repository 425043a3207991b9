"""Differential fuzzing of the compiled `Message` against the dataclass it stands in for (commitlog/message.py).

From the input: the constructor's arguments (positional and keyword, every field, odd types, unknown and repeated
names, too many), then a sequence of attribute reads, writes and deletes, ==, repr, pickling, copying,
dataclasses.replace and astuple. Each step must give the same value, or raise the same exception class, on both.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle

from mqstore.commitlog import native
from mqstore.commitlog.message import ReferenceMessage

from fuzz import messages
from fuzz.provider import Input

COMPILED = native.NATIVE.Message if native.NATIVE is not None else ReferenceMessage
FIELDS = [field.name for field in dataclasses.fields(ReferenceMessage)]
STEPS_MAX = 12
# `del message.field`: after it, the two types differ in copy, replace and == (reported; no user deletes a field),
# so the fuzzer leaves it out unless MQSTORE_FUZZ_DELETES=1.
DELETES = os.environ.get("MQSTORE_FUZZ_DELETES") == "1"


def _outcome(call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the class is the outcome compared
        return ("raised", type(exc).__name__)
    if isinstance(value, (ReferenceMessage, COMPILED)):
        return ("message", _fields(value))
    return ("value", value)


def _fields(message) -> tuple:
    return tuple(_outcome(lambda name=name: getattr(message, name)) for name in FIELDS)


def _arguments(source: Input) -> tuple[tuple, dict]:
    positional, keywords = messages.arguments(source)
    odd = source.below(8)
    if odd == 0:
        positional = positional + (0,) * (source.below(9) + 1)  # too many, or exactly all eight
    elif odd == 1:
        keywords["colour"] = "red"  # no such field
    elif odd == 2 and positional:
        keywords[FIELDS[0]] = "again"  # given twice
    elif odd == 3:
        keywords.pop("topic", None)
        positional = ()  # topic and body missing
    return positional, keywords


def _value(source: Input, name: str):
    return {"topic": messages.topic, "body": messages.body, "tags": messages.tags, "keys": messages.keys,
            "properties": messages.properties}.get(name, lambda s: messages.integer(s, (0, 1), (None, 1.5, "x")))(
        source)


def _step(source: Input, message, other, value, name: str):
    """One operation on `message` (`other` is the same-type message built from the same arguments)."""
    kind = source.below(9)
    if kind == 0:
        return lambda: setattr(message, name, value)
    if kind == 1:
        return lambda: delattr(message, name) if DELETES else getattr(message, name)
    if kind == 2:
        return lambda: message == other
    if kind == 3:
        return lambda: repr(message)
    if kind == 4:  # the dataclass does not pickle by name once `Message` names the compiled type: deepcopy
        return lambda: copy.deepcopy(message)
    if kind == 5:
        return lambda: copy.copy(message)
    if kind == 6:
        return lambda: dataclasses.replace(message, **{name: value})
    if kind == 7:
        return lambda: hash(message)
    return lambda: getattr(message, name)


def one_input(data: bytes) -> None:
    source = Input(data)
    positional, keywords = _arguments(source)
    built = {}
    for label, message_type in (("dataclass", ReferenceMessage), ("compiled", COMPILED)):
        built[label] = _outcome(lambda message_type=message_type: message_type(*positional, **keywords))
        if built[label][0] == "message":
            built[label] = (built[label], message_type(*positional, **keywords), message_type(*positional, **keywords))
    if built["dataclass"][0] == "raised" or built["compiled"][0] == "raised":
        assert built["dataclass"] == built["compiled"], f"construction: {built['dataclass']} != {built['compiled']}"
        return
    (want, reference, reference_other), (have, compiled, compiled_other) = built["dataclass"], built["compiled"]
    assert want == have, f"construction: {want} != {have}"
    for step in range(source.below(STEPS_MAX) + 1):
        name = source.pick(FIELDS)
        value = _value(source, name)
        at = source.at
        expected = _outcome(_step(source, reference, reference_other, value, name))
        source.at = at
        got = _outcome(_step(source, compiled, compiled_other, value, name))
        if expected[0] == "value" and isinstance(expected[1], str) and "Message(" in expected[1]:
            expected = ("value", expected[1].replace("ReferenceMessage(", "Message("))
        assert expected == got, f"step {step} on {name}: dataclass {expected!r}, compiled {got!r}"
        assert _fields(reference) == _fields(compiled), f"after step {step}: the fields differ"
    if _fields(compiled) == _fields(compiled_other) and not DELETES:
        copied = _outcome(lambda: pickle.loads(pickle.dumps(compiled)))
        assert copied[0] == "raised" or copied == ("message", _fields(compiled)), f"pickled: {copied!r}"
