"""Does the tier uploader keep up with put_batch, and what does a tier cost the writer?

    .venv/bin/python bench/tier_upload.py            # full run: default 1 GiB segments (several minutes)
    .venv/bin/python bench/tier_upload.py --quick    # smoke run: 4 MiB segments (the row names say so)

Rows, taking turns for ROUNDS rounds (medians): put_batch of 1 KB user-shaped messages (bench/users_rows.py's
shape: a tag and a key each, 4 topics x 4 queues, batches of 1,000) into a fresh store with StoreConfig's
defaults, (a) with no tier, (b) with a `file://` tier on the same disk, (c) with a tier on moto's S3 server on
127.0.0.1 (in a process of its own). Per row: messages a second and GB a second of the put loop; the tier's lag
at the end of the loop (how long until the manifest lists every segment sealed by then); the largest
`stats()["tier"]["lag_seconds"]` sampled during the loop. The baseline of each endpoint is measured in the same
run: PUT and GET of one 64 MiB object through pyarrow (the most any uploader could move through it; the uploader
sends each object once and reads it back once).

Targets (issue #31): tier lag <= 30 s at full write rate; put throughput with a tier >= 90% of the row without.
Writes bench/results/tier_upload.json and .md (or *_quick.*).
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from users_rows import BODY_POOL, bodies, message  # noqa: E402

from mqstore import MessageStore, StoreConfig  # noqa: E402
from mqstore.tier.location import TierLocation  # noqa: E402

ROUNDS = 3
BATCH = 1000
FULL = dict(messages=3_000_000, segment_size_bytes=1 << 30)  # 3 GB of records: two sealed 1 GiB segments
QUICK = dict(messages=40_000, segment_size_bytes=4 << 20)
PROBE_BYTES = 64 << 20
LAG_SAMPLE_S = 0.25
CATCH_UP_TIMEOUT_S = 1800.0


def start_s3():
    """moto's S3 server in a process of its own on 127.0.0.1 (in this process its threads would share the
    interpreter lock with the writer being measured); (process, URI template with {prefix})."""
    import socket
    import subprocess

    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import pyarrow.fs as pafs

    filesystem = pafs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1", scheme="http",
                                   endpoint_override=f"127.0.0.1:{port}", allow_bucket_creation=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            filesystem.create_dir("bench")
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.1)
    return server, f"s3://bench:bench@bench/{{prefix}}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"


def endpoint_rates(uri: str) -> dict:
    """PUT and GET of one PROBE_BYTES object through pyarrow: the endpoint's own rate, MB/s."""
    location = TierLocation.open(uri)
    data = os.urandom(PROBE_BYTES)
    began = time.perf_counter()
    location.put_bytes("probe/object", data)
    put_s = time.perf_counter() - began
    began = time.perf_counter()
    location.checksum("probe/object", PROBE_BYTES)
    get_s = time.perf_counter() - began
    location.delete("probe/object")
    return {"put_mb_per_s": PROBE_BYTES / put_s / 1e6, "get_mb_per_s": PROBE_BYTES / get_s / 1e6}


def run_row(work: str, tier: str | None, messages: int, segment_size_bytes: int) -> dict:
    root = tempfile.mkdtemp(prefix="store-", dir=work)
    pool = bodies(1000)
    config = StoreConfig(segment_size_bytes=segment_size_bytes, tier_uri=tier)
    lags: list[float] = []
    done = threading.Event()
    try:
        with MessageStore.open(root, config) as store:
            def sample() -> None:
                while not done.wait(LAG_SAMPLE_S):
                    lags.append(store.stats()["tier"]["lag_seconds"])

            sampler = threading.Thread(target=sample, daemon=True)
            if tier is not None:
                sampler.start()
            put_batch = store.put_batch
            began = time.perf_counter()
            for start in range(0, messages, BATCH):
                put_batch([message(i, pool[i & (BODY_POOL - 1)]) for i in range(start, start + BATCH)])
            seconds = time.perf_counter() - began
            end = store.stats()["commitlog"]["max_offset"]
            sealed = end - end % segment_size_bytes
            catch_up = 0.0
            if tier is not None:
                done.set()
                began = time.perf_counter()
                while (store.stats()["tier"]["uploaded_end"] or 0) < sealed:
                    if time.perf_counter() - began > CATCH_UP_TIMEOUT_S:
                        raise RuntimeError(f"the tier did not catch up: {store.stats()['tier']}")
                    time.sleep(0.05)
                catch_up = time.perf_counter() - began
                tier_stats = store.stats()["tier"]
            else:
                tier_stats = None
    finally:
        done.set()
        shutil.rmtree(root, ignore_errors=True)
    return {"messages": messages, "seconds": seconds, "rate": messages / seconds,
            "gb_per_s": messages * 1000 / seconds / 1e9, "sealed_segments": sealed // segment_size_bytes,
            "lag_at_end_s": catch_up, "lag_max_sampled_s": max(lags, default=0.0),
            "failures": tier_stats["failures"] if tier_stats else 0,
            "bytes_uploaded": tier_stats["bytes_uploaded"] if tier_stats else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out = args.out or os.path.join(HERE, "results", "tier_upload_quick.json" if args.quick else "tier_upload.json")
    work = tempfile.mkdtemp(prefix="tier-upload-")
    server, s3_template = start_s3()
    load_before = os.getloadavg()[0]
    try:
        endpoints = {"file": endpoint_rates(f"file://{work}/probe"),
                     "s3": endpoint_rates(s3_template.format(prefix="probe"))}
        samples: dict[str, list[dict]] = {"no tier": [], "file:// tier": [], "S3 tier (moto, loopback)": []}
        for number in range(rounds):
            for name in samples:
                tier = (None if name == "no tier" else f"file://{work}/tier-{number}" if name.startswith("file")
                        else s3_template.format(prefix=f"round-{number}"))
                samples[name].append(run_row(work, tier, **shape))
                print(name, json.dumps(samples[name][-1]), flush=True)
                if tier is not None:  # the next rows start from an empty endpoint
                    location = TierLocation.open(tier)
                    location.filesystem.delete_dir_contents(location.root, missing_dir_ok=True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    baseline = statistics.median(s["rate"] for s in samples["no tier"])
    rows = []
    for name, runs in samples.items():
        rows.append({"row": name, "rate": statistics.median(r["rate"] for r in runs),
                     "gb_per_s": statistics.median(r["gb_per_s"] for r in runs),
                     "vs_no_tier": statistics.median(r["rate"] for r in runs) / baseline,
                     "lag_at_end_s": statistics.median(r["lag_at_end_s"] for r in runs),
                     "lag_max_sampled_s": max(r["lag_max_sampled_s"] for r in runs),
                     "sealed_segments": runs[0]["sealed_segments"], "failures": sum(r["failures"] for r in runs),
                     "runs": runs})
    result = {"command": " ".join(["python", "bench/tier_upload.py"] + sys.argv[1:]), "shape": shape,
              "rounds": rounds, "endpoints": endpoints, "rows": rows, "machine": platform.platform(),
              "cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()[0],
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version()}
    result["load_average_1min"] = [result["load_before"], result["load_after"]]
    result["date_utc"] = result["when"]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1)
    with open(out[:-5] + ".md", "w") as handle:
        handle.write(render(result))
    print(render(result))
    return 0


def render(result: dict) -> str:
    shape = result["shape"]
    lines = [f"`{result['command']}`, {result['when']}, {result['rounds']} round(s), load {result['load_before']:.1f}"
             f" -> {result['load_after']:.1f}; {shape['messages']:,} messages of 1 KB by put_batch, segments of "
             f"{shape['segment_size_bytes'] >> 20} MiB",
             "", "| row | msgs/s | GB/s | vs no tier | tier lag at end (s) | largest lag seen (s) | failures |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['row']} | {row['rate']:,.0f} | {row['gb_per_s']:.2f} | {row['vs_no_tier']:.2f}x | "
                     f"{row['lag_at_end_s']:.1f} | {row['lag_max_sampled_s']:.1f} | {row['failures']} |")
    endpoints = result["endpoints"]
    lines += ["", "Endpoints, one 64 MiB object through pyarrow: " + "; ".join(
        f"{name} PUT {rates['put_mb_per_s']:,.0f} MB/s, GET {rates['get_mb_per_s']:,.0f} MB/s"
        for name, rates in endpoints.items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
