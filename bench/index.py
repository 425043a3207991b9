"""Index benchmark: IndexFile build rate and lookup latency by key, alone and through the store.

    .venv/bin/python bench/index.py            # full run (about 4 minutes; 10M keys, a 5M-message store)
    .venv/bin/python bench/index.py --quick    # smoke run (a few seconds)
    .venv/bin/python bench/index.py --out F    # write the result JSON to F

Prints a table and a "targets" line, and writes bench/results/index.json (index_quick.json with --quick).
Every index uses the default sizes (5M slots, 20M entries: one 420 MB sparse file holds every key here).
Each message carries two index keys, as a RocketMQ producer's message does: its UNIQ_KEY and one KEYS word.

Sections, measured in the same run so that ratios hold on a noisy machine:
- build: `IndexService.put_keys` fed 10M synthetic `topic#key` keys (UNIQ_KEY-like and `order-N`) in calls of
  16,384 keys (one dispatch batch of 8,192 two-key messages), and with small calls (live traffic: dispatch
  keeps up with puts, so each batch holds a few messages); then `IndexDispatcher.dispatch` fed the real
  `DispatchBatch`es that `commitlog.dispatch.parse_records` decodes from a store's log (the lazy KEYS and
  UNIQ_KEY lookups in the log are part of the dispatcher's time; decoding is timed apart, for reference).
  Baseline: `format.index_key_hashes` alone on the same keys (the vectorised Java hash every put pays).
- lookups: `IndexService.query` with 10M keys indexed, hits and misses; through the store with 5M messages
  (10M keys): `store.query(topic, key)` hit and miss, `get_by_unique_key`, `get_by_msg_id`. Baselines: one
  scalar `index_key_hash` (what a query hashes) and `store.read_at` (what a hit reads). Latency is one call,
  time.perf_counter_ns, page cache warm; every hit is checked to return the expected message.
- end to end: rebuilding a store's ConsumeQueues with the index on vs. off (index and consumequeue
  directories deleted; timed from open to `wait_dispatched`, close excluded; best of two each), and
  single-thread `put` of 100 B messages with the index on vs. off (the index adds a UNIQ_KEY property to
  every message), timed to the last put returning and to everything dispatched.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mqstore.commitlog import format as log_format  # noqa: E402
from mqstore.commitlog.dispatch import DISPATCH_BATCH_RECORDS_MAX, parse_records  # noqa: E402
from mqstore.indexfile import format as fmt  # noqa: E402
from mqstore.indexfile.dispatcher import IndexDispatcher  # noqa: E402
from mqstore.indexfile.index_service import IndexService  # noqa: E402

from mqstore import Message, MessageStore, StoreConfig  # noqa: E402

TOPIC = "orders"
QUEUES = 8
SEED = 20240601
BUILD_TARGET_KEYS_PER_S = 500_000
KEYS_PER_CALL = 2 * DISPATCH_BATCH_RECORDS_MAX  # one full dispatch batch of two-key messages
SMALL_CALL_KEYS = (2, 256)  # one message per dispatch batch; 128 messages per batch
UNIQ_PREFIX = b"0A0000012A9F1B2C3D4E"  # ip, pid, instance id of a UNIQ_KEY: 20 hex digits, then 12 more
RECORD_SPACING_BYTES = 200  # synthetic commitlog offsets of the put_keys section

SIZES = {  # full run, quick run
    "index_keys": (10_000_000, 100_000),
    "small_call_keys": (200_000, 10_000),
    "store_messages": (5_000_000, 20_000),
    "put_messages": (300_000, 20_000),
    "lookups": (20_000, 2_000),
}


def _uniq_key(message: int) -> str:
    return (UNIQ_PREFIX + b"%012X" % message).decode("ascii")


def _order_key(message: int) -> str:
    return f"order-{message}"


def _message_keys(first: int, last: int) -> list[bytes]:
    """The index keys of synthetic messages first..last-1: UNIQ_KEY then KEYS word, as the dispatcher orders."""
    prefix = TOPIC.encode("ascii") + b"#"
    uniq = prefix + UNIQ_PREFIX + b"%012X"
    order = prefix + b"order-%d"
    return [key for message in range(first, last) for key in (uniq % message, order % message)]


def _latency(name: str, calls: list[tuple], function, check=None) -> tuple[str, dict]:
    """p50/p99 of one call of `function(*args)` for each args in `calls`; `check(args, result)` after timing."""
    gc.collect()
    clock = time.perf_counter_ns
    nanoseconds = np.empty(len(calls), dtype=np.int64)
    results = []
    for i, args in enumerate(calls):
        started = clock()
        result = function(*args)
        nanoseconds[i] = clock() - started
        results.append(result)
    if check is not None:
        wrong = [args for args, result in zip(calls, results) if not check(args, result)]
        if wrong:
            raise AssertionError(f"{name}: {len(wrong)} of {len(calls)} lookups wrong, first {wrong[0]}")
    micros = nanoseconds / 1000.0
    return name, {"count": len(calls), "p50_us": float(np.percentile(micros, 50)),
                  "p99_us": float(np.percentile(micros, 99)), "mean_us": float(micros.mean())}


# --- build ---------------------------------------------------------------------------------------------------
def bench_put_keys(directory: str, key_count: int, small_call_keys: int) -> tuple[IndexService, list]:
    """Fill a fresh IndexService with `key_count` keys; returns it (for the lookups) and the rows."""
    service = IndexService(directory)
    fmt.index_key_hashes([b"warm-up"])  # builds the power tables once, outside the timings
    base_ms = time.time_ns() // 1_000_000
    hashing_s = putting_s = 0.0
    messages = key_count // 2
    per_call = KEYS_PER_CALL // 2
    for first in range(0, messages, per_call):
        last = min(messages, first + per_call)
        keys = _message_keys(first, last)
        numbers = np.repeat(np.arange(first, last, dtype=np.int64), 2)
        offsets = (numbers * RECORD_SPACING_BYTES).tolist()
        timestamps = (base_ms + numbers // 1000).tolist()
        started = time.perf_counter()
        fmt.index_key_hashes(keys)
        hashed = time.perf_counter()
        service.put_keys(keys, offsets, timestamps)
        putting_s += time.perf_counter() - hashed
        hashing_s += hashed - started
    rows = [("baseline: index_key_hashes only", {"count": key_count, "keys_per_s": key_count / hashing_s}),
            (f"IndexService.put_keys, {KEYS_PER_CALL:,} keys/call", {"count": key_count,
                                                                     "keys_per_s": key_count / putting_s})]
    first = messages
    for call_keys in SMALL_CALL_KEYS:
        elapsed = 0.0
        per_call = call_keys // 2
        for start in range(first, first + small_call_keys // 2, per_call):
            keys = _message_keys(start, start + per_call)
            numbers = np.repeat(np.arange(start, start + per_call, dtype=np.int64), 2)
            offsets = (numbers * RECORD_SPACING_BYTES).tolist()
            timestamps = (base_ms + numbers // 1000).tolist()
            started = time.perf_counter()
            service.put_keys(keys, offsets, timestamps)
            elapsed += time.perf_counter() - started
        first += small_call_keys // 2
        rows.append((f"IndexService.put_keys, {call_keys} keys/call", {"count": small_call_keys,
                                                                       "keys_per_s": small_call_keys / elapsed}))
    return service, rows


def bench_index_lookups(service: IndexService, key_count: int, lookups: int, rng) -> list:
    """Query latency of an IndexService holding `key_count` keys: hits (half UNIQ_KEY, half KEYS) and misses."""
    messages = rng.integers(0, key_count // 2, lookups).tolist()
    hits = [(TOPIC, _uniq_key(m) if i % 2 else _order_key(m), 32, 0, 2**62) for i, m in enumerate(messages)]
    expected = {args: m * RECORD_SPACING_BYTES for args, m in zip(hits, messages)}
    misses = [(TOPIC, f"absent-{m}", 32, 0, 2**62) for m in messages]
    return [
        _latency("baseline: index_key_hash, one key", [(fmt.index_key(TOPIC, args[1]),) for args in hits],
                 fmt.index_key_hash),
        _latency(f"IndexService.query hit ({key_count / 1e6:g}M keys)", hits, service.query,
                 lambda args, found: expected[args] in found),
        _latency(f"IndexService.query miss ({key_count / 1e6:g}M keys)", misses, service.query),
    ]


# --- the store -----------------------------------------------------------------------------------------------
def _config(index_enabled: bool = True) -> StoreConfig:
    return StoreConfig(store_host="10.0.0.1", index_enabled=index_enabled)


def build_store(root: str, messages: int, batch: int = 1000) -> list:
    """A store of `messages` 100 B messages, message i with KEYS `order-i` (and a UNIQ_KEY from the store)."""
    body = b"x" * 100
    elapsed = 0.0
    with MessageStore.open(root, _config()) as store:
        started_all = time.perf_counter()
        for first in range(0, messages, batch):
            chunk = [Message(TOPIC, body, queue_id=i % QUEUES, keys=(_order_key(i),))
                     for i in range(first, min(messages, first + batch))]
            started = time.perf_counter()
            store.put_batch(chunk)
            elapsed += time.perf_counter() - started
        if not store.wait_dispatched(600):
            raise RuntimeError("the store did not dispatch its messages")
        dispatched_s = time.perf_counter() - started_all
    return [(f"store build: put_batch x{batch}, 100 B + KEYS, index on",
             {"count": messages, "msgs_per_s": messages / elapsed, "msgs_per_s_dispatched": messages / dispatched_s})]


def bench_dispatcher(store: MessageStore, directory: str, samples: np.ndarray) -> tuple[list, dict]:
    """IndexDispatcher fed the real batches of the store's log, into a fresh IndexService; also collects the
    UNIQ_KEY and offset of each sampled message number (sorted `samples`) for the store lookups."""
    log = store._commitlog
    offset, end = log.min_offset(), log.readable_end()
    parsing_s = dispatching_s = 0.0
    messages = 0
    sampled: dict[int, tuple[int, str]] = {}
    with IndexService(directory) as service:
        dispatcher = IndexDispatcher(service)
        while offset < end:  # bounded: each batch advances or ends the loop
            started = time.perf_counter()
            batch = parse_records(log, offset, end)
            parsed = time.perf_counter()
            dispatcher.dispatch(batch)
            dispatching_s += time.perf_counter() - parsed
            parsing_s += parsed - started
            if batch.error is not None:
                raise batch.error
            if batch.end_offset == offset:
                break
            low, high = np.searchsorted(samples, [messages, messages + len(batch)])
            uniq_keys, offsets = batch.uniq_keys, batch.commitlog_offsets
            for number in samples[low:high].tolist():
                sampled[number] = (int(offsets[number - messages]), uniq_keys[number - messages].decode("ascii"))
            messages += len(batch)
            offset = batch.end_offset
        keys = service.entry_count
    rows = [("parse_records, decode only (reference)", {"count": messages, "msgs_per_s": messages / parsing_s}),
            ("IndexDispatcher.dispatch, real batches", {"count": keys, "keys_per_s": keys / dispatching_s,
                                                        "msgs_per_s": messages / dispatching_s})]
    return rows, sampled


def bench_store_lookups(store: MessageStore, numbers: list[int], sampled: dict, messages: int) -> list:
    host = store._commitlog.store_host_raw
    label = f"{messages / 1e6:g}M msgs"

    def is_message(number):
        return lambda args, found: found is not None and found.commitlog_offset == sampled[number][0]

    def check_query(args, found):
        return len(found) == 1 and found[0].keys == (args[1],)

    return [
        _latency("baseline: store.read_at", [(sampled[n][0],) for n in numbers], store.read_at),
        _latency(f"store.query(topic, KEYS key) hit ({label})", [(TOPIC, _order_key(n)) for n in numbers],
                 store.query, check_query),
        _latency(f"store.query miss ({label})", [(TOPIC, f"absent-{n}") for n in numbers], store.query,
                 lambda args, found: found == []),
        _latency(f"store.get_by_unique_key ({label})", [(TOPIC, sampled[n][1]) for n in numbers],
                 store.get_by_unique_key,
                 lambda args, found: found is not None and found.properties["UNIQ_KEY"] == args[1]),
        _latency(f"store.get_by_msg_id ({label})",
                 [(log_format.message_id(host, sampled[n][0]),) for n in numbers], store.get_by_msg_id,
                 lambda args, found: found.msg_id == args[0]),
    ]


def bench_rebuild(root: str, messages: int, repeats: int = 2) -> list:
    """Dispatch the whole log again with the index off and on (best of `repeats` each, alternating)."""
    best = {False: float("inf"), True: float("inf")}
    for _ in range(repeats):
        for index_enabled in (False, True):
            for part in ("consumequeue", "index"):
                shutil.rmtree(os.path.join(root, part), ignore_errors=True)
            started = time.perf_counter()
            with MessageStore.open(root, _config(index_enabled)) as store:
                if not store.wait_dispatched(600):
                    raise RuntimeError("rebuild did not finish")
                elapsed = time.perf_counter() - started
                assert store.dispatched_offset == store._commitlog.readable_end()
            best[index_enabled] = min(best[index_enabled], elapsed)
    return [(f"store rebuild (dispatch), index {'on' if on else 'off'}",
             {"count": messages, "msgs_per_s": messages / best[on]}) for on in (False, True)]


def bench_put(root: str, messages: int, index_enabled: bool) -> tuple[str, dict]:
    batch = [Message(TOPIC, b"x" * 100, queue_id=i % QUEUES) for i in range(messages)]
    with MessageStore.open(root, _config(index_enabled)) as store:
        store.put(Message(TOPIC, b"first"))
        started = time.perf_counter()
        for message in batch:
            store.put(message)
        put_s = time.perf_counter() - started
        if not store.wait_dispatched(600):
            raise RuntimeError("puts were not dispatched")
        dispatched_s = time.perf_counter() - started
    return (f"put 100 B, 1 thread, index {'on' if index_enabled else 'off'}",
            {"count": messages, "msgs_per_s": messages / put_s, "msgs_per_s_dispatched": messages / dispatched_s})


# --- report --------------------------------------------------------------------------------------------------
def _print(rows: list, header: str) -> None:
    print(f"\n{header}")
    print(f"{'case':<52} {'count':>11} {'keys/s':>11} {'msgs/s':>10} {'dispatched':>11} {'p50 us':>8} "
          f"{'p99 us':>8}")
    for name, result in rows:
        cells = [f"{result[field]:,.0f}" if field in result else "" for field in
                 ("count", "keys_per_s", "msgs_per_s", "msgs_per_s_dispatched")]
        cells += [f"{result[field]:.1f}" if field in result else "" for field in ("p50_us", "p99_us")]
        print(f"{name:<52} {cells[0]:>11} {cells[1]:>11} {cells[2]:>10} {cells[3]:>11} {cells[4]:>8} "
              f"{cells[5]:>8}")


def _targets(rows: list) -> dict:
    table = dict(rows)
    put_keys = table[f"IndexService.put_keys, {KEYS_PER_CALL:,} keys/call"]["keys_per_s"]
    dispatched = table["IndexDispatcher.dispatch, real batches"]["keys_per_s"]
    return {"build_keys_per_s_min": BUILD_TARGET_KEYS_PER_S, "put_keys_keys_per_s": put_keys,
            "put_keys_met": put_keys >= BUILD_TARGET_KEYS_PER_S, "dispatcher_keys_per_s": dispatched,
            "dispatcher_met": dispatched >= BUILD_TARGET_KEYS_PER_S}


def run(work: str, quick: bool) -> list:
    size = {name: values[1 if quick else 0] for name, values in SIZES.items()}
    rng = np.random.default_rng(SEED)
    rows = []
    service, build_rows = bench_put_keys(os.path.join(work, "index-put-keys"), size["index_keys"],
                                         size["small_call_keys"])
    rows += build_rows
    try:
        rows += bench_index_lookups(service, size["index_keys"], size["lookups"], rng)
    finally:
        service.close()
    shutil.rmtree(os.path.join(work, "index-put-keys"))

    root = os.path.join(work, "store")
    messages = size["store_messages"]
    rows += build_store(root, messages)
    numbers = rng.integers(0, messages, size["lookups"]).tolist()
    with MessageStore.open(root, _config()) as store:
        dispatch_rows, sampled = bench_dispatcher(store, os.path.join(work, "index-dispatch"),
                                                  np.unique(np.asarray(numbers, dtype=np.int64)))
        shutil.rmtree(os.path.join(work, "index-dispatch"))
        rows += dispatch_rows
        rows += bench_store_lookups(store, numbers, sampled, messages)
    rows += bench_rebuild(root, messages)
    shutil.rmtree(root)
    for index_enabled in (False, True):
        rows.append(bench_put(os.path.join(work, f"put-{index_enabled}"), size["put_messages"], index_enabled))
        shutil.rmtree(os.path.join(work, f"put-{index_enabled}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", default=None, help="result JSON path")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="mqstore-bench-index-")
    started = time.perf_counter()
    try:
        rows = run(work, args.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed_s = time.perf_counter() - started
    targets = _targets(rows)
    _print(rows, f"mqstore index benchmark ({'quick' if args.quick else 'full'} run, default index sizes "
                 f"{fmt.HASH_SLOT_COUNT_DEFAULT:,} slots / {fmt.INDEX_ENTRY_COUNT_MAX_DEFAULT:,} entries; "
                 f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                 f"Python {platform.python_version()}; {elapsed_s:.0f} s)")
    verdict = lambda met: "met" if met else "NOT met"  # noqa: E731
    print(f"targets: build >= {BUILD_TARGET_KEYS_PER_S:,} keys/s: put_keys {targets['put_keys_keys_per_s']:,.0f} "
          f"({verdict(targets['put_keys_met'])}), dispatcher {targets['dispatcher_keys_per_s']:,.0f} "
          f"({verdict(targets['dispatcher_met'])})")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "index_quick.json" if args.quick else "index.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump({"command": "bench/index.py" + (" --quick" if args.quick else ""),
                   "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "seed": SEED,
                   "sizes": {name: values[1 if args.quick else 0] for name, values in SIZES.items()},
                   "python": platform.python_version(), "cores": os.cpu_count(), "elapsed_s": elapsed_s,
                   "targets": targets, "rows": [{"case": name, **result} for name, result in rows]},
                  handle, indent=2)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
