"""recovery._first_missing_from_queues (which message of a walked batch its ConsumeQueue lacks) against a
row-by-row oracle, for queue ids numbered densely (any real log) and spread too widely for that (negative and
huge ids), with transaction-prepared and rolled-back messages passed over."""

from __future__ import annotations

import random

import pytest
from mqstore.commitlog import format as fmt
from mqstore.commitlog.dispatch_batch import DispatchBatch

from mqstore.store import recovery
from mqstore.store.recovery import RecoveryCase, RecoveryReport

SKIPPED = (fmt.SYS_FLAG_TRANSACTION_PREPARED_TYPE, fmt.SYS_FLAG_TRANSACTION_ROLLBACK_TYPE)


def _oracle(rows: list[dict], queue_ends: dict) -> tuple[int | None, set]:
    first, replayed = None, set()
    for row in rows:
        if (row["sys_flag"] & fmt.SYS_FLAG_TRANSACTION_MASK) in SKIPPED:
            continue
        queue = (row["topic"], row["queue_id"])
        if row["queue_offset"] >= queue_ends.get(queue, 0):
            first = row["commitlog_offset"] if first is None else first
            if queue in queue_ends:
                replayed.add(f"{queue[0]}/{queue[1]}")
    return first, replayed


@pytest.mark.parametrize("queue_ids", [range(8), [0, 3, 1000], [-5, 7, 2**31 - 1, -(2**31)]],
                         ids=["dense", "gaps", "spread"])
def test_the_first_missing_message_and_replayed_queues_match_a_row_by_row_check(queue_ids):
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    for trial in range(40):
        topics = [f"t{i}" for i in range(rng.randrange(1, 5))]
        queue_ends = {(topic, queue_id): rng.randrange(0, 50) for topic in topics for queue_id in queue_ids
                      if rng.random() < 0.8}
        rows = [{"commitlog_offset": 100 * i, "size": 100, "topic": rng.choice(topics),
                 "queue_id": rng.choice(list(queue_ids)), "queue_offset": rng.randrange(0, 60 if trial % 2 else 48),
                 "sys_flag": rng.choice([0, 0, 0, 0x4, 0x8, 0xC])} for i in range(rng.randrange(1, 300))]
        report = RecoveryReport()
        first = recovery._first_missing_from_queues(DispatchBatch.from_rows(rows), queue_ends, report)
        expected_first, expected_replayed = _oracle(rows, queue_ends)
        assert first == expected_first, trial
        assert report.queue_cases == dict.fromkeys(expected_replayed, RecoveryCase.QUEUE_REPLAYED), trial
