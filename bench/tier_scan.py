"""How fast does scan() read a store from its tier, against the local store and against the endpoint itself?

    .venv/bin/python bench/tier_scan.py            # full run: 1,000,000 messages, 64 MiB segments, 5 rounds
    .venv/bin/python bench/tier_scan.py --quick    # smoke run: 40,000 messages, 4 MiB segments, 1 round

A store of default-shaped messages (bench/users_rows.py's shape: 100 B bodies, a tag and a key each, 4 topics x 4
queues) is written with a `file://` tier, sealed and uploaded, and the tier is copied to moto's S3 server on
127.0.0.1 (a process of its own). Then, in interleaved rounds (medians), rows a second of:

  - `scan_store(store)`: the local store, every column;
  - `scan_store(tier URI)`: the same rows from the file:// tier and from S3, every column;
  - a raw pyarrow read of the same segment objects from the same endpoint: the exact ranges the tier scan read
    (recorded from one untimed scan), with `read_at` on one open handle per object and partition, on as many
    threads as the scan reads partitions with (SCAN_THREADS), no decoding; in rows a second as the rows the scan
    returns from those bytes over the read's seconds (and MB/s);
  - the same three for `topic=T0` (a quarter of the rows): the local scan reads through the ConsumeQueues, the
    tier scan walks every segment and keeps the topic's records.

Targets (issue #31): tier scan >= 80% of the local scan's rows/s, and >= 80% of the raw read's rows-equivalent.
Writes bench/results/tier_scan.json and .md (or tier_scan_quick.*; --out FILE names the JSON, the .md beside it);
bench/report.py renders the JSON into bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from tier_upload import process_cpu_s, process_cpu_seconds, start_s3  # noqa: E402
from users_rows import BODY_POOL, bodies, message  # noqa: E402

from mqstore import MessageStore, StoreConfig  # noqa: E402
from mqstore.store.scan import SCAN_PARTITION_BYTES_MAX, SCAN_THREADS, row_filter, scan_store  # noqa: E402
from mqstore.store.scan_options import StoreRef  # noqa: E402
from mqstore.store.scan_plan import plan_batch  # noqa: E402
from mqstore.tier import manifest as manifest_module  # noqa: E402
from mqstore.tier import scan_source  # noqa: E402
from mqstore.tier.location import TierLocation  # noqa: E402

ROUNDS = 5
BATCH = 1000
FULL = dict(messages=1_000_000, segment_size_bytes=64 << 20)
QUICK = dict(messages=40_000, segment_size_bytes=4 << 20)
TOPIC = "T0"


def build(work: str, messages: int, segment_size_bytes: int) -> tuple[str, str, int]:
    """The store (root) and its file:// tier (URI) holding every message; the tier's end."""
    root = os.path.join(work, "store")
    tier = "file://" + os.path.join(work, "tier")
    pool = bodies(100)
    config = StoreConfig(segment_size_bytes=segment_size_bytes, tier_uri=tier)
    with MessageStore.open(root, config) as store:
        for start in range(0, messages, BATCH):
            store.put_batch([message(i, pool[i & (BODY_POOL - 1)]) for i in range(start, start + BATCH)])
        end = store.seal_segment()
        if not (store.wait_dispatched(600) and store.wait_tiered(end, 1800)):
            raise RuntimeError(f"the tier did not catch up: {store.stats()['tier']}")
    return root, tier, end


def copy_tier(source_uri: str, target_uri: str) -> None:
    source, target = TierLocation.open(source_uri), TierLocation.open(target_uri)
    import pyarrow.fs as pafs

    pafs.copy_files(source.root, target.root, source_filesystem=source.filesystem,
                    destination_filesystem=target.filesystem)


def timed_scan(path: str, **filters) -> tuple[float, int]:
    """(seconds, rows) of one scan to Arrow, planning included."""
    began = time.perf_counter()
    rows = 0
    for batch in scan_store(path, **filters):
        rows += batch.num_rows
    return time.perf_counter() - began, rows


def recorded_ranges(uri: str, **filters) -> list[list[tuple[str, int, int]]]:
    """The (key, position, length) range reads one tier scan makes, per object opened, in order."""
    objects: list[list] = []
    original_init, original_view = scan_source.SegmentObject.__init__, scan_source.SegmentObject._view

    def init(self, location, base_offset, size):
        original_init(self, location, base_offset, size)
        self.recorded = []
        objects.append(self.recorded)

    def view(self, position, length):
        self.recorded.append((self.key, position, length))
        return original_view(self, position, length)

    scan_source.SegmentObject.__init__, scan_source.SegmentObject._view = init, view
    try:
        timed_scan(uri, **filters)
    finally:
        scan_source.SegmentObject.__init__, scan_source.SegmentObject._view = original_init, original_view
    return [ranges for ranges in objects if ranges]


def planning(uri: str) -> dict:
    """Seconds to plan a full scan of the tier (manifest, queue-image searches for cuts) and its range reads."""
    images = []
    original = scan_source.QueueImages.__init__

    def init(self, location, manifest):
        original(self, location, manifest)
        images.append(self)

    scan_source.QueueImages.__init__ = init
    try:
        began = time.perf_counter()
        partitions = plan_batch([StoreRef(uri, None)], row_filter(), partition_bytes_max=SCAN_PARTITION_BYTES_MAX)
        seconds = time.perf_counter() - began
    finally:
        scan_source.QueueImages.__init__ = original
    return {"seconds": seconds, "partitions": len(partitions),
            "pieces": sum(len(p.pieces) for p in partitions), "queue_range_reads": sum(i.range_reads for i in images)}


def raw_read(uri: str, objects: list[list[tuple[str, int, int]]]) -> tuple[float, int]:
    """(seconds, bytes) of reading the recorded ranges with pyarrow alone, an object's ranges in order on one
    handle, SCAN_THREADS objects at once."""
    location = TierLocation.open(uri)

    def read_object(ranges) -> int:
        done = 0
        with location.filesystem.open_input_file(location.path(ranges[0][0])) as handle:
            for _, position, length in ranges:
                done += len(handle.read_at(length, position))
        return done

    began = time.perf_counter()
    with ThreadPoolExecutor(SCAN_THREADS) as pool:
        total = sum(pool.map(read_object, objects))
    return time.perf_counter() - began, total


def run_round(root: str, tiers: dict, ranges: dict, rows_expected: dict, server_pid: int) -> dict:
    """Every read once; each row with its wall seconds, this process's CPU seconds (every thread: the scan's
    decoding and the S3 client) and the S3 server's (its own process), measured around the same read."""
    found = {}
    for kind, filters in (("full", {}), ("topic", {"topic": TOPIC})):
        found[f"local {kind}"] = _row(rows_expected[kind], *_measured(server_pid, timed_scan, root, **filters))
        for name, uri in tiers.items():
            found[f"{name} tier {kind}"] = _row(rows_expected[kind],
                                                *_measured(server_pid, timed_scan, uri, **filters))
            (seconds, done), cpu = _measured(server_pid, raw_read, uri, ranges[(name, kind)])
            found[f"{name} raw {kind}"] = {"seconds": seconds, "bytes": done, "mb_per_s": done / seconds / 1e6,
                                           "rows_per_s": rows_expected[kind] / seconds, **cpu}
    return found


def _measured(server_pid: int, action, *args, **kwargs) -> tuple[tuple, dict]:
    """(what `action` returned, {reader_cpu_s, endpoint_cpu_s}) around one call."""
    reader, endpoint = process_cpu_seconds(), process_cpu_s(server_pid)
    returned = action(*args, **kwargs)
    return returned, {"reader_cpu_s": process_cpu_seconds() - reader,
                      "endpoint_cpu_s": process_cpu_s(server_pid) - endpoint}


def _row(expected: int, measured: tuple[float, int], cpu: dict) -> dict:
    seconds, rows = measured
    if rows != expected:
        raise RuntimeError(f"a scan returned {rows} rows, {expected} expected")
    return {"seconds": seconds, "rows": rows, "rows_per_s": rows / seconds, **cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="the JSON (default bench/results/tier_scan[_quick].json)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    work = tempfile.mkdtemp(prefix="tier-scan-")
    server, s3_template = start_s3()
    try:
        root, file_uri, end = build(work, **shape)
        s3_uri = s3_template.format(prefix="tier")
        copy_tier(file_uri, s3_uri)
        tiers = {"file://": file_uri, "S3 (moto)": s3_uri}
        manifest = manifest_module.load(TierLocation.open(file_uri))
        rows_expected = {"full": timed_scan(root)[1], "topic": timed_scan(root, topic=TOPIC)[1]}
        log_bytes_per_row = end / rows_expected["full"]
        ranges = {(name, kind): recorded_ranges(uri, **filters) for name, uri in tiers.items()
                  for kind, filters in (("full", {}), ("topic", {"topic": TOPIC}))}
        plans = {name: planning(uri) for name, uri in tiers.items()}
        load_before = os.getloadavg()[0]
        samples = []
        for number in range(rounds):
            samples.append(run_round(root, tiers, ranges, rows_expected, server.pid))
            print(f"round {number + 1}:", json.dumps({k: round(v["rows_per_s"]) for k, v in samples[-1].items()}),
                  flush=True)
        load_after = os.getloadavg()[0]
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(sample[name]["rows_per_s"] for sample in samples) for name in samples[0]}
    result = {"command": " ".join(["python", "bench/tier_scan.py"] + sys.argv[1:]), "shape": shape,
              "rounds": rounds, "segments": len(manifest.segments), "rows": rows_expected, "topic": TOPIC,
              "log_bytes_per_row": log_bytes_per_row, "scan_threads": SCAN_THREADS, "medians": medians,
              "planning": plans, "samples": samples, "machine": platform.platform(), "cpus": os.cpu_count(),
              "load_before": load_before, "load_after": load_after, "python": platform.python_version(),
              "load_average_1min": [load_before, load_after], "endpoint_process": "moto.server, its own process",
              "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = args.out or os.path.join(HERE, "results", "tier_scan_quick.json" if args.quick else "tier_scan.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1)
    text = render(result)
    with open(out[:-5] + ".md", "w") as handle:
        handle.write(text)
    print(text)
    return 0


def render(result: dict) -> str:
    """The table bench/report.py puts in bench/README.md, under a line saying how it was made."""
    from reports.tier import report_tier_scan

    return (f"`{result['command']}`, {result['date_utc']}, Python {result['python']}, {result['cpus']} cores, load "
            f"{result['load_before']:.1f} -> {result['load_after']:.1f}.\n\n{report_tier_scan(result)}\n")


if __name__ == "__main__":
    sys.exit(main())
