"""How long does a get of a cold offset take from the tier, against the endpoint's own GET of the same bytes?

    .venv/bin/python bench/tier_get.py            # full run: 1,000,000 messages, 8 MiB segments, 5 rounds
    .venv/bin/python bench/tier_get.py --quick    # smoke run: 20,000 messages, 1 MiB segments, 1 round

A store of user-shaped messages (bench/users_rows.py's shape: 100 B bodies, a tag and a key each, 4 topics x 4
queues) is written with StoreConfig's defaults but for the segment size and a `file://` tier; its segments are
sealed, uploaded, and removed from local disk by retention (`file_reserved_hours=0`, `clean_expired()`), so every
message is in the tier only. Segments of 8 MiB: moto copies a whole object for each range read, so its GET of any
length takes longer the larger the object (45 ms from a 64 MiB object, 5 ms from a 16 MiB one, here); small objects
keep it near its cost a request, as a remote endpoint's latency does not depend on the object's size. And the
tier holds more objects (34) than a filesystem's open handles (16), as a tier of a long history does.

The tier is copied to moto's S3 server on 127.0.0.1 (a process of its own). Each round opens the store read_only
once per endpoint (`tier_uri` naming it; default `tier_cache_bytes`), has its reader open every object (a read of
each one's first record, not timed) and takes SAMPLES messages spread at random over the whole tier; for each, after
an untimed get and query of it (its ConsumeQueue and index pages on local disk touched: a first touch costs page
faults, not the tier; and its object's handle open), in a shuffled order, timed one by one:

  - cold rows: `get(topic, queue_id, queue_offset, max_count=1)`, `get(...)` (the default 32), `read_at(offset)`,
    `query(topic, key)`, each after the reader's block cache was emptied (its input handles stay open, as in a
    store that has read from those objects before); and `get(...)` after `TierReader.close()` (cache and handles
    gone: the object is opened again, a HEAD on S3);
  - `get(...)` again right after the cold one: warm, from the cache;
  - the endpoint itself, through pyarrow on one open handle per object: the range read the cold get made (same
    object, offset and length, recorded from TierLocation.read_range), 256 KiB at the start of the block holding
    the message, and 1 byte there (the request floor); and `open_input_file` + 1 byte (a HEAD and a GET).

Each cold call's range reads, objects opened and cache hits are counted from `stats()["tier"]["reads"]`, and every
call's result is checked against the messages read from local disk before retention removed them.

Target (issue #31): a cold get is one range read, its p50 within 2x the endpoint's GET p50 (here: of the same
range; the ratio is the median over rounds of each round's p50s' ratio).
Writes bench/results/tier_get.json and .md (or tier_get_quick.*; --out FILE names the JSON, the .md beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from tier_scan import copy_tier  # noqa: E402
from tier_upload import start_s3  # noqa: E402
from users_rows import BODY_POOL, QUEUES, TOPICS, bodies, message  # noqa: E402

from mqstore import GetStatus, MessageStore, StoreConfig  # noqa: E402
from mqstore.tier import manifest as manifest_module  # noqa: E402
from mqstore.tier.reader import TIER_CACHE_BLOCK_BYTES  # noqa: E402

ROUNDS = 5
BATCH = 1000
SEED = 20261128
FULL = dict(messages=1_000_000, segment_size_bytes=8 << 20, samples=60)
QUICK = dict(messages=20_000, segment_size_bytes=1 << 20, samples=8)
COLD_ROWS = ("get 1", "get 32", "read_at", "query", "get 32, object not open")
ENDPOINT_ROWS = ("GET same range", "GET 256 KiB", "GET 1 byte", "HEAD + GET 1 byte")
ROWS = COLD_ROWS + ("get 32, warm",) + ENDPOINT_ROWS


class Target:
    """One sampled message: where it is and what each read of it must return (read from local disk)."""

    def __init__(self, number: int):
        self.number = number
        self.topic = f"T{number % TOPICS}"
        self.queue_id = (number // TOPICS) % QUEUES
        self.queue_offset = number // (TOPICS * QUEUES)
        self.key = f"k{number}"
        self.expected_32: list = []  # get(...)'s messages

    @property
    def first(self):
        return self.expected_32[0]


def build(work: str, messages: int, segment_size_bytes: int, targets: list[Target]) -> tuple[str, str, dict]:
    """The store (root) with its history in a file:// tier (URI) only: put, seal, upload; then each target's
    messages read from local disk, and retention removes every segment. What retention did."""
    root = os.path.join(work, "store")
    tier = "file://" + os.path.join(work, "tier")
    pool = bodies(100)
    config = StoreConfig(segment_size_bytes=segment_size_bytes, tier_uri=tier, file_reserved_hours=0)
    with MessageStore.open(root, config) as store:
        for start in range(0, messages, BATCH):
            store.put_batch([message(i, pool[i & (BODY_POOL - 1)]) for i in range(start, start + BATCH)])
        end = store.seal_segment()
        if not (store.wait_dispatched(600) and store.wait_tiered(end, 1800)):
            raise RuntimeError(f"the tier did not catch up: {store.stats()['tier']}")
        for target in targets:
            result = store.get(target.topic, target.queue_id, target.queue_offset)
            if result.status is not GetStatus.FOUND or result.messages[0].keys != (target.key,):
                raise RuntimeError(f"message {target.number} not where the shape puts it: {result.status}")
            target.expected_32 = result.messages
        removed = 0
        while True:  # a round removes at most SEGMENTS_REMOVED_PER_ROUND_MAX segments
            report = store.clean_expired()
            removed += len(report["segments_removed"])
            local_min = store.stats()["commitlog"]["min_offset"]
            if local_min >= end or not report["segments_removed"]:
                break
    if local_min < end:
        raise RuntimeError(f"retention left the log from {local_min} on local disk, not only the tier: {report}")
    return root, tier, {"log_end": end, "segments_removed": removed, "local_min_offset": local_min}


def pick_targets(messages: int, count: int, rng: random.Random) -> list[Target]:
    """`count` distinct messages spread over the whole log (one draw in each of `count` equal slices)."""
    width = messages // count
    return [Target(slot * width + rng.randrange(width)) for slot in range(count)]


def reads(store) -> dict:
    return store.stats()["tier"]["reads"]


def empty_cache(reader) -> None:
    """Drop the reader's cached blocks, keep its open handles (what a store that read these objects before has)."""
    with reader._lock:
        reader._blocks.clear()
        reader.held_bytes = 0


def timed(call) -> tuple[float, object]:
    began = time.perf_counter()
    result = call()
    return time.perf_counter() - began, result


def cold(store, reader, call, *, close: bool = False) -> tuple[dict, object]:
    """Time `call` after emptying the cache (`close`: and letting the open handles go); its tier reads."""
    if close:
        reader.close()
    else:
        empty_cache(reader)
    before = reads(store)
    seconds, result = timed(call)
    after = reads(store)
    counts = {name: after[name] - before[name] for name in
              ("range_reads", "bytes_fetched", "objects_opened", "block_hits", "block_misses")}
    return {"s": seconds, **counts}, result


def check(row: str, target: Target, found) -> None:
    """Each call must return what local disk held (messages compare field by field, body included)."""
    wanted = {"get 1": target.expected_32[:1], "read_at": target.first, "query": [target.first]}.get(
        row, target.expected_32)
    if row.startswith("get"):
        found = found.messages
    if found != wanted:
        raise RuntimeError(f"{row} of message {target.number} returned other messages than local disk held")


def sample(store, reader, handles: dict, recorded: list, target: Target, rng: random.Random) -> dict:
    """Every row once for one target: the cold get of 32 first (its range is replayed by "GET same range"), the
    warm get right after it, then the rest in a shuffled order; local pages touched before."""
    get = store.get
    calls = {"get 1": lambda: get(target.topic, target.queue_id, target.queue_offset, max_count=1),
             "get 32": lambda: get(target.topic, target.queue_id, target.queue_offset),
             "read_at": lambda: store.read_at(target.first.commitlog_offset),
             "query": lambda: store.query(target.topic, target.key)}
    calls["get 32, object not open"] = calls["get 32"]
    found: dict[str, dict] = {}
    calls["get 32"]()  # untimed: the message's ConsumeQueue and index pages on local disk, touched (not the tier's
    calls["query"]()  # cost; the first get of a message would pay their page faults, the other rows not)
    recorded.clear()
    found["get 32"], result = cold(store, reader, calls["get 32"])
    check("get 32", target, result)
    ranges = list(recorded)
    before = reads(store)
    seconds, result = timed(calls["get 32"])
    check("get 32, warm", target, result)
    found["get 32, warm"] = {"s": seconds, "range_reads": reads(store)["range_reads"] - before["range_reads"]}
    key, position = segment_position(reader, target.first.commitlog_offset)
    handle, object_size = handles[key]
    block_start = position - position % TIER_CACHE_BLOCK_BYTES
    endpoint = {"GET same range": lambda: [handle.read_at(length, offset) for _, offset, length in ranges],
                "GET 256 KiB": lambda: handle.read_at(min(TIER_CACHE_BLOCK_BYTES, object_size - block_start),
                                                      block_start),
                "GET 1 byte": lambda: handle.read_at(1, position),
                "HEAD + GET 1 byte": lambda: head_and_get(reader.location, key, position)}
    rest = [row for row in ROWS if row not in found]
    rng.shuffle(rest)
    for row in rest:
        if row in endpoint:
            seconds, _ = timed(endpoint[row])
            found[row] = {"s": seconds}
        else:
            found[row], result = cold(store, reader, calls[row], close=row.endswith("not open"))
            check(row, target, result)
            if row.endswith("not open"):
                open_objects(store, reader)  # the next cold rows find their object open again
    found["GET same range"]["requests"] = len(ranges)
    found["GET same range"]["objects"] = len({key for key, _, _ in ranges})  # 2 when the messages span two
    return found


def open_objects(store, reader) -> None:
    """Have the reader open every object of the tier (a read of each one's first record; not timed)."""
    for segment in reader.manifest().segments:
        store.read_at(segment.base_offset)


def segment_position(reader, commitlog_offset: int) -> tuple[str, int]:
    """The tier object holding `commitlog_offset` and the position in it."""
    segment = reader.manifest().segment_at(commitlog_offset)
    return manifest_module.segment_key(segment.base_offset), commitlog_offset - segment.base_offset


def head_and_get(location, key: str, position: int) -> bytes:
    with location.filesystem.open_input_file(location.path(key)) as handle:
        return handle.read_at(1, position)


def run_endpoint(root: str, uri: str, segment_size_bytes: int, targets: list[Target], rng: random.Random,
                 handles_max: int | None = None) -> dict:
    """One round's samples from one endpoint: row -> [sample, ...] (a fresh read_only open of the store)."""
    config = StoreConfig(segment_size_bytes=segment_size_bytes, tier_uri=uri)
    with MessageStore.open(root, config, read_only=True) as store:
        reader = store._tier_reader
        if handles_max is not None:
            reader.handles_max = handles_max
        location = reader.location
        recorded: list[tuple[str, int, int]] = []
        read_range = location.read_range

        def recording(key, size, offset, length, handle=None):
            recorded.append((key, offset, length))
            return read_range(key, size, offset, length, handle=handle)

        location.read_range = recording
        manifest = reader.manifest()
        handles = {}
        for segment in manifest.segments:
            key = manifest_module.segment_key(segment.base_offset)
            handles[key] = (location.filesystem.open_input_file(location.path(key)), manifest.segment_size_bytes)
        open_objects(store, reader)
        try:
            samples = [sample(store, reader, handles, recorded, target, rng) for target in targets]
        finally:
            for handle, _ in handles.values():
                handle.close()
    return {row: [found[row] for found in samples] for row in ROWS}


def percentile(values: list[float], share: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[share - 1] if len(values) > 1 else values[0]


def summarize(rounds: list[dict]) -> dict:
    """Per row: latency percentiles over every round's samples (ms), each round's p50, and for the cold rows the
    tier reads a call made; per cold row, its p50 over the endpoint's (medians over rounds of each round's ratio)."""
    rows = {}
    for row in ROWS:
        samples = [found for round_ in rounds for found in round_[row]]
        seconds = [found["s"] * 1000 for found in samples]
        rows[row] = {"p50_ms": percentile(seconds, 50), "p90_ms": percentile(seconds, 90),
                     "p99_ms": percentile(seconds, 99), "samples": len(samples),
                     "round_p50_ms": [statistics.median(found["s"] * 1000 for found in round_[row])
                                      for round_ in rounds]}
        for count in ("range_reads", "objects_opened", "block_hits", "requests", "objects"):
            if count in samples[0]:
                values = [found[count] for found in samples]
                rows[row][count] = {"min": min(values), "max": max(values), "total": sum(values),
                                    "calls_with_1": values.count(1)}
    ratios = {}
    for row in COLD_ROWS:
        for reference in ("GET same range", "GET 256 KiB"):
            values = [mine / theirs for mine, theirs in zip(rows[row]["round_p50_ms"],
                                                            rows[reference]["round_p50_ms"])]
            ratios[f"{row} / {reference}"] = {"median": statistics.median(values), "min": min(values),
                                              "max": max(values)}
    return {"rows": rows, "ratios": ratios}


def columns(round_: dict) -> dict:
    """One round's samples as the JSON keeps them: per row, a list per figure (seconds to 0.1 us)."""
    return {row: {figure: [round(found[figure], 7) if figure == "s" else found[figure] for found in samples]
                  for figure in samples[0]} for row, samples in round_.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="the JSON (default bench/results/tier_get[_quick].json)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--handles-max", type=int, default=None,
                        help="input handles the reader keeps (default: TierLocation.open_inputs_max)")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out = args.out or os.path.join(HERE, "results", "tier_get_quick.json" if args.quick else "tier_get.json")
    rng = random.Random(SEED)
    work = tempfile.mkdtemp(prefix="tier-get-")
    server, s3_template = start_s3()
    try:
        targets = pick_targets(shape["messages"], rounds * shape["samples"], rng)
        root, file_uri, offloaded = build(work, shape["messages"], shape["segment_size_bytes"], targets)
        end = offloaded["log_end"]
        s3_uri = s3_template.format(prefix="tier")
        copy_tier(file_uri, s3_uri)
        endpoints = {"file://": file_uri, "S3 (moto)": s3_uri}
        load_before = os.getloadavg()[0]
        found: dict[str, list] = {name: [] for name in endpoints}
        for number in range(rounds):
            for name, uri in endpoints.items():
                found[name].append(run_endpoint(root, uri, shape["segment_size_bytes"], targets[number::rounds],
                                                rng, args.handles_max))
                print(f"round {number + 1} {name}:", json.dumps(
                    {row: round(statistics.median(s["s"] for s in samples) * 1000, 3)
                     for row, samples in found[name][-1].items()}), flush=True)
        load_after = os.getloadavg()[0]
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    result = {"command": " ".join(["python", "bench/tier_get.py"] + sys.argv[1:]), "shape": shape,
              "rounds": rounds, "log_end": end, "segments": -(-end // shape["segment_size_bytes"]),
              "block_bytes": TIER_CACHE_BLOCK_BYTES, "offload": offloaded, "handles_max": args.handles_max,
              "endpoints": {name: summarize(found[name]) for name in endpoints},
              "samples": {name: [columns(round_) for round_ in rounds_] for name, rounds_ in found.items()},
              "machine": platform.platform(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "load_average_1min": [load_before, load_after],
              "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(result, handle, separators=(",", ":"))
    text = render(result)
    with open(out[:-5] + ".md", "w") as handle:
        handle.write(text)
    print(text)
    return 0


def render(result: dict) -> str:
    """The table bench/report.py puts in bench/README.md, under a line saying how it was made."""
    from reports.tier import report_tier_get

    load = result["load_average_1min"]
    return (f"`{result['command']}`, {result['date_utc']}, Python {result['python']}, {result['cpus']} cores, load "
            f"{load[0]:.1f} -> {load[1]:.1f}.\n\n{report_tier_get(result)}\n")


if __name__ == "__main__":
    sys.exit(main())
