"""The tables of bench/README.md, generated from bench/results/*.json.

    .venv/bin/python bench/report.py            # print every table
    .venv/bin/python bench/report.py --write    # rewrite them in bench/README.md, between the report markers
    .venv/bin/python bench/report.py --check    # exit 1 if bench/README.md is not what --write would make

Each benchmark's block says when its result file was made: the date the benchmark recorded in the file, or,
for files that record none, when the file was last committed (git). tests/test_docs.py runs the check.
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


# --- formatting ------------------------------------------------------------------------------------------------
def rate(value) -> str:
    """A count per second, to three significant digits: 1.23M, 456k, 7,509."""
    if value is None:
        return ""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e5:
        return f"{value / 1e3:.0f}k"
    return f"{value:,.0f}"


def number(digits: int):
    return lambda value: "" if value is None else f"{value:,.{digits}f}"


def share(value) -> str:
    return "" if value is None else f"{value * 100:.0f}%"


def size(value) -> str:
    if value is None:
        return ""
    if value == 0:
        return "0"
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= unit:
            return f"{value / unit:g} {name}" if value % unit == 0 else f"{value / unit:.1f} {name}"
    return f"{value} B"


def body(value) -> str:
    return "" if value is None else {100: "100 B", 1000: "1 KB", 1024: "1 KB", 16384: "16 KB"}.get(value, f"{value} B")


def text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|")


def table(rows: list[dict], columns: list[tuple[str, object, object]]) -> str:
    """A Markdown table: one column per (header, key or function of the row, formatter)."""
    lines = ["| " + " | ".join(header for header, _, _ in columns) + " |",
             "|" + "|".join("---" if formatter is text else "---:" for _, _, formatter in columns) + "|"]
    for row in rows:
        cells = [formatter(key(row) if callable(key) else row.get(key)) for _, key, formatter in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- one block per benchmark -----------------------------------------------------------------------------------
def when(name: str, data: dict) -> str:
    """When the result file was made: as the benchmark recorded it, else when git last committed it."""
    recorded = data.get("date_utc") or data.get("when_utc") or (data.get("machine") or {}).get("date_utc")
    if recorded:
        return f"{recorded} UTC"
    try:
        committed = subprocess.run(
            ["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M", "--",
             f"results/{name}.json"], cwd=HERE, capture_output=True, text=True, check=True,
            env={**os.environ, "TZ": "UTC"}).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        committed = ""
    return f"{committed} UTC (committed; the file records no date)" if committed else "date not recorded"


def header(name: str, data: dict) -> str:
    machine = data.get("machine") or {}
    python = data.get("python") or machine.get("python")
    cores = data.get("cores") or machine.get("cores") or machine.get("cpus")
    load = data.get("load_average_1min") or data.get("load_average_1m")
    if load is None and "load_average_1min_before" in machine:
        load = [machine["load_average_1min_before"], machine["load_average_1min_after"]]
    parts = [f"`.venv/bin/python bench/{name}.py`", when(name, data)]
    if python:
        parts.append(f"Python {python}")
    if cores:
        parts.append(f"{cores} cores")
    if isinstance(load, list):
        parts.append("load " + " / ".join(f"{value:.1f}" for value in load) + " (before / after)")
    elif load is not None:
        parts.append(f"load {load:.1f}")
    return ", ".join(parts) + f"; `results/{name}.json`."


def report_put_get(data: dict) -> str:
    return table(data["rows"], [
        ("case", "case", text), ("msgs/s (median)", "msgs_per_s", rate), ("best", "best_msgs_per_s", rate),
        ("MB/s", "mb_per_s", number(0)), ("msgs/s counting dispatch", "msgs_per_s_dispatched", rate)])


def report_flush_modes(data: dict) -> str:
    sections: dict[str, list[dict]] = {}
    for row in data["rows"]:
        sections.setdefault(row["section"], []).append(row)
    latency = [("p50 us", "p50_us", number(0)), ("p99 us", "p99_us", number(0)),
               ("p99.9 us", "p999_us", number(0)), ("max ms", lambda row: row.get("max_us") and row["max_us"] / 1000,
                                                     number(1))]
    parts = ["Targets (the issue's):", table(data["targets"], [
        ("target", "target", text), ("met", "met", text), ("measured", "detail", text)])]
    parts += ["Puts by flush mode, body size and producer threads (each cell a 2 s run):", table(
        sections.get("matrix", []), [
            ("mode", "mode", text), ("body", "body_bytes", body), ("producers", "producers", number(0)),
            ("msgs/s", "msgs_per_s", rate),
            ("MB/s", "mb_per_s", number(1))] + latency)]
    parts += ["Segment rolls (one producer, 64 MiB segments):", table(sections.get("rolling", []), [
        ("case", "name", text), ("msgs/s", "msgs_per_s", rate), ("p99 us", "p99_us", number(0)),
        ("longest put ms", lambda row: row["max_us"] / 1000, number(1)), ("rolls", "roll_count", number(0)),
        ("longest rolling put ms", lambda row: row.get("roll_max_us", 0) / 1000, number(2))])]
    parts += ["Peers at equal durability (1 KB bodies, one producer):", table(sections.get("peers", []), [
        ("engine", "engine", text), ("durability", "durability", text), ("messages per call", "batch", number(0)),
        ("msgs/s", "msgs_per_s", rate), ("p50 us", "p50_us", number(0)), ("p99 us", "p99_us", number(0))])]
    parts += ["The machine's limits, measured in the same run:", table(sections.get("limits", []), [
        ("limit", "name", text), ("ops/s", "ops_per_s", rate), ("MB/s", "mb_per_s", number(0)),
        ("p50 us", "p50_us", number(0)), ("p99 us", "p99_us", number(0)),
        ("note", lambda row: "; ".join(filter(None, [
            row.get("flush_ms") and f"flush {row['flush_ms']:.0f} ms",
            row.get("other_thread_stall_ms") and f"another thread stopped {row['other_thread_stall_ms']:.0f} ms",
            row.get("detail")])), text)])]
    parts += ["Copying into a mapping against a write buffer (RocketMQ's TransientStorePool):", table(
        sections.get("write_buffer", []), [("case", "name", text), ("GB/s", "gb_per_s", number(1)),
                                           ("how", "detail", text)])]
    return "\n\n".join(parts)


def report_put_stalls(data: dict) -> str:
    return table(data["rows"], [
        ("case", "case", text), ("ops/s", "ops_per_s", rate), ("p99 us", "p99_us", number(0)),
        ("p99.9 us", "p999_us", number(0)), ("max ms", "max_ms", number(1)), ("> 1 ms", "over_1ms", number(0)),
        ("> 5 ms", "over_5ms", number(0))])


def report_dispatch_lag(data: dict) -> str:
    return table(data["rows"], [
        ("round", "round", number(0)),
        ("max_dispatch_lag_bytes", "max_dispatch_lag_bytes", lambda value: size(value) if value else "0 (unbounded)"),
        ("puts/s", "puts_per_s", rate), ("dispatched when the loop ended", "dispatched_share", share),
        ("largest lag", "lag_max_bytes", size), ("catch-up s", "catch_up_s", number(2)),
        ("puts/s counting the catch-up", "puts_per_s_with_catch_up", rate), ("> 5 ms", "over_5ms", number(0)),
        ("max ms", "max_ms", number(1))])


def report_dispatch_process(data: dict) -> str:
    raw = data.get("raw_loop") or {}
    medians = ", ".join(f"{body(int(size_))}: {rate(sorted(values)[len(values) // 2])}/s"
                        for size_, values in raw.items())
    rows = table(data["rows"], [
        ("flush", "flush", text), ("body", "body_bytes", body), ("dispatch", "mode", text),
        ("puts/s", "puts_per_s", rate), ("counting the catch-up", "puts_per_s_with_catch_up", rate),
        ("catch-up s", "catch_up_s", number(2)), ("p99 us", "p99_us", number(0)), ("max ms", "max_ms", number(1)),
        ("> 5 ms", "over_5ms", number(0)), ("share of the raw loop", "share_of_raw_loop", share)])
    rounds = data.get("rounds")
    return (f"Medians of {rounds} alternating rounds. " if rounds else "") + \
        f"Raw pwrite+fdatasync loop (median): {medians}.\n\n{rows}"


def report_index(data: dict) -> str:
    return table(data["rows"], [
        ("case", "case", text), ("count", "count", number(0)), ("keys/s", "keys_per_s", rate),
        ("msgs/s", "msgs_per_s", rate), ("msgs/s counting dispatch", "msgs_per_s_dispatched", rate),
        ("p50 us", "p50_us", number(1)), ("p99 us", "p99_us", number(1))])


def report_recovery(data: dict) -> str:
    return table(data["rows"], [
        ("case", "case", text), ("open s", "open_s", number(2)), ("recovery s", "recover_s", number(2)),
        ("GB/s scanned", "scan_gb_per_s", number(2)), ("messages re-dispatched", "messages_redispatched", number(0))])


def report_spark_read(data: dict) -> str:
    summary = data.get("summary") or {}
    settings = data.get("settings") or {}
    intro = (f"{settings.get('rows_100b', 0):,} records of 100 B and {settings.get('rows_1kb', 0):,} of 1 KB, "
             f"master {settings.get('master')}; every query written to Spark's noop sink. One topic of "
             f"{settings.get('topics')} read with pushdown takes {summary.get('topic_scan_time_ratio')} of a full "
             f"scan's time.")
    return intro + "\n\n" + table(data["results"], [
        ("case", "name", text), ("rows", "rows", number(0)), ("rows/s", "rows_per_s", rate)])


BENCHMARKS = {
    "put_get": report_put_get,
    "flush_modes": report_flush_modes,
    "put_stalls": report_put_stalls,
    "dispatch_lag": report_dispatch_lag,
    "dispatch_process": report_dispatch_process,
    "index": report_index,
    "recovery": report_recovery,
    "spark_read": report_spark_read,
}


def begin_marker(name: str) -> str:
    return f"<!-- report {name}: generated by bench/report.py from results/{name}.json; do not edit by hand -->"


def end_marker(name: str) -> str:
    return f"<!-- end of report {name} -->"


def block(name: str) -> str:
    """The generated block of one benchmark, or a line saying its result file is missing."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return f"No result file yet: run `.venv/bin/python bench/{name}.py`."
    data = json.loads(path.read_text(encoding="utf-8"))
    return header(name, data) + "\n\n" + BENCHMARKS[name](data)


def generated_readme(text: str) -> str:
    for name in BENCHMARKS:
        begin, end = begin_marker(name), end_marker(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise SystemExit(f"bench/README.md lacks the markers of {name}: {begin!r} ... {end!r}")
        text = text[: start + len(begin)] + "\n" + block(name) + "\n" + text[stop:]
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
    current = README.read_text(encoding="utf-8")
    wanted = generated_readme(current)
    if wanted == current:
        return 0
    if args.check:
        print("bench/README.md is out of date: run `make docs` (or bench/report.py --write)", file=sys.stderr)
        return 1
    README.write_text(wanted, encoding="utf-8")
    print("wrote bench/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
