"""A failed fdatasync is never forgotten (docs/recovery.md, "When a flush fails").

Each test runs a scenario of tests/faults/scenarios.py in a process with disk_double.c preloaded: one fdatasync
of a chosen file fails with EIO and the next one succeeds, as Linux reports a writeback error once. The store must
keep the failure: the SYNC put that waited on it gets FLUSH_DISK_FAILED, every later flush(), put, put_batch and
close() raises FlushFailedError, the flushed offset and the checkpoint stay where they were, the abort marker stays.
Then the test reopens the store without the double: recovery runs as after a crash, and every acknowledged
message is there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mqstore.commitlog import format as fmt

from mqstore import MessageStore, PutStatus
from tests.faults.scenarios import MESSAGES_BEFORE, TOPIC, config, message

pytestmark = pytest.mark.slow  # a writer process each

REFUSED = "FlushFailedError"


def assert_kept(report: dict) -> None:
    """The failure is sticky: every call after it fails, and no durable position moved past it."""
    assert report["before"] == ["PUT_OK"] * MESSAGES_BEFORE
    assert report["failed_calls"] == 1, "the double failed exactly one call"
    assert report["flush"] == [REFUSED, REFUSED], "a second flush() must not succeed after a failed one"
    assert report["put_after"] == REFUSED
    assert report["put_batch_after"] == REFUSED
    assert report["stats_failed"] and "fdatasync" in report["stats_failed"]
    assert report["close"] == REFUSED
    assert report["abort_marker"], "close() after a failed flush must leave the store to recover as after a crash"


def acknowledged(report: dict) -> list[int]:
    """The seqs of scenarios.message whose put returned PUT_OK."""
    seqs = [seq for seq, status in enumerate(report["before"]) if status == "PUT_OK"]
    if report.get("failed_put") == "PUT_OK":
        seqs.append(MESSAGES_BEFORE)
    return seqs


def assert_readable(root: Path, mode: str, seqs: list[int]) -> MessageStore:
    """Reopen (recovery as after a crash) and find each acknowledged message in its queue; returns the store."""
    store = MessageStore.open(root, config(mode, False))
    assert store.recovery_report.crashed
    found = {}
    for queue_id in range(4):
        result = store.get(TOPIC, queue_id, 0, 10_000)
        for stored in result.messages:
            found[bytes(stored.body)] = stored
    for seq in seqs:
        assert message(seq).body in found, f"acknowledged message {seq} is lost"
    return store


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_failed_log_flush_is_kept(tmp_path, run_scenario, mode, native):
    root = tmp_path / "store"
    report = run_scenario("log", root, mode, native=native)
    assert_kept(report)
    # SYNC: the put whose flush failed is told so, not that it timed out; ASYNC: it was stored before the failure
    assert report["failed_put"] == ("FLUSH_DISK_FAILED" if mode == "SYNC" else "PUT_OK")
    assert report["durable_after"] == report["durable_before"], "the flushed offset moved past the failed bytes"
    assert report["checkpoint_flushed"] == report["durable_before"], "the checkpoint moved past the failed bytes"
    store = assert_readable(root, mode, acknowledged(report))
    assert store.put(message(10**7)).status is PutStatus.PUT_OK, "a reopened store takes writes again"
    store.close()


def test_lost_pages_after_a_failed_flush_are_cut_by_recovery(tmp_path, run_scenario):
    """The disk dropped what it could not write: recovery cuts the log where the checkpoint says it was durable,
    and every message acknowledged before the failure is there."""
    root = tmp_path / "store"
    report = run_scenario("log", root, "SYNC")
    assert_kept(report)
    durable = report["checkpoint_flushed"]
    segment = root / "commitlog" / fmt.segment_name(0)
    with open(segment, "r+b") as handle:
        handle.seek(durable)
        handle.write(bytes(4096))  # the failed put's record, and more, never reached the disk
    store = assert_readable(root, "SYNC", acknowledged(report))
    assert store.recovery_report.log_end == durable
    assert store.get(TOPIC, MESSAGES_BEFORE % 4, 0, 10_000).max_offset == MESSAGES_BEFORE // 4
    store.close()


def test_the_flusher_thread_meeting_a_failure_refuses_puts(tmp_path, run_scenario):
    root = tmp_path / "store"
    report = run_scenario("log_thread", root, "ASYNC")
    assert_kept(report)
    assert report["refused_in_time"], "puts went on being accepted after the flusher's fdatasync failed"
    assert report["checkpoint_flushed"] == report["durable_before"]
    assert_readable(root, "ASYNC", acknowledged(report)).close()


@pytest.mark.parametrize("files", ["queue", "index"])
def test_a_failed_queue_or_index_flush_is_kept(tmp_path, run_scenario, files):
    root = tmp_path / "store"
    report = run_scenario(files, root, "SYNC")
    assert_kept(report)
    assert report["failed_put"] == "PUT_OK"  # its CommitLog bytes were durable; the queue's flush failed later
    store = assert_readable(root, "SYNC", acknowledged(report))
    store.close()


def test_a_failed_flush_in_the_dispatch_process_refuses_puts(tmp_path, run_scenario):
    root = tmp_path / "store"
    report = run_scenario("child_queue", root, "ASYNC")
    assert report["before"] == ["PUT_OK"] * MESSAGES_BEFORE
    assert report["refused_in_time"], "the writer kept taking puts after its dispatch process failed to flush"
    assert report["flush"] == [REFUSED, REFUSED]
    assert report["put_after"] == REFUSED
    assert report["close"] == REFUSED
    assert report["abort_marker"]
    assert_readable(root, "ASYNC", acknowledged(report)).close()


def test_close_that_meets_the_failure_raises_and_releases_the_store(tmp_path, run_scenario):
    root = tmp_path / "store"
    report = run_scenario("close", root, "ASYNC")
    assert report["close"] == REFUSED
    assert report["abort_marker"]
    assert report["checkpoint_flushed"] == report["durable_before"]
    assert_readable(root, "ASYNC", acknowledged(report)).close()  # the lock was released


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_sync_producers_never_see_put_ok_past_a_failed_flush(tmp_path, run_scenario, native):
    """Four SYNC producers; the 26th flush fails. A PUT_OK is a promise: every one ends at or below the durable
    offset the checkpoint holds, and every one is there after the reopen."""
    root = tmp_path / "store"
    report = run_scenario("threads", root, "SYNC", "--threads", "4", native=native)
    results = report["results"]
    assert report["failed_calls"] == 1
    statuses = {status for status, _, _ in results}
    assert "FLUSH_DISK_FAILED" in statuses
    assert statuses <= {"PUT_OK", "FLUSH_DISK_FAILED", REFUSED}
    for status, offset, size in results:
        if status == "PUT_OK":
            assert offset + size <= report["checkpoint_flushed"], "PUT_OK for bytes the disk did not take"
    assert report["flush"] == [REFUSED, REFUSED] and report["close"] == REFUSED
    ok = [MESSAGES_BEFORE + seq for seq, (status, _, _) in enumerate(results) if status == "PUT_OK"]
    assert_readable(root, "SYNC", list(range(MESSAGES_BEFORE)) + ok).close()



@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_asyncio_puts_in_flight_get_flush_disk_failed(tmp_path, run_scenario, native):
    """mqstore.aio: 200 SYNC puts in flight from one loop when the flush fails. Each awaiting put resolves (no
    hang) with FLUSH_DISK_FAILED, or raises FlushFailedError when written after the failure was kept; none is
    PUT_OK past the durable offset, and the store refuses puts and close() as the sync API does."""
    root = tmp_path / "store"
    report = run_scenario("aio", root, "SYNC", native=native)
    assert report["before"] == ["PUT_OK"] * MESSAGES_BEFORE
    assert report["failed_calls"] == 1
    outcomes = [status for status, _, _ in report["results"]]
    assert set(outcomes) <= {"PUT_OK", "FLUSH_DISK_FAILED", REFUSED}, outcomes
    assert "FLUSH_DISK_FAILED" in outcomes, "no awaiting put was told that its flush failed"
    for status, offset, size in report["results"]:
        if status == "PUT_OK":  # only a put made durable before the failure may say so
            assert offset + size <= report["checkpoint_flushed"]
    assert report["durable_after"] == report["durable_before"] == report["checkpoint_flushed"]
    assert report["put_after"] == REFUSED
    assert report["close"] == REFUSED
    seqs = list(range(MESSAGES_BEFORE))
    assert_readable(root, "SYNC", seqs).close()
