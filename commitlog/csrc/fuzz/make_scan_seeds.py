"""Seeds of the scan fuzzer (fuzz_scan.c): real segments with the 16-byte header the target reads.

From RocketMQ 4.4.0's fixture store when it is there ($MQSTORE_ROCKETMQ_FIXTURES, else tests/data), and
from a small log this project's CommitLog writes (record CRCs on, tags, keys, a segment roll), so that a clone
without the fixtures still has seeds. Usage: make_scan_seeds.py OUT_DIRECTORY
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from pathlib import Path

SEGMENTS_PER_STORE = 4  # segments taken from each store (the first ones, a blank at each end)
LARGE = 64  # fuzz_scan.c's large-segment flag; the start's top 2 bits pick 2^31 - k, 2^31 + k, 2^32 - k, the end
LARGE_VARIANTS = ((LARGE | 2, 100), (LARGE | 3, (1 << 22) | 8), (LARGE | 6, (2 << 22) | 4096), (LARGE, 3 << 22))
REPO = Path(__file__).resolve().parents[3]


def header(base: int, flags: int, records_max: int = 0, start: int = 0) -> bytes:
    return struct.pack(">qBH", base, flags, records_max) + start.to_bytes(3, "big") + bytes(2)


def seeds_of(directory: Path, out: Path, label: str) -> int:
    written = 0
    names = sorted(name for name in os.listdir(directory) if name.isdigit() and len(name) == 20)
    for name in names[:SEGMENTS_PER_STORE]:
        data = (directory / name).read_bytes()
        for flags in (0, 1, 2, 3, 6):
            (out / f"{label}-{name}-{flags}").write_bytes(header(int(name), flags) + data)
            written += 1
        for flags, start in LARGE_VARIANTS:  # the same bytes past 2^31 or 2^32 or at the end of a 4 GiB segment
            (out / f"{label}-{name}-large-{flags}-{start}").write_bytes(header(int(name), flags, start=start) + data)
            written += 1
    return written


def own_store(out: Path) -> int:
    """Segments this project's CommitLog writes: record CRCs, tags, keys, several topics, a segment roll."""
    sys.path.insert(0, str(REPO))
    from mqstore.commitlog import format as fmt
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.commitlog.message import Message

    with tempfile.TemporaryDirectory() as root:
        log = CommitLog(root, 65536, writable=True, max_message_size_bytes=8192, max_queues_per_topic=4,
                        born_host_raw=fmt.encode_host("10.1.2.3", 4000), store_host_raw=fmt.encode_host("10.0.0.7",
                                                                                                       10911),
                        preallocate=False, record_crc=True)
        try:
            for index in range(900):
                log.append(log.prepare(Message(f"topic{index % 3}", bytes([index % 251]) * (index % 200),
                                               queue_id=index % 4, tags=["TagA", "TagB", None][index % 3],
                                               keys=(f"k{index}",) if index % 2 else ())))
        finally:
            log.close()
        return seeds_of(Path(root), out, "mqstore")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    fixtures = Path(os.environ.get("MQSTORE_ROCKETMQ_FIXTURES", REPO / "tests" / "data"))
    count = own_store(out)
    commitlog = fixtures / "rocketmq-4.4.0-store" / "store" / "commitlog"
    if commitlog.is_dir():
        count += seeds_of(commitlog, out, "rocketmq")
    print(f"{count} seeds in {out}")


if __name__ == "__main__":
    main()
