"""The format settings a store is opened with: the ones its caller passed, else the store's own.

A StoreConfig remembers which fields its caller passed (`StoreConfig.explicit_fields`). Opening a store
resolves each format setting (config.FORMAT_FIELDS, the two index sizes and index_enabled) in this order:

  1. passed explicitly: used as given, and checked against the store (ConfigMismatchError naming the setting);
  2. else saved in the store's `config/mqstore.json` (mqstore writes it when it creates a store);
  3. else, for a store without saved settings (one RocketMQ wrote), what its files say: the length of a CommitLog
     segment, the length of a ConsumeQueue file, and an IndexFile's length and header (below);
  4. else (a new store, or files that do not tell) the field's default.

`max_message_size_bytes`, when not passed, is lowered to what the store's segments can hold. The settings saved
in the store stay the reference: `config.save_or_check_format` saves or checks them after resolution.

An IndexFile is 40 + 4*S + 20*N bytes for S hash slots and N entries, one equation for two unknowns. A size
pair (S, N) is taken when exactly one of these candidates fits the file's length, its header's indexCount
(at most N; exactly N in a file that is not the last, which RocketMQ fills before it starts the next) and its
newest entry (which heads the chain of slot keyHash % S): the pair saved in config/mqstore.json, N from a full
file's indexCount, N = 4*S (RocketMQ's own ratio, 5 000 000 and 20 000 000), S's default, N's default. When none
or several fit, a reader is told to pass index_slot_count and index_entry_count_max; a writer rebuilds the
index (derived data) with the defaults.
"""

from __future__ import annotations

import collections
import json
import os
import struct

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import ConfigMismatchError
from mqstore.consumequeue import format as cqf
from mqstore.indexfile import format as index_format
from mqstore.store.config import (
    CONFIG_FILE_NAME,
    INDEX_ENABLED_KEY,
    MESSAGE_OVERHEAD_MAX_BYTES,
    RECORD_CRC_FROM_KEY,
    StoreConfig,
)

INDEX_SIZE_FIELDS = ("index_slot_count", "index_entry_count_max")
SEGMENTS_SAMPLED_MAX = 64  # segments whose lengths decide the log's segment size


def resolve_config(root: str, config: StoreConfig, *, read_only: bool) -> StoreConfig:
    """`config` with every format setting it was not given taken from the store at `root` (module docstring);
    ConfigMismatchError when a setting it was given contradicts the store's files."""
    explicit = config.explicit_fields
    saved = read_saved_settings(root)
    values = {}
    segment_file, segment_length = _segment_length(root)
    if "segment_size_bytes" not in explicit:
        found = saved.get("segment_size_bytes") or segment_length
        if isinstance(found, int) and found > 0:
            values["segment_size_bytes"] = found
    elif segment_length and segment_length != config.segment_size_bytes and "segment_size_bytes" not in saved:
        raise ConfigMismatchError(
            f"the CommitLog segment {segment_file} is {segment_length} bytes, but the config passes "
            f"segment_size_bytes={config.segment_size_bytes}: pass {segment_length} or leave it out")
    if "consume_queue_entries_per_file" not in explicit:
        found = saved.get("consume_queue_entries_per_file") or _consume_queue_entries(root)
        if isinstance(found, int) and found > 0:
            values["consume_queue_entries_per_file"] = found
    if "record_crc" not in explicit and isinstance(saved.get("record_crc"), bool):
        values["record_crc"] = saved["record_crc"]
    if INDEX_ENABLED_KEY not in explicit and isinstance(saved.get(INDEX_ENABLED_KEY), bool):
        values[INDEX_ENABLED_KEY] = saved[INDEX_ENABLED_KEY]
    if not explicit & set(INDEX_SIZE_FIELDS):
        values.update(_index_sizes(root, saved, read_only=read_only))
    segment = values.get("segment_size_bytes", config.segment_size_bytes)
    if "max_message_size_bytes" not in explicit:
        values["max_message_size_bytes"] = max(0, min(config.max_message_size_bytes,
                                                      segment - MESSAGE_OVERHEAD_MAX_BYTES))
    values = {name: value for name, value in values.items() if getattr(config, name) != value}
    return config.adopting(**values) if values else config


def saved_settings_damage(root: str) -> str | None:
    """Why the store's settings file cannot be one mqstore wrote for this store, or None (also without one): not
    a JSON object, a value of the wrong type, or a saved size the store's own files contradict (the length most
    of its segments have, of its ConsumeQueue files). For `repair=True`, which then sets the file aside."""
    path = os.path.join(root, "config", CONFIG_FILE_NAME)
    try:
        with open(path, "rb") as handle:
            saved = json.loads(handle.read())
    except OSError:
        return None  # none, or unreadable: the open reports that itself
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(saved, dict) or type(saved.get("format_version")) is not int:
        return "not a settings object with a format_version"
    for name in ("segment_size_bytes", "consume_queue_entries_per_file", *INDEX_SIZE_FIELDS):
        if name in saved and (type(saved[name]) is not int or saved[name] <= 0):
            return f"{name} is {saved[name]!r}"
    for name in ("record_crc", INDEX_ENABLED_KEY):
        if name in saved and type(saved[name]) is not bool:
            return f"{name} is {saved[name]!r}"
    start = saved.get(RECORD_CRC_FROM_KEY)
    if start is not None and (type(start) is not int or start < 0):
        return f"{RECORD_CRC_FROM_KEY} is {start!r}"
    _, segment_length = _segment_length(root)
    if segment_length and saved.get("segment_size_bytes", segment_length) != segment_length:
        return f"segment_size_bytes is {saved['segment_size_bytes']}, the segments are {segment_length} bytes"
    entries = _consume_queue_entries(root)
    if entries and saved.get("consume_queue_entries_per_file", entries) != entries:
        return (f"consume_queue_entries_per_file is {saved['consume_queue_entries_per_file']}, the queue files "
                f"hold {entries}")
    return None


def _segment_length(root: str) -> tuple[str | None, int | None]:
    """(a segment, its length): the length most of the log's segments have (one cut short or grown by damage
    does not decide it), the first such segment; (None, None) without segments."""
    directory = os.path.join(root, "commitlog")
    try:
        names = sorted(name for name in os.listdir(directory) if fmt.parse_segment_name(name) is not None)
    except OSError:
        return None, None
    paths = [os.path.join(directory, name) for name in names[:SEGMENTS_SAMPLED_MAX]]
    found = [(length, path) for path in paths if (length := _length(path))]
    if not found:
        return (paths[0] if paths else None), None
    common = collections.Counter(length for length, _ in found).most_common(1)[0][0]
    return next(path for length, path in found if length == common), common


def read_saved_settings(root: str) -> dict:
    """The store's saved settings, {} when it has none; a damaged file is reported by save_or_check_format."""
    try:
        with open(os.path.join(root, "config", CONFIG_FILE_NAME), "rb") as handle:
            saved = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _first_file(directory: str, parse_name) -> str | None:
    try:
        names = sorted(name for name in os.listdir(directory) if parse_name(name) is not None)
    except OSError:
        return None
    return os.path.join(directory, names[0]) if names else None


def _length(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.path.getsize(path) or None  # 0: a writer is still making it
    except OSError:
        return None


def _consume_queue_entries(root: str) -> int | None:
    """Entries per ConsumeQueue file from the first queue file found (a RocketMQ queue file is full length)."""
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
            length = _length(_first_file(os.path.join(directory, topic, queue), cqf.parse_file_name))
            if length and length % cqf.UNIT_SIZE_BYTES == 0:
                return length // cqf.UNIT_SIZE_BYTES
    return None


def _index_sizes(root: str, saved: dict, *, read_only: bool) -> dict:
    """index_slot_count and index_entry_count_max from the saved settings and the index files (module
    docstring): {} for the defaults."""
    directory = os.path.join(root, "index")
    try:
        names = sorted(name for name in os.listdir(directory) if index_format.parse_file_name(name) is not None)
    except OSError:
        names = []
    saved_pair = tuple(saved.get(name) for name in INDEX_SIZE_FIELDS)
    saved_pair = saved_pair if all(type(v) is int and v > 0 for v in saved_pair) else None
    if not names:
        return dict(zip(INDEX_SIZE_FIELDS, saved_pair)) if saved_pair else {}
    path = os.path.join(directory, names[0])
    length = None
    try:
        with open(path, "rb") as handle:
            length = os.fstat(handle.fileno()).st_size
            header = handle.read(index_format.HEADER_SIZE_BYTES)
            candidates = _index_candidates(length, header, saved_pair, full=len(names) > 1)
            fitting = sorted({pair for pair in candidates if _index_pair_fits(handle, length, header, pair)})
    except OSError:
        fitting = []
    if len(fitting) == 1:
        return dict(zip(INDEX_SIZE_FIELDS, fitting[0]))
    if read_only:
        raise ConfigMismatchError(
            f"the index file {path} is {length} bytes (40 + 4*slots + 20*entries), "
            "and neither the store's saved settings nor its header tell its sizes apart: pass index_slot_count and "
            "index_entry_count_max, or index_enabled=False")
    return {}  # the writer rebuilds the index with the defaults (engine_index)


def _index_candidates(length: int, header: bytes, saved_pair, *, full: bool) -> list[tuple[int, int]]:
    rest = length - index_format.HEADER_SIZE_BYTES
    candidates = [saved_pair] if saved_pair else []
    if len(header) == index_format.HEADER_SIZE_BYTES:
        index_count = index_format.HEADER_STRUCT.unpack(header)[5]
        if full and index_count > 0:
            candidates.append(((rest - index_format.ENTRY_SIZE_BYTES * index_count) // 4, index_count))
    slots_by_ratio = rest // (4 + 4 * index_format.ENTRY_SIZE_BYTES)
    candidates.append((slots_by_ratio, 4 * slots_by_ratio))
    default_slots, default_entries = StoreConfig.index_slot_count, StoreConfig.index_entry_count_max
    candidates.append((default_slots, (rest - 4 * default_slots) // index_format.ENTRY_SIZE_BYTES))
    candidates.append(((rest - index_format.ENTRY_SIZE_BYTES * default_entries) // 4, default_entries))
    return [pair for pair in candidates
            if pair[0] >= 1 and pair[1] >= index_format.INDEX_ENTRY_COUNT_MAX_MIN
            and index_format.file_size_bytes(*pair) == length]


def _index_pair_fits(handle, length: int, header: bytes, pair: tuple[int, int]) -> bool:
    """Whether an index file of `length` with this header can have `pair`'s sizes: its indexCount is at most N
    and its newest entry heads the chain of its slot (format rule 7)."""
    slots, entries = pair
    if len(header) != index_format.HEADER_SIZE_BYTES:
        return False
    index_count = index_format.HEADER_STRUCT.unpack(header)[5]
    if not 0 <= index_count <= entries:
        return False
    if index_count <= 1:
        return True  # no entry to look at: the sizes fit the length
    newest = index_count - 1
    handle.seek(index_format.entries_offset(slots) + index_format.ENTRY_SIZE_BYTES * newest)
    entry = handle.read(4)
    if len(entry) != 4:
        return False
    key_hash = struct.unpack(">i", entry)[0]
    if key_hash < 0:
        return False
    handle.seek(index_format.HEADER_SIZE_BYTES + 4 * (key_hash % slots))
    slot = handle.read(4)
    return len(slot) == 4 and struct.unpack(">i", slot)[0] == newest
