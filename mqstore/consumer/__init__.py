"""Consumer groups over the store: committed offsets (RocketMQ's consumerOffset.json) and polling consumers."""

from mqstore.consumer.group import Consumer, open_consumer
from mqstore.consumer.offsets import ConsumerOffsets

__all__ = ["Consumer", "ConsumerOffsets", "open_consumer"]
