"""The tier uploader in a process of its own (mqstore/tier/upload_process.py, the default): it uploads what the
thread would, the writer follows its manifest, a killed child is started again, a killed writer's child goes away
(by itself, or killed by the next open), and the tier's credentials never reach a command line."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

import mqstore
from mqstore import MessageStore
from mqstore.tier import manifest as manifest_module
from mqstore.tier import upload_process
from mqstore.tier.location import TierLocation
from mqstore.tier.verify import verify_tier
from tests.conftest import wait_until
from tests.tier.test_uploader import SEGMENT, put_messages, sealed_end, tier_config, wait_uploaded

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the tests read processes from /proc")
REPO = Path(__file__).resolve().parents[2]


def uploader_children(root) -> list[int]:
    """The live (not zombie) uploader processes of the store at `root`."""
    found = []
    marker, wanted = upload_process.CHILD_MARKER, os.fsencode(os.path.abspath(root))
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            arguments = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(marker in argument for argument in arguments) and wanted in arguments:
            found.append(int(name))
    return found


def test_the_child_uploads_and_the_writer_follows_its_manifest(tmp_path, tier_uri):
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, random.Random(51), 600)
        end = sealed_end(store)
        stats = wait_uploaded(store, end)
        uploader = store._tier_uploader
        assert isinstance(uploader, upload_process.ProcessUploader)
        child = stats["process"]["pid"]
        assert stats["process"]["running"] and child != os.getpid() and uploader_children(root) == [child]
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        assert b"s3://" not in cmdline and b"file://" not in cmdline  # the URI (and its keys) came on stdin
        parent_package = os.fsencode(Path(mqstore.__file__).resolve().parents[1])
        environ = dict(e.split(b"=", 1) for e in Path(f"/proc/{child}/environ").read_bytes().split(b"\0") if e)
        assert environ[b"PYTHONPATH"].split(os.pathsep.encode())[0] == parent_package  # the parent's mqstore
        listed = manifest_module.load(TierLocation.open(tier_uri))
        assert uploader.manifest.generation == listed.generation and uploader.verified_end() == listed.end >= end
        assert stats["objects_uploaded"] >= end // SEGMENT and stats["bytes_uploaded"] >= end
        assert stats["failures"] == 0 and stats["refused"] is None and stats["process"]["exits"] == 0
        assert stats["upload_cost"]["thread_cpu_seconds"]["uploader"] > 0  # measured in the child, published
    assert uploader_children(root) == []  # close stopped it
    config = root / "config"
    assert not (config / upload_process.CONTROL_FILE_NAME).exists()
    assert not (config / upload_process.STATUS_FILE_NAME).exists()


def test_a_killed_child_is_started_again_and_goes_on(tmp_path):
    uri = (tmp_path / "tier").as_uri()
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(uri)) as store:
        put_messages(store, random.Random(52), 300)
        wait_uploaded(store, sealed_end(store))
        first = store.stats()["tier"]["process"]["pid"]
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: store.stats()["tier"]["process"]["exits"] == 1)
        assert wait_until(lambda: store.stats()["tier"]["process"]["running"])
        stats = store.stats()["tier"]
        assert stats["process"]["pid"] != first and stats["process"]["starts"] == 2
        assert "exit status -9" in stats["process"]["last_exit"]
        put_messages(store, random.Random(53), 300, first=300)
        end = sealed_end(store)
        assert wait_uploaded(store, end)["uploaded_end"] >= end


WRITER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from tests.tier.test_uploader import put_messages, tier_config, sealed_end
    from mqstore import MessageStore
    import random
    store = MessageStore.open(sys.argv[1], tier_config(sys.argv[2]))
    put_messages(store, random.Random(54), 300)
    while (store.stats()["tier"]["uploaded_end"] or 0) < sealed_end(store):
        time.sleep(0.01)
    print(store.stats()["tier"]["process"]["pid"], flush=True)
    time.sleep(120)
""")


def start_writer(root, uri) -> tuple[subprocess.Popen, int]:
    """A writer process with a tier that has uploaded; (the process, its uploader child's pid)."""
    env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO))
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO)), str(root), uri],
                              stdout=subprocess.PIPE, env=env)
    line = writer.stdout.readline()
    assert line.strip().isdigit(), line
    return writer, int(line)


def test_a_killed_writers_child_stops_by_itself(tmp_path):
    root, uri = tmp_path / "store", (tmp_path / "tier").as_uri()
    writer, child = start_writer(root, uri)
    assert uploader_children(root) == [child]
    writer.kill()
    writer.wait()
    assert wait_until(lambda: uploader_children(root) == [])  # it saw its writer gone
    with MessageStore.open(root, tier_config(uri)) as store:
        assert store.stats()["tier"]["uploaded_end"] is not None or wait_uploaded(store, SEGMENT)
        assert len(uploader_children(root)) == 1


def test_the_next_open_kills_a_child_its_killed_writer_left(tmp_path):
    """A child that has not noticed its writer's death (stopped here, as a busy machine may hold it) must not
    upload beside the next writer's: the open kills it before recovery."""
    root, uri = tmp_path / "store", (tmp_path / "tier").as_uri()
    writer, child = start_writer(root, uri)
    os.kill(child, signal.SIGSTOP)
    try:
        writer.kill()
        writer.wait()
        time.sleep(0.05)  # well past the child's look at its writer, had it run
        assert uploader_children(root) == [child]
        with MessageStore.open(root, tier_config(uri)) as store:
            assert child not in uploader_children(root)
            assert wait_until(lambda: store.stats()["tier"]["process"]["running"])
            assert uploader_children(root) == [store.stats()["tier"]["process"]["pid"]]
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert uploader_children(root) == []


def test_the_thread_and_the_process_write_the_same_tier(tmp_path):
    """The same puts into two stores, one uploading from a thread, one from its process: the same objects listed
    (records and index file names differ only by the clock), each whole by `tier verify`."""
    listed = {}
    for process in (False, True):
        uri = (tmp_path / f"tier-{process}").as_uri()
        with MessageStore.open(tmp_path / f"store-{process}", tier_config(uri, tier_upload_process=process)) as store:
            put_messages(store, random.Random(55), 600)
            wait_uploaded(store, sealed_end(store))
        location = TierLocation.open(uri)
        manifest = manifest_module.load(location)
        assert verify_tier(uri).ok
        listed[process] = (manifest.end, [s.base_offset for s in manifest.segments],
                           sorted((key, [(f.name, f.entries) for f in files])
                                  for key, files in manifest.queues.items()),
                           [f.end_commitlog_offset for f in manifest.index])  # named by time
    assert listed[False] == listed[True] and listed[True][1]


def test_a_status_file_that_cannot_be_written_leaves_the_generation_published(tmp_path, caplog):
    """On a full disk the child cannot replace its status file; it must still publish the manifest's generation,
    which the writer's retention follows to free the disk."""
    words = upload_process.MappedWords(str(tmp_path / "words"), upload_process.WORDS, create=True, truncate=True)
    control = words.words
    uploader = types.SimpleNamespace(counters=lambda: {"failures": 0, "refused": None},
                                     manifest=types.SimpleNamespace(generation=3))
    publisher = upload_process._Publisher(str(tmp_path / "no-such-store"), control, uploader)
    publisher.publish()
    assert int(control[upload_process.GENERATION]) == 3 and int(control[upload_process.STATUS]) == 1
    assert "cannot write the uploader's figures" in caplog.text
    del control, publisher  # views of the mapping
    words.close()
