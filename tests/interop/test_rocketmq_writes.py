"""RocketMQ 4.4.0 writes, mqstore reads and appends, RocketMQ reads the whole.

`rmq write` makes a store with RocketMQ's own DefaultMessageStore (two seeds, two sets of segment,
ConsumeQueue and IndexFile sizes; 5 topics, bodies up to 3 KB, tags, keys, UNIQ_KEY, unicode properties) and
shuts it down cleanly. Then, each on a copy:
  * every queue read through mqstore's get() equals RocketMQ's own `rmq read` of the store, field by field,
    and `store.query()` answers RocketMQ's index queries as RocketMQ does, each message once;
  * mqstore appends (put and put_batch; the store's topics and new ones; record CRC on), closes, and `rmq read`
    of the result returns RocketMQ's messages unchanged, mqstore's as put, and what mqstore's get() returns.
"""

from __future__ import annotations

import random

import pytest
from mqstore.commitlog import format as fmt

from mqstore import MessageStore, PutStatus
from tests.conftest import small_config
from tests.interop.test_mqstore_writes import QUERIED_KEYS, QUERIED_TOPICS, planned_messages
from tests.rocketmq import assert_same_messages, copy_store, index_answer, put_entry, store_entries

WRITES = {
    # name: sizes RocketMQ writes with; messages it writes; messages mqstore appends
    "64k-segments": dict(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64, index_slot_count=64,
                         index_entry_count_max=256, max_message_size_bytes=8192, written=600, appended=200),
    "48k-segments": dict(segment_size_bytes=48 * 1024, consume_queue_entries_per_file=10, index_slot_count=16,
                         index_entry_count_max=50, max_message_size_bytes=4096, written=300, appended=120),
}
APPEND_BATCH_MAX = 25


def _answers(store) -> dict:
    return {(topic, key): sorted(m.commitlog_offset for m in store.query(topic, key, max_count=1000))
            for topic in QUERIED_TOPICS for key in QUERIED_KEYS}


@pytest.fixture(scope="module")
def runs(rmq, interop_seed, tmp_path_factory) -> dict:
    bases = {name: tmp_path_factory.mktemp(f"rocketmq-writes-{name}") for name in WRITES}  # not thread-safe

    def one(item):
        name, settings = item
        settings = dict(settings)
        written, appended = settings.pop("written"), settings.pop("appended")
        config = small_config(index_enabled=True, **settings)
        seed = interop_seed + list(WRITES).index(name)
        base = bases[name]
        rmq.write(base / "rocketmq", config, written, seed)
        first = rmq.read(base / "rocketmq", config, _directory(base / "read-1"))
        copy_store(base / "rocketmq", base / "mqstore")
        with MessageStore.open(base / "mqstore", config, read_only=True) as store:
            before, answers_before = store_entries(store), _answers(store)
        rng = random.Random(f"{seed}-append")
        messages = planned_messages(rng, appended, config.max_message_size_bytes)
        done = []
        with MessageStore.open(base / "mqstore", config) as store:
            position = 0
            while position < len(messages):
                if rng.random() < 0.5:
                    done.append((messages[position], store.put(messages[position])))
                    position += 1
                else:
                    batch = messages[position : position + rng.randint(1, APPEND_BATCH_MAX)]
                    done.extend(zip(batch, store.put_batch(batch)))
                    position += len(batch)
        assert [result.status for _, result in done] == [PutStatus.PUT_OK] * len(messages)
        with MessageStore.open(base / "mqstore", config, read_only=True) as store:
            after, answers_after = store_entries(store), _answers(store)
            uniq_keys = {result.commitlog_offset: store.read_at(result.commitlog_offset).properties.get(
                fmt.PROPERTY_UNIQ_KEY) for _, result in done}
        second = rmq.read(base / "mqstore", config, _directory(base / "read-2"))
        return name, dict(config=config, seed=seed, written=written, first=first, before=before,
                          answers_before=answers_before, done=done, uniq_keys=uniq_keys, after=after,
                          answers_after=answers_after, second=second)

    print(f"[interop] rmq write seeds: {[interop_seed + i for i in range(len(WRITES))]}")
    return dict(rmq.map(one, WRITES.items()))


def _directory(path):
    path.mkdir()
    return path


@pytest.mark.parametrize("name", WRITES)
def test_mqstore_reads_rocketmqs_store_as_rocketmq_does(runs, name):
    run = runs[name]
    assert run["first"].message_count == run["written"]
    assert_same_messages(run["before"], run["first"].entries, f"{name} seed {run['seed']}: mqstore vs RocketMQ")


@pytest.mark.parametrize("name", WRITES)
def test_query_answers_rocketmqs_index_queries_each_message_once(runs, name):
    run = runs[name]
    entries = run["first"].entries
    for query in run["first"].queries:
        topic, key = query["topic"], query["key"]
        assert query["commitlog_offsets"] == index_answer(entries, topic, key), (topic, key)
        assert run["answers_before"][(topic, key)] == sorted(set(query["commitlog_offsets"])), (topic, key)
    assert sum(len(query["commitlog_offsets"]) for query in run["first"].queries) > 0


@pytest.mark.parametrize("name", WRITES)
def test_rocketmq_reads_the_store_mqstore_appended_to(runs, name):
    run = runs[name]
    label = f"{name} seed {run['seed']}"
    first, second, config = run["first"], run["second"], run["config"]
    old_end = first.max_physical_offset
    kept = [entry for entry in second.entries if entry["commitlog_offset"] < old_end]
    assert_same_messages(kept, first.entries, f"{label}: RocketMQ's messages after the appends vs before")
    as_put = [put_entry(message, result, config, run["uniq_keys"][result.commitlog_offset])
              for message, result in run["done"]]
    assert min(entry["commitlog_offset"] for entry in as_put) >= old_end
    appended = [entry for entry in second.entries if entry["commitlog_offset"] >= old_end]
    assert_same_messages(as_put, appended, f"{label}: mqstore's appends as put vs RocketMQ's read")
    assert_same_messages(run["after"], second.entries, f"{label}: mqstore's get() vs RocketMQ's read")
    assert second.max_physical_offset == max(e["commitlog_offset"] + e["size_bytes"] for e in as_put)
    continued = {(e["topic"], e["queue_id"]) for e in appended} & {(e["topic"], e["queue_id"]) for e in kept}
    assert continued, "mqstore's appends continue queues RocketMQ wrote"


@pytest.mark.parametrize("name", WRITES)
def test_rocketmqs_index_finds_what_mqstore_appended(runs, name):
    run = runs[name]
    entries = run["second"].entries
    appended = 0
    for query in run["second"].queries:
        topic, key = query["topic"], query["key"]
        assert query["commitlog_offsets"] == index_answer(entries, topic, key), (topic, key)
        assert run["answers_after"][(topic, key)] == sorted(set(query["commitlog_offsets"])), (topic, key)
        appended += sum(offset >= run["first"].max_physical_offset for offset in query["commitlog_offsets"])
    assert appended > 0
