"""recover, clean and query subcommands; no command reaches into bench/."""

from __future__ import annotations

from mqstore import Message, MessageStore
from tests.cli.conftest import TOPIC
from tests.conftest import small_config

INDEX = ("--index-slot-count", "64", "--index-entry-count-max", "256")


def test_recover_reports_a_clean_store(mqstore, store_dir):
    run = mqstore("recover", str(store_dir), "--json")
    assert run.code == 0
    report = run.json()
    assert report["case"] == "CLEAN" and report["dropped_bytes"] == 0
    assert "case: CLEAN" in mqstore("recover", str(store_dir)).out


def test_recover_redispatches_nothing_after_a_clean_close(mqstore, tmp_path):
    """Every reopen of a cleanly closed store with an index found nothing to re-dispatch (it used to replay the
    last indexed message each time). The last message has KEYS of two words besides its UNIQ_KEY."""
    root = tmp_path / "indexed"
    put = mqstore("put", root, "--topic", "t", "--keys", "a b", *INDEX, "--segment-size-bytes", 65536,
                  "--cq-entries-per-file", 64, stdin=b"one\ntwo\nthree\n")
    assert put.code == 0
    for _ in range(2):
        report = mqstore("recover", root, *INDEX, "--json").json()
        assert report["case"] == "CLEAN" and report["messages_redispatched"] == 0
    assert len(mqstore("query", root, "--topic", "t", "--key", "b", *INDEX, "--json").json_lines()) == 3


def test_recover_refuses_damage_then_repairs_it(mqstore, store_dir):
    segment = store_dir / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[88] ^= 0x40  # the first byte of the first message's body: its CRC no longer matches
    segment.write_bytes(bytes(data))
    refused = mqstore("recover", str(store_dir))
    assert refused.code == 1 and "rule 5" in refused.err and str(segment) in refused.err
    repaired = mqstore("recover", str(store_dir), "--repair", "--json")
    assert repaired.code == 0 and repaired.json()["case"] == "CLEAN_CORRUPT"
    assert repaired.json()["log_end"] == 0


def test_clean_removes_nothing_young(mqstore, store_dir):
    run = mqstore("clean", str(store_dir), "--json")
    assert run.code == 0 and run.json()["segments_removed"] == []
    assert "removed 0 segment(s)" in mqstore("clean", str(store_dir)).out


def test_query_finds_messages_by_key(mqstore, tmp_path):
    root = tmp_path / "indexed"
    with MessageStore.open(root, small_config(index_enabled=True)) as store:
        store.put_batch([Message(TOPIC, b"m%d" % i, keys=(f"k{i % 3}",)) for i in range(9)])
    run = mqstore("query", str(root), "--topic", TOPIC, "--key", "k1", "--json", *INDEX)
    assert run.code == 0
    assert [m["body_text"] for m in run.json_lines()] == ["m7", "m4", "m1"]
    assert "# 3 message(s)" in mqstore("query", str(root), "--topic", TOPIC, "--key", "k1", *INDEX).out
    assert mqstore("query", str(root), "--topic", "../x", "--key", "k1", *INDEX).code == 1
    assert mqstore("query", str(root), "--topic", TOPIC, *INDEX).code == 2  # --key is required


def test_the_shipped_command_has_no_bench_subcommand(mqstore):
    assert mqstore("bench", "put_get").code == 2  # benchmarks run from a checkout: make bench, python bench/*.py
