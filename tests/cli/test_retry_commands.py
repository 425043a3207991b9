"""dead-letters and replay subcommands (mqstore/cli/retry.py)."""

from __future__ import annotations

from mqstore import Message, MessageStore
from tests.conftest import small_config

WAIT_S = 20.0


def _store_with_dead_letters(root, count: int) -> None:
    with MessageStore.open(root, small_config()) as store:
        for index in range(count):
            store.put(Message("orders", b"d%d" % index, tags="T"))
        assert store.wait_dispatched(WAIT_S)
        consumer = store.consumer("g", "orders")
        for message in consumer.poll(max_count=count):
            consumer.nack(message, delay_level=-1)
        consumer.commit()


def test_dead_letters_lists_them_with_their_original_topic(mqstore, tmp_path):
    root = tmp_path / "store"
    _store_with_dead_letters(root, 3)
    run = mqstore("dead-letters", root, "--group", "g", "--json")
    assert run.code == 0
    letters = run.json_lines()
    assert [(m["topic"], m["body_text"], m["reconsume_times"]) for m in letters] == [
        ("orders", "d0", 1), ("orders", "d1", 1), ("orders", "d2", 1)]
    assert "# 1 dead letter(s) of group g" in mqstore("dead-letters", root, "--group", "g", "--start", "2").out
    assert mqstore("dead-letters", root, "--group", "x" * 121).code == 1  # an illegal DLQ topic: a clear error


def test_replay_puts_dead_letters_back_on_their_topic(mqstore, tmp_path):
    root = tmp_path / "store"
    _store_with_dead_letters(root, 3)
    run = mqstore("replay", root, "--group", "g", "--start", "1", "--json")
    assert run.code == 0
    report = run.json()
    assert [entry["dlq_offset"] for entry in report["replayed"]] == [1, 2] and report["next_start"] == 3
    with MessageStore.open(root, small_config(), read_only=True) as store:
        replayed = store.get("orders", 0, 3).messages
        assert [(m.body, m.tags, m.reconsume_times) for m in replayed] == [(b"d1", "T", 0), (b"d2", "T", 0)]
    assert "replayed 0 dead letter(s)" in mqstore("replay", root, "--group", "g", "--start", "3").out
