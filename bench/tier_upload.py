"""Does the tier uploader keep up with put_batch, and what does a tier cost the writer?

    .venv/bin/python bench/tier_upload.py            # full run: default 1 GiB segments (several minutes)
    .venv/bin/python bench/tier_upload.py --quick    # smoke run: 4 MiB segments (the row names say so)

Rows, taking turns for ROUNDS rounds (medians): put_batch of 1 KB user-shaped messages (bench/users_rows.py's
shape: a tag and a key each, 4 topics x 4 queues, batches of 1,000) into a fresh store with StoreConfig's
defaults (the uploader in a process of its own), (a) with no tier, (b) with a `file://` tier on the same disk, (c)
with a `file://` tier on tmpfs (/dev/shm: no disk shared with the writer), (d) the same with the uploader as a
thread of the writer's (`tier_upload_process=False`), with and without its cuts (uploader.UPLOAD_CUTS, this
process's settings; `--each-cut` adds a row for each cut off alone), (e) the tmpfs tier with bench/tier_sink.py
deleting each segment object once the manifest lists it (as if the bytes had left the machine for an object store
elsewhere), (f) with a tier on moto's S3 server on 127.0.0.1 (in a process of its own), (g) with no tier but
bench/tier_copier.py in a process of its own moving each sealed segment's bytes into tmpfs and back as the uploader
does (pread, CRC-32, write, read back; no manifest, queues or indexes), deleting each copy, or keeping them.
Per row: messages a second and GB a second of the put loop; the tier's lag at the end of the loop (how long until
the manifest lists every segment sealed by then; for (f), until the stand-in has moved them); the largest
`stats()["tier"]["lag_seconds"]` sampled during the loop; the writer process's CPU seconds per GB put (loop and
catch-up); the uploader's and verifier's thread CPU seconds per GB uploaded, whole and by phase
(`stats()["tier"]["upload_cost"]`; for (f), the stand-in process's CPU seconds per GB it moved). The baseline of
each endpoint is measured in the same run: PUT and GET of one 64 MiB object through pyarrow (the most any uploader
could move through it; the uploader sends each object once and reads it back once).

Targets (issue #31): tier lag <= 30 s at full write rate; put throughput with a tier >= 90% of the row without.
Writes bench/results/tier_upload.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from users_rows import BODY_POOL, bodies, message  # noqa: E402

from mqstore import MessageStore, StoreConfig  # noqa: E402
from mqstore.tier import uploader as uploader_module  # noqa: E402
from mqstore.tier.location import UPLOAD_PHASES, TierLocation  # noqa: E402

ROUNDS = 3
BATCH = 1000
FULL = dict(messages=3_000_000, segment_size_bytes=1 << 30)  # 3 GB of records: two sealed 1 GiB segments
QUICK = dict(messages=40_000, segment_size_bytes=4 << 20)
PROBE_BYTES = 64 << 20
LAG_SAMPLE_S = 0.25
CATCH_UP_TIMEOUT_S = 1800.0
SHM = "/dev/shm"  # tmpfs: a tier there shares no disk with the writer
SHM_ROOM = 2  # the tmpfs row runs when tmpfs has this many times the log's bytes free
ALL_CUTS = tuple(uploader_module.UPLOAD_CUTS)
THREAD = {"tier_upload_process": False}  # the uploader as a thread of the writer's (the default is a process)
# (row, endpoint, the uploader's cuts turned off, settings beside the defaults); the rows take turns in this order
# each round. The cuts are this process's module settings: they apply to the thread only.
ROWS = (("no tier", None, (), {}), ("file:// tier", "disk", (), {}), ("file:// tier on tmpfs", "shm", (), {}),
        ("file:// tier on tmpfs, uploader thread", "shm", (), THREAD),
        ("file:// tier on tmpfs, uploader thread, no cuts", "shm", ALL_CUTS, THREAD),
        ("file:// tier on tmpfs, listed segments deleted (they leave the machine)", "shm", (), {"sink": True}),
        ("S3 tier (moto, loopback)", "s3", (), {}),
        ("no tier, an uploader stand-in process to tmpfs", "copier", (), {}),
        ("no tier, an uploader stand-in process to tmpfs, copies kept", "copier", (), {"keep": True}))
COPIER = os.path.join(HERE, "tier_copier.py")
SINK = os.path.join(HERE, "tier_sink.py")


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def set_cuts(off) -> list:
    """Turn the uploader's cuts (uploader.UPLOAD_CUTS) named in `off` off and the others on, for the stores opened
    next; the old settings, to give restore_cuts."""
    old = []
    for cut, (module_name, setting, value) in uploader_module.UPLOAD_CUTS.items():
        module = importlib.import_module(module_name)
        old.append((module, setting, getattr(module, setting)))
        setattr(module, setting, type(value)() if cut in off else value)
    return old


def restore_cuts(old: list) -> None:
    for module, setting, value in old:
        setattr(module, setting, value)


def start_s3():
    """moto's S3 server in a process of its own on 127.0.0.1 (in this process its threads would share the
    interpreter lock with the writer being measured); (process, URI template with {prefix})."""
    import socket

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


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used so far, from /proc (0.0 where there is
    no /proc): the S3 server's CPU, measured apart from the reader's."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            raw = handle.read()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def run_row(work: str, tier: str | None, messages: int, segment_size_bytes: int, copier_dir: str | None = None,
            settings: dict | None = None) -> dict:
    root = tempfile.mkdtemp(prefix="store-", dir=work)
    copier = sinker = None
    pool = bodies(1000)
    settings = dict(settings or {})
    keep = settings.pop("keep", False)  # the stand-in's, not the store's: its copies stay until the row ends
    sink = settings.pop("sink", False)  # bench/tier_sink.py deletes each segment object the manifest lists
    config = StoreConfig(segment_size_bytes=segment_size_bytes, tier_uri=tier, **settings)
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
            if sink:
                sinker = subprocess.Popen([sys.executable, SINK, tier], stdout=subprocess.PIPE, text=True)
            if copier_dir is not None:
                copier = subprocess.Popen([sys.executable, COPIER, root, copier_dir] + ["--keep"] * keep,
                                          stdout=subprocess.PIPE,
                                          text=True)
            put_batch = store.put_batch
            cpu_began = process_cpu_seconds()
            began = time.perf_counter()
            for start in range(0, messages, BATCH):
                put_batch([message(i, pool[i & (BODY_POOL - 1)]) for i in range(start, start + BATCH)])
            seconds = time.perf_counter() - began
            loop_cpu = process_cpu_seconds() - cpu_began
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
            copied = None
            if copier is not None:  # it copies what is sealed, then exits: its lag, its CPU
                began, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                copier.send_signal(signal.SIGTERM)
                copied = json.loads(copier.communicate(timeout=CATCH_UP_TIMEOUT_S)[0].strip().splitlines()[-1])
                catch_up = time.perf_counter() - began
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                copied["cpu_s"] = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
            total_cpu = process_cpu_seconds() - cpu_began
    finally:
        done.set()
        for helper in (copier, sinker):
            if helper is not None and helper.poll() is None:
                helper.kill()
                helper.wait()
        shutil.rmtree(root, ignore_errors=True)
        if copier_dir is not None:
            shutil.rmtree(copier_dir, ignore_errors=True)
    put_gb = messages * 1000 / 1e9
    result = {"messages": messages, "seconds": seconds, "rate": messages / seconds, "gb_per_s": put_gb / seconds,
              "sealed_segments": sealed // segment_size_bytes, "lag_at_end_s": catch_up,
              "lag_max_sampled_s": max(lags, default=0.0), "failures": tier_stats["failures"] if tier_stats else 0,
              "bytes_uploaded": tier_stats["bytes_uploaded"] if tier_stats else 0,
              "process_cpu_s_per_gb_put": total_cpu / put_gb, "loop_cpu_s_per_gb_put": loop_cpu / put_gb}
    if tier_stats is not None:
        result.update(upload_cost_per_gb(tier_stats["upload_cost"], tier_stats["bytes_uploaded"]))
    if copied is not None:  # the stand-in's whole process, per GB it moved
        result["bytes_uploaded"] = copied["bytes"]
        result["uploader_cpu_s_per_gb"] = copied["cpu_s"] / max(copied["bytes"], 1) * 1e9
    return result


def upload_cost_per_gb(cost: dict, bytes_uploaded: int) -> dict:
    """The uploader's CPU seconds per GB uploaded: its two threads' and each phase's."""
    gb = max(bytes_uploaded, 1) / 1e9
    threads = cost["thread_cpu_seconds"]
    return {"uploader_cpu_s_per_gb": (threads["uploader"] + threads["verifier"]) / gb,
            "phase_cpu_s_per_gb": {phase: cost["cpu_seconds"][phase] / gb for phase in UPLOAD_PHASES},
            "upload_cost": cost}


def tier_uri(endpoint: str | None, work: str, shm_work: str | None, s3_template: str, number: int) -> str | None:
    if endpoint in (None, "copier"):
        return None
    if endpoint == "s3":
        return s3_template.format(prefix=f"round-{number}")
    return f"file://{work if endpoint == 'disk' else shm_work}/tier-{number}"


def shm_directory(shape: dict) -> str | None:
    """A temporary directory on tmpfs with room for the row's tier, or None (the row is skipped, and says so)."""
    if not os.path.isdir(SHM) or shutil.disk_usage(SHM).free < SHM_ROOM * shape["messages"] * 1100:
        print(f"no tmpfs at {SHM} with room for the tier: the tmpfs rows are skipped", flush=True)
        return None
    return tempfile.mkdtemp(prefix="tier-upload-", dir=SHM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", default=None, help="row names to run, separated by semicolons (default: every row)")
    parser.add_argument("--messages", type=int, default=None, help="messages a row (default: the shape's)")
    parser.add_argument("--each-cut", action="store_true",
                        help="add a tmpfs row for each of the uploader's cuts, with that one cut off")
    args = parser.parse_args()
    shape = dict(QUICK if args.quick else FULL)
    if args.messages:
        shape["messages"] = args.messages
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out = args.out or os.path.join(HERE, "results", "tier_upload_quick.json" if args.quick else "tier_upload.json")
    only = None if args.only is None else set(args.only.split(";"))
    rows = list(ROWS)
    if args.each_cut:
        rows[5:5] = [(f"file:// tier on tmpfs, uploader thread, without {cut}", "shm", (cut,), THREAD)
                     for cut in ALL_CUTS]
    rows = [row for row in rows if only is None or row[0] in only]
    work = tempfile.mkdtemp(prefix="tier-upload-")
    shm_work = shm_directory(shape) if any(endpoint in ("shm", "copier") for _, endpoint, _, _ in rows) else None
    rows = [row for row in rows if row[1] not in ("shm", "copier") or shm_work is not None]
    server, s3_template = start_s3()
    load_before = os.getloadavg()[0]
    try:
        endpoints = {"file": endpoint_rates(f"file://{work}/probe"),
                     "s3": endpoint_rates(s3_template.format(prefix="probe"))}
        if shm_work is not None:
            endpoints["tmpfs"] = endpoint_rates(f"file://{shm_work}/probe")
        samples: dict[str, list[dict]] = {name: [] for name, _, _, _ in rows}
        for number in range(rounds):
            for name, endpoint, off, settings in rows:
                tier = tier_uri(endpoint, work, shm_work, s3_template, number)
                old = set_cuts(off)
                copier_dir = f"{shm_work}/copier-{number}" if endpoint == "copier" else None
                try:
                    samples[name].append(run_row(work, tier, **shape, copier_dir=copier_dir, settings=settings))
                finally:
                    restore_cuts(old)
                print(name, json.dumps(samples[name][-1]), flush=True)
                if tier is not None:  # the next rows start from an empty endpoint
                    location = TierLocation.open(tier)
                    location.filesystem.delete_dir_contents(location.root, missing_dir_ok=True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
        if shm_work is not None:
            shutil.rmtree(shm_work, ignore_errors=True)
    result = {"command": " ".join(["python", "bench/tier_upload.py"] + sys.argv[1:]), "shape": shape,
              "rounds": rounds, "endpoints": endpoints, "rows": summarise(samples), "machine": platform.platform(),
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


def summarise(samples: dict[str, list[dict]]) -> list[dict]:
    """One row a name: medians of its runs (the largest sampled lag: the largest); its rate against the no-tier
    row's of the same round, median (and min, max) over the rounds: the machine's load drifts between rounds."""
    baseline = samples.get("no tier")
    rows = []
    for name, runs in samples.items():
        ratios = [run["rate"] / base["rate"] for run, base in zip(runs, baseline)] if baseline else []
        row = {"row": name, "rate": statistics.median(r["rate"] for r in runs),
               "gb_per_s": statistics.median(r["gb_per_s"] for r in runs),
               "vs_no_tier": statistics.median(ratios) if ratios else None,
               "vs_no_tier_range": [min(ratios), max(ratios)] if ratios else None,
               "lag_at_end_s": statistics.median(r["lag_at_end_s"] for r in runs),
               "lag_max_sampled_s": max(r["lag_max_sampled_s"] for r in runs),
               "process_cpu_s_per_gb_put": statistics.median(r["process_cpu_s_per_gb_put"] for r in runs),
               "sealed_segments": runs[0]["sealed_segments"], "failures": sum(r["failures"] for r in runs),
               "runs": runs}
        if "uploader_cpu_s_per_gb" in runs[0]:
            row["uploader_cpu_s_per_gb"] = statistics.median(r["uploader_cpu_s_per_gb"] for r in runs)
        if "phase_cpu_s_per_gb" in runs[0]:
            row["phase_cpu_s_per_gb"] = {phase: statistics.median(r["phase_cpu_s_per_gb"][phase] for r in runs)
                                         for phase in UPLOAD_PHASES}
        rows.append(row)
    return rows


def render(result: dict) -> str:
    shape = result["shape"]
    lines = [f"`{result['command']}`, {result['when']}, {result['rounds']} round(s), load {result['load_before']:.1f}"
             f" -> {result['load_after']:.1f}; {shape['messages']:,} messages of 1 KB by put_batch, segments of "
             f"{shape['segment_size_bytes'] >> 20} MiB",
             "", "| row | msgs/s | GB/s | vs no tier, a round's (min-max) | tier lag at end (s) | largest lag seen (s) "
             "| writer CPU s/GB put | uploader CPU s/GB uploaded | read / crc / put / verify read / verify crc "
             "| failures |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in result["rows"]:
        ratio = (f"{row['vs_no_tier']:.2f}x ({row['vs_no_tier_range'][0]:.2f}-{row['vs_no_tier_range'][1]:.2f})"
                 if row.get("vs_no_tier") else "-")
        phases = row.get("phase_cpu_s_per_gb")
        split = " / ".join(f"{phases[phase]:.2f}" for phase in UPLOAD_PHASES) if phases else "-"
        uploader = f"{row['uploader_cpu_s_per_gb']:.2f}" if "uploader_cpu_s_per_gb" in row else "-"
        lines.append(f"| {row['row']} | {row['rate']:,.0f} | {row['gb_per_s']:.2f} | {ratio} | "
                     f"{row['lag_at_end_s']:.1f} | {row['lag_max_sampled_s']:.1f} | "
                     f"{row['process_cpu_s_per_gb_put']:.2f} | {uploader} | {split} | {row['failures']} |")
    endpoints = result["endpoints"]
    lines += ["", "Endpoints, one 64 MiB object through pyarrow: " + "; ".join(
        f"{name} PUT {rates['put_mb_per_s']:,.0f} MB/s, GET {rates['get_mb_per_s']:,.0f} MB/s"
        for name, rates in endpoints.items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
