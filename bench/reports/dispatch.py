"""The blocks of what follows the log: dispatch_lag, dispatch_process, index and recovery."""

from __future__ import annotations

from .cells import body, number, rate, share, size, table, text


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
