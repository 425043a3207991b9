"""An uploader stand-in in a process of its own, for bench/tier_upload.py's "stand-in process" row.

    python bench/tier_copier.py STORE_DIR OUT_DIR [--keep]

Copies each sealed segment of the store (every CommitLog file but the newest) as the tier's uploader moves it,
with plain system calls: pread in 8 MiB chunks, CRC-32 of each chunk, write into OUT_DIR (tmpfs in the bench),
then read the copy back with its CRC, and delete the copy (tmpfs's room; with --keep the copies stay, as a tier's
objects do). No manifest, no queues or indexes: the
bytes of the segments alone. It runs 10 nicer, as the uploader's threads do. On SIGTERM it copies what is sealed
by then and exits, printing the segments and bytes it copied as one JSON line. What the row asks: does moving a
segment's bytes cost the writer less from another process than from the uploader's threads in its own?
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

try:
    from isal.isal_zlib import crc32  # the uploader's CRC-32 (it lets go of the interpreter lock)
except ImportError:
    from zlib import crc32

CHUNK_BYTES = 8 << 20  # what one write of an upload moves (location.STREAM_CHUNK_BYTES)
NICE = 10  # uploader.UPLOADER_NICE
POLL_S = 0.2


def copy_segment(path: str, out: str, buffer: bytearray, keep: bool = False) -> int:
    """One segment copied and read back, CRCs compared; its size."""
    source = os.open(path, os.O_RDONLY)
    target = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    at, written_crc = 0, 0
    try:
        while data := os.pread(source, CHUNK_BYTES, at):
            written_crc = crc32(data, written_crc)
            os.write(target, data)
            at += len(data)
    finally:
        os.close(source)
        os.close(target)
    back, read_crc = os.open(out, os.O_RDONLY), 0
    try:
        while (count := os.readv(back, [buffer])) > 0:
            read_crc = crc32(memoryview(buffer)[:count], read_crc)
    finally:
        os.close(back)
    if not keep:
        os.unlink(out)
    if read_crc != written_crc:
        raise SystemExit(f"{out}: read back CRC {read_crc}, written {written_crc}")
    return at


def main() -> int:
    store, out = sys.argv[1], sys.argv[2]
    keep = "--keep" in sys.argv[3:]
    os.nice(NICE)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    os.makedirs(out, exist_ok=True)
    buffer = bytearray(CHUNK_BYTES)
    copied: set[str] = set()
    total = 0
    while True:
        last_look = bool(stopping)  # after SIGTERM: one more look, then out
        names = sorted(os.listdir(os.path.join(store, "commitlog")))
        for name in names[:-1]:
            if name not in copied:
                total += copy_segment(os.path.join(store, "commitlog", name), os.path.join(out, name), buffer, keep)
                copied.add(name)
        if last_look:
            break
        time.sleep(POLL_S)
    print(json.dumps({"segments": len(copied), "bytes": total}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
