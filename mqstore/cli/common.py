"""What the `mqstore` subcommands share: the StoreConfig a store is opened with, and the output helpers."""

from __future__ import annotations

import json
import os
import sys

from mqstore.commitlog import format as fmt
from mqstore.consumequeue import format as cqf
from mqstore.indexfile import format as index_format
from mqstore.store.config import CONFIG_FILE_NAME, StoreConfig
from mqstore.store.engine import MessageStore

MESSAGE_SIZE_DEFAULT_BYTES = StoreConfig.max_message_size_bytes
_RECORD_OVERHEAD_MAX_BYTES = (fmt.RECORD_SIZE_FIXED + fmt.TOPIC_LENGTH_MAX + fmt.PROPERTIES_LENGTH_MAX
                              + fmt.END_FILE_MIN_BLANK_LENGTH)


# --- opening a store -----------------------------------------------------------------------------------------
def _saved_format(root: str) -> dict:
    try:
        with open(os.path.join(root, "config", CONFIG_FILE_NAME), "rb") as handle:
            saved = json.loads(handle.read())
    except (OSError, ValueError):
        return {}  # a bad file is reported by the store's own check when it opens
    return saved if isinstance(saved, dict) else {}


def _first_file_size(directory: str, is_name) -> int | None:
    try:
        names = sorted(name for name in os.listdir(directory) if is_name(name))
        return os.path.getsize(os.path.join(directory, names[0])) if names else None
    except OSError:
        return None


def _inferred_cq_entries(root: str) -> int | None:
    directory = os.path.join(root, "consumequeue")
    try:
        topics = sorted(os.listdir(directory))
    except OSError:
        return None
    for topic in topics:
        try:
            queues = sorted(os.listdir(os.path.join(directory, topic)))
        except OSError:
            continue
        for queue in queues:
            size = _first_file_size(os.path.join(directory, topic, queue),
                                    lambda name: cqf.parse_file_name(name) is not None)
            if size and size % cqf.UNIT_SIZE_BYTES == 0:
                return size // cqf.UNIT_SIZE_BYTES
    return None


def _index_settings(args, root: str) -> dict:
    """Index settings to open `root` with: the options if given; the defaults when the store has no index files
    or default-sized ones; otherwise the index stays off (an index file's size does not tell its two sizes
    apart), and a later open with the right sizes catches the index up."""
    if args.index_slot_count or args.index_entry_count_max:
        return {"index_slot_count": args.index_slot_count or StoreConfig.index_slot_count,
                "index_entry_count_max": args.index_entry_count_max or StoreConfig.index_entry_count_max}
    size = _first_file_size(os.path.join(root, "index"), lambda name: index_format.parse_file_name(name) is not None)
    default = index_format.file_size_bytes(StoreConfig.index_slot_count, StoreConfig.index_entry_count_max)
    return {} if size is None or size == default else {"index_enabled": False}


def store_config(args) -> StoreConfig:
    """The StoreConfig to open args.store with: options, else the saved format, else the files' sizes."""
    root = args.store
    saved = _saved_format(root)
    segment = (args.segment_size_bytes or saved.get("segment_size_bytes")
               or _first_file_size(os.path.join(root, "commitlog"),
                                   lambda name: fmt.parse_segment_name(name) is not None)
               or StoreConfig.segment_size_bytes)
    entries = (args.cq_entries_per_file or saved.get("consume_queue_entries_per_file") or _inferred_cq_entries(root)
               or StoreConfig.consume_queue_entries_per_file)
    message_max = max(0, min(MESSAGE_SIZE_DEFAULT_BYTES, segment - _RECORD_OVERHEAD_MAX_BYTES))
    return StoreConfig(segment_size_bytes=segment, consume_queue_entries_per_file=entries,
                       max_message_size_bytes=message_max, **_index_settings(args, root))


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
