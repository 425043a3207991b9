"""Timers (mqstore/timer/): what a delayed put costs, how late timers fire with many pending, what memory they hold.

    .venv/bin/python bench/timer.py            # full run (about a minute)
    .venv/bin/python bench/timer.py --quick    # smoke run (a few seconds)

1. Put cost: ASYNC puts of a 100-byte body with a tag and a key, plain, with TIMER_DELAY_MS (one hour) and with
   DELAY (level 18, two hours), and plain puts as long as each delayed record as stored (its properties kept, on a
   topic of the same length: what the delay costs beyond the longer record RocketMQ's format gives it), ROUNDS
   rounds of each in turns on one store (default settings), timed by phase:
   the put calls; then the wait until dispatch (ConsumeQueue, index, the schedule's retag) caught up; then, for
   timers, the wait until the timer service linked the round into the wheel. Dispatch and the service run in
   threads beside the puts on the same interpreter, so what they cost during the put calls shows in that column.
   "Its CPU" is the putting thread's own CPU time (time.thread_time) during the put calls: the rest of the put
   call's wall time is spent waiting for the interpreter while dispatch and the services run (or for another
   process on the machine). Medians over rounds, in microseconds a put; `--put-only` runs this section and
   section 4 (RocketMQ's put costs) alone and writes no files.
2. Firing error: a store holding PENDING timers due in one to two hours; then PROBES timers due 0.2 s .. 0.2 s +
   PROBE_WINDOW_S ahead, on the system clock. Error = the delivered copy's store timestamp minus its
   TIMER_DELIVER_MS (never negative: a timer is not delivered early); p50, p99, max; the probes later than
   LATE_MS, with those whose wait overlapped a stall of the machine watch (section 5 says what that is).
3. Memory: a child process links N timers into a fresh wheel and TimerLog (the service's own enqueue code, no
   store around it) and reports its peak RSS; N = 1M and 10M (quick: 100k and 1M). The wheel is one 38.7 MB
   mapping and the TimerLog is written with pwrite, so RSS should not grow with N.
4. RocketMQ 4.4.0's own DELAY put (bench/java/DelayedPuts.java, its DefaultMessageStore with its defaults, ASYNC,
   warmed), run after section 1: a plain put, a DELAY put (level 18) and a plain put as long as the DELAY record,
   5 rounds of 300,000 of each in turns after 200,000 of each (quick: 2 of 20,000 after 2,000); the same ratios
   as section 1's, for what RocketMQ's own format costs RocketMQ. Needs its jars ($MQSTORE_ROCKETMQ_HOME, else
   ../shared/rocketmq-4.4.0) and a JDK; skipped with the reason otherwise. Its HA service binds a port: the JVM
   runs in a network namespace of its own where the kernel allows one (`unshare -rn`).

5. Timers during a burst: one thread puts BURST_PUTS timer messages (the shape of section 1, due in an hour) as fast
   as it can, and every BURST_PUTS / BURST_PROBES puts a probe due PROBE_LEAD_MS after its put, so that probes fall
   due while the loop runs. Measured: the share of the loop's timers the service linked by the loop's end, the wait
   after it until all were, and the probes' firing error (as section 2's). Each round runs the service's compiled
   link (commitlog/csrc/timer_link.c) and then, on a fresh store, its Python link (the reference, which lets go of
   the interpreter lock at its numpy calls and writes), and then the same loop of DELAY puts (level 18) with a
   level-1 probe as often, for the schedule service; medians of BURST_ROUNDS rounds. Beside each round a bare
   process that only sleeps 1 ms at a time (bench/machine_watch.py) records its own stalls, the machine's: the
   probes later than LATE_MS are counted with those whose wait overlapped such a stall, and the p99 is given again
   over the probes whose wait overlapped none. `--burst-only` runs this section alone and writes no files.

Writes bench/results/timer.json and .md (or timer_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine_watch import STALL_MS as MACHINE_STALL_MS  # noqa: E402  (bench/machine_watch.py: the machine's stalls)
from machine_watch import MachineWatch  # noqa: E402
from users import rocketmq_home  # noqa: E402  (bench/users.py: where RocketMQ's harness is)

from mqstore import Message, MessageStore, StoreConfig  # noqa: E402
from mqstore.store.clock import SYSTEM_CLOCK  # noqa: E402

HOUR_MS = 3_600_000
LEVEL = 18  # the default levels' last: 2 h, so nothing is delivered during the run
FULL = {"rounds": 5, "puts_per_round": 300_000, "pending": 1_000_000, "probes": 2000, "memory": (1_000_000, 10_000_000),
        "rocketmq": (5, 300_000, 200_000), "burst": (3, 3_000_000, 600)}
QUICK = {"rounds": 2, "puts_per_round": 20_000, "pending": 20_000, "probes": 100, "memory": (100_000, 1_000_000),
         "rocketmq": (2, 20_000, 2_000), "burst": (1, 20_000, 20)}
BURST_LINKS = ("compiled", "python", "schedule")  # the timer service's two links, then the schedule service
PROBE_WINDOW_S = 5.0
PROBE_LEAD_MS = 200
LATE_MS = 50  # section 5 counts the probes later than this (section 2's target for the p99)
LINK_BATCH = 100_000
WAIT_S = 600.0


def rss_kib(field: str = "VmHWM") -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def sized_like(store, topic: str, queue_id: int, name: str) -> Message:
    """A plain message whose record is as long as the first one stored on (topic, queue_id): the delayed message
    as the rewrite stored it, its properties kept (TIMER_OUT_MS or REAL_TOPIC stop a second rewrite), on a topic
    of the same length. What a delayed put costs beyond its longer record is its put over this one's."""
    stored = store.get(topic, queue_id, 0, 1).messages[0]
    properties = {key: value for key, value in stored.properties.items() if key not in ("TAGS", "KEYS", "UNIQ_KEY")}
    sized = Message(name.ljust(len(stored.topic), "_"), stored.body, tags=stored.tags,
                    keys=tuple(stored.keys), properties=properties)
    size = store.put(sized).size_bytes
    assert size == stored.size_bytes, (name, size, stored.size_bytes)
    return sized


def put_cost(root: str, rounds: int, count: int) -> dict:
    """Section 1: plain, timer and delay-level puts, and plain puts of the same sizes, in turns, each round timed
    by phase (module docstring)."""
    body = random.Random(1).randbytes(100)
    kinds = {"plain": Message("plain", body, tags="a", keys=("k1",)),
             "timer": Message("delayed", body, tags="a", keys=("k1",), properties={"TIMER_DELAY_MS": str(HOUR_MS)}),
             "level": Message("leveled", body, tags="a", keys=("k1",), properties={"DELAY": str(LEVEL)})}
    with MessageStore.open(root, StoreConfig()) as store:
        put, clock = store.put, time.perf_counter
        for message in list(kinds.values()):
            for _ in range(200):
                put(message)
        assert store.timer.wait_caught_up(WAIT_S)
        store.wait_dispatched(WAIT_S)
        kinds["timer_sized"] = sized_like(store, "rmq_sys_wheel_timer", 0, "sized_timer")
        kinds["level_sized"] = sized_like(store, "SCHEDULE_TOPIC_XXXX", LEVEL - 1, "sized_level")
        phases = {kind: {"put": [], "put_cpu": [], "dispatch": [], "ingest": []} for kind in kinds}
        for _ in range(rounds):
            for kind, message in kinds.items():
                started, started_cpu = clock(), time.thread_time()
                for _ in range(count):
                    put(message)
                put_done, put_cpu = clock(), time.thread_time() - started_cpu
                store.wait_dispatched(WAIT_S)
                dispatched = clock()
                ingested = dispatched
                if kind == "timer":
                    assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
                    ingested = clock()
                for phase, seconds in (("put", put_done - started), ("put_cpu", put_cpu),
                                       ("dispatch", dispatched - put_done), ("ingest", ingested - dispatched)):
                    phases[kind][phase].append(seconds / count * 1e6)
        segments = len(os.listdir(os.path.join(root, "commitlog")))
        sizes = {kind: store.put(message).size_bytes for kind, message in kinds.items()}  # as stored
    row = {"rounds": rounds, "puts_per_round": count, "segments": segments, "record_bytes": sizes}
    for kind, by_phase in phases.items():
        medians = {phase: float(np.median(values)) for phase, values in by_phase.items()}
        walls = zip(by_phase["put"], by_phase["dispatch"], by_phase["ingest"])
        medians["total"] = float(np.median([sum(parts) for parts in walls]))
        row[kind] = medians
    for kind in ("timer", "level", "timer_sized", "level_sized"):
        row[f"{kind}_over_plain"] = row[kind]["put"] / row["plain"]["put"]
        row[f"{kind}_cpu_over_plain"] = row[kind]["put_cpu"] / row["plain"]["put_cpu"]
        row[f"{kind}_total_over_plain"] = row[kind]["total"] / row["plain"]["total"]
    for kind in ("timer", "level"):  # the delay's own cost: over a plain put of the same record size
        row[f"{kind}_over_sized"] = row[kind]["put"] / row[f"{kind}_sized"]["put"]
        row[f"{kind}_cpu_over_sized"] = row[kind]["put_cpu"] / row[f"{kind}_sized"]["put_cpu"]
        row[f"{kind}_total_over_sized"] = row[kind]["total"] / row[f"{kind}_sized"]["total"]
    return row


def firing_error(root: str, pending: int, probes: int) -> dict:
    """Section 2: probes fired while `pending` timers wait in the wheel."""
    rng = random.Random(2)
    with MessageStore.open(root, StoreConfig()) as store:
        started = time.perf_counter()
        for index in range(pending):
            store.put(Message("far", b"%d" % index, properties={"TIMER_DELAY_MS": str(HOUR_MS + index % HOUR_MS)}))
        put_s = time.perf_counter() - started
        assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
        link_s = time.perf_counter() - started - put_s
        held = store.timer.stats()["pending"]
        now = SYSTEM_CLOCK.now_ms()
        due = sorted(now + PROBE_LEAD_MS + rng.randrange(int(PROBE_WINDOW_S * 1000)) for _ in range(probes))
        fired: list[tuple[int, int]] = []  # (TIMER_DELIVER_MS, the delivered copy's store timestamp)
        with MachineWatch() as watch:
            for index, deliver_ms in enumerate(due):
                store.put(Message("probe", b"%d" % index, properties={"TIMER_DELIVER_MS": str(deliver_ms)}))
            deadline = time.monotonic() + PROBE_WINDOW_S + 60
            while len(fired) < probes and time.monotonic() < deadline:
                time.sleep(0.05)
                store.wait_dispatched(1)
                messages = store.get("probe", 0, len(fired), 1000).messages
                fired.extend((int(m.properties["TIMER_DELIVER_MS"]), m.store_timestamp_ms) for m in messages)
        rss = rss_kib("VmRSS")
        stats = store.timer.stats()
    errors = [stored - deliver_ms for deliver_ms, stored in fired]
    values = np.asarray(errors, dtype=np.float64)
    late = [(deliver_ms, stored) for deliver_ms, stored in fired if stored - deliver_ms > LATE_MS]
    return {"pending": pending, "pending_held": held, "probes": probes, "delivered": len(errors),
            "put_s": put_s, "link_after_puts_s": link_s, "error_p50_ms": float(np.percentile(values, 50)),
            "error_p99_ms": float(np.percentile(values, 99)), "error_max_ms": float(values.max()),
            "error_min_ms": float(values.min()), "store_rss_mib": rss / 1024, "late": len(late),
            "late_in_stall": sum(watch.overlaps(due_ms / 1000, stored / 1000) for due_ms, stored in late),
            "machine_longest_ms": watch.result["longest_ms"],
            "precision_ms": store.timer.precision_ms, "pending_after": stats["pending"]}


def burst_round(root: str, link: str, count: int, probes: int) -> dict:
    """Section 5, one round on a fresh store with the service's `link` (BURST_LINKS), a MachineWatch beside it.
    "schedule": DELAY puts (level LEVEL) with level-1 probes, for the schedule service."""
    body = random.Random(3).randbytes(100)
    timers = link != "schedule"
    bulk = Message("delayed", body, tags="a", keys=("k1",),
                   properties={"TIMER_DELAY_MS": str(HOUR_MS)} if timers else {"DELAY": str(LEVEL)})
    every = max(1, count // probes)
    with MessageStore.open(root, StoreConfig()) as store, MachineWatch() as watch:
        if link == "python":
            store.timer._native = None  # the reference link (mqstore/timer/service.py's _link)
        lead_ms = PROBE_LEAD_MS if timers else store.schedule.delays[0]
        put, now = store.put, SYSTEM_CLOCK.now_ms
        for _ in range(1000):
            put(bulk)
        if timers:
            assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
            linked_before = store.timer.stats()["enqueued"]
        started = time.perf_counter()
        for index in range(count):
            if index % every == 0:  # a level's due time is its store timestamp + delay: taken here just before
                due = now() + lead_ms
                put(Message("probe", b"%d" % due, properties={"TIMER_DELIVER_MS": str(due)} if timers else
                            {"DELAY": "1"}))
            put(bulk)
        loop_s = time.perf_counter() - started
        if timers:
            linked = store.timer.stats()["enqueued"] - linked_before
            assert store.timer.wait_caught_up(WAIT_S), store.timer.stats()
        catch_up_s = time.perf_counter() - started - loop_s
        sent = (count + every - 1) // every
        fired: list[tuple[int, int]] = []  # (due time, the delivered copy's store timestamp)
        deadline = time.monotonic() + lead_ms / 1000 + 60
        while len(fired) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
            store.wait_dispatched(1)
            messages = store.get("probe", 0, len(fired), 1000).messages
            fired.extend((int(m.body), m.store_timestamp_ms) for m in messages)
    values = np.asarray([stored - due for due, stored in fired], dtype=np.float64)
    # A probe whose wait overlaps a stall of the bare process waited (at least partly) for the machine.
    in_stall = np.asarray([watch.overlaps(due / 1000, stored / 1000) for due, stored in fired], dtype=bool)
    late = values > LATE_MS
    outside = values[~in_stall]
    return {"loop_s": loop_s, "puts_per_s": count / loop_s,
            "linked_share": linked / (count + sent) if timers else float("nan"),
            "catch_up_s": catch_up_s if timers else float("nan"), "probes": sent, "delivered": len(fired),
            "lead_ms": lead_ms, "error_p50_ms": float(np.percentile(values, 50)),
            "error_p99_ms": float(np.percentile(values, 99)), "error_max_ms": float(values.max()),
            "error_min_ms": float(values.min()), "late": int(late.sum()), "late_in_stall": int((late & in_stall).sum()),
            "error_p99_outside_stalls_ms": float(np.percentile(outside, 99)) if len(outside) else 0.0,
            "machine_longest_ms": watch.result["longest_ms"], "machine_stalls": len(watch.result["stalls"])}


def firing_text(fire: dict) -> str:
    """Section 2's figures, with the machine watch's where the result has them."""
    text = (f"p50 {fire['error_p50_ms']:.0f} ms, p99 {fire['error_p99_ms']:.0f} ms, max {fire['error_max_ms']:.0f} ms, "
            f"min {fire['error_min_ms']:.0f} ms")
    if "machine_longest_ms" in fire:
        text += (f"; {fire['late']} over {LATE_MS} ms ({fire['late_in_stall']} during a stall of the bare process, "
                 f"whose longest wait was {fire['machine_longest_ms']:.0f} ms)")
    return text


def burst(work: str, rounds: int, count: int, probes: int) -> dict:
    """Section 5: BURST_LINKS in turns, `rounds` rounds; the medians of each."""
    runs: dict[str, list[dict]] = {link: [] for link in BURST_LINKS}
    for round_ in range(rounds):
        for link in BURST_LINKS:
            root = os.path.join(work, f"burst-{link}-{round_}")
            runs[link].append(burst_round(root, link, count, probes))
            shutil.rmtree(root)
    result = {"rounds": rounds, "puts": count, "probes": probes, "lead_ms": PROBE_LEAD_MS}
    for link, values in runs.items():
        result[link] = {key: float(np.median([value[key] for value in values])) for key in values[0]}
        result[link]["rounds"] = values
    return result


def burst_lines(result: dict | None) -> list[str]:
    """Section 5 as Markdown lines (nothing for a result from before it)."""
    if result is None:
        return []
    watched = "machine_longest_ms" in result["compiled"]  # results from before the MachineWatch lack its columns
    lines = ["| timers during a burst (median of rounds) | puts a second | linked by the loop's end | catch-up after "
             "it | probe firing error |" + (f" probes over {LATE_MS} ms (during a stall) | a bare process's longest "
                                           "wait |" if watched else ""),
             "|---|---|---|---|---|" + ("---|---|" if watched else "")]
    names = (("compiled", "the timer service's compiled link"), ("python", "its Python link (the reference)"),
             ("schedule", "the schedule service: DELAY puts, level-1 probes"))
    for link, name in names:
        if link not in result:  # results from before the schedule's row
            continue
        row = result[link]
        linked = "n/a" if np.isnan(row["linked_share"]) else f"{row['linked_share']:.0%}"
        catch_up = "n/a" if np.isnan(row["catch_up_s"]) else f"{row['catch_up_s']:.2f} s"
        line = (f"| {name} | {row['puts_per_s'] / 1000:.0f}k | {linked} | {catch_up} | p50 {row['error_p50_ms']:.0f} "
                f"ms, p99 {row['error_p99_ms']:.0f} ms, max {row['error_max_ms']:.0f} ms |")
        if watched:
            line += f" {row['late']:.0f} ({row['late_in_stall']:.0f}) | {row['machine_longest_ms']:.0f} ms |"
        lines.append(line)
    lines.append(f"\n{result['rounds']} rounds of {result['puts']:,} timer puts from one thread, with a probe due "
                 f"{result['lead_ms']} ms after its put every {result['puts'] // result['probes']:,} puts; each round "
                 f"runs both links in turns, on fresh stores with default settings" +
                 (f", then {result['puts']:,} DELAY puts (level {LEVEL}) with a level-1 probe (due "
                  f"{result['schedule']['lead_ms']:.0f} ms after its put) as often." if "schedule" in result else "."))
    if watched:
        for link, name in (("compiled", "The compiled link"), ("schedule", "The schedule service")):
            if link in result:
                lines.append(f"{name} round by round: " + "; ".join(
                    f"p99 {one['error_p99_ms']:.0f} ms ({one['error_p99_outside_stalls_ms']:.0f} ms over the probes "
                    f"whose wait overlapped no stall), {one['late']} over {LATE_MS} ms ({one['late_in_stall']} during "
                    f"a stall), longest wait of the bare process {one['machine_longest_ms']:.0f} ms"
                    for one in result[link]["rounds"]) + ".")
        lines.append(f"A stall: the bare process (bench/machine_watch.py, sleeping 1 ms at a time beside the store) "
                     f"woke more than {MACHINE_STALL_MS:.0f} ms after its previous wake-up.")
    lines.append("")
    return lines


def memory_child(count: int) -> None:
    """Section 3, in a child: link `count` timers through TimerService._link and print the RSS figures."""
    from mqstore.timer.service import TimerService

    root = tempfile.mkdtemp(prefix="timer-memory-")
    try:
        service = TimerService(None, root, SYSTEM_CLOCK, config=StoreConfig())
        service._open_files()
        now = SYSTEM_CLOCK.now_ms() // service.precision_ms * service.precision_ms
        service.read_time_ms = now
        rng = np.random.default_rng(3)
        before = rss_kib("VmRSS")
        started = time.perf_counter()
        for start in range(0, count, LINK_BATCH):
            size = min(LINK_BATCH, count - start)
            out = now + rng.integers(1000, 20 * 60_000, size)  # within the roll window: all linked, none rolled
            offsets = np.arange(start, start + size, dtype=np.int64) * 256
            service._link(now, out, offsets, np.full(size, 256), np.zeros(size, dtype=np.int64))
        link_s = time.perf_counter() - started
        pending = service.wheel.pending_count(now)
        after = rss_kib("VmRSS")
        print(json.dumps({"timers": count, "pending": pending, "link_s": link_s, "rss_before_mib": before / 1024,
                          "rss_after_mib": after / 1024, "rss_peak_mib": rss_kib("VmHWM") / 1024,
                          "timer_log_mib": service.timer_log.end / (1 << 20)}))
        service.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def memory(counts) -> list[dict]:
    rows = []
    for count in counts:
        completed = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child", str(count)],
                                   capture_output=True, text=True, check=True)
        rows.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    return rows


ROCKETMQ_SEGMENT_BYTES = 1 << 30  # RocketMQ's default CommitLog file size
JAVA_OPTIONS = ["--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
                "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-exports",
                "java.base/jdk.internal.ref=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]  # RocketMQ 4.4.0's mappings on Java 17
ROCKETMQ_KINDS = {"plain": "plain", "delayed": "level", "sized": "level_sized"}  # its names: section 1's


def rocketmq_jars() -> tuple[list[str] | None, str]:
    """RocketMQ 4.4.0's jars (where bench/users.py finds its harness) and a JDK: (the jars, ""), or (None, why
    not)."""
    home = rocketmq_home()
    if home is None:
        return None, "no RocketMQ 4.4.0 harness or no java (set MQSTORE_ROCKETMQ_HOME)"
    if shutil.which("javac") is None:
        return None, "no JDK: javac is not on PATH"
    lib = os.path.join(home, "lib")
    return sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.endswith(".jar")), ""


def private_network() -> list[str]:
    """The command prefix that runs a command in a network namespace of its own with only loopback up, or [] where
    the kernel does not let this user make one."""
    prefix = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    done = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if done.returncode == 0 else []


def rocketmq_delay(work: str, rounds: int, count: int, warmup: int) -> dict:
    """Section 4: RocketMQ 4.4.0's plain, DELAY and same-size puts (bench/java/DelayedPuts.java); {"skipped": why}
    without its jars or a JDK."""
    jars, why = rocketmq_jars()
    if jars is None:
        return {"skipped": why}
    classes, store, home = (os.path.join(work, name) for name in ("classes", "store", "home"))
    for folder in (classes, store, home):
        os.makedirs(folder)
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java", "DelayedPuts.java")
    classpath = os.pathsep.join(jars)
    subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", classes, source], check=True, capture_output=True)
    command = [*private_network(), "java", *JAVA_OPTIONS, f"-Duser.home={home}", "-cp",
               classpath + os.pathsep + classes, "DelayedPuts", store, str(ROCKETMQ_SEGMENT_BYTES), str(count),
               str(rounds), str(warmup), str(LEVEL)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S)
    if done.returncode != 0:
        raise RuntimeError(f"DelayedPuts failed ({done.returncode}): {done.stderr[-2000:]}")
    row = {"rounds": rounds, "puts_per_round": count, "warmup": warmup, "record_bytes": {},
           "private_network": bool(command[0] == "unshare")}
    for line in done.stdout.splitlines():
        kind, size, wall, cpu = line.split()
        name = ROCKETMQ_KINDS[kind]
        row["record_bytes"][name] = int(size.split("=")[1])
        walls, cpus = (json.loads(part.split("=")[1]) for part in (wall, cpu))
        row[name] = {"put": float(np.median(walls)) / 1000, "put_cpu": float(np.median(cpus)) / 1000,
                     "put_rounds": [value / 1000 for value in walls]}
    for key, part in (("", "put"), ("cpu_", "put_cpu")):
        for kind in ("level", "level_sized"):
            row[f"{kind}_{key}over_plain"] = row[kind][part] / row["plain"][part]
        row[f"level_{key}over_sized"] = row["level"][part] / row["level_sized"][part]
    return row


KIND_NAMES = {"plain": "plain put (100 B, tag, key)", "timer": "TIMER_DELAY_MS put (1 h)",
              "timer_sized": "plain put as long as the TIMER_DELAY_MS record", "level": f"DELAY put (level {LEVEL})",
              "level_sized": "plain put as long as the DELAY record"}


def put_rows(put: dict) -> list[tuple[str, dict]]:
    """The put-cost table's rows: (name, cells as text), the ratios to the plain put, and for a delayed put to
    the plain put of its size too (the bench/reports/timer.py block shows the same)."""
    rows = []
    for kind, name in KIND_NAMES.items():
        if kind not in put:  # a result from before the same-size rows
            continue
        name = f"{name}, {put['record_bytes'][kind]} B" if "record_bytes" in put else name
        cells = {"dispatch": f"{put[kind]['dispatch']:.2f}", "ingest": f"{put[kind]['ingest']:.2f}"}
        for part, key in (("put", ""), ("put_cpu", "cpu_"), ("total", "total_")):
            ratio = ""
            if kind != "plain":
                ratio = f" ({put[f'{kind}_{key}over_plain']:.1f}x"
                sized = put.get(f"{kind}_{key}over_sized")
                ratio += f"; {sized:.2f}x same size)" if sized is not None else ")"
            cells[part] = f"{put[kind][part]:.2f}{ratio}"
        rows.append((name, cells))
    return rows


def rocketmq_rows(rocketmq: dict) -> list[tuple[str, dict]]:
    """Section 4's rows as put_rows gives section 1's (put call and CPU only)."""
    rows = []
    for kind in ("plain", "level", "level_sized"):
        cells = {}
        for part, key in (("put", ""), ("put_cpu", "cpu_")):
            ratio = ""
            if kind != "plain":
                ratio = f" ({rocketmq[f'{kind}_{key}over_plain']:.2f}x"
                ratio += f"; {rocketmq[f'level_{key}over_sized']:.2f}x same size)" if kind == "level" else ")"
            cells[part] = f"{rocketmq[kind][part]:.2f}{ratio}"
        rows.append((f"{KIND_NAMES[kind]}, {rocketmq['record_bytes'][kind]} B", cells))
    return rows


def rocketmq_lines(rocketmq: dict | None, put: dict) -> list[str]:
    """Section 4 as Markdown lines (nothing for a result from before it)."""
    if rocketmq is None:
        return []
    if "skipped" in rocketmq:
        return [f"RocketMQ 4.4.0's own DELAY put: not measured ({rocketmq['skipped']}).\n"]
    lines = ["| RocketMQ 4.4.0, same run (us a put; median of rounds) | put call | its CPU |", "|---|---|---|"]
    lines += [f"| {name} | {cells['put']} | {cells['put_cpu']} |" for name, cells in rocketmq_rows(rocketmq)]
    lines.append(f"\nIts own DefaultMessageStore at its defaults (ASYNC, index on), one thread, after "
                 f"{rocketmq['warmup']:,} puts of each kind; {rocketmq['rounds']} rounds of "
                 f"{rocketmq['puts_per_round']:,} puts of each kind in turns, after section 1 (not interleaved with "
                 f"it). No UNIQ_KEY (a producer adds one; the store does not). mqstore's DELAY put call "
                 f"{put['level']['put']:.2f} us against RocketMQ's {rocketmq['level']['put']:.2f} us.\n")
    return lines


def markdown(result: dict) -> str:
    put = result["put_cost"]
    lines = [f"`.venv/bin/python {result['command']}` ({result['date']}, Python {result['python']}, "
             f"{result['cpus']} CPUs)\n",
             "| measure (us a put; median of rounds) | put call | its CPU | dispatch | timer ingestion | total |",
             "|---|---|---|---|---|---|"]
    for name, row in put_rows(put):
        lines.append(f"| {name} | {row['put']} | {row['put_cpu']} | {row['dispatch']} | {row['ingest']} | "
                     f"{row['total']} |")
    lines.append(f"\n{put['rounds']} rounds of {put['puts_per_round']:,} puts of each kind in turns, default "
                 f"settings, {put['segments']} CommitLog segments at the end.\n")
    lines += rocketmq_lines(result.get("rocketmq"), put)
    lines += burst_lines(result.get("burst"))
    fire = result.get("firing")
    if fire is None:
        return "\n".join(lines) + "\n"
    lines += ["| measure | value |", "|---|---|",
              f"| firing error with {fire['pending_held']:,} pending, {fire['probes']} probes | {firing_text(fire)} |"]
    for row in result["memory"]:
        lines.append(f"| RSS after linking {row['timers']:,} timers | {row['rss_after_mib']:.0f} MiB "
                     f"(peak {row['rss_peak_mib']:.0f} MiB, before {row['rss_before_mib']:.0f} MiB; TimerLog "
                     f"{row['timer_log_mib']:.0f} MiB on disk, linked in {row['link_s']:.1f} s) |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path (the Markdown table goes beside it)")
    parser.add_argument("--put-only", action="store_true", help="sections 1 and 4: put costs (no result files)")
    parser.add_argument("--burst-only", action="store_true", help="section 5: timers during a burst (no result files)")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        memory_child(args.memory_child)
        return 0
    plan = QUICK if args.quick else FULL
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    out = args.out or os.path.join(results, "timer_quick.json" if args.quick else "timer.json")
    work = tempfile.mkdtemp(prefix="bench-timer-")
    if args.burst_only:
        try:
            print("\n".join(burst_lines(burst(work, *plan["burst"]))))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    try:
        result = {"date": time.strftime("%Y-%m-%d"), "command": "bench/timer.py" + (" --quick" if args.quick else ""),
                  "python": platform.python_version(), "cpus": os.cpu_count(),
                  "put_cost": put_cost(os.path.join(work, "put"), plan["rounds"], plan["puts_per_round"])}
        shutil.rmtree(os.path.join(work, "put"))
        os.makedirs(os.path.join(work, "rocketmq"))
        result["rocketmq"] = rocketmq_delay(os.path.join(work, "rocketmq"), *plan["rocketmq"])
        shutil.rmtree(os.path.join(work, "rocketmq"))
        if args.put_only:
            print(markdown(result))
            return 0
        result["firing"] = firing_error(os.path.join(work, "fire"), plan["pending"], plan["probes"])
        shutil.rmtree(os.path.join(work, "fire"))
        result["memory"] = memory(plan["memory"])
        result["burst"] = burst(work, *plan["burst"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(result, handle, indent=2)
    table = markdown(result)
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
