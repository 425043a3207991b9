"""The timer benchmark's --quick mode runs end to end and reports every section (timings are not asserted), RocketMQ's
own DELAY put included where its jars are."""

from __future__ import annotations

import json

from tests.bench.quick import run_quick


def test_timer_quick_reports_put_cost_firing_and_memory(tmp_path):
    out = tmp_path / "timer.json"
    run_quick("timer.py", "--out", str(out))
    result = json.loads(out.read_text())
    put = result["put_cost"]
    for kind in ("plain", "timer", "level", "timer_sized", "level_sized"):
        phases = put[kind]
        assert phases["put"] > 0 and phases["put_cpu"] > 0 and phases["dispatch"] >= 0 and phases["ingest"] >= 0
        assert phases["total"] >= phases["put"]
    assert put["plain"]["ingest"] == put["level"]["ingest"] == 0  # only timers wait for the timer service
    sizes = put["record_bytes"]  # the same-size rows are as long as the delayed records, which are longer
    assert sizes["timer_sized"] == sizes["timer"] > sizes["plain"]
    assert sizes["level_sized"] == sizes["level"] > sizes["plain"]
    assert put["timer_over_sized"] == put["timer"]["put"] / put["timer_sized"]["put"]
    firing = result["firing"]
    assert firing["pending_held"] >= firing["pending"] == 20_000
    assert firing["delivered"] == firing["probes"]
    assert firing["error_min_ms"] >= 0  # no probe was stored before its TIMER_DELIVER_MS
    assert 0 <= firing["late_in_stall"] <= firing["late"] <= firing["probes"] and firing["machine_longest_ms"] > 0
    assert [row["timers"] for row in result["memory"]] == [100_000, 1_000_000]
    for row in result["memory"]:
        assert row["pending"] == row["timers"] and row["rss_after_mib"] > 0
    rocketmq = result["rocketmq"]  # its own DELAY put, or why it was not measured (no jars or JDK here)
    if "skipped" in rocketmq:
        assert "MQSTORE_ROCKETMQ_HOME" in rocketmq["skipped"] or "JDK" in rocketmq["skipped"]
    else:
        sizes = rocketmq["record_bytes"]  # its DELAY record is longer than its plain one, and the sized one as long
        assert sizes["level_sized"] == sizes["level"] > sizes["plain"]
        for kind in ("plain", "level", "level_sized"):
            assert rocketmq[kind]["put"] > 0 and rocketmq[kind]["put_cpu"] > 0
            assert len(rocketmq[kind]["put_rounds"]) == rocketmq["rounds"] == 2
        assert rocketmq["level_over_sized"] == rocketmq["level"]["put"] / rocketmq["level_sized"]["put"]
    burst = result["burst"]  # section 5: every probe delivered, none early, and the loop's timers all linked after
    assert burst["rounds"] == 1 and burst["puts"] == 20_000
    for link in ("compiled", "python", "schedule"):
        row = burst[link]
        assert row["delivered"] == row["probes"] == 20 and row["error_min_ms"] >= 0 and row["puts_per_s"] > 0
        if link != "schedule":  # the timer's: every timer of the loop linked
            assert 0 <= row["linked_share"] <= 1 and row["catch_up_s"] >= 0
        assert 0 <= row["late_in_stall"] <= row["late"] <= row["probes"]  # the machine watch beside the round
        assert row["machine_longest_ms"] > 0
        assert row["error_p99_outside_stalls_ms"] <= row["error_max_ms"]
    table_rows = [line for line in (tmp_path / "timer.md").read_text().splitlines() if line.startswith("| ")]
    # 2 headers, 5 put rows, firing, 2 memory, the burst's header and 3 rows; RocketMQ's header and 3 rows when it
    # was measured
    assert len(table_rows) == (14 if "skipped" in rocketmq else 18)
