"""The writer process that tests/crash/test_tier_kill.py kills with SIGKILL while it uploads to its tier.

    python tests/crash/tier_writer_process.py ROOT TIER_URI --generation G [--count N] [--check ACKED] [--thread]

Opens the store at ROOT with `tier_kill_config(TIER_URI)` (a tier uploaded every millisecond, local retention
removing uploaded segments as soon as the manifest lists them; the uploader in its process, or with --thread a
thread of the writer's). With --check, it first reads back, through the
store it recovered, every put acknowledged before (the file ACKED: one `<seq> <commitlog_offset> <size>
<queue_offset>` line each): get() of its queue must return it at its queue offset and commitlog offset, with its
planned topic, body and keys, and query(topic, key) must return exactly it, whether its segment is on local disk or
only in the tier. Then it puts `planned_message(seq)` for seq = G * 1_000_000, + 1, ... until it is killed (with
--count, N puts, then it waits with the store open, uploading, until it is killed), printing one line per event, in
one write(2):

    OPENED <log end>
    LOST <seq> <what>                      --check: an acknowledged put not read back (at most CHECK_LOST_SHOWN)
    CHECKED <count> <lost>                 --check: done
    ACK <seq> <commitlog_offset> <size> <queue_offset>    put returned PUT_OK
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mqstore import FlushMode, GetStatus, MessageStore, PutStatus, StoreConfig  # noqa: E402
from tests.crash.checks import RETENTION_OFF, planned_message  # noqa: E402

GENERATION_SEQ_STRIDE = 1_000_000
WRITER_LIFETIME_MAX_S = 120.0  # a writer nobody kills stops by itself
PUT_PAUSE_EVERY = 50  # puts between short pauses, so that kills land in uploads as well as in puts
PUT_PAUSE_S = 0.002
CHECK_GET_ENTRIES = 1000  # entries a get of --check asks for at once
CHECK_LOST_SHOWN = 20


def tier_kill_config(tier_uri: str, upload_process: bool = True) -> StoreConfig:
    settings = dict(RETENTION_OFF, disk_max_used_space_ratio=0.001)  # every round removes what the tier lists
    return StoreConfig(dispatch_process=False, segment_size_bytes=64 * 1024, consume_queue_entries_per_file=64,
                       max_message_size_bytes=8192, store_host="10.0.0.7", store_port=10911, index_enabled=True,
                       index_slot_count=64, index_entry_count_max=256, flush_mode=FlushMode.ASYNC,
                       flush_interval_ms=5, flush_least_pages=1, flush_consume_queue_interval_ms=5,
                       file_reserved_hours=0, clean_interval_ms=10, tier_uri=tier_uri, tier_upload_interval_ms=1,
                       tier_backoff_max_ms=50, tier_upload_process=upload_process, **settings)


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def read_queues(store, queues) -> dict:
    """Every entry of each queue in `queues`, through get(): (topic, queue_id) -> {queue offset: message}."""
    found = {}
    for topic, queue_id in queues:
        messages = found[(topic, queue_id)] = {}
        offset, end = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        while offset < end:  # bounded by the queue's entries
            result = store.get(topic, queue_id, offset, max_count=CHECK_GET_ENTRIES)
            if result.status is not GetStatus.FOUND:
                break
            messages.update((message.queue_offset, message) for message in result.messages)
            offset = result.next_offset
    return found


def check_acked(store, path: str) -> None:
    """--check (module docstring): one LOST line per acknowledged put not read back, then CHECKED."""
    with open(path) as handle:
        acked = [tuple(int(part) for part in line.split()) for line in handle if line.strip()]
    planned = {seq: planned_message(seq, keys=True) for seq, _, _, _ in acked}
    queues = read_queues(store, sorted({(planned[seq].topic, planned[seq].queue_id) for seq in planned}))
    lost = 0
    for seq, offset, size, queue_offset in acked:
        want = planned[seq]
        got = queues[(want.topic, want.queue_id)].get(queue_offset)
        what = None
        if got is None or (got.commitlog_offset, got.size_bytes, got.topic, got.body, tuple(got.keys)) != (
                offset, size, want.topic, want.body, tuple(want.keys)):
            what = f"get({want.topic}/{want.queue_id}, {queue_offset}) returned {got!r}"
        else:
            found = [m.commitlog_offset for m in store.query(want.topic, want.keys[0], max_count=4)]
            if found != [offset]:
                what = f"query({want.topic}, {want.keys[0]}) found commitlog offsets {found}, not [{offset}]"
        if what is not None:
            lost += 1
            if lost <= CHECK_LOST_SHOWN:
                _say(f"LOST {seq} {what}")
    _say(f"CHECKED {len(acked)} {lost}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("tier_uri")
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--check", default=None)
    parser.add_argument("--thread", action="store_true")
    args = parser.parse_args(argv)
    store = MessageStore.open(args.root, tier_kill_config(args.tier_uri, upload_process=not args.thread))
    _say(f"OPENED {store.recovery_report.log_end}")
    if args.check is not None:
        check_acked(store, args.check)
    deadline = time.monotonic() + WRITER_LIFETIME_MAX_S
    seq = args.generation * GENERATION_SEQ_STRIDE
    last = None if args.count is None else seq + args.count
    while time.monotonic() < deadline and seq != last:
        message = planned_message(seq, keys=True)
        result = store.put(message)
        if result.status is PutStatus.PUT_OK:
            _say(f"ACK {seq} {result.commitlog_offset} {result.size_bytes} {result.queue_offset}")
        seq += 1
        if seq % PUT_PAUSE_EVERY == 0:
            time.sleep(PUT_PAUSE_S)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
