"""The `mqstore` subcommands for store maintenance and lookups: recover, clean, query.

Kept apart from mqstore/cli/commands.py (the parser and the reading commands); both use mqstore/cli/common.py.
"""

from __future__ import annotations

import sys

from mqstore.cli.common import open_store, print_json, print_messages


def add_parsers(add) -> None:
    """Add the subcommands through `add(name, help)` (cli.py's helper that adds the common store options)."""
    recover = add("recover", "open the store for writing, which recovers it; print what recovery found and did")
    recover.add_argument("--repair", action="store_true",
                         help="cut the log at the first damaged record instead of failing (drops what follows)")
    add("clean", "run retention now: remove (or archive) expired segments and what points into them")
    query = add("query", "messages of a topic with a key (KEYS or UNIQ_KEY), newest first, through the index")
    query.add_argument("--topic", required=True)
    query.add_argument("--key", required=True)
    query.add_argument("--count", type=int, default=32, help="messages at most (default 32)")
    query.add_argument("--begin-ms", type=int, default=0, help="stored at or after this time (ms)")
    query.add_argument("--end-ms", type=int, default=None, help="stored at or before this time (ms)")


def cmd_recover(args) -> int:
    with open_store(args, read_only=False, repair=args.repair) as store:
        report = store.recovery_report.as_dict()
    if args.json:
        print_json(report)
    else:
        for name, value in report.items():
            print(f"{name}: {value}")
    return 0


def cmd_clean(args) -> int:
    with open_store(args, read_only=False) as store:
        report = store.clean_expired()
    if args.json:
        print_json(report)
    else:
        removed = report["segments_removed"]
        verb = "archived" if report["archived"] else "removed"
        print(f"{verb} {len(removed)} segment(s) ({report['bytes_freed']:,} bytes): {' '.join(removed) or '-'}")
        print(f"log starts at {report['log_min_offset']:,}; queue files removed {report['queue_files_removed']}, "
              f"index files removed {report['index_files_removed']}; disk used {report['disk_used_ratio']:.1%}")
    return 0


def cmd_query(args) -> int:
    with open_store(args, read_only=True) as store:
        if args.topic not in store.topics():
            print(f"mqstore: the store has no topic {args.topic}", file=sys.stderr)
            return 1
        messages = store.query(args.topic, args.key, max_count=args.count, begin_ms=args.begin_ms,
                               end_ms=args.end_ms)
        print_messages(args, messages)
    if not args.json:
        print(f"# {len(messages)} message(s)")
    return 0


def add_tier_parser(commands) -> None:
    """`mqstore tier verify URI [--repair-from STORE]`: its own arguments (a tier URI, not a store directory)."""
    tier = commands.add_parser("tier", help="check a tier (object storage) against its manifest")
    actions = tier.add_subparsers(dest="tier_command", required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check every object the tier's manifest lists: presence, size, "
                                "CRC-32; exit 1 on a problem")
    verify.add_argument("uri", metavar="URI", help="the tier: s3://bucket/prefix, file:///dir, a local path ...")
    verify.add_argument("--repair-from", metavar="STORE",
                        help="re-upload damaged objects from this store directory where its copy matches")
    verify.add_argument("--json", action="store_true", help="machine-readable JSON output")


def cmd_tier(args) -> int:
    from mqstore.cli.common import progress_bar
    from mqstore.tier.verify import verify_tier

    report = verify_tier(args.uri, repair_from=args.repair_from, progress=progress_bar)
    if args.json:
        print_json(report.as_dict())
        return 0 if report.ok else 1
    print(f"tier {report.uri}: manifest generation {report.generation}, log {report.start_offset}.."
          f"{report.end_offset}, {report.objects} objects, {report.bytes_checked:,} bytes checked, "
          f"{report.unlisted} unlisted")
    for slot in report.spoiled_slots:
        print(f"note [{slot['rule']}] {slot['object']}: {slot['message']}")
    for problem in report.problems:
        print(f"CORRUPT [{problem['rule']}] {problem['object']} at {problem['offset']}: {problem['message']}")
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more problems")
    for key in report.repaired:
        print(f"repaired {key} from {args.repair_from}")
    print("OK" if report.ok else f"CORRUPTION: {report.problem_count - len(report.repaired)} problems")
    return 0 if report.ok else 1
