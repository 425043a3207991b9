"""`python -m mqstore` as a real process: exit codes, a pipe in and out, Ctrl-C and a closed pipe."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

from tests.cli.conftest import MESSAGES_PER_QUEUE, QUEUE_COUNT, TOPIC

RESPONSE_TIMEOUT_S = 60


def mqstore(*args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqstore", *map(str, args)], input=stdin, capture_output=True,
                          timeout=RESPONSE_TIMEOUT_S)


def test_exit_codes_and_a_round_trip(tmp_path):
    assert mqstore("--help").returncode == 0
    usage = mqstore("get", tmp_path)
    assert usage.returncode == 2 and b"usage: mqstore get" in usage.stderr
    store = tmp_path / "store"
    put = mqstore("put", store, "--topic", "t", "--segment-size-bytes", 65536, "--cq-entries-per-file", 64,
                  stdin=b"alpha\nbeta\n")
    assert put.returncode == 0, put.stderr
    got = mqstore("tail", store, "--topic", "t")
    assert got.returncode == 0
    assert [line.rsplit(b"body=", 1)[1] for line in got.stdout.splitlines()] == [b"alpha", b"beta"]
    missing = mqstore("stats", tmp_path / "missing")
    assert missing.returncode == 1 and missing.stderr.startswith(b"mqstore: ")


def _read_line(process) -> bytes:
    ready, _, _ = select.select([process.stdout], [], [], RESPONSE_TIMEOUT_S)
    if not ready:
        process.kill()
        pytest.fail(f"mqstore printed nothing within {RESPONSE_TIMEOUT_S} s")
    return process.stdout.readline()


def test_follow_stops_on_ctrl_c_and_keeps_its_commit(store_dir):
    process = subprocess.Popen([sys.executable, "-m", "mqstore", "tail", str(store_dir), "--topic", TOPIC,
                                "--group", "watcher", "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               bufsize=0)  # unbuffered: select() sees every line that was not read yet
    try:
        first = _read_line(process)
        assert first.startswith(f"{TOPIC}/".encode())
        rest = [_read_line(process) for _ in range(QUEUE_COUNT * MESSAGES_PER_QUEUE - 1)]  # all printed, committed
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=RESPONSE_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert b"Traceback" not in err and out == b"" and len(rest) == QUEUE_COUNT * MESSAGES_PER_QUEUE - 1
    again = mqstore("tail", store_dir, "--topic", TOPIC, "--group", "watcher")
    assert again.returncode == 0 and again.stdout == b""


def test_a_closed_output_pipe_ends_quietly(tmp_path):
    store = tmp_path / "store"
    lines = b"".join(b"message number %d with some padding to fill the pipe quickly\n" % i for i in range(5000))
    assert mqstore("put", store, "--topic", "t", "--segment-size-bytes", 1 << 20, stdin=lines).returncode == 0
    read_end, write_end = os.pipe()
    process = subprocess.Popen([sys.executable, "-m", "mqstore", "tail", str(store), "--topic", "t"],
                               stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline().endswith(b"body=message number 0 with some padding to fill the pipe quickly\n")
    _, err = process.communicate(timeout=RESPONSE_TIMEOUT_S)
    assert process.returncode == 0 and err == b""
