"""Where a message goes after too many deliveries: a plain put on `%DLQ%<group>`, as a RocketMQ broker does.

One small function, so that it can later use the consumer package's dead-letter put (retries, issue 32).
"""

from __future__ import annotations

from mqstore.commitlog.message import Message, PutStatus, StoredMessage

DLQ_TOPIC_PREFIX = "%DLQ%"
RETRY_TOPIC_PROPERTY = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID_PROPERTY = "ORIGIN_MESSAGE_ID"
DELIVERY_COUNT_PROPERTY = "LEASE_DELIVERY_COUNT"
_NOT_COPIED = frozenset(("TAGS", "KEYS", "UNIQ_KEY"))
_STORED = frozenset((PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT))  # in the log (not yet durable: stored)


def dead_letter_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


def put_dead_letter(store, group: str, message: StoredMessage, delivery_count: int) -> bool:
    """Put a copy of `message` on %DLQ%<group> with RETRY_TOPIC and ORIGIN_MESSAGE_ID; True when stored.

    Returns False when the store cannot take it (opened read_only, or the put was refused): the caller leaves
    the message for another consumer.
    """
    if store.read_only:
        return False
    properties = {name: value for name, value in message.properties.items() if name not in _NOT_COPIED}
    properties[RETRY_TOPIC_PROPERTY] = message.topic
    properties[ORIGIN_MESSAGE_ID_PROPERTY] = message.msg_id
    properties[DELIVERY_COUNT_PROPERTY] = str(delivery_count)
    copy = Message(dead_letter_topic(group), message.body, tags=message.tags, keys=tuple(message.keys),
                   properties=properties, flag=message.flag, born_timestamp_ms=message.born_timestamp_ms)
    return store.put(copy).status in _STORED
