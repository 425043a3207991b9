"""Delayed messages' block: timer."""

from __future__ import annotations

from .cells import table, text


def report_timer(data: dict) -> str:
    put, fire = data["put_cost"], data["firing"]
    firing = (f"p50 {fire['error_p50_ms']:.0f} ms, p99 {fire['error_p99_ms']:.0f} ms, "
              f"max {fire['error_max_ms']:.0f} ms, min {fire['error_min_ms']:.0f} ms")
    rows = [
        {"measure": "plain put (100 B, tag), us", "value": f"{put['plain']:.2f}"},
        {"measure": "delayed put (TIMER_DELAY_MS), us",
         "value": f"{put['delayed']:.2f} ({put['delayed_over_plain']:.1f}x)"},
        {"measure": "delayed put + linking into the wheel, us",
         "value": f"{put['delayed_with_link']:.2f} ({put['delayed_with_link_over_plain']:.1f}x)"},
        {"measure": f"firing error, {fire['pending_held']:,} pending, {fire['probes']} probes "
                    f"({fire['precision_ms']} ms slots)", "value": firing},
    ]
    for row in data["memory"]:
        rows.append({"measure": f"RSS of a process holding {row['timers']:,} linked timers",
                     "value": f"{row['rss_after_mib']:.0f} MiB (before linking {row['rss_before_mib']:.0f} MiB; "
                              f"TimerLog {row['timer_log_mib']:.0f} MiB on disk)"})
    return (f"Medians of {put['rounds']} alternating rounds of {put['puts_per_round']:,} puts.\n\n"
            + table(rows, [("measure", "measure", text), ("value", "value", text)]))
