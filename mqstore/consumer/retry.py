"""Retries and dead letters of a consumer group, as a RocketMQ 4.4.0 broker does them (docs/retry.md).

A group consumer that fails a message sends it back (`Consumer.nack`, RocketMQ's consumerSendMsgBack): the record
is looked up by its commitlog offset and written again (`MessageStore.reput`, which keeps the header fields) as

    the send-back of a record R (its reconsume times n = R.RECONSUMETIMES)
    topic        %RETRY%<group> queue 0 through SCHEDULE_TOPIC_XXXX (REAL_TOPIC / REAL_QID, DELAY = level), where
                 level = delay_level, or 3 + n when delay_level is 0, at most the store's level count;
                 %DLQ%<group> queue 0, at once, when n >= max_reconsume_times or delay_level < 0
    properties   R's, plus RETRY_TOPIC = R's topic when R has none, ORIGIN_MESSAGE_ID = R's ORIGIN_MESSAGE_ID or
                 R's offset message id, WAIT = false (as the broker's send-back leaves it); a dead letter's
                 DELAY is removed (it is never scheduled: readable at once)
    header       R's body, flag, sys flag, born timestamp and born host; RECONSUMETIMES n + 1; the store's host

The group's consumers read `%RETRY%<group>` beside their topic (RocketMQ's client subscribes to it) with committed
offsets under RocketMQ's key `%RETRY%<group>@<group>`, and present a retried message with topic = RETRY_TOPIC.
Several Consumer objects of one group (one per topic) share the one retry queue: each presents only the retries
of its own topic and skips the others, and each commit of the retry queue stores the lowest position of the
group's open consumers of this store object, so a retry one of them has not handled yet is never committed past
(at-least-once; docs/decisions/0055-retries-and-dead-letters.md).
"""

from __future__ import annotations

import threading
import weakref

from mqstore.commitlog.commitlog import validate_topic
from mqstore.commitlog.errors import InvalidMessageError, ReadOnlyStoreError
from mqstore.commitlog.message import Message, PutStatus, StoredMessage
from mqstore.schedule import format as sfmt

RETRY_TOPIC_PREFIX = "%RETRY%"  # RocketMQ's MixAll.RETRY_GROUP_TOPIC_PREFIX
DLQ_TOPIC_PREFIX = "%DLQ%"  # MixAll.DLQ_GROUP_TOPIC_PREFIX
RETRY_QUEUE_ID = 0  # SubscriptionGroupConfig.retryQueueNums = 1
DLQ_QUEUE_ID = 0  # DLQ_NUMS_PER_GROUP = 1
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_WAIT = "WAIT"  # MessageConst.PROPERTY_WAIT_STORE_MSG_OK
MAX_RECONSUME_TIMES_DEFAULT = 16  # SubscriptionGroupConfig.retryMaxTimes
MAX_RECONSUME_TIMES_LIMIT = 2**31 - 1
FIRST_RETRY_LEVEL = 3  # delay level of the first retry: 3 + reconsume times (10 s with the default levels)
STORED = (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)
_HEADER_FIELDS = 16  # StoredMessage fields before the topic: compared to find the record a message was read from
_TOPIC_FIELD = 16


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


def check_group_topics(group: str) -> None:
    """InvalidMessageError, naming the topic, when the group's retry or dead-letter topic is not a legal topic."""
    if not isinstance(group, str):
        raise InvalidMessageError(f"group must be a str, got {type(group).__name__}")
    for topic in (retry_topic(group), dlq_topic(group)):
        try:
            validate_topic(topic)
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"group {group!r} cannot have retries: its topic {topic!r} is illegal "
                                      f"({exc})") from exc


def check_max_reconsume_times(value) -> int:
    if type(value) is not int or not 0 <= value <= MAX_RECONSUME_TIMES_LIMIT:
        raise InvalidMessageError(f"max_reconsume_times must be an int in 0..{MAX_RECONSUME_TIMES_LIMIT}, "
                                  f"got {value!r}")
    return value


def presented(message: StoredMessage) -> StoredMessage:
    """A message read from a retry or dead-letter topic as its consumer sees it: topic = RETRY_TOPIC (all else kept,
    its commitlog offset included, so that it can be sent back again)."""
    original_topic = message.properties.get(PROPERTY_RETRY_TOPIC)
    if not original_topic or original_topic == message.topic:
        return message
    return StoredMessage(message[:_TOPIC_FIELD] + (original_topic,) + message[_TOPIC_FIELD + 1:])


def stored_record(store, message) -> StoredMessage:
    """The record `message` was read from (by its commitlog offset); InvalidMessageError for anything else."""
    if not isinstance(message, StoredMessage):
        raise InvalidMessageError(f"only a message read from the store can be sent back, got {type(message).__name__}")
    try:
        record = store.read_at(message.commitlog_offset)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"message at commitlog offset {message.commitlog_offset} was not read from this "
                                  f"store") from exc
    if record[:_HEADER_FIELDS] != message[:_HEADER_FIELDS] or record.body != message.body:
        raise InvalidMessageError(f"message at commitlog offset {message.commitlog_offset} was not read from this "
                                  f"store")
    return record


def _sent_back(record: StoredMessage) -> tuple[dict, str | None, tuple]:
    """A send-back's properties (RETRY_TOPIC and ORIGIN_MESSAGE_ID set), tags and keys, from its record."""
    properties = record.properties
    tags, keys = properties.pop("TAGS", None), tuple(properties.pop("KEYS", "").split())
    properties.setdefault(PROPERTY_RETRY_TOPIC, record.topic)
    properties[PROPERTY_ORIGIN_MESSAGE_ID] = properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or record.msg_id
    properties[PROPERTY_WAIT] = "false"  # the broker's msgExt.setWaitStoreMsgOK(false), kept in the bytes
    return properties, tags, keys


def send_back(store, group: str, message, delay_level: int, max_reconsume_times: int):
    """Write `message` again for `group` (module docstring); the PutResult, and whether it went to the DLQ."""
    if type(delay_level) is not int:
        raise InvalidMessageError(f"delay_level must be an int, got {delay_level!r}")
    if store.read_only:
        raise ReadOnlyStoreError(f"the store at {store.root_dir} was opened read_only: nothing can be sent back")
    record = stored_record(store, message)
    count = record.reconsume_times
    if count >= max_reconsume_times or delay_level < 0:
        return put_dead_letter(store, group, record), True
    properties, tags, keys = _sent_back(record)
    levels = len(store.schedule.delays)
    level = min(delay_level or FIRST_RETRY_LEVEL + count, levels)
    properties[sfmt.PROPERTY_DELAY] = str(level)
    properties[sfmt.PROPERTY_REAL_TOPIC] = retry_topic(group)
    properties[sfmt.PROPERTY_REAL_QUEUE_ID] = str(RETRY_QUEUE_ID)
    copy = Message(topic=sfmt.SCHEDULE_TOPIC, body=record.body, queue_id=sfmt.queue_id_of(level), tags=tags,
                   keys=keys, properties=properties, flag=record.flag, born_timestamp_ms=record.born_timestamp_ms)
    result = store.reput(copy, store.reput_header(record, reconsume_times=count + 1))
    if result.status in STORED:
        store.schedule.wake()
    return result, False


def put_dead_letter(store, group: str, message, extra_properties: dict[str, str] | None = None):
    """Write `message` (read from this store) on `%DLQ%<group>` queue 0 as a send-back past its retries (module
    docstring): readable at once, DELAY removed, reconsume times + 1; `extra_properties` added. The PutResult.
    Leases (mqstore/lease/) dead-letter through this too."""
    if store.read_only:
        raise ReadOnlyStoreError(f"the store at {store.root_dir} was opened read_only: nothing can be dead-lettered")
    record = stored_record(store, message)
    properties, tags, keys = _sent_back(record)
    properties.pop(sfmt.PROPERTY_DELAY, None)
    properties.update(extra_properties or {})
    copy = Message(topic=dlq_topic(group), body=record.body, queue_id=DLQ_QUEUE_ID, tags=tags, keys=keys,
                   properties=properties, flag=record.flag, born_timestamp_ms=record.born_timestamp_ms)
    return store.reput(copy, store.reput_header(record, reconsume_times=record.reconsume_times + 1))


# --- dead letters -----------------------------------------------------------------------------------------------
def dead_letters(store, group: str, max_count: int = 32, start: int = 0) -> list[StoredMessage]:
    """Up to `max_count` dead letters of `group` from queue offset `start`, presented with their original topic."""
    check_group_topics(group)
    result = store.get(dlq_topic(group), DLQ_QUEUE_ID, start, max_count=max_count)
    return [presented(message) for message in result.messages]


def dead_letter_count(store, group: str) -> int:
    """Dead letters `group`'s DLQ holds (retention aside)."""
    check_group_topics(group)
    topic = dlq_topic(group)
    return store.max_offset(topic, DLQ_QUEUE_ID) - store.min_offset(topic, DLQ_QUEUE_ID)


def replay(store, message, queue_id: int = 0):
    """Put a dead letter back on its original topic (RETRY_TOPIC), queue `queue_id`, with its body, flag,
    properties, sys flag, born timestamp and born host, and reconsume times 0 (a full retry budget again)."""
    if store.read_only:
        raise ReadOnlyStoreError(f"the store at {store.root_dir} was opened read_only: nothing can be replayed")
    record = stored_record(store, message)
    properties = record.properties
    topic = properties.get(PROPERTY_RETRY_TOPIC)
    if not record.topic.startswith(DLQ_TOPIC_PREFIX) or not topic:
        raise InvalidMessageError(f"the message at {record.commitlog_offset} is not a dead letter")
    tags, keys = properties.pop("TAGS", None), tuple(properties.pop("KEYS", "").split())
    copy = Message(topic=topic, body=record.body, queue_id=queue_id, tags=tags, keys=keys, properties=properties,
                   flag=record.flag, born_timestamp_ms=record.born_timestamp_ms)
    return store.reput(copy, store.reput_header(record, reconsume_times=0))


# --- the group's consumers of one store object, for the retry queue's commits ------------------------------------
_readers_lock = threading.Lock()
_readers: "weakref.WeakKeyDictionary[object, dict[str, weakref.WeakSet]]" = weakref.WeakKeyDictionary()


def register_reader(store, group: str, consumer) -> None:
    with _readers_lock:
        _readers.setdefault(store, {}).setdefault(group, weakref.WeakSet()).add(consumer)


def unregister_reader(store, group: str, consumer) -> None:
    with _readers_lock:
        readers = _readers.get(store, {}).get(group)
        if readers is not None:
            readers.discard(consumer)


def lowest_retry_positions(store, group: str, own: dict[int, int]) -> dict[int, int]:
    """The retry queue positions to commit: the lowest of the group's open consumers of `store` (and `own`)."""
    with _readers_lock:
        readers = list(_readers.get(store, {}).get(group, ()))
    lowest = dict(own)
    topic = retry_topic(group)
    for consumer in readers:
        positions = consumer.retry_positions()
        for queue_id in lowest:
            position = positions.get(queue_id)
            if position is None:  # not read yet: it starts where the group committed, or at the queue's start
                position = consumer.retry_committed().get(queue_id, store.min_offset(topic, queue_id))
            lowest[queue_id] = min(lowest[queue_id], position)
    return lowest
