"""The tables of bench/README.md (and the targets table of README.md), generated from bench/results/*.json.

    .venv/bin/python bench/report.py            # print every table
    .venv/bin/python bench/report.py --write    # rewrite them in bench/README.md, between the report markers
    .venv/bin/python bench/report.py --check    # exit 1 if bench/README.md is not what --write would make

Each benchmark's block says when its result file was made: the date the benchmark recorded in the file, or,
for files that record none, when the file was last committed (git). tests/test_docs.py runs the check.
This file places the blocks and writes their header lines; what is under each header comes from the family's
module in bench/reports/ (its docstring lists them), through `BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
# bench/reports/ is imported from bench/: on sys.path when this file runs as a script; when it is loaded by its
# path (tests/test_docs.py), bench/ is put on the path for this import only, so no bench module shadows another's.
_BENCH_ADDED = str(HERE) not in sys.path
if _BENCH_ADDED:
    sys.path.insert(0, str(HERE))
from reports import dispatch, native, put, spark, targets, tier, timer  # noqa: E402

if _BENCH_ADDED:
    sys.path.remove(str(HERE))

GAPS = targets.GAPS  # where the time goes in each row of users.json not met (tests/test_docs.py reads both)
gap_sections = targets.gap_sections


# --- one block per benchmark -----------------------------------------------------------------------------------
def when(name: str, data: dict) -> str:
    """When the result file was made: as the benchmark recorded it, else when git last committed it."""
    recorded = data.get("date_utc") or data.get("when_utc") or data.get("date") or machine_of(data).get("date_utc")
    if recorded:
        return recorded if recorded.endswith("UTC") else f"{recorded} UTC"
    try:
        committed = subprocess.run(
            ["git", "log", "-1", "--no-merges", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M", "--",
             f"results/{name}.json"], cwd=HERE, capture_output=True, text=True, check=True,
            env={**os.environ, "TZ": "UTC"}).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        committed = ""
    return f"{committed} UTC (committed; the file records no date)" if committed else "date not recorded"


def machine_of(data: dict) -> dict:
    """The result file's machine record; some files give only the machine's name there."""
    machine = data.get("machine")
    return machine if isinstance(machine, dict) else {}


# Result files a benchmark writes under another name than its script's, and the command that writes them.
COMMANDS = {"flush_modes_sync": "bench/flush_modes.py --sync", "flush_modes_peers": "bench/flush_modes.py --peers"}


def command(name: str) -> str:
    return f".venv/bin/python {COMMANDS.get(name, f'bench/{name}.py')}"


def header(name: str, data: dict) -> str:
    machine = machine_of(data)
    python = data.get("python") or machine.get("python")
    cores = data.get("cores") or data.get("cpus") or machine.get("cores") or machine.get("cpus")
    load = data.get("load_average_1min") or data.get("load_average_1m")
    if load is None and "load_average_1min_before" in machine:
        load = [machine["load_average_1min_before"], machine["load_average_1min_after"]]
    parts = [f"`{command(name)}`", when(name, data)]
    if python:
        parts.append(f"Python {python}")
    if cores:
        parts.append(f"{cores} cores")
    if isinstance(load, list):
        parts.append("load " + " / ".join(f"{value:.1f}" for value in load) + " (before / after)")
    elif load is not None:
        parts.append(f"load {load:.1f}")
    return ", ".join(parts) + f"; `results/{name}.json`."


BENCHMARKS = {
    "put_get": put.report_put_get,
    "flush_modes": put.report_flush_modes,
    "put_stalls": put.report_put_stalls,
    "dispatch_lag": dispatch.report_dispatch_lag,
    "dispatch_process": dispatch.report_dispatch_process,
    "index": dispatch.report_index,
    "recovery": dispatch.report_recovery,
    "spark_read": spark.report_spark_read,
    "crc32": native.report_crc32,
    "disk_reservation": put.report_disk_reservation,
    "native": native.report_native,
    "native_scan": native.report_native_scan,
    "flush_modes_sync": put.report_flush_modes_sync,
    "flush_modes_peers": put.report_flush_modes_peers,
    "sync_share": put.report_sync_share,
    "core": targets.report_core,
    "users": targets.report_users,
    "aio_put": put.report_aio_put,
    "tier_upload": tier.report_tier_upload,
    "tier_scan": tier.report_tier_scan,
    "tier_get": tier.report_tier_get,
    "timer": timer.report_timer,
    "lease": timer.report_lease,
}
TOP_README = HERE.parent / "README.md"
TOP_README_BLOCKS = ("users",)  # also rendered in the repository's README.md
TOP_README_RENDERERS = {"users": targets.report_users_readme}  # README.md's version of a block, where it differs


def begin_marker(name: str) -> str:
    return f"<!-- report {name}: generated by bench/report.py from results/{name}.json; do not edit by hand -->"


def end_marker(name: str) -> str:
    return f"<!-- end of report {name} -->"


def block(name: str, top: bool = False) -> str:
    """The generated block of one benchmark (README.md's version with `top`), or a line saying its result file
    is missing."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return f"No result file yet: run `{command(name)}`."
    data = json.loads(path.read_text(encoding="utf-8"))
    render = TOP_README_RENDERERS.get(name, BENCHMARKS[name]) if top else BENCHMARKS[name]
    return header(name, data) + "\n\n" + render(data)


def generated_readme(text: str, names=None) -> str:
    """`text` with every block of `names` (all benchmarks when None: bench/README.md) regenerated; README.md
    passes its own names and gets their README versions."""
    for name in BENCHMARKS if names is None else names:
        begin, end = begin_marker(name), end_marker(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise SystemExit(f"bench/README.md lacks the markers of {name}: {begin!r} ... {end!r}")
        text = text[: start + len(begin)] + "\n" + block(name, top=names is not None) + "\n" + text[stop:]
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the tables in bench/README.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if bench/README.md's tables are out of date")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print("\n\n".join(f"## {name}\n\n{block(name)}" for name in BENCHMARKS))
        return 0
    stale = 0
    for path, names in ((README, None), (TOP_README, TOP_README_BLOCKS)):
        current = path.read_text(encoding="utf-8")
        wanted = generated_readme(current, names)
        if wanted == current:
            continue
        if args.check:
            print(f"{path.name} is out of date: run `make docs` (or bench/report.py --write)", file=sys.stderr)
            stale = 1
        else:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
