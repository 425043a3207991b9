"""receive + ack, one consumer, one thread: mqstore's lease consumer against persist-queue and litequeue.

    .venv/bin/python bench/lease.py              # 5 interleaved rounds (a few minutes)
    .venv/bin/python bench/lease.py --quick      # one short round (a smoke run)

Each round runs every cell in turn, each in a fresh process on a fresh directory. A cell fills its queue first
(not timed) with messages of a 100 B body, a tag and a key, then times one thread taking every message and
acknowledging it:
- mqstore, leases: `open_lease_consumer(store, group, topic)`, `receive(max_count=32, visibility_ms=30000)` then
  `ack` of each message (what users write); and the same with one `ack_many` of the batch. The store at its
  defaults; the lease journal at its default (a returned receive or ack survives kill -9 of any process: written
  with write(2)), and with `sync=True` (each receive and ack fdatasynced: it survives a power loss);
- persist-queue 1.1 `SQLiteAckQueue(path)` at its defaults (auto_commit=True: a transaction per get and per ack,
  SQLite WAL with synchronous FULL: each commit fsyncs the WAL: power-loss durable), `get(block=False, raw=True)`
  then `ack(id=pqid)`; the item a dict of body, tags and keys (pickled by persist-queue);
- litequeue `LiteQueue(path)` at its defaults (WAL, synchronous NORMAL: a commit survives a process crash, not a
  power loss), `pop()` then `done(message_id)`; the item the same fields as JSON text (litequeue stores str);
- a bare 32-byte append + fdatasync on the same disk: the floor of one power-loss-durable ack. Its rate over
  persist-queue's is printed as a bound, not a target: the most `sync=True` + `ack` each can reach against it.
Targets (issue 32), at equal durability: mqstore's default with `ack` each >= 10x litequeue (both survive a
process crash), mqstore `sync=True` >= 10x persist-queue (both survive a power loss); and mqstore's default with
`ack` each >= 100k messages a second. The unequal comparison (ours process-crash durable against persist-queue's
power-loss durable) is printed too, labelled so.
Writes bench/results/lease.json and .md (or *_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BODY_BYTES = 100
ROUNDS = 5
BATCH = 32
MQSTORE_MESSAGES = 200_000
PEER_MESSAGES = 5_000
QUICK_MESSAGES = 2_000
TARGET_RATIO = 10.0
TARGET_RATE = 100_000
CELL_TIMEOUT_S = 900
FSYNC_ROW = "bare append of 32 B + fdatasync (the floor of one power-loss-durable ack)"
CELLS = {  # name -> (kind, option); a "sync" option fdatasyncs each journal write, so fewer messages
    "mqstore lease, receive 32 + ack each": ("mqstore", "each"),
    "mqstore lease, receive 32 + ack_many": ("mqstore", "batch"),
    "mqstore lease sync=True, receive 32 + ack each": ("mqstore", "sync-each"),
    "mqstore lease sync=True, receive 32 + ack_many": ("mqstore", "sync-batch"),
    "persist-queue SQLiteAckQueue, get + ack": ("persistqueue", ""),
    "litequeue LiteQueue, pop + done": ("litequeue", ""),
    FSYNC_ROW: ("fdatasync", ""),
}
DEFAULT_ROW = "mqstore lease, receive 32 + ack each"
# (ours, peer, durability): the rows compared, and what both survive (the last one says it is unequal)
COMPARISONS = (
    ("mqstore lease, receive 32 + ack each", "litequeue LiteQueue, pop + done", "process crash"),
    ("mqstore lease sync=True, receive 32 + ack each", "persist-queue SQLiteAckQueue, get + ack", "power loss"),
    ("mqstore lease sync=True, receive 32 + ack_many", "persist-queue SQLiteAckQueue, get + ack", "power loss"),
    ("mqstore lease, receive 32 + ack each", "persist-queue SQLiteAckQueue, get + ack",
     "unequal: ours process crash, the peer power loss"),
)


DURABILITY_NOTE = (
    "Durability of each row at the settings measured. Survives a process crash (kill -9 of any process): "
    "mqstore's lease rows without sync (store defaults, journal default: each receive and ack written with "
    "write(2) before it returns), and litequeue at its defaults (WAL, synchronous NORMAL). Survives a power "
    "loss: mqstore's `sync=True` rows (each journal write fdatasynced before the call returns) and persist-queue "
    "SQLiteAckQueue at its defaults (auto_commit, WAL, synchronous FULL: each commit fsyncs). Queues filled first "
    "(not timed), 100 B bodies with a tag and a key; one thread. The bare fdatasync row appends 32 B to a file and "
    "fdatasyncs it, on the same disk: an `ack` that must survive a power loss before it returns costs at least that.")


def fields(index: int, pool: list[bytes]) -> tuple[bytes, str, str]:
    return pool[index & 1023], "TagA", f"key-{index}"


def mqstore_cell(directory: str, count: int, option: str) -> dict:
    from mqstore import Message, MessageStore
    from mqstore.lease import open_lease_consumer

    pool = [os.urandom(BODY_BYTES) for _ in range(1024)]
    with MessageStore.open(directory) as store:
        batch = []
        for index in range(count):
            body, tag, key = fields(index, pool)
            batch.append(Message("LeaseBench", body, tags=tag, keys=[key]))
        store.put_batch(batch)
        store.wait_dispatched(60)
        consumer = open_lease_consumer(store, "workers", "LeaseBench", sync=option.startswith("sync"))
        done = 0
        started = time.perf_counter()
        cpu = time.process_time()
        while done < count:
            received = consumer.receive(BATCH, 30_000)
            if option.endswith("each"):
                for leased in received:
                    consumer.ack(leased.lease)
            else:
                consumer.ack_many([leased.lease for leased in received])
            done += len(received)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        prefix = consumer.commit()
        consumer.close()
    assert prefix == {0: count}, prefix
    return {"count": done, "seconds": seconds, "msgs_per_s": done / seconds, "cpu_us_per_msg": cpu / done * 1e6}


def persistqueue_cell(directory: str, count: int) -> dict:
    from persistqueue import SQLiteAckQueue

    pool = [os.urandom(BODY_BYTES) for _ in range(1024)]
    queue = SQLiteAckQueue(directory)
    for index in range(count):
        body, tag, key = fields(index, pool)
        queue.put({"body": body, "tags": tag, "keys": key})
    done = 0
    started = time.perf_counter()
    cpu = time.process_time()
    while done < count:
        item = queue.get(block=False, raw=True)
        queue.ack(id=item["pqid"])
        done += 1
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    assert queue.ready_count() == 0
    return {"count": done, "seconds": seconds, "msgs_per_s": done / seconds, "cpu_us_per_msg": cpu / done * 1e6}


def litequeue_cell(directory: str, count: int) -> dict:
    from litequeue import LiteQueue

    pool = [os.urandom(BODY_BYTES) for _ in range(1024)]
    queue = LiteQueue(os.path.join(directory, "queue.sqlite3"))
    for index in range(count):
        body, tag, key = fields(index, pool)
        queue.put(json.dumps({"body": body.hex(), "tags": tag, "keys": key}))
    done = 0
    started = time.perf_counter()
    cpu = time.process_time()
    while done < count:
        message = queue.pop()
        queue.done(message.message_id)
        done += 1
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    assert queue.pop() is None
    return {"count": done, "seconds": seconds, "msgs_per_s": done / seconds, "cpu_us_per_msg": cpu / done * 1e6}


def fdatasync_cell(directory: str, count: int) -> dict:
    """What one power-loss-durable ack cannot go below here: a 32-byte append to a file, fdatasynced, `count` times."""
    fd = os.open(os.path.join(directory, "floor"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    record = os.urandom(32)
    started = time.perf_counter()
    cpu = time.process_time()
    try:
        for _ in range(count):
            os.write(fd, record)
            os.fdatasync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return {"count": count, "seconds": seconds, "msgs_per_s": count / seconds, "cpu_us_per_msg": cpu / count * 1e6}


def run_cell(work: str, name: str, quick: bool) -> dict:
    """One cell in a fresh interpreter on a fresh directory."""
    kind, option = CELLS[name]
    fast = kind == "mqstore" and not option.startswith("sync")
    count = QUICK_MESSAGES if quick else MQSTORE_MESSAGES if fast else PEER_MESSAGES
    directory = tempfile.mkdtemp(prefix=f"lease-{kind}-", dir=work)
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--cell", kind, directory, str(count),
                               option or "-"], capture_output=True, text=True, timeout=CELL_TIMEOUT_S)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(runs: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    rows = []
    for name, measured in runs.items():
        good = [run for run in measured if "error" not in run]
        rates = [run["msgs_per_s"] for run in good]
        rows.append({"name": name, "runs": measured, "errors": len(measured) - len(good),
                     "msgs_per_s_median": statistics.median(rates) if rates else None,
                     "msgs_per_s_min": min(rates) if rates else None, "msgs_per_s_max": max(rates) if rates else None,
                     "cpu_us_per_msg_median": statistics.median(run["cpu_us_per_msg"] for run in good)
                     if good else None})
    by_name = {row["name"]: row["msgs_per_s_median"] for row in rows}
    targets = []
    for ours, peer, durability in COMPARISONS:
        if by_name.get(ours) and by_name.get(peer):
            ratio = by_name[ours] / by_name[peer]
            targets.append({"name": f"{ours} >= {TARGET_RATIO:.0f}x {peer} (durable to: {durability})",
                            "ratio": ratio, "met": ratio >= TARGET_RATIO})
    floor, peer = by_name.get(FSYNC_ROW), by_name.get(COMPARISONS[1][1])
    if floor and peer:  # one fdatasync an ack at the least: the most `sync=True` + `ack` each can reach
        targets.append({"name": f"bound, not a target: {FSYNC_ROW} / {COMPARISONS[1][1]} (the most a power-loss-"
                                f"durable `ack` each can reach against it)", "ratio": floor / peer, "met": None})
    ours = by_name.get(DEFAULT_ROW)
    if ours:
        targets.append({"name": f"{DEFAULT_ROW} >= {TARGET_RATE:,} msgs/s", "ratio": ours / TARGET_RATE,
                        "met": ours >= TARGET_RATE})
    return rows, targets


MET_WORDS = {True: "yes", False: "no", None: "-"}


def markdown(data: dict) -> str:
    lines = [f"# {data['command']}", "",
             f"{data['date_utc']}: medians of {data['rounds']} interleaved round(s), each cell a fresh process; "
             f"{data['cpus']} CPUs, load {data['load_average_1min']:.1f}, Python {data['python']}.", "",
             "| row | msgs/s median | min-max | CPU us a message |", "|---|---:|---:|---:|"]
    for row in data["rows"]:
        if row["msgs_per_s_median"] is None:
            lines.append(f"| {row['name']} | failed |  |  |")
            continue
        lines.append(f"| {row['name']} | {row['msgs_per_s_median']:,.0f} | {row['msgs_per_s_min']:,.0f}-"
                     f"{row['msgs_per_s_max']:,.0f} | {row['cpu_us_per_msg_median']:.1f} |")
    lines += ["", DURABILITY_NOTE, "", "| target | ratio | met |", "|---|---:|---|"]
    lines += [f"| {target['name']} | {target['ratio']:.1f}x | {MET_WORDS[target['met']]} |"
              for target in data["targets"]]
    return "\n".join(lines) + "\n"


def cell_main(kind: str, directory: str, count: int, option: str) -> None:
    if kind == "mqstore":
        measured = mqstore_cell(directory, count, option)
    elif kind == "persistqueue":
        measured = persistqueue_cell(directory, count)
    elif kind == "fdatasync":
        measured = fdatasync_cell(directory, count)
    else:
        measured = litequeue_cell(directory, count)
    print(json.dumps(measured))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help="the JSON file (the .md goes beside it)")
    parser.add_argument("--dir", default=None, help="where the queues are made (a temporary folder by default)")
    parser.add_argument("--cell", nargs=4, metavar=("KIND", "DIR", "COUNT", "OPTION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell is not None:
        kind, directory, count, option = args.cell
        cell_main(kind, directory, int(count), option)
        return
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out = args.out or os.path.join(ROOT, "bench", "results", "lease_quick.json" if args.quick else "lease.json")
    work = tempfile.mkdtemp(prefix="lease-bench-", dir=args.dir)
    runs: dict[str, list[dict]] = {}
    try:
        for round_ in range(rounds):
            for name in CELLS:
                measured = run_cell(work, name, args.quick)
                runs.setdefault(name, []).append(measured)
                shown = measured.get("error") or f"{measured['msgs_per_s']:,.0f} msgs/s"
                print(f"round {round_ + 1}/{rounds} {name}: {shown}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, targets = summarise(runs)
    data = {"command": "bench/lease.py" + (" --quick" if args.quick else ""), "rounds": rounds,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0], "python": platform.python_version(), "rows": rows,
            "targets": targets}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
    with open(os.path.splitext(out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
