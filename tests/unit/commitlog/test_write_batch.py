"""put_batch's numpy path (commitlog/write_batch.py) writes exactly the bytes one put per message writes."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest
from mqstore.commitlog import (
    _native,  # built by the package's install; MQSTORE_NATIVE=0 only changes the default
    native,
    write_batch,
)
from mqstore.commitlog import format as fmt

from mqstore import InvalidMessageError, Message, MessageStore, PutStatus
from tests.conftest import small_config


def _segments(root) -> dict[str, bytearray]:
    return {path.name: bytearray(path.read_bytes()) for path in sorted((root / "commitlog").iterdir())}


def _mask_store_times(data: bytearray, results) -> None:
    """Zero the STORETIMESTAMP and the record-CRC digits (which cover it) of every record: the only bytes
    that depend on when a message was stored."""
    for result in results:
        at = result.commitlog_offset % len(data)
        data[at + fmt.OFFSET_STORE_TIMESTAMP : at + fmt.OFFSET_STORE_TIMESTAMP + 8] = bytes(8)
        end = at + result.size_bytes
        if data[end - 20 : end - 11] == fmt.RECORD_CRC_PREFIX:
            data[end - 11 : end - 1] = bytes(10)


def _one_segment_each(root, results, config):
    images = _segments(root)
    for result in results:
        name = f"{result.commitlog_offset - result.commitlog_offset % config.segment_size_bytes:020d}"
        _mask_store_times(images[name], [result])
    return images


BATCHES = {
    "plain": [Message("t", b"m%d" % i * (i % 7), queue_id=i % 3, born_timestamp_ms=1000 + i) for i in range(50)],
    "tags": [Message("t" if i % 2 else "u", b"x" * i, tags=("A", "B", None)[i % 3], flag=i - 25,
                     born_timestamp_ms=5) for i in range(50)],
    "mixed shapes": [Message("t", bytearray(b"b%d" % i), keys=("k%d" % i,), properties={"p": str(i)},
                             born_timestamp_ms=7) for i in range(20)],
    "rolls segments": [Message("t", b"r" * 3000, queue_id=i % 2, born_timestamp_ms=9) for i in range(60)],
}


@pytest.mark.parametrize("through", [True, False], ids=["pwrite", "mapping"])
@pytest.mark.parametrize("record_crc", [True, False], ids=["record-crc", "rocketmq-4"])
@pytest.mark.parametrize("name", list(BATCHES))
def test_a_batch_writes_the_bytes_of_one_put_per_message(tmp_path, name, record_crc, through):
    messages = BATCHES[name]
    config = small_config(record_crc=record_crc)
    with MessageStore.open(tmp_path / "one", config) as store:
        singles = [store.put(message) for message in messages]
    with MessageStore.open(tmp_path / "batch", config) as store:
        store._commitlog.batch_write_through = through  # batches written with pwrite, or into the mapping
        batched = store.put_batch(messages)
        assert store.wait_dispatched(30)
        read = [store.read_at(result.commitlog_offset) for result in batched]
    assert [r[1:4] for r in batched] == [r[1:4] for r in singles]  # offsets, queue offsets, sizes
    assert [r.msg_id for r in batched] == [r.msg_id for r in singles]
    assert _one_segment_each(tmp_path / "batch", batched, config) == _one_segment_each(tmp_path / "one", singles,
                                                                                       config)
    assert [(m.topic, m.queue_id, m.body, m.tags, m.keys, m.flag) for m in read] == [
        (m.topic, m.queue_id, bytes(m.body), m.tags, tuple(m.keys), m.flag) for m in messages]
    if name == "rolls segments":
        assert batched[-1].commitlog_offset >= 2 * config.segment_size_bytes


def test_queue_offsets_continue_across_batches_and_puts(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:
        first = store.put_batch([Message("t", b"a", queue_id=i % 2) for i in range(5)])
        middle = store.put(Message("t", b"b", queue_id=1))
        last = store.put_batch([Message("t", b"c", queue_id=1), Message("u", b"d")])
    assert [r.queue_offset for r in first] == [0, 0, 1, 1, 2]
    assert middle.queue_offset == 2 and [r.queue_offset for r in last] == [3, 0]



def test_queue_ranks_number_each_queues_messages_in_batch_order():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    draw = random.Random(seed)
    for count, queues in ((1, 1), (7, 3), (1000, 16), (300, 64)):
        key_ids = [draw.randrange(queues) for _ in range(count)]
        seen: dict[int, int] = {}
        expected = [seen.__setitem__(k, seen.get(k, -1) + 1) or seen[k] for k in key_ids]
        ranks = write_batch._queue_ranks(np.asarray(key_ids, dtype=np.int64), queues)
        assert ranks.tolist() == expected


def test_queue_offsets_of_interleaved_queues_follow_each_queue(tmp_path):
    """The harness's shape: 4 topics x 4 queues interleaved in each batch, offsets continuing across batches."""
    shape = [(f"T{i % 4}", (i // 4) % 4) for i in range(200)]
    with MessageStore.open(tmp_path, small_config()) as store:
        store.put(Message("T1", b"x", queue_id=2))
        results = [r for _ in range(2) for r in store.put_batch([Message(t, b"b", queue_id=q) for t, q in shape])]
    counted: dict[tuple[str, int], int] = {("T1", 2): 1}
    for (topic, queue), result in zip(shape * 2, results):
        assert result.queue_offset == counted.get((topic, queue), 0)
        counted[topic, queue] = result.queue_offset + 1


BAD = [
    Message("bad topic!", b"x"),
    Message("t", b"x", queue_id=-1),
    Message("t", "not bytes"),
    Message("t", b"x", tags=""),
    Message("t", b"x", tags="a\x01b"),
    Message("t", b"x", flag=2**31),
    Message("t", b"x", born_timestamp_ms=-5),
    Message("t", b"x" * 9000),
]


@pytest.mark.parametrize("bad", BAD, ids=range(len(BAD)))
def test_a_bad_message_gives_the_error_a_single_put_gives_and_writes_nothing(tmp_path, bad):
    with MessageStore.open(tmp_path, small_config()) as store:
        with pytest.raises(InvalidMessageError) as single:
            store.put(bad)
        with pytest.raises(InvalidMessageError) as batched:
            store.put_batch([Message("t", b"ok")] * 3 + [bad, Message("t", b"ok")])
        assert str(batched.value) == str(single.value)
        assert store._commitlog.readable_end() == 0


class _FailingWrites:
    """The compiled codec, except that encode_run's pwrite (write_to) fails from the `fail_at`-th call on."""

    def __init__(self, codec, fail_at: int):
        self._codec, self._fail_at, self.calls = codec, fail_at, 0

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def encode_run(self, *args):
        if args[-1] is not None:
            self.calls += 1
            if self.calls >= self._fail_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._codec.encode_run(*args)


def test_a_failed_pwrite_keeps_the_pieces_before_it_and_publishes_nothing_after(tmp_path):
    """A batch written through in pieces (write_batch.WRITE_THROUGH_PIECE_BYTES): when the second piece's pwrite
    fails, the first piece's messages are stored and acknowledged, the rest refused, and the log's end is the
    first piece's end, where the next put goes."""
    config = small_config(segment_size_bytes=64 * 1024 * 1024, max_message_size_bytes=64 * 1024)
    body = b"p" * 60_000
    with MessageStore.open(tmp_path / "store", config) as store:
        log = store._commitlog
        assert log.batch_write_through
        log.codec = _FailingWrites(_native, fail_at=2)  # the compiled codec also under MQSTORE_NATIVE=0
        results = store.put_batch([Message("t", body) for _ in range(200)])  # about 3 pieces
        per_piece = write_batch.WRITE_THROUGH_PIECE_BYTES // results[0].size_bytes
        stored = results[:per_piece]
        assert [r.status for r in stored] == [PutStatus.PUT_OK] * per_piece
        assert {r.status for r in results[per_piece:]} == {PutStatus.UNKNOWN_ERROR}
        assert log.codec.calls == 2
        end = stored[-1].commitlog_offset + stored[-1].size_bytes
        assert log.readable_end() == end
        log.codec = native.NATIVE
        after = store.put(Message("t", b"after"))
        assert after.status is PutStatus.PUT_OK and after.commitlog_offset == end
        assert after.queue_offset == len(stored)
        assert store.wait_dispatched(30)
        assert [m.body for m in store.get("t", 0, 0, 64).messages] == [body] * min(len(stored), 64)
