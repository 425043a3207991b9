"""The put-side rewrite of a timer message onto `rmq_sys_wheel_timer`, as RocketMQ 5's broker does it.

RocketMQ 5 (broker HookUtils.transformTimerMessage): a message with TIMER_DELAY_SEC, TIMER_DELAY_MS or
TIMER_DELIVER_MS (looked at in that order) whose delivery time is in the future is stored on the timer topic,
queue 0, with TIMER_OUT_MS = its delivery time rounded down to the precision (one precision earlier when it is on
a boundary), REAL_TOPIC and REAL_QID. A delivery time not in the future leaves the message as it is (RocketMQ
delivers it at once); a message already on the timer topic or carrying TIMER_OUT_MS (a re-put) is not rewritten.
mqstore refuses with InvalidMessageError, where RocketMQ answers WHEEL_TIMER_MSG_ILLEGAL: a value that is not an
integer, a negative TIMER_DELAY_MS / TIMER_DELAY_SEC (mqstore's rule; RocketMQ delivers at once), a delay past
`max_delay_ms`. The rewrite runs in the put path's Python prepare, so an error there writes nothing. The compiled
put does the same rewrite itself (commitlog/csrc/put_rewrite.c) with this module as its reference: it hands every
value this module refuses back to the Python path, so the errors are raised here. A message with a DELAY level >= 1
never reaches this rewrite with its timer properties (the schedule's rewrite, which runs first, removes them).
"""

from __future__ import annotations

import dataclasses
import re

from mqstore.commitlog.errors import InvalidMessageError
from mqstore.commitlog.message import Message
from mqstore.timer import format as tfmt

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}\Z")  # what Java's Long.parseLong takes (range checked after)
INT64_MAX = (1 << 63) - 1


def _parse(name: str, value) -> int:
    if value.__class__ is not str or not (value.isdigit() and value.isascii() and len(value) <= 19):
        if not isinstance(value, str) or _INTEGER.match(value) is None:  # the common case above, a sign here
            raise InvalidMessageError(f"{name} must be an integer in a str, got {value!r}")
    number = int(value)
    if not -INT64_MAX - 1 <= number <= INT64_MAX:
        raise InvalidMessageError(f"{name} must fit in a 64-bit integer, got {value!r}")
    return number


def delivery_time_ms(properties: dict, now_ms: int) -> int:
    """The delivery time a message's timer properties ask for (RocketMQ's order: DELAY_SEC, DELAY_MS,
    DELIVER_MS); InvalidMessageError for a bad or negative value."""
    if tfmt.PROPERTY_DELAY_SEC in properties:
        delay = _parse(tfmt.PROPERTY_DELAY_SEC, properties[tfmt.PROPERTY_DELAY_SEC])
        if delay < 0:
            raise InvalidMessageError(f"{tfmt.PROPERTY_DELAY_SEC} must be >= 0, got {delay}")
        return now_ms + delay * 1000
    if tfmt.PROPERTY_DELAY_MS in properties:
        delay = _parse(tfmt.PROPERTY_DELAY_MS, properties[tfmt.PROPERTY_DELAY_MS])
        if delay < 0:
            raise InvalidMessageError(f"{tfmt.PROPERTY_DELAY_MS} must be >= 0, got {delay}")
        return now_ms + delay
    return _parse(tfmt.PROPERTY_DELIVER_MS, properties[tfmt.PROPERTY_DELIVER_MS])


def out_time_ms(deliver_ms: int, precision_ms: int) -> int:
    """TIMER_OUT_MS for a delivery time: the start of the slot before the one holding it when it is on a slot
    boundary, else of its slot; the slot fires one precision after its start, never before `deliver_ms`."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms // precision_ms * precision_ms


def is_timer_request(message) -> bool:
    """Whether a message asks for a timer and is not a timer message already (RocketMQ's checkIfTimerMessage)."""
    properties = message.properties
    if not properties or message.topic == tfmt.TIMER_TOPIC or tfmt.PROPERTY_OUT_MS in properties:
        return False
    return (tfmt.PROPERTY_DELIVER_MS in properties or tfmt.PROPERTY_DELAY_MS in properties
            or tfmt.PROPERTY_DELAY_SEC in properties)


def rewrite(message, now_ms: int, precision_ms: int, max_delay_ms: int):
    """The message to store for `message`: itself unless it asks for a timer in the future, else a copy on the
    timer topic (module docstring). InvalidMessageError for bad input."""
    if not is_timer_request(message):
        return message
    properties = dict(message.properties)
    deliver_ms = delivery_time_ms(properties, now_ms)
    if deliver_ms <= now_ms:
        return message
    if deliver_ms - now_ms > max_delay_ms:
        raise InvalidMessageError(
            f"a delay of {deliver_ms - now_ms} ms is over the store's timer_max_delay_ms={max_delay_ms}")
    if not isinstance(message.topic, str) or not isinstance(message.queue_id, int):
        return message  # prepare reports the bad field
    properties[tfmt.PROPERTY_OUT_MS] = str(out_time_ms(deliver_ms, precision_ms))
    properties[tfmt.PROPERTY_REAL_TOPIC] = message.topic
    properties[tfmt.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    return Message(topic=tfmt.TIMER_TOPIC, body=message.body, queue_id=tfmt.TIMER_QUEUE_ID, tags=message.tags,
                   keys=message.keys, properties=properties, flag=message.flag,
                   born_timestamp_ms=message.born_timestamp_ms)


def with_delay(message, *, delay_ms: int | None = None, deliver_at_ms: int | None = None):
    """A copy of `message` asking for delivery `delay_ms` from now or at `deliver_at_ms` (ms since the epoch):
    the TIMER_DELAY_MS or TIMER_DELIVER_MS property set, as a RocketMQ 5 producer sets it."""
    if (delay_ms is None) == (deliver_at_ms is None):
        raise InvalidMessageError("give exactly one of delay_ms and deliver_at_ms")
    properties = dict(message.properties)
    if delay_ms is not None:
        if not isinstance(delay_ms, int) or delay_ms < 0:
            raise InvalidMessageError(f"delay_ms must be an int >= 0, got {delay_ms!r}")
        properties[tfmt.PROPERTY_DELAY_MS] = str(delay_ms)
    else:
        if not isinstance(deliver_at_ms, int) or deliver_at_ms < 0:
            raise InvalidMessageError(f"deliver_at_ms must be an int >= 0, got {deliver_at_ms!r}")
        properties[tfmt.PROPERTY_DELIVER_MS] = str(deliver_at_ms)
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    fields["properties"] = properties
    return Message(**fields)
