"""A small store with known messages for the CLI tests, and helpers to run the command in-process."""

from __future__ import annotations

import io
import json
import sys

import pytest

from mqstore import Message, MessageStore
from mqstore.cli.commands import main
from tests.conftest import small_config

TOPIC = "orders"
QUEUE_COUNT = 2
MESSAGES_PER_QUEUE = 6


def body(queue_id: int, index: int) -> bytes:
    return f"order {queue_id}-{index}".encode()


def tags(index: int) -> str:
    return "paid" if index % 2 else "created"


@pytest.fixture
def store_dir(tmp_path):
    """A closed store: TOPIC with QUEUE_COUNT queues of MESSAGES_PER_QUEUE messages, and a 'binary' topic."""
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as store:
        store.put_batch([Message(TOPIC, body(q, i), queue_id=q, tags=tags(i), keys=(f"k{q}-{i}",))
                         for i in range(MESSAGES_PER_QUEUE) for q in range(QUEUE_COUNT)])
        store.put(Message("binary", bytes(range(256)), queue_id=0))
    return root


class Run:
    """The outcome of one in-process `mqstore` run."""

    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self):
        return json.loads(self.out)

    def json_lines(self) -> list:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def mqstore(capsys, monkeypatch):
    """Run `mqstore ARGS` in-process: mqstore(*args, stdin=b"...") -> Run."""

    def run(*args, stdin: bytes | None = None) -> Run:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main([str(arg) for arg in args])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
