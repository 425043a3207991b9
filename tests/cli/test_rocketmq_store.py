"""The command on the store RocketMQ 4.4.0 wrote: format settings inferred or given, every check passes."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import FIXTURES_DIR, ROCKETMQ_STORE, rocketmq_manifest

ORIGINAL = ROCKETMQ_STORE / "store"


@pytest.fixture(autouse=True)
def _fixture_present():
    if not ORIGINAL.is_dir():
        pytest.fail(f"the RocketMQ fixture store is missing: {ORIGINAL}")


def test_verify_the_original_read_only_store(mqstore):
    run = mqstore("verify", ORIGINAL, "--json")
    assert run.code == 0, run.out
    report = run.json()
    assert (report["segments"], report["records"], report["blanks"]) == (13, 1200, 12)
    assert (report["log_end_offset"], report["queues"], report["entries"]) == (845018, 20, 1200)


def test_topics_stats_get_and_dump_match_the_manifest(mqstore):
    manifest = rocketmq_manifest()
    topics = mqstore("topics", ORIGINAL, "--json").json()["topics"]
    assert {t: v["messages"] for t, v in topics.items()} == {
        t: sum(1 for m in manifest if m["topic"] == t) for t in {m["topic"] for m in manifest}}
    stats = mqstore("stats", ORIGINAL, "--json").json()
    assert stats["commitlog"]["end_offset"] == 845018 and stats["dispatch_lag_bytes"] == 0
    assert stats["topics"]["orders"]["2"]["bytes"] == sum(
        m["size_bytes"] for m in manifest if (m["topic"], m["queue_id"]) == ("orders", 2))
    wanted = [m for m in manifest if (m["topic"], m["queue_id"]) == ("a|b", 3)][5:9]
    got = mqstore("get", ORIGINAL, "--topic", "a|b", "--queue", 3, "--offset", 5, "--count", 4, "--json",
                  "--segment-size-bytes", 65536, "--cq-entries-per-file", 64).json()["messages"]
    assert [(m["body_hex"], m["msg_id"], m["tags"]) for m in got] == [
        (m["body_hex"], m["msg_id"], m["tags"]) for m in wanted]
    record = mqstore("dump", ORIGINAL, "--offset", wanted[0]["commitlog_offset"], "--json").json()
    assert record["properties"] == wanted[0]["properties"] and record["crc_ok"] is True


def test_format_options_that_contradict_the_files_are_errors(mqstore):
    run = mqstore("topics", ORIGINAL, "--segment-size-bytes", 1 << 20)
    assert run.code == 1 and "is 65536 bytes" in run.err and "segment_size_bytes=1048576" in run.err


def test_tail_a_group_from_the_offsets_rocketmq_wrote(mqstore, rocketmq_store_copy):
    (rocketmq_store_copy / "config").mkdir()
    shutil.copy(FIXTURES_DIR / "consumerOffset.json", rocketmq_store_copy / "config" / "consumerOffset.json")
    manifest = rocketmq_manifest()
    run = mqstore("tail", rocketmq_store_copy, "--topic", "TopicTest", "--group", "audit", "--json")
    assert run.code == 0, run.err
    got = sorted((m["queue_id"], m["queue_offset"], m["body_hex"]) for m in run.json_lines())
    assert got == sorted((m["queue_id"], m["queue_offset"], m["body_hex"]) for m in manifest
                         if m["topic"] == "TopicTest" and m["queue_offset"] >= 3)
    table = json.loads((rocketmq_store_copy / "config" / "consumerOffset.json").read_text())["offsetTable"]
    counts = {str(q): sum(1 for m in manifest if (m["topic"], m["queue_id"]) == ("TopicTest", q)) for q in range(4)}
    assert table["TopicTest@audit"] == counts
    assert table["orders@group_a"] == {"0": 120, "1": 97, "2": 0, "3": 64}  # other groups kept
