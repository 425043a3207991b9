"""The tables of bench/README.md (and the targets table of README.md), generated from bench/results/*.json.

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
import statistics
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


def ratio(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def figure(value) -> str:
    """A measurement whose unit the row names: 1.23M, 456k, 7,509, 0.085."""
    if value is None:
        return ""
    if value >= 1e5:
        return rate(value)
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def preformatted(value) -> str:
    """A cell already formatted by its column's function (right-aligned, unlike text)."""
    return value or ""


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
        ("call", lambda row: row.get("call", "put"), text),
        ("flush", "flush", text), ("body", "body_bytes", body), ("dispatch", "mode", text),
        ("msgs/s", "puts_per_s", rate), ("counting the catch-up", "puts_per_s_with_catch_up", rate),
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
    intro = (f"{settings.get('rows', 0):,} messages of {settings.get('body_bytes')} B written by MessageStore with "
             f"the default StoreConfig (a tag and a key each, UNIQ_KEY, put_batch of "
             f"{settings.get('put_batch_messages')}), {settings.get('topics')} topics of "
             f"{settings.get('queues_per_topic')} queues, against a Parquet file of the same rows; master "
             f"{settings.get('master')}, {settings.get('rounds')} interleaved rounds, medians (min-max). \"commitlog\" "
             f"is the JVM reader, \"commitlog-python\" the Python source.")
    for kind, key in (("full scan", "full_scan"), ("group-by topic", "group_by_topic"),
                      ("topic+queue filter", "topic_queue_filter")):
        if f"{key}_commitlog_vs_parquet" in summary:
            low, high = summary[f"{key}_commitlog_vs_parquet_min_max"]
            intro += (f" {kind.capitalize()}: {summary[f'{key}_commitlog_vs_parquet']:.2f}x Parquet ({low:.2f}-"
                      f"{high:.2f}; target >= {summary[f'{key}_target_vs_parquet']:.1f}x, "
                      f"{'met' if summary[f'{key}_meets_target'] else 'not met'}; the Python source "
                      f"{summary[f'{key}_python_vs_parquet']:.2f}x).")
    load = (data.get("machine") or {}).get("load_average_1m_before_after")
    if load:
        intro += f" Load average (1 min) {load[0]} before, {load[1]} after."
    return intro + "\n\n" + table(data["results"], [
        ("query", "name", text), ("rows", "rows", number(0)), ("median s", "seconds_median", number(3)),
        ("min-max s", lambda r: f"{r['seconds_min']:.3f}-{r['seconds_max']:.3f}", text),
        ("rows/s", "rows_per_s", rate), ("CPU s JVM", "cpu_jvm_s", number(2)),
        ("CPU s Python workers", "cpu_python_workers_s", number(2))])


def report_crc32(data: dict) -> str:
    """ns per call of each implementation and of each mq_crc32 path this CPU ran, and GB/s (bytes per ns)."""
    def gbps(key):
        return lambda row: row[key] and row["bytes"] / row[key]

    functions = data.get("functions") or []
    paths = [name for name in functions if name.startswith("mq_") and name != "mq_zlib"]
    chosen = f"mq_{data.get('chosen')}"
    intro = ("One CRC-32 call in C per input size, each call waiting for the previous one's value: zlib (what the "
             "build links), ISA-L (the `isal` package's copy" + ("" if "isal" in functions else
                                                                 "; not loaded in this run")
             + ") and the folding paths of mq_crc32 (commitlog/csrc/crc32.c, the compiled core's) this CPU ran; "
             f"mq_crc32 takes `{data.get('chosen')}` here. 222 and 1,120 bytes are what the record CRC covers of a "
             "100 B and a 1 KB message.")
    columns = [("bytes", "bytes", number(0)), ("zlib ns", "zlib_ns", number(1))]
    columns += [("ISA-L ns", "isal_ns", number(1))] if "isal" in functions else []
    columns += [(f"{name[3:]} ns", f"{name}_ns", number(1)) for name in paths]
    columns += [("zlib GB/s", gbps("zlib_ns"), number(2))]
    columns += [("ISA-L GB/s", gbps("isal_ns"), number(2))] if "isal" in functions else []
    if chosen in functions:
        columns += [(f"{chosen[3:]} GB/s", gbps(f"{chosen}_ns"), number(2)),
                    (f"{chosen[3:]} vs zlib", lambda row: row[f"{chosen}_ns"] and row["zlib_ns"] / row[f"{chosen}_ns"],
                     ratio)]
    return intro + "\n\n" + table(data["rows"], columns)


def report_disk_reservation(data: dict) -> str:
    def unit(row):
        case = row["case"]
        return case[case.rfind("(") + 1:-1] if case.endswith(")") else "msgs/s"

    intro = (f"ASYNC puts, one producer, {size(data.get('segment_size_bytes'))} segments, "
             f"{size(data.get('log_bytes_per_run'))} of log a run; median of {data.get('rounds')} interleaved "
             "rounds, with the slowest and fastest.")
    return intro + "\n\n" + table(data["rows"], [
        ("case", "case", text), ("unit", unit, text), ("median", "median", figure), ("min", "min", figure),
        ("max", "max", figure), ("disk used after the run", "disk_used_bytes", size)])


def report_native(data: dict) -> str:
    def part(codec, key):
        return lambda row: (row.get(codec) or {}).get(key)

    intro = (f"{data.get('messages_per_row', 0):,} messages a row; each codec in a process of its own, RocketMQ "
             "4.4.0's store (`rmq put`) in the same run.")
    return intro + "\n\n" + table(data["rows"], [
        ("case", "case", text), ("compiled msgs/s", part("native", "msgs_per_s"), rate),
        ("MB/s", part("native", "mb_per_s"), number(0)), ("pure Python msgs/s", part("python", "msgs_per_s"), rate),
        ("MB/s", part("python", "mb_per_s"), number(0)), ("compiled vs Python", "native_vs_python", ratio),
        ("RocketMQ msgs/s", part("rocketmq", "msgs_per_s"), rate),
        ("compiled vs RocketMQ", "native_vs_rocketmq", ratio)])


NATIVE_SCAN_MEASURES = (
    ("dispatch to ConsumeQueues (msgs/s)", "dispatch_cq_msgs_per_s", rate),
    ("dispatch to ConsumeQueues and index (msgs/s)", "dispatch_cq_index_msgs_per_s", rate),
    ("recovery walk, CRC on (GB/s of log)", "walk_crc_gb_per_s", number(2)),
    ("store.scan() to a Table, every column (rows/s)", "scan_rows_per_s", rate),
    ("store.scan(), one topic, two columns (rows/s)", "scan_topic_two_columns_rows_per_s", rate),
)


def report_native_scan(data: dict) -> str:
    by_codec = {row["codec"]: row for row in data["rows"]}
    python, native = by_codec.get("python", {}), by_codec.get("native", {})
    targets = data.get("targets") or {}
    reference = data.get("reference") or {}
    rocketmq = (reference.get("rocketmq_load") or {}).get("gb_per_s")
    crc = reference.get("zlib_crc32_gb_per_s")
    rows = [{"measure": label, "python": python.get(key), "native": native.get(key), "format": formatter,
             "target": targets.get(key)} for label, key, formatter in NATIVE_SCAN_MEASURES]
    intro = (f"{data.get('messages', 0):,} messages of {body(data.get('body_bytes'))} "
             f"({size(data.get('log_bytes'))} of log), best of the run's repeats. References in the same run: "
             f"zlib.crc32 over the log in 1 MiB chunks {number(2)(crc)} GB/s"
             + (f"; RocketMQ 4.4.0's crash recovery (`rmq load`) {rocketmq:.2f} GB/s" if rocketmq else "")
             + ".")
    return intro + "\n\n" + table(rows, [
        ("measure", "measure", text), ("pure Python", lambda row: row["format"](row["python"]), preformatted),
        ("compiled", lambda row: row["format"](row["native"]), preformatted),
        ("compiled vs Python", lambda row: row["python"] and row["native"] and row["native"] / row["python"], ratio),
        ("target", lambda row: row["format"](row["target"]), preformatted)])


def report_flush_modes_sync(data: dict) -> str:
    parts = ["Targets (issue 21's; measured, not asserted):", table(data["targets"], [
        ("target", "target", text), ("met", "met", text), ("measured", "detail", text)])]
    parts += ["Every row of the run, taking turns (the raw loop and the bare group commit are the machine's "
              "limits; RocketMQ's rows time its own putMessage):", table(data["rows"], [
                  ("row", "name", text), ("msgs/s", lambda row: row.get("msgs_per_s", row.get("ops_per_s")), rate),
                  ("MB/s", "mb_per_s", number(2)), ("p50 us", "p50_us", number(0)), ("p99 us", "p99_us", number(0)),
                  ("max ms", lambda row: row.get("max_us") and row["max_us"] / 1000, number(1)),
                  ("flushes", "commitlog_flushes", number(0))])]
    return "\n\n".join(parts)


def report_sync_share(data: dict) -> str:
    def error(row):  # the raw loop is the reference: no error of its own
        value = row["ratio_standard_error"]
        return "" if value is None or row["case"] == "raw" else f"± {value:.3f}"

    intro = (f"One SYNC producer of {body(data.get('body_bytes'))} bodies ({size(data.get('record_bytes'))} records), "
             f"{data.get('rounds')} rotated rounds of {data.get('puts_per_run', 0):,} puts a run, each run a fresh "
             "process; the ratio is to the raw loop of the same round (mean, standard error).")
    return intro + "\n\n" + table(data["rows"], [
        ("case", "case", text), ("msgs/s (mean)", "mean_per_s", rate), ("ratio to the raw loop", "ratio_to_raw",
                                                                       number(3)),
        ("error", error, text)])


def report_flush_modes_peers(data: dict) -> str:
    against = data.get("mqstore_vs") or {}
    rows = [{**row, "versus": against.get(row["name"])} for row in data["rows"]]
    return ("SYNC batches of 1000 x 1 KB, each engine with an fdatasync (or its sync) per batch, taking turns with "
            "the raw pwrite+fdatasync loop of the same bytes:\n\n" + table(rows, [
                ("row", "name", text),
                ("msgs/s", lambda row: row.get("msgs_per_s") or row.get("ops_per_s", 0) * 1000, rate),
                ("MB/s", "mb_per_s", number(0)), ("p99 ms", lambda row: row.get("p99_us") and row["p99_us"] / 1000,
                                                 number(1)),
                ("mqstore vs it", "versus", ratio)]))


def report_core(data: dict) -> str:
    runs = ", ".join(f"`{run['command']}` {run['started_utc']} UTC ({run['seconds']:.0f} s, load "
                     f"{run['load_average_1min_before']:.1f})" + ("" if run["exit"] == 0 else " FAILED")
                     for run in data.get("runs", []))
    intro = (f"{data['met']} of {len(data['rows'])} targets met, {data['not_met']} not. One run of {runs}. "
             "Each reference was measured in the same benchmark's run.")
    verdict = {True: "met", False: "**not met**", None: "no figure"}
    return intro + "\n\n" + table(data["rows"], [
        ("target", "target", text), ("mqstore", "measured", text), ("reference, same run", "reference", text),
        ("", lambda row: verdict[row["met"]], text)])


def report_users(data: dict, readme_only: bool = False) -> str:
    """Issue 30's rows: each side's median (min-max) over interleaved rounds, the per-round ratio, the verdict.
    README.md gets the rows README quotes; bench/README.md also the diagnostic ones."""
    rows = [row for row in data["rows"] if row["readme"] or not readme_only]
    readme = [row for row in data["rows"] if row["readme"]]
    targets = [row for row in readme if row["met"] is not None]
    intro = (f"{data['met']} of {len(targets)} targets met, {data['not_met']} not"
             + (" (a partial run: rows are missing)" if data.get("partial") else "") + ". `StoreConfig()` unless the "
             "row says otherwise; a tag and a key a message, built in the timed loop; 4 topics x 4 queues; the ASYNC "
             "and put_batch rows roll 1 GiB segments; RocketMQ 4.4.0 warmed, index on, the better of its two put "
             f"locks. {data['rounds']} interleaved rounds of fresh processes ({data.get('minutes', 0):.0f} minutes): "
             "median (min-max) of each side and of the per-round ratio.")
    if data.get("note"):
        intro += " " + data["note"]
    reruns = data.get("reruns", [])
    if reruns:
        intro += " Measured again later (`--only ... --merge`): " + "; ".join(
            f"{', '.join(run['only'])} at {run['date_utc']} UTC, {run['rounds']} rounds" for run in reruns) + "."
    gaps = ("bench/" if readme_only else "") + GAPS.relative_to(HERE).as_posix()
    return intro + "\n\n" + table(rows, [
        ("workload", "label", text), ("mqstore", "measured_text", text), ("reference, same run", "reference_text",
                                                                         text),
        ("ratio", "ratio_text", text), ("target", "target", text),
        ("", lambda row: users_verdict(row, gaps), text)])


def users_verdict(row: dict, gaps: str) -> str:
    """A row's last cell: met, or not met with its gap and a link to where its time goes (GAPS)."""
    if row["met"] is None:
        return "-"
    if row["met"]:
        return "met"
    gap = f"{row['gap']}; " if row.get("gap") else ""
    return f"**not met** ({gap}[where the time goes]({gaps}#{row['name']}))"


def gap_sections() -> list[str]:
    """The row names GAPS has a section for (`## name`)."""
    return [line[3:].strip() for line in GAPS.read_text(encoding="utf-8").splitlines() if line.startswith("## ")]


def report_users_readme(data: dict) -> str:
    return report_users(data, readme_only=True)


def report_aio_put(data: dict) -> str:
    rows = [{**row, "range": f"{row['msgs_per_s_min']:,.0f}-{row['msgs_per_s_max']:,.0f}"} for row in data["rows"]]
    parts = [f"Medians of {data['rounds']} interleaved rounds, each cell a fresh process (RocketMQ's rows time its "
             "own putMessage, warmed up):", table(rows, [
                 ("row", "name", text), ("msgs/s", "msgs_per_s_median", rate), ("min-max", "range", text),
                 ("puts a flush", "puts_per_flush_median", number(0)), ("CPU us a put", "cpu_s_per_put_us_median",
                                                                       number(1)),
                 ("runs timed out", lambda row: row.get("timed_out") or None, number(0))])]
    if data.get("targets"):
        parts += ["Issue 30's target (measured, not asserted):", table(data["targets"], [
            ("row", "name", text), ("against", "against", text), ("ratio", "ratio", ratio),
            ("met (>= 4x)", lambda row: "yes" if row["met"] else "**no**", text)])]
    return "\n\n".join(parts)


def report_tier_upload(data: dict) -> str:
    shape = data["shape"]
    endpoints = data["endpoints"]

    def vs_no_tier(row):
        spread = row.get("vs_no_tier_range")
        if row.get("vs_no_tier") is None or spread is None:
            return ratio(row.get("vs_no_tier"))
        return f"{row['vs_no_tier']:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"

    def phase(name):
        return lambda row: (row.get("phase_cpu_s_per_gb") or {}).get(name)

    tiers = [row for row in data["rows"] if "uploader_cpu_s_per_gb" in row]
    parts = [f"{shape['messages']:,} messages of 1 KB by put_batch, segments of {shape['segment_size_bytes'] >> 20} "
             f"MiB, medians of {data['rounds']} interleaved rounds (against no tier: each round's ratio, median and "
             "min-max):", table(data["rows"], [
                 ("row", "row", text), ("msgs/s", "rate", rate), ("GB/s", "gb_per_s", number(2)),
                 ("vs no tier", vs_no_tier, text), ("tier lag at the loop's end (s)", "lag_at_end_s", number(1)),
                 ("largest lag seen (s)", "lag_max_sampled_s", number(1)), ("failures", "failures", number(0))])]
    if tiers:
        parts += ["CPU seconds, medians: the writer process's per GB put (the put loop and the tier's catch-up), and "
                  "the uploader's two threads' per GB uploaded, whole and by phase (`stats()[\"tier\"]"
                  "[\"upload_cost\"]`; the S3 client's own threads are in the writer's figure only):",
                  table(data["rows"], [
                      ("row", "row", text), ("writer CPU s/GB put", "process_cpu_s_per_gb_put", number(2)),
                      ("uploader CPU s/GB", "uploader_cpu_s_per_gb", number(2)), ("read", phase("read"), number(2)),
                      ("CRC", phase("crc"), number(2)), ("put", phase("put"), number(2)),
                      ("read back", phase("verify_read"), number(2)), ("its CRC", phase("verify_crc"), number(2))])]
    parts.append("Each endpoint's own rates in the same run (one 64 MiB object through pyarrow): " + "; ".join(
        f"{name} PUT {rates['put_mb_per_s']:,.0f} MB/s, GET {rates['get_mb_per_s']:,.0f} MB/s"
        for name, rates in endpoints.items()) + ".")
    return "\n\n".join(parts)


def _round_ratio(samples: list[dict], row: str, reference: str) -> str:
    """The median over rounds of two rows' rows/s ratio (load that shifts between rounds cancels), min-max."""
    ratios = [sample[row]["rows_per_s"] / sample[reference]["rows_per_s"] for sample in samples]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def report_tier_scan(data: dict) -> str:
    shape, medians, samples = data["shape"], data["medians"], data["samples"]
    rows = []
    for kind, label in (("full", "every row"), ("topic", f"topic={data.get('topic', 'T0')}")):
        rows.append({"read": label, "endpoint": "local store", "scan": medians[f"local {kind}"], "raw": "-",
                     "vs_raw": "-", "vs_local": "1.00"})
        for name in ("file://", "S3 (moto)"):
            raw_mb = statistics.median(sample[f"{name} raw {kind}"]["mb_per_s"] for sample in samples)
            rows.append({"read": label, "endpoint": f"{name} tier", "scan": medians[f"{name} tier {kind}"],
                         "raw": f"{rate(medians[f'{name} raw {kind}'])} ({raw_mb:,.0f})",
                         "vs_raw": _round_ratio(samples, f"{name} tier {kind}", f"{name} raw {kind}"),
                         "vs_local": _round_ratio(samples, f"{name} tier {kind}", f"local {kind}")})
    plans = "; ".join(f"{name} {plan['seconds'] * 1000:.0f} ms, {plan['partitions']} partitions of {plan['pieces']} "
                      f"pieces, {plan['queue_range_reads']} range reads of queue images for the cuts"
                      for name, plan in data["planning"].items())
    parts = [f"{shape['messages']:,} messages of 100 B with a tag and a key (4 topics x 4 queues), {data['segments']} "
             f"segments of {size(shape['segment_size_bytes'])}, {data['log_bytes_per_row']:.0f} log bytes a row; "
             f"scans read {data['scan_threads']} partitions at once, the raw read replays the tier scan's range reads "
             f"on as many threads; medians of {data['rounds']} interleaved rounds (ratios: median of the rounds' "
             "ratios, min-max):",
             table(rows, [("read", "read", text), ("endpoint", "endpoint", text), ("scan rows/s", "scan", rate),
                          ("raw read rows/s (MB/s)", "raw", preformatted), ("scan / raw read", "vs_raw", preformatted),
                          ("scan / local scan", "vs_local", preformatted)]),
             "Targets (issue #31): tier scan >= 0.80 of the local scan and >= 0.80 of the raw read. The topic rows "
             "count matching rows: the tier scan walks every segment (a topic filter does not read through the "
             "tier's queue images), the raw read replays the same reads.",
             f"Planning a full scan of the tier (once, before the rounds): {plans}."]
    return "\n\n".join(parts)


TIER_GET_LABELS = {  # bench/tier_get.py's rows, as the table names them
    "get 1": "cold `get(..., max_count=1)`", "get 32": "cold `get(...)` (32 messages)", "read_at": "cold `read_at`",
    "query": "cold `query(topic, key)`", "get 32, object not open": "cold `get(...)`, object not open",
    "get 32, warm": "warm `get(...)` (cache hit)", "GET same range": "endpoint: GET of the cold get's range",
    "GET 256 KiB": "endpoint: GET of 256 KiB", "GET 1 byte": "endpoint: GET of 1 byte",
    "HEAD + GET 1 byte": "endpoint: open (HEAD) + GET of 1 byte"}


def report_tier_get(data: dict) -> str:
    shape = data["shape"]
    rows = []
    for endpoint, found in data["endpoints"].items():
        for name, row in found["rows"].items():
            reads = row.get("range_reads") or row.get("requests")
            same, block_ = (found["ratios"].get(f"{name} / {reference}") for reference in
                            ("GET same range", "GET 256 KiB"))
            rows.append({**row, "endpoint": endpoint, "read": TIER_GET_LABELS.get(name, name),
                         "reads": "" if reads is None else f"{reads['min']}-{reads['max']}"
                         if reads["min"] != reads["max"] else str(reads["min"]),
                         "opened": (row.get("objects_opened") or {}).get("total"),
                         "vs_same": same and f"{same['median']:.2f}x ({same['min']:.2f}-{same['max']:.2f})",
                         "vs_block": block_ and f"{block_['median']:.2f}x"})
    verdicts = "; ".join(f"{endpoint} {ratio_:.2f}x, " + ("met" if ratio_ <= 2 else "**not met**")
                         for endpoint, ratio_ in ((endpoint, found["ratios"]["get 32 / GET same range"]["median"])
                                                  for endpoint, found in data["endpoints"].items()))
    parts = [f"{shape['messages']:,} messages of 100 B with a tag and a key (4 topics x 4 queues), {data['segments']} "
             f"segments of {size(shape['segment_size_bytes'])}, all in the tier only; {data['rounds']} interleaved "
             f"round(s) of {shape['samples']} messages spread over the tier, a read_only open per endpoint and round; "
             "latencies over every sample (ms); ratios: median (min-max) over rounds of each round's p50s' ratio:",
             table(rows, [("endpoint", "endpoint", text), ("read", "read", text), ("p50 ms", "p50_ms", number(3)),
                          ("p90 ms", "p90_ms", number(3)), ("p99 ms", "p99_ms", number(3)),
                          ("range reads a call", "reads", preformatted), ("objects opened", "opened", number(0)),
                          ("p50 / GET of the same range", "vs_same", preformatted),
                          ("p50 / GET of 256 KiB", "vs_block", preformatted)]),
             "Target (issue #31): a cold get is one range read, its p50 within 2x the endpoint's GET "
             f"(`cold get(...) / GET of the cold get's range`): {verdicts}. Cold rows empty the reader's block cache "
             "first and keep its open handles; \"object not open\" also closes them (`TierReader.close()`), so the "
             "object is opened again. The endpoint rows use pyarrow on one open handle per object. A get of 32 "
             "messages makes two range reads when they lie in two objects, a query when another key shares the key's "
             "hash (its message is read and dropped)."]
    if data.get("handles_max") is not None:
        parts[-1] += f" The reader kept at most {data['handles_max']} open handles (`--handles-max`)."
    return "\n\n".join(parts)
def report_timer(data: dict) -> str:
    put, fire = data["put_cost"], data["firing"]
    firing = (f"p50 {fire['error_p50_ms']:.0f} ms, p99 {fire['error_p99_ms']:.0f} ms, "
              f"max {fire['error_max_ms']:.0f} ms, min {fire['error_min_ms']:.0f} ms")
    names = {"plain": "plain put (100 B, tag, key)", "timer": "TIMER_DELAY_MS put (1 h)",
             "level": "DELAY put (level 18)"}
    put_rows = []
    for kind, name in names.items():
        row = dict(put[kind], kind=name)
        for part, key in (("put", ""), ("put_cpu", "cpu_"), ("total", "total_")):
            ratio = "" if kind == "plain" else f" ({put[f'{kind}_{key}over_plain']:.1f}x)"
            row[part] = f"{put[kind][part]:.2f}{ratio}"
        row["dispatch"], row["ingest"] = f"{put[kind]['dispatch']:.2f}", f"{put[kind]['ingest']:.2f}"
        put_rows.append(row)
    rows = [{"measure": f"firing error, {fire['pending_held']:,} pending, {fire['probes']} probes "
                        f"({fire['precision_ms']} ms slots)", "value": firing}]
    for row in data["memory"]:
        rows.append({"measure": f"RSS of a process holding {row['timers']:,} linked timers",
                     "value": f"{row['rss_after_mib']:.0f} MiB (before linking {row['rss_before_mib']:.0f} MiB; "
                              f"TimerLog {row['timer_log_mib']:.0f} MiB on disk)"})
    return (f"Put cost: medians of {put['rounds']} alternating rounds of {put['puts_per_round']:,} puts of each kind "
            "(us a put; CPU: the putting thread's own).\n\n"
            + table(put_rows, [("put", "kind", text), ("put call", "put", preformatted),
                               ("its CPU", "put_cpu", preformatted), ("dispatch", "dispatch", preformatted),
                               ("timer ingestion", "ingest", preformatted), ("total", "total", preformatted)])
            + "\n\n" + table(rows, [("measure", "measure", text), ("value", "value", text)]))


def report_lease(data: dict) -> str:
    rows = [{**row, "range": "" if row["msgs_per_s_min"] is None else
             f"{row['msgs_per_s_min']:,.0f}-{row['msgs_per_s_max']:,.0f}"} for row in data["rows"]]
    return "\n\n".join([
        f"Medians of {data['rounds']} interleaved rounds, each cell a fresh process:", table(rows, [
            ("row", "name", text), ("msgs/s", "msgs_per_s_median", rate), ("min-max", "range", text),
            ("CPU us a message", "cpu_us_per_msg_median", number(1))]),
        "Issue 32's targets (measured, not asserted):", table(data["targets"], [
            ("target", "name", text), ("ratio", "ratio", ratio),
            ("met", lambda row: "yes" if row["met"] else "**no**", text)])])


BENCHMARKS = {
    "put_get": report_put_get,
    "flush_modes": report_flush_modes,
    "put_stalls": report_put_stalls,
    "dispatch_lag": report_dispatch_lag,
    "dispatch_process": report_dispatch_process,
    "index": report_index,
    "recovery": report_recovery,
    "spark_read": report_spark_read,
    "crc32": report_crc32,
    "disk_reservation": report_disk_reservation,
    "native": report_native,
    "native_scan": report_native_scan,
    "flush_modes_sync": report_flush_modes_sync,
    "flush_modes_peers": report_flush_modes_peers,
    "sync_share": report_sync_share,
    "core": report_core,
    "users": report_users,
    "aio_put": report_aio_put,
    "tier_upload": report_tier_upload,
    "tier_scan": report_tier_scan,
    "tier_get": report_tier_get,
    "timer": report_timer,
    "lease": report_lease,
}
TOP_README = HERE.parent / "README.md"
GAPS = HERE / "results" / "users-gaps.md"  # where the time goes in each row of users.json not met
TOP_README_BLOCKS = ("users",)  # also rendered in the repository's README.md
TOP_README_RENDERERS = {"users": report_users_readme}  # README.md's version of a block, where it differs


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
