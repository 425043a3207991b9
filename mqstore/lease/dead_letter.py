"""Where a leased message goes after too many deliveries: `%DLQ%<group>`, written as a consumer group's dead
letter (mqstore/consumer/retry.py: RETRY_TOPIC, ORIGIN_MESSAGE_ID, the header fields kept, reconsume times + 1),
plus the delivery count it reached.
"""

from __future__ import annotations

from mqstore.commitlog.message import PutStatus, StoredMessage
from mqstore.consumer.retry import put_dead_letter as put_group_dead_letter

DELIVERY_COUNT_PROPERTY = "LEASE_DELIVERY_COUNT"
_STORED = frozenset((PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT))  # in the log (not yet durable: stored)


def put_dead_letter(store, group: str, message: StoredMessage, delivery_count: int) -> bool:
    """Put a copy of `message` on %DLQ%<group>; True when stored.

    Returns False when the store cannot take it (opened read_only, or the put was refused): the caller leaves
    the message for another consumer.
    """
    if store.read_only:
        return False
    result = put_group_dead_letter(store, group, message, {DELIVERY_COUNT_PROPERTY: str(delivery_count)})
    return result.status in _STORED
