"""RocketMQ 4.4.0 itself as the tests' oracle: where its jars are, `rmq` run safely, and message comparisons.

The jars (with the `rmq` command that runs RocketMQ's own DefaultMessageStore) are looked for at
$MQSTORE_ROCKETMQ_HOME, else at ../shared/rocketmq-4.4.0 beside the repository. `require_rmq()` skips the
calling test, with that reason, when neither holds an `rmq` or when Java is missing; every test that runs
RocketMQ goes through it (tests/interop/conftest.py's `rmq` fixture).

Three things about `rmq` the helpers here take care of:
  * `rmq read` and `rmq load` recover the store they open and may write to it: `Rmq.read` always reads a
    copy (`copy_store`, which keeps sparse files sparse: RocketMQ's default IndexFile is a 420 MB hole).
  * RocketMQ's store listens on port 10912 (its HA service) on every interface. Where the kernel lets an
    unprivileged user make namespaces (`unshare -rn` and `ip`), each call runs in a private network namespace
    with only a loopback device: calls then run side by side, and nothing listens on the machine's interfaces.
    Elsewhere calls take turns (a lock file) and one that still meets the port taken is retried.
  * When the harness's main thread throws, RocketMQ's service threads keep the JVM alive forever: a call
    whose stderr shows an exception leaving main is killed and reported, and every call has a time bound.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from mqstore.commitlog import format as fmt

ROCKETMQ_HOME_VARIABLE = "MQSTORE_ROCKETMQ_HOME"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROCKETMQ_HOME = REPO_ROOT.parent / "shared" / "rocketmq-4.4.0"
RMQ_CALL_TIMEOUT_S = 600.0  # a call that takes longer is hung (a read of the largest test store takes ~10 s)
RMQ_POLL_S = 0.05
RMQ_PARALLEL_CALLS = 3  # calls at once when each has its own network namespace (2 cores; calls mostly sleep)
RMQ_PORT_RETRIES = 10  # without namespaces: attempts when RocketMQ's HA port is taken by another process
RMQ_PORT_RETRY_WAIT_S = 3.0
MAIN_THREW = 'Exception in thread "main"'
PORT_TAKEN = "Address already in use"
READ_SUMMARY = re.compile(r"manifest messages: (\d+) maxPhy=(-?\d+)")
RECORD_CRC_PROPERTY = fmt.PROPERTY_RECORD_CRC
# The manifest fields of a message, as `rmq read` writes them (tests/data/README.md lists them).
ENTRY_FIELDS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "size_bytes", "body_hex", "body_crc", "flag",
                "sys_flag", "born_timestamp_ms", "store_timestamp_ms", "born_host", "store_host", "reconsume_times",
                "prepared_transaction_offset", "tags", "keys", "tags_code", "msg_id", "properties")
COPY_CHUNK_BYTES = 1 << 20


class RmqError(AssertionError):
    """An `rmq` call failed (an AssertionError: the test fails with RocketMQ's own words)."""


def rocketmq_home() -> tuple[Path | None, str]:
    """(the directory holding `rmq`, "") or (None, why there is none)."""
    configured = os.environ.get(ROCKETMQ_HOME_VARIABLE)
    candidates = [Path(configured)] if configured else [DEFAULT_ROCKETMQ_HOME]
    for home in candidates:
        if (home / "rmq").is_file() and (home / "lib").is_dir():
            return home.resolve(), ""
    where = (f"${ROCKETMQ_HOME_VARIABLE}={configured}" if configured
             else f"${ROCKETMQ_HOME_VARIABLE} (unset) or {DEFAULT_ROCKETMQ_HOME}")
    return None, f"RocketMQ 4.4.0's jars and `rmq` are not at {where}"


def require_rmq() -> Rmq:
    """The Rmq runner, or skip the calling test with the reason RocketMQ cannot run here."""
    home, reason = rocketmq_home()
    if home is None:
        pytest.skip(reason)
    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.skip("RocketMQ 4.4.0 needs Java 17 (java and javac on PATH): not found")
    return _runner(str(home))


@functools.lru_cache(maxsize=None)
def _runner(home: str) -> Rmq:
    return Rmq(Path(home))


@functools.lru_cache(maxsize=None)
def namespaces_work() -> bool:
    """Whether `unshare -rn` gives this user a network namespace whose loopback `ip` can bring up."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        done = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@dataclass
class RocketMQRead:
    """What `rmq read` returned: every message in manifest form, its index answers, where its log ends."""

    entries: list[dict]
    queries: list[dict]
    message_count: int
    max_physical_offset: int


class Rmq:
    """Runs `rmq` (see ../shared/rocketmq-4.4.0/README.md) with a time bound, isolated or in turns."""

    def __init__(self, home: Path):
        self.home = home
        self.command = str(home / "rmq")
        self.isolated = namespaces_work()
        self.parallel_calls = RMQ_PARALLEL_CALLS if self.isolated else 1
        self._lock_path = Path(tempfile.gettempdir()) / f"mqstore-rmq-{os.getuid()}.lock"
        self._compiled = False
        self._compiling = threading.Lock()

    # -- the commands -------------------------------------------------------------------------------------------

    def read(self, store: Path, config, work: Path) -> RocketMQRead:
        """`rmq read` of a copy of `store` (made under `work`) with `config`'s sizes."""
        copy = _fresh(work / "rocketmq-read")
        copy_store(store, copy)
        out = work / "rocketmq-read.jsonl"
        stdout = self.run("read", copy, *_sizes(config), out)
        summary = READ_SUMMARY.search(stdout)
        if summary is None:
            raise RmqError(f"rmq read printed no summary: {stdout[-2000:]}")
        entries = _json_lines(out)
        if len(entries) != int(summary.group(1)):
            raise RmqError(f"rmq read says {summary.group(1)} messages, its output has {len(entries)}")
        return RocketMQRead(entries, _json_lines(Path(f"{out}.queries")), int(summary.group(1)),
                            int(summary.group(2)))

    def write(self, store: Path, config, count: int, seed: int) -> None:
        """`rmq write`: `count` deterministic random messages (5 topics, queues 0-3) from `seed`, clean shutdown."""
        self.run("write", store, *_sizes(config), count, seed)

    def start_put(self, directory: Path, segment_size_bytes: int, count: int, body_bytes: int, flush: str,
                  topics: int, queues: int, threads: int = 1) -> subprocess.Popen:
        """`rmq put` started (not waited for): RocketMQ's defaults but for the segment size; kill it with `kill`.
        Call it inside `with rmq.turn():` (without namespaces it holds RocketMQ's port while it runs)."""
        self.compile()
        return self._start(["put", directory, segment_size_bytes, count, body_bytes, flush, topics, queues, threads])

    def compile(self) -> None:
        """Have `rmq` compile its harness now (it does on first use), so a later call's time is RocketMQ's."""
        with self._compiling:
            if not self._compiled:
                done = subprocess.run([self.command], capture_output=True, text=True, timeout=RMQ_CALL_TIMEOUT_S)
                if done.returncode != 2 or "rmq read" not in done.stderr:  # no command: the usage, exit status 2
                    raise RmqError(f"rmq could not compile its harness: {done.stderr[-3000:]}")
                self._compiled = True

    def map(self, function, items) -> list:
        """function(item) for every item, `parallel_calls` at a time (each may make rmq calls)."""
        items = list(items)
        if self.parallel_calls == 1 or len(items) < 2:
            return [function(item) for item in items]
        with ThreadPoolExecutor(self.parallel_calls) as pool:
            return list(pool.map(function, items))

    # -- running ------------------------------------------------------------------------------------------------

    def run(self, *args) -> str:
        """Run `rmq ARGS` to its end; its stdout. RmqError on failure, with RocketMQ's stderr."""
        self.compile()
        for attempt in range(RMQ_PORT_RETRIES):
            with self.turn():
                process = self._start(list(args))
                status = self.wait(process, RMQ_CALL_TIMEOUT_S)
            stdout, stderr = process.output()
            if status == 0:
                return stdout
            if PORT_TAKEN in stderr and not self.isolated and attempt + 1 < RMQ_PORT_RETRIES:
                time.sleep(RMQ_PORT_RETRY_WAIT_S)
                continue
            raise RmqError(f"rmq {' '.join(map(str, args))} failed ({status}):\n{_rocketmq_words(stderr)}")
        raise AssertionError("unreachable")

    def wait(self, process: RmqProcess, timeout_s: float) -> int | str:
        """The exit status, or why it was killed: "main threw" (RocketMQ keeps running without its main thread)
        or "timeout"."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = process.popen.poll()
            if status is not None:
                return status
            if MAIN_THREW in process.stderr_text():
                process.kill()
                return "main threw"
            if time.monotonic() > deadline:
                process.kill()
                return "timeout"
            time.sleep(RMQ_POLL_S)

    def _start(self, args: list) -> RmqProcess:
        command = [self.command, *map(str, args)]
        if self.isolated:
            command = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *command]
        return RmqProcess(command)

    def turn(self):
        """Isolated calls need no turns; others hold a lock file while RocketMQ runs (every user of this helper
        on the machine takes turns)."""
        return _NoLock() if self.isolated else _FileLock(self._lock_path)


class RmqProcess:
    """One running `rmq`, in a session of its own (so `kill` reaches java), output going to temporary files."""

    def __init__(self, command: list[str]):
        self.stdout_file = tempfile.TemporaryFile()
        self.stderr_file = tempfile.NamedTemporaryFile(prefix="rmq-stderr-")
        self.popen = subprocess.Popen(command, stdout=self.stdout_file, stderr=self.stderr_file,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr_text(self) -> str:
        with open(self.stderr_file.name, "rb") as handle:
            return handle.read().decode("utf-8", "replace")

    def kill(self) -> None:
        """SIGKILL to every process of the call (java included), then reap it."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()

    def output(self) -> tuple[str, str]:
        self.stdout_file.seek(0)
        stdout = self.stdout_file.read().decode("utf-8", "replace")
        stderr = self.stderr_text()
        self.stdout_file.close()
        self.stderr_file.close()
        return stdout, stderr


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.handle = open(self.path, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
        return False


def _rocketmq_words(stderr: str) -> str:
    """stderr without RocketMQ's normal chatter (its README lists it), the last lines."""
    chatter = ("illegal magic code", "Offset not matched", "interrupted, possibly by shutdown")
    lines = [line for line in stderr.splitlines() if not any(word in line for word in chatter)]
    return "\n".join(lines[-60:])


def _sizes(config) -> tuple[int, int, int, int]:
    return (config.segment_size_bytes, config.consume_queue_entries_per_file, config.index_slot_count,
            config.index_entry_count_max)


def _json_lines(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


# -- copies --------------------------------------------------------------------------------------------------------

def copy_store(source: Path, target: Path) -> None:
    """Copy a store directory file by file, holes kept as holes (SEEK_DATA/SEEK_HOLE), everything writable."""
    target.mkdir(parents=True)
    for entry in sorted(Path(source).iterdir()):
        if entry.is_dir():
            copy_store(entry, target / entry.name)
        elif entry.is_file():
            _copy_sparse(entry, target / entry.name)


def _copy_sparse(source: Path, target: Path) -> None:
    with open(source, "rb") as reader, open(target, "wb") as writer:
        size = os.fstat(reader.fileno()).st_size
        position = 0
        while position < size:
            try:
                start = os.lseek(reader.fileno(), position, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(reader.fileno(), start, os.SEEK_HOLE)
            reader.seek(start)
            writer.seek(start)
            remaining = end - start
            while remaining:
                chunk = reader.read(min(COPY_CHUNK_BYTES, remaining))
                if not chunk:
                    break
                writer.write(chunk)
                remaining -= len(chunk)
            position = end
        writer.truncate(size)


# -- comparisons ---------------------------------------------------------------------------------------------------

def entry_of(message) -> dict:
    """A StoredMessage in the form `rmq read` writes each message (the manifest form)."""
    tags = message.tags
    return {"topic": message.topic, "queue_id": message.queue_id, "queue_offset": message.queue_offset,
            "commitlog_offset": message.commitlog_offset, "size_bytes": message.size_bytes,
            "body_hex": message.body.hex(), "body_crc": message.body_crc, "flag": message.flag,
            "sys_flag": message.sys_flag, "born_timestamp_ms": message.born_timestamp_ms,
            "store_timestamp_ms": message.store_timestamp_ms, "born_host": message.born_host,
            "store_host": message.store_host, "reconsume_times": message.reconsume_times,
            "prepared_transaction_offset": message.prepared_transaction_offset, "tags": tags,
            "keys": " ".join(message.keys) or None, "tags_code": fmt.tags_code(tags) if tags is not None else 0,
            "msg_id": message.msg_id, "properties": message.properties}


def put_entry(message, result, config, uniq_key: str | None) -> dict:
    """The manifest form of what a put stored: the Message, its PutResult and the store's settings."""
    properties = dict(message.properties)
    if message.tags is not None:
        properties[fmt.PROPERTY_TAGS] = message.tags
    if message.keys:
        properties[fmt.PROPERTY_KEYS] = " ".join(message.keys)
    if uniq_key is not None:
        properties.setdefault(fmt.PROPERTY_UNIQ_KEY, uniq_key)
    born_host = config.born_host or config.store_host
    return {"topic": message.topic, "queue_id": message.queue_id, "queue_offset": result.queue_offset,
            "commitlog_offset": result.commitlog_offset, "size_bytes": result.size_bytes,
            "body_hex": message.body.hex(), "body_crc": zlib.crc32(message.body) & 0x7FFFFFFF, "flag": message.flag,
            "sys_flag": 0, "born_timestamp_ms": (result.store_timestamp_ms if message.born_timestamp_ms is None
                                                 else message.born_timestamp_ms),
            "store_timestamp_ms": result.store_timestamp_ms, "born_host": f"{born_host}:{config.born_port}",
            "store_host": f"{config.store_host}:{config.store_port}", "reconsume_times": 0,
            "prepared_transaction_offset": 0, "tags": message.tags, "keys": " ".join(message.keys) or None,
            "tags_code": fmt.tags_code(message.tags) if message.tags is not None else 0, "msg_id": result.msg_id,
            "properties": properties}


def without_record_crc(entry: dict) -> dict:
    """The entry with the record-CRC property (mqstore's `__CRC32#`, an ordinary property to RocketMQ 4.4.0)
    left out of its properties."""
    properties = {name: value for name, value in entry["properties"].items() if name != RECORD_CRC_PROPERTY}
    return {**entry, "properties": properties}


def store_entries(store, chunk: int = 64) -> list[dict]:
    """Every message of every queue of an open store, through get(), in manifest form and order."""
    entries = []
    for topic, queue_ids in sorted(store.topics().items()):
        for queue_id in sorted(queue_ids):
            offset, end = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
            while offset < end:
                result = store.get(topic, queue_id, offset, max_count=chunk)
                if not result.messages:
                    raise AssertionError(f"get({topic}, {queue_id}, {offset}) returned {result.status.name} "
                                         f"below max_offset {end}")
                entries.extend(entry_of(message) for message in result.messages)
                offset = result.next_offset
    return entries


def _place(entry: dict) -> tuple[str, int, int]:
    return entry["topic"], entry["queue_id"], entry["queue_offset"]


def differences(ours: list[dict], theirs: list[dict], *, limit: int = 8) -> list[str]:
    """How two message lists differ, queue by queue and field by field (the record-CRC property aside):
    messages one side lacks, then the first differing field of each message both have. Empty when equal."""
    mine = {_place(entry): without_record_crc(entry) for entry in ours}
    other = {_place(entry): without_record_crc(entry) for entry in theirs}
    found = []
    if len(mine) != len(ours) or len(other) != len(theirs):
        found.append(f"a queue offset appears twice: mqstore {len(ours)} entries at {len(mine)} places, "
                     f"RocketMQ {len(theirs)} at {len(other)}")
    for place in sorted(mine.keys() - other.keys())[:limit]:
        found.append(f"{place}: mqstore has the message at {mine[place]['commitlog_offset']}, RocketMQ none")
    for place in sorted(other.keys() - mine.keys())[:limit]:
        found.append(f"{place}: RocketMQ has the message at {other[place]['commitlog_offset']}, mqstore none")
    for place in sorted(mine.keys() & other.keys()):
        a, b = mine[place], other[place]
        for name in ENTRY_FIELDS:
            if a.get(name) != b.get(name):
                found.append(f"{place} field {name}: mqstore {_short(a.get(name))}, RocketMQ {_short(b.get(name))}")
                break
        if len(found) >= 2 * limit:
            break
    return found


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:160] + "..."


def assert_same_messages(ours: list[dict], theirs: list[dict], label: str) -> None:
    found = differences(ours, theirs)
    assert not found, f"{label}: {len(found)}+ differences:\n" + "\n".join(found)


def index_answer(entries: list[dict], topic: str, key: str) -> list[int]:
    """What RocketMQ's IndexService answers for (topic, key) over these messages, sorted: a commitlog offset per
    index entry, so a message once per time its UNIQ_KEY and KEYS words name the key."""
    offsets = []
    for entry in entries:
        if entry["topic"] == topic:
            properties = entry["properties"]
            words = [properties.get(fmt.PROPERTY_UNIQ_KEY)] + (properties.get(fmt.PROPERTY_KEYS) or "").split(" ")
            offsets += [entry["commitlog_offset"]] * words.count(key)
    return sorted(offsets)
