"""The crash simulator's own rules, where a mistake would make the sweeps fail (or pass) for the wrong reason."""

from __future__ import annotations

import os
import random

from mqstore.commitlog.mapped_file import MappedFile

from tests.crash import simulator
from tests.crash.simulator import FlushRecorder, image_files

SIZE = 2 * simulator.PAGE_SIZE_BYTES


def _image(recorder, point, policy="lost") -> dict[str, bytes]:
    return image_files(recorder, point, recorder.durable_pages(point), random.Random(1), policy)


def test_a_file_recreated_while_a_snapshot_reads_is_a_new_inode(tmp_path, monkeypatch):
    # Recovery deleted a segment that the recording started with; the allocator makes it again, under the same
    # name, while a snapshot reads the files. Its unflushed pages can only be zeros after a crash, never the
    # deleted file's records.
    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    segment = root / "commitlog" / "00000000000000008192"
    segment.write_bytes(b"old record " * (SIZE // 11) + bytes(SIZE % 11))
    with FlushRecorder(str(root)) as recorder:
        os.unlink(segment)
        real_read_group = simulator._read_group

        def read_group(root_dir, relative_dir, files):
            if relative_dir == "commitlog" and not segment.exists():
                MappedFile.create(str(segment), 8192, SIZE).close()  # the allocator, mid-snapshot
            real_read_group(root_dir, relative_dir, files)

        monkeypatch.setattr(simulator, "_read_group", read_group)
        point = recorder.snapshot()
    relative = os.path.join("commitlog", segment.name)
    assert point.files[relative] == bytes(SIZE)
    for policy in ("lost", "mixed", "ordered"):
        assert _image(recorder, point, policy).get(relative, bytes(SIZE)) == bytes(SIZE)


def test_flushes_of_a_deleted_file_do_not_count_for_the_file_made_under_its_name(tmp_path):
    root = tmp_path / "store"
    (root / "consumequeue").mkdir(parents=True)
    path = str(root / "consumequeue" / "00000000000000000000")
    relative = os.path.join("consumequeue", "00000000000000000000")
    with FlushRecorder(str(root)) as recorder:
        first = MappedFile.create(path, 0, SIZE)
        first.array[:] = 7
        first.flush(0, SIZE)  # durable: a crash now leaves the sevens
        first.close()
        assert _image(recorder, recorder.snapshot())[relative] == bytes([7]) * SIZE
        os.unlink(path)
        second = MappedFile.create(path, 0, SIZE)
        second.array[: simulator.PAGE_SIZE_BYTES] = 9
        second.flush(0, simulator.PAGE_SIZE_BYTES)
        second.array[simulator.PAGE_SIZE_BYTES:] = 5  # not flushed
        point = recorder.snapshot()
        second.close()
    image = _image(recorder, point)[relative]
    assert image == bytes([9]) * simulator.PAGE_SIZE_BYTES + bytes(simulator.PAGE_SIZE_BYTES)
