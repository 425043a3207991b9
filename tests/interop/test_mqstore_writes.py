"""mqstore writes, RocketMQ 4.4.0 reads: every message RocketMQ returns is the one put, field by field.

Stores are written with put(), put_batch() and from four threads at once, with every kind of topic name
(`%RETRY%` and `|` names, 127 characters), empty bodies and bodies of max_message_size_bytes, unicode tags and
properties, zero to four keys (a key twice in one message among them), segments that roll with end-of-segment
blanks, two segment and ConsumeQueue file sizes, the record CRC on and off, the index on. Each store is closed
cleanly, then `rmq read` of a copy: RocketMQ's recovery and reads must give, queue by queue, exactly the
messages put (the record-CRC property aside: to RocketMQ 4.4.0 it is an ordinary property), none missing;
mqstore's own reads give the same; RocketMQ's IndexService answers for keys what `store.query()` answers (each
message once where RocketMQ repeats a message whose KEYS name the key twice).
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from mqstore.commitlog import format as fmt

from mqstore import Message, MessageStore, PutStatus
from tests.conftest import small_config
from tests.rocketmq import RECORD_CRC_PROPERTY, assert_same_messages, entry_of, index_answer, put_entry, store_entries

LONG_TOPIC = ("A|b%_-" * 22)[:fmt.TOPIC_LENGTH_MAX]
TOPICS = ("orders", "TopicTest", "%RETRY%group_a", "a|b", LONG_TOPIC)
QUERIED_TOPICS = ("orders", "TopicTest")  # `rmq read` asks its IndexService for these topics ...
QUERIED_KEYS = tuple(f"key-{k}" for k in range(0, 50, 7))  # ... and these keys
THREADS = 4
LAYOUTS = {
    # name: settings; messages put singly, in batches and from THREADS threads
    "64k-segments-crc": dict(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, record_crc=True,
                             max_message_size_bytes=8192, index_slot_count=64, index_entry_count_max=256,
                             messages=600),
    "40k-segments-no-crc": dict(segment_size_bytes=40 * 1024, consume_queue_entries_per_file=10, record_crc=False,
                                max_message_size_bytes=4096, index_slot_count=16, index_entry_count_max=40,
                                messages=300),
}


def planned_messages(rng: random.Random, count: int, max_body: int) -> list[Message]:
    """`count` random messages, the first three fixed: an empty body, a body of max_body bytes, and a queried
    key twice in one message's KEYS."""
    messages = [Message("orders", b"", queue_id=1), Message("a|b", rng.randbytes(max_body), queue_id=2),
                Message("TopicTest", b"key twice", keys=("key-7", "key-7"), tags="TagA")]
    for index in range(3, count):
        kind = rng.randrange(10)
        size = (0 if kind == 0 else max_body if kind == 1 else rng.randint(max_body // 2, max_body) if kind == 2
                else rng.randint(1, 300))
        key_count = rng.choice((0, 0, 1, 1, 2, 3, 4))
        keys = [f"key-{rng.randrange(50)}" for _ in range(key_count)]
        if keys and rng.random() < 0.15:
            keys.append(keys[0])  # the same key twice in KEYS
        properties = {}
        if rng.random() < 0.4:
            prefix = rng.choice(("v\u00e9rit\u00e9-", "\u6d88\u606f-", "\U0001f680-", "x-"))
            properties["user.prop"] = prefix + str(index)
        if rng.random() < 0.1:
            properties["UNIQ_KEY"] = f"{rng.getrandbits(128):032X}"
        messages.append(Message(
            rng.choice(TOPICS), rng.randbytes(size), queue_id=rng.choice((0, 1, 2, 3, 3, 9)),
            tags=rng.choice((None, "TagA", "TagB", "t\u00e9g", "\U0001f600tag")), keys=tuple(keys),
            properties=properties, flag=rng.choice((0, 0, 1, 7, 2**31 - 1)),
            born_timestamp_ms=rng.choice((None, 1_700_000_000_000 + index))))
    return messages


def write_store(root, config, messages: list[Message]) -> list[tuple[Message, object]]:
    """Put a third singly, a third in batches of 1-40, a third from THREADS threads (put and put_batch)."""
    third = len(messages) // 3
    done = []
    with MessageStore.open(root, config) as store:
        for message in messages[:third]:
            done.append((message, store.put(message)))
        position, rng = third, random.Random(len(messages))
        while position < 2 * third:
            batch = messages[position : min(2 * third, position + rng.randint(1, 40))]
            done.extend(zip(batch, store.put_batch(batch)))
            position += len(batch)
        shares = [messages[2 * third + t :: THREADS] for t in range(THREADS)]
        results: list[list] = [[] for _ in range(THREADS)]

        def producer(thread: int) -> None:
            for number, message in enumerate(shares[thread]):
                if number % 3 == 2:
                    results[thread].extend(zip([message], store.put_batch([message])))
                else:
                    results[thread].append((message, store.put(message)))

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for share in results:
            done.extend(share)
    assert [result.status for _, result in done] == [PutStatus.PUT_OK] * len(messages)
    return done


@pytest.fixture(scope="module")
def written(rmq, interop_seed, tmp_path_factory) -> dict:
    """For each layout: its config, what was put, mqstore's reads, RocketMQ's read and mqstore's query answers."""

    bases = {name: tmp_path_factory.mktemp(f"interop-{name}") for name in LAYOUTS}  # not thread-safe

    def one(item):
        name, settings = item
        settings = dict(settings)
        count = settings.pop("messages")
        config = small_config(index_enabled=True, **settings)
        base = bases[name]
        rng = random.Random(f"{interop_seed}-{name}")
        messages = planned_messages(rng, count, config.max_message_size_bytes)
        done = write_store(base / "store", config, messages)
        with MessageStore.open(base / "store", config, read_only=True) as store:
            ours = store_entries(store)
            stored = {result.commitlog_offset: store.read_at(result.commitlog_offset) for _, result in done}
            answers = {(topic, key): sorted(m.commitlog_offset for m in store.query(topic, key, max_count=1000))
                       for topic in QUERIED_TOPICS for key in QUERIED_KEYS}
        theirs = rmq.read(base / "store", config, base)
        return name, dict(config=config, done=done, ours=ours, stored=stored, theirs=theirs, answers=answers)

    return dict(rmq.map(one, LAYOUTS.items()))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rocketmq_reads_every_message_as_put(written, layout):
    run = written[layout]
    config, theirs = run["config"], run["theirs"]
    expected = [put_entry(message, result, config,
                          run["stored"][result.commitlog_offset].properties.get(fmt.PROPERTY_UNIQ_KEY))
                for message, result in run["done"]]
    assert_same_messages(expected, theirs.entries, f"{layout}: as put vs RocketMQ's read")
    log_end = max(result.commitlog_offset + result.size_bytes for _, result in run["done"])
    assert theirs.max_physical_offset == log_end


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rocketmq_reads_what_mqstore_reads(written, layout):
    run = written[layout]
    assert_same_messages(run["ours"], run["theirs"].entries, f"{layout}: mqstore's get() vs RocketMQ's read")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_layout_covers_what_it_claims(written, layout):
    """The store holds what the module docstring promises (so the comparisons above are about something)."""
    run = written[layout]
    config, entries = run["config"], run["theirs"].entries
    topics = {entry["topic"] for entry in entries}
    assert topics == set(TOPICS)
    assert {len(entry["body_hex"]) // 2 for entry in entries} >= {0, config.max_message_size_bytes}
    segments = {entry["commitlog_offset"] // config.segment_size_bytes for entry in entries}
    assert len(segments) >= 5, "segments roll (each full one ends in a blank)"
    key_lists = [entry["keys"].split(" ") for entry in entries if entry["keys"]]
    assert any(len(keys) != len(set(keys)) for keys in key_lists), "a key twice in one message's KEYS"
    with_crc = [RECORD_CRC_PROPERTY in entry["properties"] for entry in entries]
    assert with_crc == [config.record_crc] * len(entries)
    uniq_keys = [entry["properties"].get(fmt.PROPERTY_UNIQ_KEY) for entry in entries]
    assert None not in uniq_keys and len(set(uniq_keys)) == len(uniq_keys)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rocketmq_index_answers_are_mqstore_query_answers(written, layout):
    """RocketMQ lists a message once per index entry, so twice when its KEYS hold the key twice; query() lists
    each message once. Both are checked against the messages put."""
    run = written[layout]
    theirs = {(query["topic"], query["key"]): query["commitlog_offsets"] for query in run["theirs"].queries}
    assert theirs.keys() == run["answers"].keys()
    as_put = [put_entry(message, result, run["config"],
                        run["stored"][result.commitlog_offset].properties.get(fmt.PROPERTY_UNIQ_KEY))
              for message, result in run["done"]]
    repeated = 0
    for (topic, key), offsets in theirs.items():
        expected = index_answer(as_put, topic, key)
        assert offsets == expected, (topic, key)
        assert run["answers"][(topic, key)] == sorted(set(expected)), (topic, key)
        repeated += sum(times > 1 for times in Counter(offsets).values())
    assert sum(len(offsets) for offsets in theirs.values()) > 0
    assert repeated > 0, "a queried key twice in one message's KEYS (the case where the answers differ)"


def test_entry_of_matches_rocketmqs_form(written):
    """entry_of gives every field rmq read writes, and nothing else."""
    run = written["64k-segments-crc"]
    stored = next(iter(run["stored"].values()))
    assert set(entry_of(stored)) == set(run["theirs"].entries[0])
