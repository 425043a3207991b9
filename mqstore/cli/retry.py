"""The `mqstore` subcommands for a consumer group's dead letters: dead-letters (list), replay (put back).

A dead letter is listed with its original topic (RETRY_TOPIC, mqstore/consumer/retry.py); `replay` puts dead
letters back on that topic with their header fields and reconsume times 0. Replayed letters stay in the DLQ
(RocketMQ's DLQ is never consumed by the group); `--start` picks up after the ones already replayed.
"""

from __future__ import annotations

from mqstore.cli.common import open_store, print_json, print_messages
from mqstore.consumer import retry

REPLAY_BATCH_MESSAGES = 256  # dead letters read at once by replay


def add_parsers(add) -> None:
    """Add the subcommands through `add(name, help)` (cli.py's helper that adds the common store options)."""
    listing = add("dead-letters", "a consumer group's dead letters (%%DLQ%%<group>), with their original topic")
    listing.add_argument("--group", required=True)
    listing.add_argument("--start", type=int, default=0, help="DLQ queue offset to start from (default 0)")
    listing.add_argument("--count", type=int, default=32, help="messages at most (default 32)")
    replay = add("replay", "put a group's dead letters back on their original topic (reconsume times 0)")
    replay.add_argument("--group", required=True)
    replay.add_argument("--start", type=int, default=0, help="DLQ queue offset of the first to replay (default 0)")
    replay.add_argument("--count", type=int, default=None, help="dead letters at most (default: all from --start)")
    replay.add_argument("--queue-id", type=int, default=0, help="queue of the original topic to put them on")


def cmd_dead_letters(args) -> int:
    with open_store(args, read_only=True) as store:
        messages = retry.dead_letters(store, args.group, args.count, args.start)
        print_messages(args, messages)
    if not args.json:
        print(f"# {len(messages)} dead letter(s) of group {args.group}")
    return 0


def cmd_replay(args) -> int:
    replayed = []
    with open_store(args, read_only=False) as store:
        position, left = args.start, args.count
        while left is None or left > 0:
            batch = REPLAY_BATCH_MESSAGES if left is None else min(left, REPLAY_BATCH_MESSAGES)
            messages = retry.dead_letters(store, args.group, batch, position)
            if not messages:
                break
            for message in messages:
                result = retry.replay(store, message, args.queue_id)
                replayed.append({"dlq_offset": message.queue_offset, "topic": message.topic,
                                 "commitlog_offset": result.commitlog_offset, "status": result.status.name})
            position = messages[-1].queue_offset + 1
            left = None if left is None else left - len(messages)
        store.flush()
    if args.json:
        print_json({"replayed": replayed, "next_start": position})
    else:
        print(f"replayed {len(replayed)} dead letter(s) of group {args.group}; next --start {position}")
    return 0
