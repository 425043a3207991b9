"""The write path's blocks: put_get, flush_modes (and its --sync and --peers runs), put_stalls, sync_share,
aio_put and disk_reservation."""

from __future__ import annotations

from .cells import body, figure, number, rate, ratio, size, table, text


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



def report_put_stalls(data: dict) -> str:
    return table(data["rows"], [
        ("case", "case", text), ("ops/s", "ops_per_s", rate), ("p99 us", "p99_us", number(0)),
        ("p99.9 us", "p999_us", number(0)), ("max ms", "max_ms", number(1)), ("> 1 ms", "over_1ms", number(0)),
        ("> 5 ms", "over_5ms", number(0))])



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
