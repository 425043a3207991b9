"""Committed consumer offsets: `<root>/config/consumerOffset.json`, in RocketMQ's format.

A consumer group's committed offset of a queue is the queue offset of the next message it will consume.
RocketMQ's broker (ConsumerOffsetManager) keeps them in one file for every topic and group:

    {"offsetTable": {"<topic>@<group>": {"<queue_id>": <offset>, ...}, ...}}

The broker writes it with fastjson, whose map keys are unquoted integers (`{0:543,1:543}`): that is not strict
JSON, so the file is read with a small tolerant parser (`parse_lenient_json`) that accepts strict JSON plus
bare integer or identifier keys. mqstore writes strict JSON with string keys, which RocketMQ reads as well;
top-level fields other than `offsetTable` (RocketMQ 5 adds `dataVersion`) are kept as they were read.

Validity rule. A file is valid iff (1) it parses and its top level is an object; (2) `offsetTable`, when
present, is an object; (3) every key of it is `<topic>@<group>` with a valid topic and group; (4) every value
is an object whose keys are non-negative integers (as text) and whose values are non-negative integers.
Anything else is reported as CorruptionError (file, character position, rule).

Writes are atomic and serialised: under an exclusive flock of `consumerOffset.json.lock`, the file is read
again, the new offsets merged in (a commit only advances an offset, never moves it back), written to
`consumerOffset.json.tmp`, fsynced, renamed over the file, and the directory fsynced. So a crash leaves the
old file or the new one, and writers in several processes do not lose each other's commits.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from json.decoder import scanstring

from mqstore.commitlog.commitlog import TOPIC_PATTERN
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError, StoreIOError
from mqstore.commitlog.mapped_file import write_file_atomically

OFFSETS_DIR_NAME = "config"
OFFSETS_FILE_NAME = "consumerOffset.json"
OFFSET_TABLE_FIELD = "offsetTable"
TOPIC_GROUP_SEPARATOR = "@"
GROUP_LENGTH_MAX = 255  # RocketMQ's limit on group names
GROUP_PATTERN = re.compile("[A-Za-z0-9_%|-]{1," + str(GROUP_LENGTH_MAX) + "}")
OFFSETS_FILE_BYTES_MAX = 256 << 20  # a larger file is refused rather than parsed
JSON_NESTING_MAX = 64  # deepest nesting the tolerant parser follows

OffsetTable = dict[str, dict[int, int]]  # "topic@group" -> {queue_id: offset}


# --- names ---------------------------------------------------------------------------------------------------
def validate_group(group) -> str:
    """The group name; InvalidMessageError unless it is 1-255 characters of [A-Za-z0-9_%|-]."""
    if not isinstance(group, str):
        raise InvalidMessageError(f"group must be a str, got {type(group).__name__}")
    if not GROUP_PATTERN.fullmatch(group):
        raise InvalidMessageError(f"group {group!r} must be 1 to {GROUP_LENGTH_MAX} characters of "
                                  "A-Z a-z 0-9 _ % | -")
    return group


def offset_key(topic: str, group: str) -> str:
    """The offset table key of a (topic, group): `topic@group`, as RocketMQ writes it."""
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def split_offset_key(key: str) -> tuple[str, str] | None:
    """(topic, group) of an offset table key, or None when it is not `topic@group` with valid names."""
    topic, separator, group = key.partition(TOPIC_GROUP_SEPARATOR)
    if not separator or not TOPIC_PATTERN.fullmatch(topic) or not GROUP_PATTERN.fullmatch(group):
        return None
    return topic, group


# --- the tolerant parser -------------------------------------------------------------------------------------
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_BARE_KEY = re.compile(r"-?[0-9]+|[A-Za-z_$][A-Za-z0-9_$]*")
_LITERALS = (("true", True), ("false", False), ("null", None))


def parse_lenient_json(text: str):
    """Parse strict JSON, or fastjson's output whose object keys may be bare integers or identifiers.

    Bare keys become strings (`{0:5}` gives `{"0": 5}`). Raises ValueError naming the character position.
    """
    parser = _LenientParser(text)
    value = parser.value(0)
    parser.skip()
    if parser.pos != len(text):
        parser.fail("extra data after the value")
    return value


class _LenientParser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, what: str):
        raise ValueError(f"{what} at character {self.pos}")

    def skip(self) -> None:
        self.pos = _WHITESPACE.match(self.text, self.pos).end()

    def value(self, depth: int):
        if depth > JSON_NESTING_MAX:
            self.fail(f"nesting deeper than {JSON_NESTING_MAX}")
        self.skip()
        text, pos = self.text, self.pos
        if pos >= len(text):
            self.fail("unexpected end of input")
        char = text[pos]
        if char == "{":
            return self.object(depth)
        if char == "[":
            return self.array(depth)
        if char == '"':
            return self.string()
        number = _NUMBER.match(text, pos)
        if number:
            self.pos = number.end()
            return float(number.group()) if number.group(1) or number.group(2) else int(number.group())
        for word, literal in _LITERALS:
            if text.startswith(word, pos):
                self.pos = pos + len(word)
                return literal
        self.fail(f"unexpected character {char!r}")

    def string(self) -> str:
        try:
            value, self.pos = scanstring(self.text, self.pos + 1, True)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bad string at character {exc.pos}: {exc.msg}") from exc
        return value

    def object(self, depth: int) -> dict:
        self.pos += 1
        result: dict = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return result
        while True:
            self.skip()
            if self.text.startswith('"', self.pos):
                key = self.string()
            else:
                bare = _BARE_KEY.match(self.text, self.pos)
                if not bare:
                    self.fail("expected an object key")
                key = bare.group()
                self.pos = bare.end()
            self.skip()
            if not self.text.startswith(":", self.pos):
                self.fail("expected ':' after an object key")
            self.pos += 1
            result[key] = self.value(depth + 1)
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("}", self.pos):
                self.pos += 1
                return result
            else:
                self.fail("expected ',' or '}' in an object")

    def array(self, depth: int) -> list:
        self.pos += 1
        result: list = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return result
        while True:
            result.append(self.value(depth + 1))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("]", self.pos):
                self.pos += 1
                return result
            else:
                self.fail("expected ',' or ']' in an array")


# --- the file --------------------------------------------------------------------------------------------------
def offsets_path(root_dir) -> str:
    """Where the committed offsets of the store under `root_dir` live."""
    return os.path.join(os.fspath(root_dir), OFFSETS_DIR_NAME, OFFSETS_FILE_NAME)


def decode_offsets_file(raw: bytes, path: str) -> tuple[OffsetTable, dict]:
    """(offset table, the other top-level fields) of a file's bytes, checked by the validity rule."""
    if len(raw) > OFFSETS_FILE_BYTES_MAX:
        raise CorruptionError(f"offsets file of {len(raw)} bytes is over {OFFSETS_FILE_BYTES_MAX}", path=path,
                              rule="offsets.size")
    try:
        document = parse_lenient_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorruptionError(f"offsets file is not UTF-8: {exc.reason}", path=path, offset=exc.start,
                              rule="offsets.1") from exc
    except ValueError as exc:
        raise CorruptionError(f"offsets file does not parse: {exc}", path=path, rule="offsets.1") from exc
    if not isinstance(document, dict):
        raise CorruptionError("offsets file is not an object", path=path, rule="offsets.1")
    raw_table = document.get(OFFSET_TABLE_FIELD, {})
    if not isinstance(raw_table, dict):
        raise CorruptionError(f"{OFFSET_TABLE_FIELD} is not an object", path=path, rule="offsets.2")
    table: OffsetTable = {}
    for key, queues in raw_table.items():
        if split_offset_key(key) is None:
            raise CorruptionError(f"offset table key {key!r} is not topic@group", path=path, rule="offsets.3")
        if not isinstance(queues, dict):
            raise CorruptionError(f"offsets of {key!r} are not an object", path=path, rule="offsets.4")
        offsets = {}
        for queue_id, offset in queues.items():
            if not (queue_id.isascii() and queue_id.isdigit()) or type(offset) is not int or offset < 0:
                raise CorruptionError(f"{key!r}: queue {queue_id!r} has offset {offset!r}; both must be "
                                      "non-negative integers", path=path, rule="offsets.4")
            offsets[int(queue_id)] = offset
        table[key] = offsets
    others = {name: value for name, value in document.items() if name != OFFSET_TABLE_FIELD}
    return table, others


def encode_offsets_file(table: OffsetTable, others: dict | None = None) -> bytes:
    """Strict JSON with string keys, sorted, in the layout RocketMQ reads."""
    document = dict(others or {})
    document[OFFSET_TABLE_FIELD] = {key: {str(queue_id): offset for queue_id, offset in sorted(queues.items())}
                                    for key, queues in sorted(table.items())}
    return (json.dumps(document, indent=2) + "\n").encode("utf-8")


class ConsumerOffsets:
    """The committed offsets file of one store."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def of_store(cls, root_dir) -> "ConsumerOffsets":
        return cls(offsets_path(root_dir))

    def read(self) -> tuple[OffsetTable, dict]:
        """(offset table, other top-level fields); both empty when there is no file yet."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(OFFSETS_FILE_BYTES_MAX + 1)
        except FileNotFoundError:
            return {}, {}
        except OSError as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc.strerror}") from exc
        return decode_offsets_file(raw, self.path)

    def table(self) -> OffsetTable:
        return self.read()[0]

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        """The committed offsets of a (topic, group) by queue id (empty when it never committed)."""
        return dict(self.table().get(offset_key(topic, group), {}))

    def commit(self, topic: str, group: str, offsets: dict[int, int]) -> dict[int, int]:
        """Merge `offsets` into the file (an offset only advances); returns the (topic, group)'s offsets now."""
        for queue_id, offset in offsets.items():
            assert type(queue_id) is int and queue_id >= 0, queue_id
            assert type(offset) is int and offset >= 0, offset
        key = offset_key(topic, group)
        with self._locked():
            table, others = self.read()
            stored = table.setdefault(key, {})
            changed = False
            for queue_id, offset in offsets.items():
                if offset > stored.get(queue_id, -1):
                    stored[queue_id] = offset
                    changed = True
            if changed:
                self._write(encode_offsets_file(table, others))
            return dict(stored)

    def _locked(self):
        return _FileLock(self.path + ".lock")

    def _write(self, data: bytes) -> None:
        write_file_atomically(self.path, data)


class _FileLock:
    """An exclusive flock on a lock file next to the offsets file (created with its directory if needed)."""

    def __init__(self, path: str):
        self.path = path
        self.handle = None

    def __enter__(self) -> "_FileLock":
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.handle = open(self.path, "a+b")
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX)
        except OSError as exc:
            if self.handle is not None:
                self.handle.close()
            raise StoreIOError(f"cannot lock {self.path}: {exc.strerror}") from exc
        return self

    def __exit__(self, *exc_info) -> None:
        self.handle.close()  # closing releases the flock
