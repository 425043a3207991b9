"""Every `mqstore` subcommand in-process: output, --json, exit codes (0 ok, 1 error, 2 usage)."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from mqstore import Message, MessageStore
from mqstore.consumer.group import open_consumer
from tests.cli.conftest import MESSAGES_PER_QUEUE, QUEUE_COUNT, TOPIC, body, tags
from tests.conftest import small_config

COMMANDS = ["demo", "put", "get", "tail", "topics", "stats", "dump", "verify"]


# --- usage -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(mqstore, command):
    run = mqstore(command, "--help")
    assert run.code == 0
    assert run.out.startswith(f"usage: mqstore {command}")


@pytest.mark.parametrize("args", [
    [],                                                          # no command
    ["frobnicate", "x"],                                         # unknown command
    ["get", "STORE", "--topic", "t", "--queue", "0"],            # --offset missing
    ["get", "STORE", "--topic", "t", "--queue", "-1", "--offset", "0"],
    ["get", "STORE", "--topic", "t", "--queue", "0", "--offset", "x"],
    ["get", "STORE", "--topic", "t", "--queue", "0", "--offset", "0", "--count", "0"],
    ["put", "STORE"],                                            # --topic missing
    ["tail", "STORE", "--topic", "t", "--from", "middle"],
    ["dump", "STORE"],
    ["verify"],                                                  # STORE missing
    ["stats", "STORE", "--segment-size-bytes", "0"],
])
def test_bad_arguments_are_usage_errors(mqstore, args):
    run = mqstore(*args)
    assert run.code == 2
    assert "usage: mqstore" in run.err


@pytest.mark.parametrize("command", [["get", "--topic", "t", "--queue", "0", "--offset", "0"], ["tail", "--topic", "t"],
                                     ["topics"], ["stats"], ["dump", "--offset", "0"], ["verify"]])
def test_read_commands_refuse_a_missing_store_and_create_nothing(mqstore, tmp_path, command):
    missing = tmp_path / "nothing-here"
    run = mqstore(command[0], missing, *command[1:])
    assert run.code == 1
    assert run.err.startswith("mqstore: ") and "not a store" in run.err
    assert not missing.exists()


# --- put -------------------------------------------------------------------------------------------------------
def test_put_stores_one_message_per_stdin_line(mqstore, tmp_path):
    root = tmp_path / "new"
    run = mqstore("put", root, "--topic", "t", "--queue", "2", "--tags", "A", "--keys", "k1 k2", "--keys", "k3",
                  "--segment-size-bytes", 65536, "--cq-entries-per-file", 64, stdin=b"one\ntwo\n\nlast-no-newline")
    assert run.code == 0, run.err
    assert "stored 4 messages in t/2: queue offsets 0..3" in run.out
    with MessageStore.open(root, small_config(), read_only=True) as store:
        got = store.get("t", 2, 0, max_count=10)
        assert [m.body for m in got.messages] == [b"one", b"two", b"", b"last-no-newline"]
        assert {(m.tags, m.keys) for m in got.messages} == {("A", ("k1", "k2", "k3"))}


def test_put_json_and_file_input(mqstore, store_dir, tmp_path):
    bodies = tmp_path / "bodies.txt"
    bodies.write_bytes(b"x\ny\n")
    run = mqstore("put", store_dir, "--topic", TOPIC, "--file", bodies, "--json")
    assert run.code == 0, run.err
    result = run.json()
    assert result["count"] == 2
    assert (result["first_queue_offset"], result["last_queue_offset"]) == (MESSAGES_PER_QUEUE, MESSAGES_PER_QUEUE + 1)
    assert len(result["first_msg_id"]) == 32


def test_put_errors(mqstore, store_dir, tmp_path):
    run = mqstore("put", store_dir, "--topic", "bad topic!", stdin=b"x\n")
    assert run.code == 1 and "topic" in run.err
    run = mqstore("put", store_dir, "--topic", "t", "--file", tmp_path / "absent.txt")
    assert run.code == 1 and "absent.txt" in run.err
    with MessageStore.open(store_dir, small_config()):  # another writer holds the lock
        run = mqstore("put", store_dir, "--topic", "t", stdin=b"x\n")
    assert run.code == 1 and "open for writing elsewhere" in run.err
    run = mqstore("put", store_dir, "--topic", "t", "--segment-size-bytes", 131072, stdin=b"x\n")
    assert run.code == 1 and "other format settings" in run.err


# --- get -------------------------------------------------------------------------------------------------------
def test_get_prints_messages_and_status(mqstore, store_dir):
    run = mqstore("get", store_dir, "--topic", TOPIC, "--queue", 1, "--offset", 2, "--count", 3)
    assert run.code == 0, run.err
    for line, index in zip(run.lines, (2, 3, 4)):
        assert line.startswith(f"{TOPIC}/1 @{index} commitlog=")
        assert line.endswith(f" tags={tags(index)} keys=k1-{index} body={body(1, index).decode()}")
    assert run.lines[3] == "# FOUND: 3 messages, next offset 5 (queue offsets 0..6)"


def test_get_json_with_tag_filter(mqstore, store_dir):
    run = mqstore("get", store_dir, "--topic", TOPIC, "--queue", 0, "--offset", 0, "--count", 10, "--tags", "paid",
                  "--json")
    assert run.code == 0, run.err
    result = run.json()
    assert result["status"] == "FOUND"
    assert [m["queue_offset"] for m in result["messages"]] == [1, 3, 5]
    assert {m["tags"] for m in result["messages"]} == {"paid"}
    assert result["messages"][0]["body_text"] == body(0, 1).decode()
    assert bytes.fromhex(result["messages"][0]["body_hex"]) == body(0, 1)


def test_get_binary_body_and_statuses(mqstore, store_dir):
    run = mqstore("get", store_dir, "--topic", "binary", "--queue", 0, "--offset", 0)
    assert run.lines[0].endswith("body=0x" + bytes(range(256)).hex())
    run = mqstore("get", store_dir, "--topic", TOPIC, "--queue", 0, "--offset", MESSAGES_PER_QUEUE, "--json")
    assert run.code == 0 and run.json()["status"] == "OFFSET_OVERFLOW_ONE" and run.json()["messages"] == []
    run = mqstore("get", store_dir, "--topic", TOPIC, "--queue", 7, "--offset", 0)
    assert run.code == 1 and "no queue orders/7" in run.err
    run = mqstore("get", store_dir, "--topic", "bad topic", "--queue", 0, "--offset", 0)
    assert run.code == 1 and run.err.startswith("mqstore: ")


# --- tail ------------------------------------------------------------------------------------------------------
def test_tail_prints_every_queue_and_ends_when_caught_up(mqstore, store_dir):
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--json")
    assert run.code == 0, run.err
    seen = sorted((m["queue_id"], m["queue_offset"], m["body_text"]) for m in run.json_lines())
    assert seen == sorted((q, i, body(q, i).decode()) for q in range(QUEUE_COUNT) for i in range(MESSAGES_PER_QUEUE))
    assert not (store_dir / "config" / "consumerOffset.json").exists()  # no group: nothing committed


def test_tail_with_group_commits_and_resumes(mqstore, store_dir):
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--group", "billing", "--max-messages", 5)
    assert run.code == 0 and len(run.lines) == 5
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--group", "billing")
    assert run.code == 0 and len(run.lines) == QUEUE_COUNT * MESSAGES_PER_QUEUE - 5
    assert mqstore("tail", store_dir, "--topic", TOPIC, "--group", "billing").out == ""
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        consumer = open_consumer(store, "billing", TOPIC)
        assert consumer.committed() == {q: MESSAGES_PER_QUEUE for q in range(QUEUE_COUNT)}


def test_tail_filters_by_tag_and_queue_and_starts_from_last(mqstore, store_dir):
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--queue", 1, "--tags", "created", "--json")
    assert [(m["queue_id"], m["queue_offset"]) for m in run.json_lines()] == [(1, 0), (1, 2), (1, 4)]
    assert mqstore("tail", store_dir, "--topic", TOPIC, "--from", "last").out == ""


def test_tail_follow_ends_by_itself(mqstore, store_dir):
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--follow", "--timeout-ms", 50)
    assert run.code == 0 and len(run.lines) == QUEUE_COUNT * MESSAGES_PER_QUEUE
    run = mqstore("tail", store_dir, "--topic", "not-yet", "--follow", "--timeout-ms", 0)
    assert run.code == 0 and run.out == ""


def test_tail_follow_sees_messages_put_by_a_writer(mqstore, store_dir):
    """A read-only follower is given a message by a writer in another thread and stops after it."""
    writer = MessageStore.open(store_dir, small_config())
    try:
        thread = threading.Thread(target=lambda: writer.put(Message("late", b"news", queue_id=3)))
        thread.start()
        run = mqstore("tail", store_dir, "--topic", "late", "--follow", "--max-messages", 1, "--timeout-ms", 60_000)
        thread.join()
    finally:
        writer.close()
    assert run.code == 0, run.err
    assert run.lines == [run.lines[0]] and run.lines[0].startswith("late/3 @0 ") and run.lines[0].endswith("body=news")


def test_tail_unknown_topic_is_an_error_without_follow(mqstore, store_dir):
    run = mqstore("tail", store_dir, "--topic", "nothing")
    assert run.code == 1 and "no topic nothing" in run.err
    run = mqstore("tail", store_dir, "--topic", TOPIC, "--group", "bad group!")
    assert run.code == 1 and "group" in run.err


# --- topics, stats, dump ---------------------------------------------------------------------------------------
def test_topics(mqstore, store_dir):
    run = mqstore("topics", store_dir)
    assert run.code == 0
    assert run.lines == ["TOPIC   QUEUES  MESSAGES", "binary  0       1", "orders  0,1     12"]
    run = mqstore("topics", store_dir, "--json")
    assert run.json() == {"topics": {"binary": {"queues": [0], "messages": 1},
                                     TOPIC: {"queues": [0, 1], "messages": QUEUE_COUNT * MESSAGES_PER_QUEUE}}}


def test_stats(mqstore, store_dir):
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        sizes = {q: sum(m.size_bytes for m in store.get(TOPIC, q, 0, max_count=100).messages)
                 for q in range(QUEUE_COUNT)}
        end = max(m.commitlog_offset + m.size_bytes for m in store.get("binary", 0, 0).messages)
    result = mqstore("stats", store_dir, "--json").json()
    segments = len(os.listdir(store_dir / "commitlog"))  # 1, or 2 with a segment made ahead of need
    assert result["commitlog"] == {"segments": segments, "min_offset": 0, "end_offset": end, "bytes": end}
    assert (result["dispatch_lag_bytes"], result["flush_lag_bytes"]) == (0, None)
    assert result["topics"][TOPIC] == {str(q): {"min_offset": 0, "max_offset": MESSAGES_PER_QUEUE,
                                                "messages": MESSAGES_PER_QUEUE, "bytes": sizes[q]}
                                       for q in range(QUEUE_COUNT)}
    run = mqstore("stats", store_dir)
    assert run.code == 0
    assert run.lines[1] == f"dispatch lag: 0 bytes (ConsumeQueues reach offset {end})"
    assert f"orders  1      0           6           6         {sizes[1]}" in run.lines


def test_stats_shows_dispatch_lag_of_a_store_closed_before_dispatching(mqstore, store_dir):
    shutil.rmtree(store_dir / "consumequeue" / "binary")  # as if the last message was never dispatched
    result = mqstore("stats", store_dir, "--json").json()
    binary_size = result["commitlog"]["end_offset"] - result["dispatched_offset"]
    assert result["dispatch_lag_bytes"] == binary_size > 256


def test_dump(mqstore, store_dir):
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        offset = store.get("binary", 0, 0).messages[0].commitlog_offset
    run = mqstore("dump", store_dir, "--offset", offset)
    assert run.code == 0
    assert "topic: binary" in run.lines and "crc_ok: True" in run.lines and "body_length: 256" in run.lines
    assert "body text: (not printable UTF-8)" in run.lines
    assert "  00000040  40 41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f  |@ABCDEFGHIJKLMNO|" in run.lines
    record = mqstore("dump", store_dir, "--offset", 0, "--json").json()
    assert (record["topic"], record["queue_offset"], record["body_text"]) == (TOPIC, 0, body(0, 0).decode())
    assert record["magic_code"] == "0xDAA320A7" and record["crc_ok"] is True
    run = mqstore("dump", store_dir, "--offset", 1)
    assert run.code == 1 and "no message record starts at commitlog offset 1" in run.err


# --- verify ----------------------------------------------------------------------------------------------------
def _snapshot(root):
    return {path: (os.stat(path).st_mtime_ns, os.stat(path).st_size)
            for path in (os.path.join(d, f) for d, _, files in os.walk(root) for f in files)}


def test_verify_a_sound_store_writes_nothing(mqstore, store_dir):
    before = _snapshot(store_dir)
    run = mqstore("verify", store_dir)
    assert run.code == 0, run.out
    assert run.lines[-1] == "OK"
    segments = len(os.listdir(store_dir / "commitlog"))  # 1, or 2 with a segment made ahead of need
    assert run.lines[0].startswith(f"commitlog: {segments} segments, 13 records, 0 end-of-segment blanks")
    assert _snapshot(store_dir) == before
    assert mqstore("verify", store_dir, "--json").json()["ok"] is True


def _record_of(store_dir, topic, queue_id, queue_offset):
    with MessageStore.open(store_dir, small_config(), read_only=True) as store:
        return store.get(topic, queue_id, queue_offset).messages[0]


def test_verify_reports_a_flipped_body_byte(mqstore, store_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(store_dir, copy)
    message = _record_of(copy, TOPIC, 1, 3)
    segment = copy / "commitlog" / "00000000000000000000"
    data = bytearray(segment.read_bytes())
    data[message.commitlog_offset + 88 + 2] ^= 0x01  # a byte of the body
    segment.write_bytes(bytes(data))
    run = mqstore("verify", copy)
    assert run.code == 1
    assert run.lines[-1] == "CORRUPTION: 1 problems"
    assert [line for line in run.lines if line.startswith("CORRUPT [commitlog.5]")] == [
        line for line in run.lines if f"offset {message.commitlog_offset})" in line]
    report = mqstore("verify", copy, "--json").json()
    assert report["ok"] is False and report["records"] == 13  # the walk went on past the bad CRC
    assert [(p["rule"], p["offset"]) for p in report["problems"]] == [("commitlog.5", message.commitlog_offset)]
    assert mqstore("verify", store_dir).code == 0  # the original is untouched


def test_verify_reports_a_queue_entry_pointing_at_the_wrong_record(mqstore, store_dir):
    other = _record_of(store_dir, TOPIC, 0, 2)  # between entries 1 and 3 of queue 1: order kept
    queue_file = store_dir / "consumequeue" / TOPIC / "1" / "00000000000000000000"
    data = bytearray(queue_file.read_bytes())
    data[2 * 20 : 2 * 20 + 8] = other.commitlog_offset.to_bytes(8, "big")  # entry 2 of queue 1 -> queue 0's record
    queue_file.write_bytes(bytes(data))
    report = mqstore("verify", store_dir, "--json").json()
    assert report["ok"] is False
    [problem] = report["problems"]
    assert (problem["rule"], problem["path"], problem["offset"]) == ("consumequeue.matches-log", str(queue_file), 40)
    assert "queue orders/1 entry 2 points to the record at" in problem["message"]


def test_verify_reports_a_missing_segment_blank(mqstore, tmp_path):
    root = tmp_path / "rolled"
    with MessageStore.open(root, small_config()) as store:
        store.put_batch([Message("t", b"x" * 1000) for _ in range(100)])  # > 64 KiB: two segments
    first = root / "commitlog" / "00000000000000000000"
    data = bytearray(first.read_bytes())
    blank_at = data.rfind(bytes.fromhex("CBD43194")) - 4
    data[blank_at:] = bytes(len(data) - blank_at)
    first.write_bytes(bytes(data))
    report = mqstore("verify", root, "--json").json()
    assert [(p["rule"], p["offset"]) for p in report["problems"]] == [("commitlog.blank", blank_at)]
    assert mqstore("verify", root).code == 1


def test_verify_checks_the_index_when_it_knows_its_sizes(mqstore, tmp_path):
    root = tmp_path / "indexed"
    with MessageStore.open(root, small_config(index_enabled=True)) as store:
        store.put_batch([Message("t", b"m", keys=(f"k{i}",)) for i in range(20)])
    run = mqstore("verify", root)  # index files of non-default sizes: the store's saved settings tell them
    assert run.code == 0 and "index: 1 files checked" in run.lines and run.lines[-1] == "OK"
    settings = root / "config" / "mqstore.json"
    settings.write_text(settings.read_text().replace('"index_slot_count": 64', '"index_slot_count": 65'))
    run = mqstore("verify", root)  # a saved pair that does not fit; the file alone fits RocketMQ's ratio
    assert run.code == 0 and "index: 1 files checked" in run.lines
    sized = ("--index-slot-count", small_config().index_slot_count,
             "--index-entry-count-max", small_config().index_entry_count_max)
    run = mqstore("verify", root, *sized)
    assert run.code == 0 and "index: 1 files checked" in run.lines and run.lines[-1] == "OK"
    [name] = os.listdir(root / "index")
    with open(root / "index" / name, "r+b") as handle:
        handle.seek(40)  # slot 0
        handle.write((10_000).to_bytes(4, "big"))
    run = mqstore("verify", root, *sized)
    assert run.code == 1 and any(line.startswith("CORRUPT [indexfile.4]") for line in run.lines)
