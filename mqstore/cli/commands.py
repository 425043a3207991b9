"""The `mqstore` command (also `python -m mqstore`). Exit codes: 0 ok, 1 error, 2 usage.

    mqstore put STORE --topic T [--queue Q] [--tags X] [--keys K] [--file F]     bodies: one per line
    mqstore get STORE --topic T --queue Q --offset N [--count C (default 32)] [--tags X]
    mqstore tail STORE --topic T [--group G] [--queue Q]... [--tags X] [--from first|last] [--follow]
                       [--max-messages N] [--timeout-ms MS]
    mqstore topics STORE | stats STORE | dump STORE --offset N | verify STORE
    mqstore recover STORE [--repair] | clean STORE | query STORE --topic T --key K
    mqstore tier verify URI [--repair-from STORE] [--json]
    mqstore demo [--store DIR] [--messages N] | --version

Store commands take `--json` (one JSON document on stdout; `tail` writes one per message, JSON Lines) and the
format settings `--segment-size-bytes` / `--cq-entries-per-file` / `--index-slot-count` /
`--index-entry-count-max`. Those not given are the store's, as MessageStore.open(path) takes them: from
`config/mqstore.json` when the store has it, else from its files (a RocketMQ store's CommitLog and ConsumeQueue
files are full-size; an IndexFile's header), else the defaults; given options must match the store's.
`--tier-uri URI` names the store's tier (the messages that left local disk are read from it); without it, the
tier the store saved in `config/tier.json` (a writer saves its tier's URI there when it carries no credentials;
credentials come from pyarrow's usual environment variables and files).

`put` opens the store for writing (creating it; a put that fails before storing a message removes the
directory it created). A body is a line without its ending, LF or CRLF (a CR elsewhere is part of the body).
Every other command opens it read_only: no lock, nothing written (except `tail --group`, which commits the
group's offsets to `config/consumerOffset.json`), a missing store is an error, and a writer may be running in
another process. Progress bars (tqdm, on stderr) show on long work when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import signal
import sys
import threading
import time

from mqstore import __version__
from mqstore.cli import admin as cli_admin
from mqstore.cli import export as cli_export
from mqstore.cli import retry as cli_retry
from mqstore.cli.common import (
    body_text,
    hexdump,
    message_dict,
    message_line,
    open_store,
    print_json,
    print_messages,
    progress_bar,
    resolved_store_config,
    table,
)
from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import InvalidMessageError, StoreError
from mqstore.commitlog.message import Message
from mqstore.consumer import open_consumer
from mqstore.store.engine import MessageStore
from mqstore.store.reads import GetStatus
from mqstore.store.verify import log_written_end, queue_usage, verify_store

PUT_BATCH_MESSAGES = 1000  # messages `put` stores per put_batch
TAIL_BATCH_MESSAGES = 256  # messages `tail` asks one poll for
FOLLOW_POLL_TIMEOUT_MS = 1000  # how long one poll of `tail --follow` waits before looking again
GET_COUNT_DEFAULT = inspect.signature(MessageStore.get).parameters["max_count"].default  # the API's default


# --- arguments -----------------------------------------------------------------------------------------------
def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


_non_negative = _int_at_least(0)
_positive = _int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqstore", description="An embedded RocketMQ-format message store.")
    parser.add_argument("--version", action="version", version=f"mqstore {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="write a demo store under the working directory, read it back, summarise")
    demo.add_argument("--store", default="demo-store", help="store directory (default: ./demo-store)")
    demo.add_argument("--messages", type=int, default=300_000, help="messages to write (default: 300000)")

    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("store", metavar="STORE", help="the store directory")
    store.add_argument("--json", action="store_true", help="machine-readable JSON output")
    store.add_argument("--segment-size-bytes", type=_positive, metavar="N",
                       help="CommitLog segment size, for a store without config/mqstore.json")
    store.add_argument("--cq-entries-per-file", type=_positive, metavar="N",
                       help="ConsumeQueue entries per file, for a store without config/mqstore.json")
    store.add_argument("--index-slot-count", type=_positive, metavar="N",
                       help="hash slots per index file (default 5000000; RocketMQ's maxHashSlotNum)")
    store.add_argument("--index-entry-count-max", type=_positive, metavar="N",
                       help="entries per index file (default 20000000; RocketMQ's maxIndexNum)")
    store.add_argument("--tier-uri", metavar="URI",
                       help="the store's tier (s3://bucket/prefix, file:///dir, ...), to read what left local disk; "
                            "default: the one the store saved (credentials come from the environment)")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[store], help=help_text, description=help_text)

    put = add("put", "store messages: one body per line of stdin (or of --file), without its newline")
    put.add_argument("--topic", required=True)
    put.add_argument("--queue", type=_non_negative, default=0, help="queue id (default 0)")
    put.add_argument("--tags", help="the TAGS of every message")
    put.add_argument("--keys", action="append", default=[], help="keys of every message (space-separated; "
                     "may be repeated)")
    put.add_argument("--file", help="read bodies from this file instead of stdin")

    get = add("get", "print messages of one queue from a queue offset")
    get.add_argument("--topic", required=True)
    get.add_argument("--queue", type=_non_negative, required=True)
    get.add_argument("--offset", type=_non_negative, required=True, help="queue offset of the first message")
    get.add_argument("--count", type=_positive, default=GET_COUNT_DEFAULT,
                     help=f"messages at most (default {GET_COUNT_DEFAULT}, as MessageStore.get)")
    get.add_argument("--tags", help="only messages with these tags: 'A' or 'A || B'")

    tail = add("tail", "print a topic's messages; with --group from the group's committed offsets, committing")
    tail.add_argument("--topic", required=True)
    tail.add_argument("--group", help="consumer group: start at its committed offsets and commit what is printed")
    tail.add_argument("--queue", type=_non_negative, action="append", dest="queues", metavar="Q",
                      help="only this queue (may be repeated; default all)")
    tail.add_argument("--tags", help="only messages with these tags: 'A' or 'A || B'")
    tail.add_argument("--from", dest="start", choices=("first", "last"), default="first",
                      help="where queues without a committed offset start (default first)")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new messages (until Ctrl-C)")
    tail.add_argument("--max-messages", type=_positive, metavar="N", help="stop after N messages")
    tail.add_argument("--timeout-ms", type=_non_negative, metavar="MS",
                      help="with --follow: stop when no message arrived for MS milliseconds")

    add("topics", "list the topics and their queues")
    add("stats", "per queue: min/max offset, messages, bytes; the log's positions, dispatch and flush lag")
    dump = add("dump", "print the record at a commitlog offset, every field, body as hex and text")
    dump.add_argument("--offset", type=_non_negative, required=True, help="commitlog offset of the record")
    add("verify", "check every record's CRC, segment ends, ConsumeQueue entries and index files; exit 1 on corruption")
    cli_admin.add_parsers(add)
    cli_retry.add_parsers(add)
    cli_admin.add_tier_parser(commands)
    cli_export.add_parser(add)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "demo":
            from mqstore.demo import run_demo

            return run_demo(args.store, args.messages)
        return _COMMANDS[args.command](args)
    except StoreError as exc:
        print(f"mqstore: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our output went away (`| head`): stop quietly
        _silence_stdout()
        return 0
    except OSError as exc:
        print(f"mqstore: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# --- commands ------------------------------------------------------------------------------------------------
class OversizedLineError(InvalidMessageError):
    """An input line of `put` longer than the store takes as a message body."""


def _open_input(args):
    """--file (opened before the store, so a missing file creates nothing) or stdin, as a binary file."""
    if args.file is not None:
        return open(args.file, "rb")
    return getattr(sys.stdin, "buffer", sys.stdin)


def _bodies(handle, body_size_max: int):
    """Each line of `handle` as bytes, without its ending (LF or CRLF); OversizedLineError naming the line
    (counted from 1) and the limit for one over `body_size_max` bytes."""
    for number, line in enumerate(handle, 1):
        if isinstance(line, str):
            line = line.encode("utf-8")
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if len(line) > body_size_max:
            raise OversizedLineError(f"line {number} is {len(line):,} bytes, over the store's limit of "
                                      f"{body_size_max:,} bytes a message body (max_message_size_bytes)")
        yield line


def _first_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (what a put would create), or None."""
    missing = None
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing = path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


class _PutProgress:
    """What `put` stored so far: the first and last PutResult and the count."""

    def __init__(self):
        self.first = self.last = None
        self.stored = 0

    def add(self, placed: list) -> None:
        self.first, self.last, self.stored = self.first or placed[0], placed[-1], self.stored + len(placed)


def _cmd_put(args) -> int:
    created = _first_missing(args.store)
    handle = _open_input(args)
    progress = _PutProgress()
    try:
        _put_lines(args, handle, progress)
    except BaseException as exc:
        if progress.stored and isinstance(exc, StoreError):
            print(f"mqstore: {progress.stored} messages were stored before the error", file=sys.stderr)
        if created is not None and progress.stored == 0:  # nothing stored: leave no empty store behind
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        if args.file is not None:
            handle.close()
    first, last, stored = progress.first, progress.last, progress.stored
    if args.json:
        print_json({"topic": args.topic, "queue_id": args.queue, "count": stored,
                     "first_queue_offset": first.queue_offset if first else None,
                     "last_queue_offset": last.queue_offset if last else None,
                     "first_msg_id": first.msg_id if first else None, "last_msg_id": last.msg_id if last else None})
    elif stored:
        print(f"stored {stored} messages in {args.topic}/{args.queue}: queue offsets {first.queue_offset}.."
              f"{last.queue_offset}, msg ids {first.msg_id}..{last.msg_id}")
    else:
        print("stored 0 messages (no input lines)")
    return 0


def _put_lines(args, handle, progress: _PutProgress) -> None:
    """Store each line of `handle`, PUT_BATCH_MESSAGES a batch; the lines before a bad one are stored."""
    keys = tuple(key for group in args.keys for key in group.split())
    bar = progress_bar(None, "put", "msg")
    with open_store(args, read_only=False) as store:
        batch = []
        try:
            for body in _bodies(handle, store.config.max_message_size_bytes):
                batch.append(Message(args.topic, body, queue_id=args.queue, tags=args.tags, keys=keys))
                if len(batch) == PUT_BATCH_MESSAGES:
                    progress.add(store.put_batch(batch))
                    bar.update(len(batch))
                    batch = []
        except OversizedLineError:
            if batch:
                progress.add(store.put_batch(batch))  # the lines before the oversized one are stored
            raise
        finally:
            bar.close()
        if batch:
            progress.add(store.put_batch(batch))


def _cmd_get(args) -> int:
    with open_store(args, read_only=True) as store:
        result = store.get(args.topic, args.queue, args.offset, max_count=args.count, tags=args.tags)
        if result.status is GetStatus.NO_MATCHED_LOGIC_QUEUE:
            print(f"mqstore: the store has no queue {args.topic}/{args.queue}", file=sys.stderr)
            return 1
        if args.json:
            print_json({"status": result.status.value, "next_offset": result.next_offset,
                         "min_offset": result.min_offset, "max_offset": result.max_offset,
                         "messages": [message_dict(message) for message in result.messages]})
        else:
            for message in result.messages:
                print(message_line(message))
            print(f"# {result.status.value}: {len(result.messages)} messages, next offset {result.next_offset} "
                  f"(queue offsets {result.min_offset}..{result.max_offset})")
    return 0


class _DeferredInterrupt:
    """While installed, Ctrl-C raises KeyboardInterrupt except inside `critical` blocks, where it is held
    until the block ends (so a printed batch is always committed). A no-op outside the main thread."""

    def __init__(self):
        self.requested = False
        self.in_critical = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if not self.in_critical:
            raise KeyboardInterrupt

    def __enter__(self) -> "_DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _cmd_tail(args) -> int:
    with open_store(args, read_only=True) as store:
        if not args.follow and args.queues is None and args.topic not in store.topics():
            print(f"mqstore: the store has no topic {args.topic}", file=sys.stderr)
            return 1
        consumer = open_consumer(store, args.group, args.topic, args.queues, tags=args.tags,
                                 consume_from=args.start)
        with _DeferredInterrupt() as interrupt:
            try:
                _tail(args, consumer, interrupt)
            except KeyboardInterrupt:
                pass  # Ctrl-C ends tail; every printed batch was committed
    return 0


def _tail(args, consumer, interrupt: _DeferredInterrupt) -> None:
    limit = args.max_messages
    printed = 0
    idle_s = None if args.timeout_ms is None or not args.follow else args.timeout_ms / 1000
    idle_deadline = None if idle_s is None else time.monotonic() + idle_s
    while (limit is None or printed < limit) and not interrupt.requested:
        wanted = TAIL_BATCH_MESSAGES if limit is None else min(TAIL_BATCH_MESSAGES, limit - printed)
        if not args.follow:
            wait_ms = 0
        elif idle_deadline is None:
            wait_ms = FOLLOW_POLL_TIMEOUT_MS
        else:
            wait_ms = max(0, int((idle_deadline - time.monotonic()) * 1000))
        messages = consumer.poll(wanted, wait_ms)
        if messages:
            interrupt.in_critical = True
            try:
                print_messages(args, messages)
                consumer.commit()  # after printing: at-least-once
            finally:
                interrupt.in_critical = False
            printed += len(messages)
            idle_deadline = None if idle_s is None else time.monotonic() + idle_s
        elif not args.follow or (idle_deadline is not None and time.monotonic() >= idle_deadline):
            return


def _cmd_topics(args) -> int:
    with open_store(args, read_only=True) as store:
        topics = store.topics()
        counts = {topic: sum(store.max_offset(topic, q) - store.min_offset(topic, q) for q in queue_ids)
                  for topic, queue_ids in topics.items()}
    if args.json:
        print_json({"topics": {topic: {"queues": queue_ids, "messages": counts[topic]}
                                for topic, queue_ids in topics.items()}})
    else:
        rows = [[topic, ",".join(map(str, queue_ids)), counts[topic]] for topic, queue_ids in topics.items()]
        print("\n".join(table(rows, ["TOPIC", "QUEUES", "MESSAGES"])))
    return 0


def _flush_lag(engine: dict) -> int | None:
    """The flush lag MessageStore.stats() reports; None for a read-only view (only the writer knows it)."""
    if engine.get("read_only"):
        return None
    flush = engine.get("flush")
    if isinstance(flush, dict) and "flush_lag_bytes" in flush:
        return flush["flush_lag_bytes"]
    return engine["commitlog"].get("flush_lag_bytes")


def _cmd_stats(args) -> int:
    with open_store(args, read_only=True) as store:
        engine = store.stats()
        usage = queue_usage(args.store, store.config, progress_bar)
        end = log_written_end(args.store, store.config)
        log_min = engine["commitlog"]["min_offset"]
        dispatched = max([log_min] + [queue["commitlog_end"] for queue in usage.values()])
        dispatch_lag = engine["dispatch"]["lag_bytes"]
        if dispatch_lag is None:  # read_only: the lag the ConsumeQueue files show
            dispatch_lag = max(0, end - dispatched)
        flush_lag = _flush_lag(engine)
    topics: dict = {}
    for (topic, queue_id), queue in sorted(usage.items()):
        topics.setdefault(topic, {})[str(queue_id)] = {
            "min_offset": queue["min_offset"], "max_offset": queue["max_offset"],
            "messages": queue["max_offset"] - queue["min_offset"], "bytes": queue["bytes"]}
    summary = {"commitlog": {"segments": engine["commitlog"]["segments"], "min_offset": log_min,
                             "end_offset": end, "bytes": end - log_min},
               "dispatched_offset": dispatched, "dispatch_lag_bytes": dispatch_lag, "flush_lag_bytes": flush_lag,
               "topics": topics, "tier": _tier_summary(engine["tier"])}
    if args.json:
        print_json(summary)
        return 0
    print(f"commitlog: {summary['commitlog']['segments']} segments, offsets {log_min}..{end} ({end - log_min} bytes)")
    if summary["tier"] is not None:
        tier = summary["tier"]
        print(f"tier: {tier['uri']}, offsets {tier['start_offset']}..{tier['end_offset']}; reads reach offset "
              f"{tier['read_min_offset']}" + (f" ({tier['last_error']})" if tier.get("last_error") else ""))
    print(f"dispatch lag: {dispatch_lag} bytes (ConsumeQueues reach offset {dispatched})")
    print("flush lag: " + ("unknown (a read-only view: only the writer knows)" if flush_lag is None
                           else f"{flush_lag} bytes"))
    rows = [[topic, queue_id, q["min_offset"], q["max_offset"], q["messages"], q["bytes"]]
            for topic, queues in topics.items() for queue_id, q in queues.items()]
    print("\n".join(table(rows, ["TOPIC", "QUEUE", "MIN_OFFSET", "MAX_OFFSET", "MESSAGES", "BYTES"])))
    return 0


def _tier_summary(tier: dict | None) -> dict | None:
    """What `stats` shows of the store's tier: where it is, the log it holds, where reads start."""
    if tier is None:
        return None
    return {"uri": tier["uri"], "start_offset": tier.get("start_offset"), "end_offset": tier.get("uploaded_end"),
            "read_min_offset": tier.get("read_min_offset"), "last_error": tier.get("last_error")}


def _cmd_dump(args) -> int:
    with open_store(args, read_only=True) as store:
        message = store.read_at(args.offset)
    record = message_dict(message)
    record.update(magic_code=f"0x{message.magic_code:08X}", crc_ok=fmt.body_crc(message.body) == message.body_crc,
                  prepared_transaction_offset=message.prepared_transaction_offset, body_length=len(message.body))
    if args.json:
        print_json(record)
        return 0
    for name, value in record.items():
        if name not in ("body_text", "body_hex"):
            print(f"{name}: {value}")
    text = body_text(message.body)
    print(f"body text: {text if text is not None else '(not printable UTF-8)'}")
    print(f"body hex ({len(message.body)} bytes):")
    print("\n".join(hexdump(message.body)))
    return 0


def _cmd_verify(args) -> int:
    # As a writer would (read_only=False): index files of sizes nothing tells are reported as not checked.
    report = verify_store(args.store, resolved_store_config(args, read_only=False), progress_bar)
    if args.json:
        print_json(report.as_dict())
        return 0 if report.ok else 1
    print(f"commitlog: {report.segments} segments, {report.records} records, {report.blanks} end-of-segment "
          f"blanks, offsets {report.log_min_offset}..{report.log_end_offset}")
    print(f"consumequeues: {report.queues} queues, {report.entries} entries checked"
          + (f" ({report.entries_removed} below the log's start)" if report.entries_removed else ""))
    if report.index_not_checked:  # index files whose sizes neither the store nor their headers tell
        print(f"index: not checked: {report.index_not_checked}")
    elif report.index_files:
        print(f"index: {report.index_files} files checked")
    for problem in report.problems:
        print(f"CORRUPT [{problem.rule}] {problem}")
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more problems")
    print("OK" if report.ok else f"CORRUPTION: {report.problem_count} problems")
    return 0 if report.ok else 1


_COMMANDS = {"put": _cmd_put, "get": _cmd_get, "tail": _cmd_tail, "topics": _cmd_topics, "stats": _cmd_stats,
             "dump": _cmd_dump, "verify": _cmd_verify,
             "recover": cli_admin.cmd_recover, "clean": cli_admin.cmd_clean, "query": cli_admin.cmd_query,
             "tier": cli_admin.cmd_tier,
             "dead-letters": cli_retry.cmd_dead_letters, "replay": cli_retry.cmd_replay,
             "export": cli_export.cmd_export}
