"""IndexDispatcher: keys from dispatch batches, RocketMQ's skip rules, replays and resumed messages."""

from __future__ import annotations

import random

import pytest
from mqstore.commitlog import format as log_format
from mqstore.commitlog.dispatch import DispatchBatch
from mqstore.commitlog.native import NATIVE
from mqstore.indexfile.dispatcher import IndexDispatcher, message_index_keys
from mqstore.indexfile.index_service import IndexService

T0 = 1_700_000_000_000
ALWAYS = (0, 2**62)


def _batch(rows) -> DispatchBatch:
    """rows: (offset, topic, keys, uniq_key, sys_flag)."""
    return DispatchBatch.from_rows([
        {"commitlog_offset": offset, "size": 100, "topic": topic, "store_timestamp_ms": T0 + offset,
         "sys_flag": sys_flag, "keys": keys, "uniq_key": uniq_key}
        for offset, topic, keys, uniq_key, sys_flag in rows])


def _query(service, topic, key):
    return service.query(topic, key, 100, *ALWAYS)


def test_keys_and_uniq_key_are_indexed_in_rocketmq_order(tmp_path):
    service = IndexService(tmp_path, 8, 32)
    IndexDispatcher(service).dispatch(_batch([
        (0, "orders", b"a b", b"U0", 0),
        (100, "orders", b"  b   c ", None, 0),  # empty words are skipped, as Java's split + length check does
        (200, "pay", None, b"U2", 0),
        (300, "orders", b"", None, 0),  # nothing to index
        (400, "orders", None, None, 0),
    ]))
    assert _query(service, "orders", "a") == [0]
    assert _query(service, "orders", "b") == [100, 0]
    assert _query(service, "orders", "c") == [100]
    assert _query(service, "orders", "U0") == [0]
    assert _query(service, "pay", "U2") == [200] and _query(service, "orders", "U2") == []
    assert service.entry_count == 6 and service.max_indexed_offset == 200
    assert message_index_keys(b"t#", b"U", b"x  y") == [b"t#U", b"t#x", b"t#y"]


def test_rollback_is_skipped_prepared_and_commit_are_indexed(tmp_path):
    service = IndexService(tmp_path, 8, 32)
    IndexDispatcher(service).dispatch(_batch([
        (0, "t", b"prepared", None, log_format.SYS_FLAG_TRANSACTION_PREPARED_TYPE),
        (100, "t", b"commit", None, log_format.SYS_FLAG_TRANSACTION_COMMIT_TYPE | log_format.SYS_FLAG_MULTI_TAGS),
        (200, "t", b"rollback", None, log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE),
    ]))
    assert _query(service, "t", "prepared") == [0]
    assert _query(service, "t", "commit") == [100]
    assert _query(service, "t", "rollback") == []


def test_a_replayed_batch_adds_nothing(tmp_path):
    service = IndexService(tmp_path, 8, 6)
    rows = [(i * 100, "t", b"k%d k" % i, b"U%d" % i, 0) for i in range(6)]
    dispatcher = IndexDispatcher(service)
    dispatcher.dispatch(_batch(rows[:4]))
    before = service.entry_count
    dispatcher.dispatch(_batch(rows[:4]))  # a replay after a restart
    assert service.entry_count == before == 12
    dispatcher.dispatch(_batch(rows[2:]))  # overlapping: only 400 and 500 are new
    assert service.entry_count == 18
    assert _query(service, "t", "k") == [500, 400, 300, 200, 100, 0]


def test_a_message_cut_between_its_keys_is_completed_without_duplicates(tmp_path):
    service = IndexService(tmp_path, 8, 32)
    service.put_keys([b"t#a", b"t#U1"], [0, 100], [T0, T0 + 100])  # message 100 got its UNIQ_KEY only
    IndexDispatcher(service).dispatch(_batch([(0, "t", b"a", None, 0), (100, "t", b"x y", b"U1", 0),
                                              (200, "t", b"x", None, 0)]))
    assert _query(service, "t", "U1") == [100]
    assert _query(service, "t", "x") == [200, 100]
    assert _query(service, "t", "y") == [100]
    assert service.entry_count == 5


@pytest.mark.parametrize("rollback_share, keys_share, batch_size", [
    (0.25, 1.0, 37),  # nearly every batch of the first half has a rollback: the per-message loop
    (0.0, 1.0, 37), (0.0, 1.0, 100),  # none, but KEYS: the loop
    (0.0, 0.0, 100), (0.0, 0.0, 25),  # no KEYS, a UNIQ_KEY each: the uniq-keys-only passes
    (0.02, 0.5, 60), (0.0, 1.0, 3),  # a mix; batches below the whole-batch size
])
def test_dispatch_builds_the_same_bytes_as_one_key_at_a_time(tmp_path, rollback_share, keys_share, batch_size):
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    rows, offset = [], 0
    for index in range(300):
        words = [rng.choice([b"", b"k%d" % rng.randrange(40)]) for _ in range(rng.randrange(4))]
        keys = (b" ".join(words) or None) if rng.random() < keys_share else None  # b" " and b"" hold no key
        uniq = b"U%d" % offset if rng.random() < 0.8 or not keys_share else None
        rollback = index < 150 and rng.random() < rollback_share  # the second half has none
        flag = log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE if rollback else rng.choice(
            [0, log_format.SYS_FLAG_TRANSACTION_PREPARED_TYPE, log_format.SYS_FLAG_TRANSACTION_COMMIT_TYPE])
        rows.append((offset, rng.choice(["a", "b", "é"]), keys, uniq, flag))
        offset += rng.randrange(1, 500)
    batched = IndexService(tmp_path / "batched", 5, 17)
    dispatcher = IndexDispatcher(batched)
    passes = []
    put_uniq_keys_only = dispatcher._put_uniq_keys_only
    dispatcher._put_uniq_keys_only = lambda *args: passes.append(put_uniq_keys_only(*args)) or passes[-1]
    for start in range(0, len(rows), batch_size):
        dispatcher.dispatch(_batch(rows[start : start + batch_size]))
    if NATIVE is None:  # the paths each case is meant for (the first batch starts at the empty index's end: the loop)
        assert any(passes) == (batch_size > 24 and not keys_share) and (all(passes[1:]) or keys_share)
    else:  # the compiled placement takes every batch
        assert passes == []
    single = IndexService(tmp_path / "single", 5, 17)
    for offset, topic, keys, uniq, flag in rows:
        if flag == log_format.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE:
            continue
        for key in ([uniq] if uniq is not None else []) + [k for k in (keys or b"").split(b" ") if k]:
            single.put_key(topic, key.decode(), offset, T0 + offset)
    assert len(batched.files) == len(single.files) > 3
    for mine, theirs in zip(batched.files, single.files):
        mine.flush()
        theirs.flush()
        with open(mine.path, "rb") as a, open(theirs.path, "rb") as b:
            assert a.read() == b.read()
    batched.close()
    single.close()
