"""Stores with segments of 4 GiB and more (sparse files) holding a hostile record, through the store's own paths:
read_at on a read-only open (which trusts the segment: no recovery walk filters it first), get (a ConsumeQueue
entry that gives the hostile size), a writable open's recovery, the dispatch scan and scan(), on both codecs.

Each call that a defect could end with a crash runs in a child process (MQSTORE_NATIVE=0 or 1), so that a crash
fails the test rather than ending pytest. The hostile record: TOTALSIZE near 2^31, BODYLENGTH = TOTALSIZE - 91 (the
body runs to 3 bytes before the end), TOPICLENGTH 255; every field position past the body is beyond 2^31.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from mqstore.commitlog import format as fmt
from mqstore.consumequeue import format as cqfmt

from mqstore import Message, MessageStore, StoreConfig

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CHILD_TIMEOUT_S = 120
CODECS = {"python": "0", "native": "1"}

# The child: open the store as told, make one call, print its outcome as JSON (a crash prints nothing).
CHILD = """
import json, sys
from mqstore import MessageStore, StoreConfig
root, call = sys.argv[1], sys.argv[2]
try:
    if call == "read_at":
        with MessageStore.open(root, read_only=True) as store:
            result = repr(store.read_at(0))
    elif call == "get":
        with MessageStore.open(root, read_only=True) as store:
            found = store.get("T", 0, 0)
            result = [found.status.name, [repr(m) for m in found.messages]]
    elif call == "recover":
        with MessageStore.open(root, StoreConfig(dispatch_process=False, index_enabled=False)) as store:
            result = store.stats()
    outcome = ["ok", result]
except Exception as exc:
    outcome = [type(exc).__name__, str(exc), getattr(exc, "rule", None), getattr(exc, "offset", None)]
print(json.dumps(outcome, default=str))
"""


def _hostile_store(root: Path, segment_size_bytes: int, total_size: int, topic_length: int = 255) -> Path:
    """A store of one message in a segment of `segment_size_bytes`, its record then overwritten by the hostile one
    (and its ConsumeQueue entry given the hostile size, as an index damaged alike would)."""
    config = StoreConfig(segment_size_bytes=segment_size_bytes, dispatch_process=False, index_enabled=False)
    with MessageStore.open(str(root), config) as store:
        store.put(Message(topic="T", body=b"x"))
    segment = root / "commitlog" / fmt.segment_name(0)
    assert segment.stat().st_size == segment_size_bytes
    body_length = total_size - 91
    header = struct.pack(">iIiiiqqiq8sq8siqi", total_size, fmt.MESSAGE_MAGIC_CODE, 0, 0, 0, 0, 0, 0, 0, bytes(8), 0,
                         bytes(8), 0, 0, body_length)
    with open(segment, "r+b") as handle:
        handle.write(header)
        handle.seek(fmt.HEADER_SIZE + body_length)
        handle.write(bytes([topic_length]))
    queue_file = next((root / "consumequeue" / "T" / "0").iterdir())
    with open(queue_file, "r+b") as handle:
        handle.seek(cqfmt.CONSUME_QUEUE_UNIT.fields["size"][1])
        handle.write(struct.pack(">i", total_size))
    return root


def _child(root: Path, call: str, codec: str) -> list:
    environment = {**os.environ, "MQSTORE_NATIVE": CODECS[codec]}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), call], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, f"{call} on the {codec} codec: exit {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_read_at_of_a_record_wrapping_int32_is_a_corruption_error_not_a_crash(tmp_path, codec):
    # the reproduction: TOTALSIZE 0x7FFFFFFF in a 4 GiB segment (a SIGSEGV on the compiled codec before)
    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFF)
    outcome = _child(root, "read_at", codec)
    assert outcome[0] == "CorruptionError", outcome
    assert "TOPICLENGTH 255 does not fit TOTALSIZE 2147483647" in outcome[1], outcome
    assert outcome[2] == "commitlog.3" and outcome[3] == 0, outcome
    assert str(root / "commitlog" / fmt.segment_name(0)) in outcome[1]


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_get_of_an_entry_giving_a_size_near_2_31_is_a_corruption_error(tmp_path, codec):
    # 0x7FFFFFFE: 0x7FFFFFFF with commitlog offset 0 is RocketMQ's filler entry, which a ConsumeQueue skips
    root = _hostile_store(tmp_path / "store", 5 * GIB, 0x7FFFFFFE)
    outcome = _child(root, "get", codec)
    assert outcome[0] == "CorruptionError", outcome
    assert "TOPICLENGTH 255 does not fit TOTALSIZE 2147483646" in outcome[1] and outcome[2] == "commitlog.3", outcome


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_recovery_of_a_writable_open_reports_the_record(tmp_path, codec):
    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFF)
    outcome = _child(root, "recover", codec)
    assert outcome[0] == "CorruptionError" and outcome[2] == "commitlog.3" and outcome[3] == 0, outcome


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_the_dispatch_scan_stops_at_the_record_with_the_same_error(tmp_path, codec, monkeypatch):
    from mqstore.commitlog import _native, dispatch_batch
    from mqstore.commitlog.commitlog import CommitLog

    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFF)
    monkeypatch.setattr(dispatch_batch, "NATIVE", _native if codec == "native" else None)
    log = CommitLog(str(root / "commitlog"), 4 * GIB, writable=False, max_message_size_bytes=1 << 20,
                    max_queues_per_topic=8, born_host_raw=bytes(8), store_host_raw=bytes(8), preallocate=False)
    try:
        batch = dispatch_batch.parse_records(log, 0, 4 * GIB, check_crc=True)
    finally:
        log.close()
    assert len(batch) == 0 and batch.end_offset == 0
    assert batch.error is not None and batch.error.rule == "commitlog.3"
    assert "TOPICLENGTH 255 does not fit TOTALSIZE 2147483647" in str(batch.error)


# scan() checks a record longer than its read chunk by its header and tail before reading it whole: well under
# a second, though the record claims 2 GiB
@pytest.mark.parametrize("codec", sorted(CODECS))
def test_scan_reports_the_record(tmp_path, codec, monkeypatch):
    from mqstore.commitlog import _native, arrow_decode

    root = _hostile_store(tmp_path / "store", 4 * GIB, 0x7FFFFFFF)
    monkeypatch.setattr(arrow_decode, "NATIVE", _native if codec == "native" else None)
    with MessageStore.open(str(root), read_only=True) as store, pytest.raises(Exception) as raised:
        store.scan().read_all()
    assert "TOPICLENGTH 255 does not fit TOTALSIZE 2147483647" in str(raised.value)
    assert getattr(raised.value, "rule", None) == "commitlog.3"
