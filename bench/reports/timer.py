"""Issue 32's blocks: timer (delayed puts, firing error, memory) and lease (receive + ack against the peers)."""

from __future__ import annotations

import timer as timer_bench  # bench/timer.py: the put table's rows, shared with its own Markdown

from .cells import number, preformatted, rate, ratio, table, text


def report_timer(data: dict) -> str:
    put, fire = data["put_cost"], data["firing"]
    firing = timer_bench.firing_text(fire)
    put_rows = [dict(cells, kind=name) for name, cells in timer_bench.put_rows(put)]
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
            + rocketmq_block(data.get("rocketmq"), put)
            + "\n\n" + table(rows, [("measure", "measure", text), ("value", "value", text)])
            + burst_block(data.get("burst")))


def burst_block(burst: dict | None) -> str:
    """Section 5 of bench/timer.py: timers during a put loop that never pauses, by the compiled and the Python
    link (nothing for a result from before it)."""
    if burst is None:
        return ""
    lines = timer_bench.burst_lines(burst)
    return "\n\nTimers during a burst (section 5).\n\n" + "\n".join(lines).rstrip()


def rocketmq_block(rocketmq: dict | None, put: dict) -> str:
    """RocketMQ 4.4.0's own DELAY put in the same run (bench/timer.py, section 4), or why it was not measured."""
    if rocketmq is None:
        return ""
    if "skipped" in rocketmq:
        return f"\n\nRocketMQ 4.4.0's own DELAY put: not measured ({rocketmq['skipped']})."
    rows = [dict(cells, kind=name) for name, cells in timer_bench.rocketmq_rows(rocketmq)]
    return (f"\n\nRocketMQ 4.4.0's own store in the same run, after the rows above: {rocketmq['rounds']} alternating "
            f"rounds of {rocketmq['puts_per_round']:,} puts of each kind after {rocketmq['warmup']:,} of each (its "
            f"defaults, ASYNC, no UNIQ_KEY). mqstore's DELAY put call {put['level']['put']:.2f} us against its "
            f"{rocketmq['level']['put']:.2f} us.\n\n"
            + table(rows, [("put", "kind", text), ("put call", "put", preformatted),
                           ("its CPU", "put_cpu", preformatted)]))


def report_lease(data: dict) -> str:
    rows = [{**row, "range": "" if row["msgs_per_s_min"] is None else
             f"{row['msgs_per_s_min']:,.0f}-{row['msgs_per_s_max']:,.0f}"} for row in data["rows"]]
    return "\n\n".join([
        f"Medians of {data['rounds']} interleaved rounds, each cell a fresh process:", table(rows, [
            ("row", "name", text), ("msgs/s", "msgs_per_s_median", rate), ("min-max", "range", text),
            ("CPU us a message", "cpu_us_per_msg_median", number(1))]),
        "Issue 32's targets (measured, not asserted):", table(data["targets"], [
            ("target", "name", text), ("ratio", "ratio", ratio),
            ("met", lambda row: "-" if row["met"] is None else "yes" if row["met"] else "**no**", text)])])
