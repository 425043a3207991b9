"""What the uploader costs the writer, and its cuts: stats()["tier"]["upload_cost"] counts every byte each phase
moved; the uploader with each cut on or off writes the same objects with the same checksums; a segment's chunked
read and the read-back into one buffer give what a plain read gives, short files and objects included; the uploader's
threads run nicer than the writer's."""

from __future__ import annotations

import os
import random
import threading

import pytest
from mqstore.commitlog.errors import StoreIOError

from mqstore import MessageStore
from mqstore.tier import local_files
from mqstore.tier import location as location_module
from mqstore.tier import manifest as manifest_module
from mqstore.tier import uploader as uploader_module
from mqstore.tier.location import UPLOAD_PHASES, TierLocation, UploadMeter, crc32
from mqstore.tier.verify import verify_tier
from tests.tier.test_uploader import SEGMENT, put_messages, sealed_end, tier_config, wait_uploaded

CUT_SETTINGS = [(location_module, "VERIFY_READS_INTO_BUFFER")]


@pytest.mark.parametrize(("cuts_on", "process"), [(True, False), (False, False), (True, True)],
                         ids=["cuts", "no-cuts", "uploader-process"])
def test_each_phase_counts_every_byte_and_the_objects_match_the_local_files(tmp_path, tier_uri, monkeypatch,
                                                                            cuts_on, process):
    """The thread (with and without the cuts, patched here) and the process (its figures come through the status
    file) count the same phases."""
    for module, setting in CUT_SETTINGS:
        monkeypatch.setattr(module, setting, cuts_on)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, tier_upload_process=process)) as store:
        put_messages(store, random.Random(7), 600)
        end = sealed_end(store)
        stats = wait_uploaded(store, end)
        cost = store.stats()["tier"]["upload_cost"]
    # every sealed segment is read, sent and read back before the manifest lists it (a later round may be halfway)
    assert end >= 3 * SEGMENT and stats["failures"] == 0
    assert cost["bytes"]["read"] >= end and cost["bytes"]["crc"] >= cost["bytes"]["put"] >= end
    assert stats["bytes_uploaded"] >= cost["bytes"]["verify_read"] >= end
    assert cost["bytes"]["verify_read"] >= cost["bytes"]["verify_crc"] >= end
    assert set(cost["cpu_seconds"]) == set(UPLOAD_PHASES) and min(cost["cpu_seconds"].values()) >= 0
    assert cost["thread_cpu_seconds"]["uploader"] > 0 and cost["thread_cpu_seconds"]["verifier"] > 0
    location = TierLocation.open(tier_uri)
    manifest = manifest_module.load(location)
    assert manifest.end == end
    for segment in manifest.segments:
        local = (root / "commitlog" / f"{segment.base_offset:020d}").read_bytes()
        key = manifest_module.segment_key(segment.base_offset)
        assert location.read_range(key, SEGMENT, 0, SEGMENT) == local and crc32(local) == segment.crc32
    assert verify_tier(tier_uri).ok


@pytest.mark.parametrize("size", [0, 1, 5, location_module.STREAM_CHUNK_BYTES + 3])
def test_a_segment_is_read_in_chunks_and_every_byte_is_metered(tmp_path, size):
    path = tmp_path / "segment"
    data = random.Random(size).randbytes(size + 11)
    path.write_bytes(data)
    meter = UploadMeter()
    chunks = list(local_files.file_chunks(str(path), size, meter))
    assert b"".join(chunks) == data[:size] and all(len(c) <= location_module.STREAM_CHUNK_BYTES for c in chunks)
    assert meter.bytes["read"] == size


def test_the_read_of_a_short_or_missing_file_is_an_error(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 10)
    with pytest.raises(StoreIOError, match="shorter than 11 bytes"):
        list(local_files.file_chunks(str(path), 11))
    with pytest.raises(StoreIOError, match="cannot open"):
        list(local_files.file_chunks(str(tmp_path / "missing"), 1))


@pytest.mark.parametrize("into_buffer", [True, False], ids=["into-buffer", "read-at"])
def test_the_read_back_into_one_buffer_checks_what_read_at_checks(tmp_path, monkeypatch, into_buffer):
    monkeypatch.setattr(location_module, "VERIFY_CHUNK_BYTES", 1000)
    monkeypatch.setattr(location_module, "VERIFY_READS_INTO_BUFFER", into_buffer)
    location = TierLocation.open(f"file://{tmp_path}/tier")
    data = random.Random(3).randbytes(2500)
    location.put_bytes("object", data)
    meter = location.meter = UploadMeter()
    assert location.checksum("object", 2500) == (2500, crc32(data))
    assert location.checksum("object", 2500, 1700) == (1700, crc32(data[:1700]))
    assert location.checksum("object", 3000) == (2500, crc32(data))  # shorter than listed: what there is
    assert meter.bytes["verify_read"] == meter.bytes["verify_crc"] == 2500 + 1700 + 2500
    assert location.checksum("object", 0) == (0, 0)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread nice values here")
def test_the_uploader_threads_run_nicer_than_the_writer():
    seen = {}

    def thread() -> None:
        uploader_module._lower_priority()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    writer = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen["nice"] == min(19, writer + uploader_module.UPLOADER_NICE)
