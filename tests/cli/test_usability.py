"""What a new user meets on the command line: --version, put's input handling and failures, get's default count,
query on an unknown topic, and the packaging metadata behind `pip install`."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import mqstore as package
from mqstore import MessageStore
from tests.cli.conftest import MESSAGES_PER_QUEUE, TOPIC
from tests.conftest import small_config

SMALL = ("--segment-size-bytes", 65536, "--cq-entries-per-file", 64)
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def bodies(root, topic: str = "t", queue_id: int = 0) -> list[bytes]:
    with MessageStore.open(root, small_config(), read_only=True) as store:
        return [m.body for m in store.get(topic, queue_id, 0, max_count=1000).messages]


# --- version ---------------------------------------------------------------------------------------------------
def test_version_is_the_installed_distributions(mqstore, capsys):
    run = mqstore("--version")
    assert run.code == 0
    assert run.out.strip() == f"mqstore {package.__version__}"
    assert package.__version__ == importlib.metadata.version("mqstore")


def test_pyproject_reads_the_version_and_declares_an_spdx_license():
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mqstore.__version__"}
    assert project["project"]["license"] == "Apache-2.0"  # a table draws setuptools' deprecation warning
    assert "setuptools>=77" in project["build-system"]["requires"]  # the first to take an SPDX string


def test_pyproject_lists_every_package_of_the_tree():
    """setuptools installs the packages named in pyproject.toml, no others: one left out is missing from a wheel
    and from `pip install .` (an editable install hides it)."""
    settings = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]
    roots = {"mqstore": "mqstore", **settings["package-dir"]}
    found = set()
    for name, directory in roots.items():
        top = PYPROJECT.parent / directory
        for init in top.rglob("__init__.py"):
            parts = init.parent.relative_to(top).parts
            found.add(".".join((name, *parts)))
    assert found == set(settings["packages"])


# --- put -------------------------------------------------------------------------------------------------------
def test_put_drops_the_carriage_return_of_crlf_lines(mqstore, tmp_path):
    root = tmp_path / "store"
    run = mqstore("put", root, "--topic", "t", *SMALL, stdin=b"one\r\ntwo\r\nin\rside\r\n\r\nlast\r")
    assert run.code == 0, run.err
    assert bodies(root) == [b"one", b"two", b"in\rside", b"", b"last\r"]  # a "\r" not before "\n" is data


def test_an_oversized_line_is_named_with_the_limit_and_the_lines_before_it_are_stored(mqstore, tmp_path):
    root = tmp_path / "store"
    run = mqstore("put", root, "--topic", "t", *SMALL, stdin=b"first\nsecond\n" + b"x" * 70_000 + b"\nafter\n")
    assert run.code == 1
    assert "line 3 is 70,000 bytes" in run.err and "(max_message_size_bytes)" in run.err
    assert "2 messages were stored before the error" in run.err
    assert bodies(root) == [b"first", b"second"]
    limit = int(re.search(r"limit of ([\d,]+) bytes", run.err).group(1).replace(",", ""))
    assert mqstore("put", root, "--topic", "t", stdin=b"z" * limit + b"\n").code == 0  # the limit is the limit
    assert mqstore("put", root, "--topic", "t", stdin=b"z" * (limit + 1) + b"\n").code == 1
    assert bodies(root) == [b"first", b"second", b"z" * limit]


def test_a_failed_put_leaves_no_store_directory(mqstore, tmp_path):
    bad_topic = tmp_path / "new" / "store"
    run = mqstore("put", bad_topic, "--topic", "bad topic!", *SMALL, stdin=b"x\n")
    assert run.code == 1 and "topic" in run.err
    assert not (tmp_path / "new").exists()  # the parent it created too
    missing_file = tmp_path / "other"
    run = mqstore("put", missing_file, "--topic", "t", "--file", tmp_path / "absent.txt", *SMALL)
    assert run.code == 1 and "absent.txt" in run.err
    assert not missing_file.exists()
    oversized = tmp_path / "third"
    assert mqstore("put", oversized, "--topic", "t", *SMALL, stdin=b"y" * 70_000).code == 1
    assert not oversized.exists()


def test_a_failed_put_keeps_an_existing_store(mqstore, store_dir):
    assert mqstore("put", store_dir, "--topic", "bad topic!", stdin=b"x\n").code == 1
    assert bodies(store_dir, TOPIC) == [f"order 0-{i}".encode() for i in range(MESSAGES_PER_QUEUE)]


# --- get, query ------------------------------------------------------------------------------------------------
def test_get_without_count_returns_what_the_api_returns(mqstore, tmp_path):
    root = tmp_path / "store"
    assert mqstore("put", root, "--topic", "t", *SMALL, stdin=b"".join(b"m%d\n" % i for i in range(100))).code == 0
    run = mqstore("get", root, "--topic", "t", "--queue", 0, "--offset", 0, "--json")
    assert run.code == 0, run.err
    with MessageStore.open(root, small_config(), read_only=True) as store:
        expected = [m.body for m in store.get("t", 0, 0).messages]  # MessageStore.get's default max_count
    assert 1 < len(expected) < 100
    assert [bytes.fromhex(m["body_hex"]) for m in run.json()["messages"]] == expected


def test_query_of_an_unknown_topic_is_an_error_as_get_and_tail(mqstore, store_dir):
    index = ("--index-slot-count", 64, "--index-entry-count-max", 256)
    for command in (["query", "--key", "k"], ["tail"], ["get", "--queue", 0, "--offset", 0]):
        run = mqstore(command[0], store_dir, "--topic", "nowhere", *command[1:], *index)
        assert run.code == 1 and ("no topic nowhere" in run.err or "no queue nowhere/0" in run.err)
        assert run.out == ""
