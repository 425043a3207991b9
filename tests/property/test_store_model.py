"""The store against an in-memory model: random put / put_batch / get / reopen sequences on small segments.

On failure hypothesis prints the shortest failing sequence of steps and, with print_blob, a
`@reproduce_failure(...)` line that replays it exactly (the seed of this run).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqstore import GetStatus, InvalidMessageError, Message, MessageStore, StoreConfig
from mqstore.store.reads import GET_FILTER_SCAN_ENTRIES_MIN

TOPICS = ("alpha", "beta")
QUEUES = 2
TAGS = (None, "A", "B", "C")
CONFIG = StoreConfig(segment_size_bytes=64 * 1024, consume_queue_entries_per_file=8, max_message_size_bytes=6000,
                     max_queues_per_topic=QUEUES, store_host="10.0.0.7", preallocate_segments=False,
                     dispatch_process=False)  # the dispatch thread; ProcessStoreModel below runs the child

bodies = st.one_of(st.binary(max_size=64), st.integers(0, 6000).map(lambda n: bytes([n % 251]) * n))  # rolls segments
messages = st.builds(Message, topic=st.sampled_from(TOPICS), body=bodies, queue_id=st.integers(0, QUEUES - 1),
                     tags=st.sampled_from(TAGS))
bad_messages = st.sampled_from([
    Message("bad/topic", b"x"), Message("alpha", b"x", queue_id=QUEUES), Message("alpha", b"x" * 6001),
    Message("alpha", "str body"), Message("alpha", b"x", properties={"a": "\x01"}),
])
# Each example is a new store: a memory file system keeps the many stores of a shrinking run cheap.
SCRATCH_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

tag_filters = st.sampled_from([None, "*", "A", "B || C", ["A", "C"], "Z"])


class StoreModel(RuleBasedStateMachine):
    """model[(topic, queue_id)] is the list of (body, tags, commitlog_offset) the store should hold, in order."""

    config = CONFIG

    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="mqstore-model-", dir=SCRATCH_DIR)
        self.store = MessageStore.open(self.directory, self.config)
        self.model: dict[tuple[str, int], list[tuple[bytes, str | None, int]]] = defaultdict(list)
        self.log_end = 0

    def _record(self, message: Message, result) -> None:
        queue = self.model[(message.topic, message.queue_id)]
        assert result.queue_offset == len(queue)
        assert result.commitlog_offset >= self.log_end
        assert result.commitlog_offset // CONFIG.segment_size_bytes == (
            result.commitlog_offset + result.size_bytes - 1) // CONFIG.segment_size_bytes
        queue.append((bytes(message.body), message.tags, result.commitlog_offset))
        self.log_end = result.commitlog_offset + result.size_bytes

    @rule(message=messages)
    def put(self, message):
        self._record(message, self.store.put(message))

    @rule(batch=st.lists(messages, max_size=6))
    def put_batch(self, batch):
        results = self.store.put_batch(batch)
        assert len(results) == len(batch)
        for message, result in zip(batch, results):
            self._record(message, result)

    @rule(batch=st.lists(messages, max_size=3), bad=bad_messages, position=st.integers(0, 3))
    def put_batch_with_a_bad_message(self, batch, bad, position):
        batch = list(batch)
        batch.insert(min(position, len(batch)), bad)
        try:
            self.store.put_batch(batch)
        except InvalidMessageError:
            pass
        else:
            raise AssertionError("a batch holding a bad message was accepted")

    @rule(data=st.data(), max_count=st.integers(1, 12), tags=tag_filters)
    def get(self, data, max_count, tags):
        """Mostly from a queue that has messages and at an offset inside it; sometimes anywhere."""
        known = sorted(self.model)
        anywhere = st.tuples(st.sampled_from(TOPICS), st.integers(0, QUEUES - 1))
        topic, queue_id = data.draw(st.one_of(st.sampled_from(known), anywhere) if known else anywhere)
        count = len(self.model.get((topic, queue_id), ()))
        offset = data.draw(st.one_of(st.integers(0, max(0, count - 1)), st.integers(-2, count + 3)))
        assert self.store.wait_dispatched(30)
        result = self.store.get(topic, queue_id, offset, max_count=max_count, tags=tags)
        assert result == self._expected_get(topic, queue_id, offset, max_count, tags)

    def _expected_get(self, topic, queue_id, offset, max_count, tags):
        if (topic, queue_id) not in self.model:
            return (GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        queue = self.model[(topic, queue_id)]
        count = len(queue)
        if offset < 0:
            return (GetStatus.OFFSET_TOO_SMALL, [], 0, 0, count)
        if offset == count:
            return (GetStatus.OFFSET_OVERFLOW_ONE, [], offset, 0, count)
        if offset > count:
            return (GetStatus.OFFSET_OVERFLOW_BADLY, [], 0, 0, count)
        wanted = None
        if tags is not None and tags != "*":
            wanted = set(tags) if isinstance(tags, list) else {part.strip() for part in tags.split("||")}
        scan_end = min(count, offset + (max(max_count, GET_FILTER_SCAN_ENTRIES_MIN) if wanted else max_count))
        picked, next_offset = [], scan_end
        for queue_offset in range(offset, scan_end):
            if wanted is None or queue[queue_offset][1] in wanted:
                picked.append(queue_offset)
                if len(picked) == max_count:
                    next_offset = queue_offset + 1
                    break
        status = GetStatus.FOUND if picked else GetStatus.NO_MATCHED_MESSAGE
        stored = [self.store.read_at(queue[q][2]) for q in picked]
        for queue_offset, message in zip(picked, stored):
            body, message_tags, commitlog_offset = queue[queue_offset]
            assert (message.topic, message.queue_id, message.queue_offset) == (topic, queue_id, queue_offset)
            assert (message.body, message.tags, message.commitlog_offset) == (body, message_tags, commitlog_offset)
        return (status, stored, next_offset, 0, count)

    @rule()
    def reopen(self):
        self.store.close()
        self.store = MessageStore.open(self.directory, self.config)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def read_any_message_at_its_offset(self, data):
        key = data.draw(st.sampled_from(sorted(self.model)))
        queue_offset = data.draw(st.integers(0, len(self.model[key]) - 1))
        body, tags, commitlog_offset = self.model[key][queue_offset]
        message = self.store.read_at(commitlog_offset)
        assert (message.topic, message.queue_id, message.queue_offset, message.body, message.tags) == (
            key[0], key[1], queue_offset, body, tags)

    @invariant()
    def positions_match_the_model(self):
        assert self.store.wait_dispatched(30)
        assert self.store.topics() == {topic: sorted(q for t, q in self.model if t == topic)
                                       for topic in sorted({t for t, _ in self.model})}
        for (topic, queue_id), queue in self.model.items():
            assert self.store.max_offset(topic, queue_id) == len(queue)
        assert self.store.stats()["commitlog"]["max_offset"] == self.log_end

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


StoreModel.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None, print_blob=True,
                                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_store_against_the_model = StoreModel.TestCase


class ProcessStoreModel(StoreModel):
    """The same with dispatch_process=True: the writer reads queues a child process builds (fewer examples: each
    open starts a process)."""

    config = dataclasses.replace(CONFIG, dispatch_process=True)


class QuickProcessStoreModel(ProcessStoreModel):
    """ProcessStoreModel's quick form, for `make test`: a few short sequences (each still puts, gets and reopens
    with a child); the full one (PROCESS_MODEL_EXAMPLES sequences) is `long` and runs in `make test-long`."""


PROCESS_MODEL_EXAMPLES = 12  # about 40 s on 2 cores: most of it the child's start at each open
QUICK_PROCESS_MODEL_EXAMPLES = 3
for model, examples in ((ProcessStoreModel, PROCESS_MODEL_EXAMPLES), (QuickProcessStoreModel,
                                                                      QUICK_PROCESS_MODEL_EXAMPLES)):
    model.TestCase.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None, print_blob=True,
                                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_store_with_a_dispatch_process_against_the_model = pytest.mark.long(pytest.mark.slow(ProcessStoreModel.TestCase))
test_store_with_a_dispatch_process_against_the_model_quickly = pytest.mark.slow(QuickProcessStoreModel.TestCase)
