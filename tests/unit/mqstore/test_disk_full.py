"""A segment that cannot be created (file size limit standing in for a full disk) gives a clear put status; the
store stays readable and nothing stored before is damaged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from mqstore import GetStatus, Message, MessageStore
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[3]

WRITER = textwrap.dedent("""
    import json, resource, signal, sys
    sys.path.insert(0, sys.argv[2])
    from mqstore import Message, MessageStore
    from tests.conftest import small_config
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    limit = 32 * 1024  # smaller than a 64 KiB segment: no new segment can be made
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    statuses = []
    with MessageStore.open(sys.argv[1], small_config(preallocate_segments=True)) as store:
        for i in range(40):
            statuses.append(store.put(Message("t", b"late-%02d" % i + b"." * 3000)).status.value)
        statuses += [r.status.value for r in store.put_batch([Message("t", b"batch" + b"." * 3000)] * 3)]
        assert store.get("t", 0, 0).messages[0].body.startswith(b"early")
    print(json.dumps(statuses))
""")


def test_a_segment_that_cannot_be_created_refuses_puts_and_damages_nothing(tmp_path):
    with MessageStore.open(tmp_path, small_config()) as store:
        early = [store.put(Message("t", b"early-%02d" % i + b"." * 3000)) for i in range(30)]
    completed = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), str(ROOT)], capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    statuses = json.loads(completed.stdout.strip().splitlines()[-1])
    accepted = statuses.index("CREATE_MAPPED_FILE_FAILED")
    assert set(statuses[:accepted]) == {"PUT_OK"} and set(statuses[accepted:]) == {"CREATE_MAPPED_FILE_FAILED"}
    assert "cannot create" in completed.stderr or "CREATE_MAPPED_FILE_FAILED" in completed.stdout
    with MessageStore.open(tmp_path, small_config()) as store:
        got = store.get("t", 0, 0, max_count=1000)
        assert got.status is GetStatus.FOUND
        bodies = [m.body.split(b".")[0] for m in got.messages]
        assert bodies == [b"early-%02d" % i for i in range(30)] + [b"late-%02d" % i for i in range(accepted)]
        assert store.put(Message("t", b"room again")).queue_offset == 30 + accepted
        assert early[0].commitlog_offset == 0


def test_a_sync_put_whose_write_fails_is_refused_and_the_store_goes_on(tmp_path, monkeypatch):
    from mqstore.commitlog import commitlog as commitlog_module

    from mqstore import FlushMode, PutStatus

    with MessageStore.open(tmp_path, small_config(flush_mode=FlushMode.SYNC)) as store:
        first = store.put(Message("t", b"first"))

        def failing(fd, data, position):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(commitlog_module.os, "pwrite", failing)  # SYNC appends are written with pwrite,
        if commitlog_module._write_at is not None:  # the compiled one when the core is built
            monkeypatch.setattr(commitlog_module, "_write_at", failing)
        refused = store.put(Message("t", b"lost"))
        assert refused.status is PutStatus.UNKNOWN_ERROR and refused.commitlog_offset == -1
        monkeypatch.undo()
        second = store.put(Message("t", b"second"))
        assert second.status is PutStatus.PUT_OK and second.queue_offset == 1
        assert second.commitlog_offset == first.commitlog_offset + first.size_bytes
        assert store.wait_dispatched(10)
        assert [m.body for m in store.get("t", 0, 0).messages] == [b"first", b"second"]
