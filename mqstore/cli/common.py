"""What the `mqstore` subcommands share: the StoreConfig a store is opened with, and the output helpers."""

from __future__ import annotations

import json
import sys

from mqstore.store.config import StoreConfig
from mqstore.store.engine import MessageStore
from mqstore.store.settings import resolve_config


# --- opening a store -----------------------------------------------------------------------------------------
def store_config(args) -> StoreConfig:
    """The StoreConfig to open args.store with: the format options given on the command line, and nothing else,
    so that opening takes every other format setting from the store as the API does (mqstore/store/settings.py:
    its saved settings, else its files' sizes, else the defaults); and --tier-uri, without which the store's
    saved tier is used (mqstore/store/tiering.py)."""
    given = {"segment_size_bytes": args.segment_size_bytes, "consume_queue_entries_per_file": args.cq_entries_per_file,
             "index_slot_count": getattr(args, "index_slot_count", None),
             "index_entry_count_max": getattr(args, "index_entry_count_max", None)}
    settings = {name: value for name, value in given.items() if value}
    if getattr(args, "tier_uri", None):  # else the tier the store saved (config/tier.json), if any
        settings["tier_uri"] = args.tier_uri
    return StoreConfig(**settings)


def resolved_store_config(args, *, read_only: bool) -> StoreConfig:
    """store_config(args) with the store's own settings filled in, as MessageStore.open resolves them."""
    return resolve_config(args.store, store_config(args), read_only=read_only)


def open_store(args, *, read_only: bool, repair: bool = False):
    return MessageStore.open(args.store, store_config(args), read_only=read_only, repair=repair)


class _NoBar:
    def update(self, count: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, description: str, unit: str):
    """A tqdm bar on stderr when stderr is a terminal (and tqdm is installed), else one that does nothing."""
    if not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=description, unit=unit, unit_scale=True, file=sys.stderr, leave=False)


# --- output --------------------------------------------------------------------------------------------------
def print_json(data) -> None:
    print(json.dumps(data, ensure_ascii=False), flush=True)


def body_text(body: bytes) -> str | None:
    """The body as text when it is printable UTF-8 (tabs allowed), else None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.replace("\t", " ").isprintable() else None


def message_dict(message) -> dict:
    return {
        "topic": message.topic, "queue_id": message.queue_id, "queue_offset": message.queue_offset,
        "commitlog_offset": message.commitlog_offset, "size_bytes": message.size_bytes, "msg_id": message.msg_id,
        "tags": message.tags, "keys": list(message.keys), "properties": message.properties,
        "flag": message.flag, "sys_flag": message.sys_flag, "born_timestamp_ms": message.born_timestamp_ms,
        "store_timestamp_ms": message.store_timestamp_ms, "born_host": message.born_host,
        "store_host": message.store_host, "reconsume_times": message.reconsume_times,
        "body_crc": message.body_crc, "body_text": body_text(message.body), "body_hex": message.body.hex(),
    }


def message_line(message) -> str:
    text = body_text(message.body)
    return (f"{message.topic}/{message.queue_id} @{message.queue_offset} commitlog={message.commitlog_offset} "
            f"tags={message.tags or '-'} keys={','.join(message.keys) or '-'} "
            f"body={text if text is not None else '0x' + message.body.hex()}")


def hexdump(data: bytes) -> list[str]:
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        shown = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"  {at:08x}  {' '.join(f'{byte:02x}' for byte in chunk):<47}  |{shown}|")
    return lines


def table(rows: list[list], header: list[str]) -> list[str]:
    cells = [header] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def print_messages(args, messages) -> None:
    for message in messages:
        if args.json:
            print(json.dumps(message_dict(message), ensure_ascii=False))
        else:
            print(message_line(message))
    sys.stdout.flush()
