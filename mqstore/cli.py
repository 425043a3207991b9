"""The `mqstore` command. Exit codes: 0 ok, 1 error, 2 usage."""

from __future__ import annotations

import argparse
import sys

from commitlog.errors import StoreError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqstore", description="An embedded RocketMQ-format message store.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="write a demo store under the working directory, read it back, summarise")
    demo.add_argument("--store", default="demo-store", help="store directory (default: ./demo-store)")
    demo.add_argument("--messages", type=int, default=300_000, help="messages to write (default: 300000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from mqstore.demo import run_demo

            return run_demo(args.store, args.messages)
    except StoreError as exc:
        print(f"mqstore: {exc}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2
