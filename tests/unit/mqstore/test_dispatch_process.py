"""dispatch_process=True: a child process builds the queues and the index; the writer reads what it built."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from mqstore.commitlog.errors import StoreError

from mqstore import FlushMode, GetStatus, Message, MessageStore, PutStatus
from mqstore.store.dispatch_process import CONTROL_FILE_NAME, DispatchProcessError
from tests.conftest import small_config, wait_until

ROOT = Path(__file__).resolve().parents[3]


def _config(**overrides):
    settings = dict(dispatch_process=True, index_enabled=True, consume_queue_entries_per_file=16)
    settings.update(overrides)
    return small_config(**settings)


def _messages(count, topic="t", queues=4, size=300):
    return [Message(topic, b"%05d." % i + b"x" * (i % size), queue_id=i % queues,
                    tags=f"tag{i % 3}", keys=(f"k{i}", f"group{i % 7}")) for i in range(count)]


def _state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, T for stopped, Z for a zombie...); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")  # a zombie (exited, not yet reaped by its parent) is gone for our purpose


def _queue_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(path.relative_to(base)): path.read_bytes() for path in sorted(base.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
def test_the_writer_reads_what_the_process_dispatched_and_the_queues_equal_a_rebuild(tmp_path, mode):
    root = tmp_path / "store"
    config = _config(flush_mode=mode)
    with MessageStore.open(root, config) as store:
        pid = store.stats()["dispatch"]["process_id"]
        assert pid is not None and pid != os.getpid() and _alive(pid)
        results = []
        producers = [threading.Thread(target=lambda chunk=chunk: results.extend(store.put(m) for m in chunk))
                     for chunk in (_messages(150)[:75], _messages(150)[75:])]
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join()
        results += store.put_batch(_messages(200, topic="u", queues=2))
        assert all(result.status is PutStatus.PUT_OK for result in results)
        assert store.wait_dispatched(30)
        assert store.stats()["dispatch"]["lag_bytes"] == 0
        assert store.topics() == {"t": [0, 1, 2, 3], "u": [0, 1]}
        for topic, queues in store.topics().items():
            for queue_id in queues:
                mine = sorted((r for r in results if store.read_at(r.commitlog_offset).topic == topic
                               and store.read_at(r.commitlog_offset).queue_id == queue_id),
                              key=lambda r: r.queue_offset)
                got = store.get(topic, queue_id, 0, max_count=1000)
                assert got.status is GetStatus.FOUND and got.max_offset == len(mine)
                assert [m.commitlog_offset for m in got.messages] == [r.commitlog_offset for r in mine]
                assert [m.queue_offset for m in got.messages] == list(range(len(mine)))
        hit = store.query("t", "group3")
        assert sorted(m.body for m in hit) == sorted(m.body for m in _messages(150) if "group3" in m.keys)
        assert [m.body for m in store.query("u", "k199")] == [_messages(200, topic="u")[199].body]
        middle = store.read_at(results[100].commitlog_offset).store_timestamp_ms
        assert store.offset_for_time("u", 0, middle) <= store.max_offset("u", 0)
    assert not _alive(pid)
    built = _queue_files(root)
    rebuilt_root = tmp_path / "rebuilt"
    shutil.copytree(root, rebuilt_root)
    shutil.rmtree(rebuilt_root / "consumequeue")
    shutil.rmtree(rebuilt_root / "index")
    with MessageStore.open(rebuilt_root, _config(dispatch_process=False)) as store:
        assert store.wait_dispatched(30)
        assert len(store.query("t", "group3")) == len(hit)
    assert _queue_files(rebuilt_root) == built  # byte for byte


def test_close_stops_the_process_and_leaves_a_clean_store(tmp_path):
    with MessageStore.open(tmp_path, _config()) as store:
        results = [store.put(m) for m in _messages(100)]
        pid = store.stats()["dispatch"]["process_id"]
        store.flush()  # the queues and the index, through the process
        flush = store.stats()["flush"]
        assert flush["consume_queue_flusher"]["flushes"] >= 1 and flush["consume_queue_flusher"]["error"] is None
        assert flush["checkpoint"]["logics_msg_timestamp_ms"] >= results[-1].store_timestamp_ms
        assert flush["checkpoint"]["index_msg_timestamp_ms"] >= results[-1].store_timestamp_ms
        assert (tmp_path / "config" / CONTROL_FILE_NAME).exists()
    assert not _alive(pid)
    assert sorted(os.listdir(tmp_path / "config")) == ["mqstore.json"]  # no control file, mark or empty log
    assert not (tmp_path / "abort").exists()
    with MessageStore.open(tmp_path, _config()) as store:
        assert store.recovery_report.case == "CLEAN"
        assert store.get("t", 3, 0, max_count=100).messages[-1].body == _messages(100)[99].body


def test_the_lag_bound_and_consumers_work_against_the_process(tmp_path):
    limit = 8192
    with MessageStore.open(tmp_path, _config(max_dispatch_lag_bytes=limit)) as store:
        for message in _messages(300, queues=1):
            result = store.put(message)
            assert result.commitlog_offset + result.size_bytes - store.dispatched_offset <= limit
        consumer = store.consumer("g", "t")
        got = []
        while len(got) < 300:
            batch = consumer.poll(100, timeout_ms=5000)
            assert batch
            got += batch
        assert [m.body for m in got] == [m.body for m in _messages(300, queues=1)]
        late = threading.Timer(0.2, lambda: store.put(Message("t", b"late")))
        late.start()
        assert [m.body for m in consumer.poll(10, timeout_ms=10_000)] == [b"late"]  # woken by dispatch
        late.join()


def test_retention_deletes_queue_and_index_files_through_the_process(tmp_path):
    config = _config(file_reserved_hours=1, consume_queue_entries_per_file=8, index_slot_count=16,
                     index_entry_count_max=64)
    with MessageStore.open(tmp_path, config) as store:
        results = [store.put(Message("t", b"%05d" % i + b"." * 2000, queue_id=i % 2, keys=(f"k{i}",)))
                   for i in range(120)]
        assert store.wait_dispatched(30)
        store.flush()
        for name in os.listdir(tmp_path / "commitlog"):
            path = tmp_path / "commitlog" / name
            stamp = os.path.getmtime(path) - 2 * 3600
            os.utime(path, (stamp, stamp))
        report = store.clean_expired()
        assert report["segments_removed"] and report["queue_files_removed"] > 0
        assert report["index_files_removed"] > 0
        log_min = report["log_min_offset"]
        for queue_id in (0, 1):
            mine = [r for i, r in enumerate(results) if i % 2 == queue_id and r.commitlog_offset >= log_min]
            assert store.min_offset("t", queue_id) == mine[0].queue_offset
            assert store.get("t", queue_id, 0).status is GetStatus.OFFSET_TOO_SMALL
            got = store.get("t", queue_id, mine[0].queue_offset, max_count=1000).messages
            assert [m.commitlog_offset for m in got] == [r.commitlog_offset for r in mine]
        assert store.query("t", "k0") == []
        assert store.put(Message("t", b"after")).status is PutStatus.PUT_OK
        assert store.wait_dispatched(30)


def test_a_killed_dispatch_process_is_reported_and_the_next_open_dispatches_what_it_missed(tmp_path):
    with MessageStore.open(tmp_path, _config()) as store:
        for message in _messages(50):
            store.put(message)
        assert store.wait_dispatched(30)
        pid = store.stats()["dispatch"]["process_id"]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: store.stats()["dispatch"]["error"] is not None)
        assert "dispatch process" in store.stats()["dispatch"]["error"]
        late = [store.put(m) for m in _messages(60)[50:]]  # still stored, durable, not visible
        assert all(result.status is PutStatus.PUT_OK for result in late)
        assert not store.wait_dispatched(1)
        with pytest.raises(StoreError, match="dispatch process"):
            store.flush()
        with pytest.raises(StoreError, match="dispatch stopped"):
            store.wait_dispatched_past(late[-1].commitlog_offset, 1)
    with MessageStore.open(tmp_path, _config(dispatch_process=False)) as store:
        assert store.wait_dispatched(30)
        for queue_id in range(4):
            bodies = [m.body for m in store.get("t", queue_id, 0, max_count=100).messages]
            assert bodies == [m.body for m in _messages(60) if m.queue_id == queue_id]


WRITER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    from mqstore import FlushMode, Message, MessageStore
    from tests.conftest import small_config
    store = MessageStore.open(sys.argv[1], small_config(dispatch_process=True, flush_mode=FlushMode.SYNC))
    for i in range(200):
        store.put(Message("t", b"%05d" % i, queue_id=i % 2))
    assert store.wait_dispatched(30)
    print(store.stats()["dispatch"]["process_id"], flush=True)
    while True:
        time.sleep(1)
""")


@contextlib.contextmanager
def _writer_process(root):
    """A writer process (WRITER) that has put 200 SYNC messages and waits; yields (writer, its dispatch child's
    pid). Both are killed at the end if still alive."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(ROOT)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    child = None
    try:
        line = writer.stdout.readline()
        assert line.strip().isdigit(), writer.stderr.read()
        child = int(line)
        yield writer, child
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
        writer.stdout.close()
        writer.stderr.close()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_process_stops_when_the_writer_dies_and_the_next_open_recovers(tmp_path):
    with _writer_process(tmp_path) as (writer, child):
        assert _alive(child)
        writer.kill()
        writer.wait(10)
        assert wait_until(lambda: not _alive(child))
    with MessageStore.open(tmp_path, small_config(dispatch_process=True)) as store:
        assert store.recovery_report.crashed
        for queue_id in (0, 1):  # SYNC: every acknowledged put is there
            bodies = [m.body for m in store.get("t", queue_id, 0, max_count=1000).messages]
            assert bodies == [b"%05d" % i for i in range(queue_id, 200, 2)]


def test_a_dispatch_process_that_cannot_start_fails_the_open_and_leaves_the_store_usable(tmp_path, monkeypatch):
    with MessageStore.open(tmp_path, small_config()) as store:
        store.put(Message("t", b"before"))
    monkeypatch.setattr(sys, "executable", shutil.which("false"))
    with pytest.raises(DispatchProcessError, match="did not start"):
        MessageStore.open(tmp_path, small_config(dispatch_process=True))
    monkeypatch.undo()
    with MessageStore.open(tmp_path, small_config(dispatch_process=True)) as store:  # lock released, no leftovers
        assert store.get("t", 0, 0).messages[0].body == b"before"


def test_a_read_only_store_follows_a_writer_with_a_dispatch_process(tmp_path):
    with MessageStore.open(tmp_path, _config()) as store:
        for message in _messages(40):
            store.put(message)
        assert store.wait_dispatched(30)
        with MessageStore.open(tmp_path, _config(), read_only=True) as reader:
            for queue_id in range(4):
                assert [m.body for m in reader.get("t", queue_id, 0, max_count=100).messages] == \
                    [m.body for m in _messages(40) if m.queue_id == queue_id]
            assert len(reader.query("t", "group2")) == len([m for m in _messages(40) if "group2" in m.keys])
            assert reader.stats()["dispatch"]["process_id"] is None


def test_the_control_file_is_read_as_whole_words(tmp_path):
    from mqstore.store.dispatch_process import ControlWords

    path = str(tmp_path / "control")
    writer = ControlWords(path, create=True)
    reader = ControlWords(path, create=False)
    writer[3] = (1 << 62) + 12345
    assert reader[3] == (1 << 62) + 12345 and reader[2] == 0
    (tmp_path / "short").write_bytes(bytes(8))
    with pytest.raises(StoreError, match="not a dispatch control file"):
        ControlWords(str(tmp_path / "short"), create=False)
    reader.close()
    writer.close()


def test_a_dispatch_process_left_running_by_a_killed_writer_is_stopped_by_the_next_open(tmp_path):
    with _writer_process(tmp_path) as (writer, child):
        os.kill(child, signal.SIGSTOP)  # it cannot see its writer go: as if it had not noticed yet
        assert wait_until(lambda: _state(child) == "T")  # stopped (a signal is delivered asynchronously)
        writer.kill()
        writer.wait(10)
        assert _alive(child)
        with MessageStore.open(tmp_path, small_config()) as store:
            assert not _alive(child)  # stopped before recovery touched the queues
            assert store.recovery_report.crashed
            assert store.max_offset("t", 0) == store.max_offset("t", 1) == 100


def test_lookups_by_key_follow_the_index_files_the_process_adds(tmp_path):
    with MessageStore.open(tmp_path, _config(index_entry_count_max=64, index_slot_count=16)) as store:
        for round_ in range(6):  # each round fills most of an index file (2 entries a message)
            batch = [Message("t", b"%d-%d" % (round_, i), keys=(f"r{round_}k{i}",)) for i in range(25)]
            for message in batch:
                store.put(message)
            assert store.wait_dispatched(30)
            for round_seen in range(round_ + 1):  # keys of every file so far, the newest included
                assert [m.body for m in store.query("t", f"r{round_seen}k24")] == [b"%d-24" % round_seen]
        assert len(store._index.files) >= 3


def _environment(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").split("=", 1) for entry in entries if b"=" in entry)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the child's environment from /proc")
@pytest.mark.parametrize("chosen", [None, "2"])
def test_the_child_runs_openblas_on_one_thread_unless_the_user_chose(tmp_path, monkeypatch, chosen):
    """The child does no linear algebra; OpenBLAS's threads would spin a core at its numpy import."""
    if chosen is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", chosen)
    with MessageStore.open(tmp_path, _config()) as store:
        assert _environment(store._dispatch.pid)["OPENBLAS_NUM_THREADS"] == (chosen or "1")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the child's environment from /proc")
def test_the_child_imports_mqstore_from_where_its_parent_did(tmp_path, monkeypatch):
    import mqstore

    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    with MessageStore.open(tmp_path, _config()) as store:
        path = _environment(store._dispatch.pid)["PYTHONPATH"].split(os.pathsep)
    assert path == [str(Path(mqstore.__file__).resolve().parents[1]), "elsewhere"]


INSTALLED_WRITER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import mqstore
    from mqstore import Message, MessageStore
    from tests.conftest import small_config
    assert mqstore.__file__.startswith(sys.argv[1]), mqstore.__file__
    with MessageStore.open(sys.argv[2], small_config(dispatch_process=True, index_enabled=True)) as store:
        store.put(Message("t", b"body", keys=("k",)))
        store.flush()
        pid = store._dispatch.pid
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = dict(e.split(b"=", 1) for e in handle.read().split(b"\\0") if b"=" in e)
        with open(f"/proc/{pid}/maps") as handle:
            native = sorted({line.split()[-1] for line in handle if "_native" in line})
        print(environ[b"PYTHONPATH"].decode().split(os.pathsep)[0])
        print(json.dumps(native))
        print(store.query("t", "k")[0].body.decode())
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the child's environment and maps from /proc")
def test_a_copy_installed_as_a_wheel_lays_it_out_starts_its_own_child(tmp_path):
    """An installed mqstore is one directory, mqstore/ with the format layers inside; a writer importing such a
    copy starts its dispatch child on that same copy, not on whatever else the interpreter would find."""
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "csrc")
    shutil.copytree(ROOT / "mqstore", site / "mqstore", ignore=ignore)
    for layer in ("commitlog", "consumequeue", "indexfile", "flush"):
        shutil.copytree(ROOT / layer, site / "mqstore" / layer, ignore=ignore)
    environment = dict(os.environ, PYTHONPATH=str(ROOT))  # for tests.conftest only; mqstore comes from `site`
    done = subprocess.run([sys.executable, "-c", INSTALLED_WRITER, str(site), str(tmp_path / "store")],
                          env=environment, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first_path, native, body = done.stdout.splitlines()
    assert first_path == str(site)
    if os.environ.get("MQSTORE_NATIVE", "1") != "0":
        mapped = json.loads(native)  # the compiled core the child loaded
        assert mapped and all(path.startswith(str(site)) for path in mapped)
    assert body == "body"
