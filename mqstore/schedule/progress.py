"""The schedule's files under config/: delayOffset.json (progress per level) and delayLevels.json (the levels).

Formats: mqstore/schedule/format.py. delayOffset.json is written as strict JSON with quoted keys (fastjson, which
RocketMQ reads it with, takes them) and read leniently: RocketMQ's fastjson writes the integer keys unquoted
(`{"offsetTable":{1:5,2:0}}`), which strict JSON refuses, so bare integer keys are quoted before parsing. An
unreadable file is logged and read as no progress (at-least-once: delivered again, never lost).
"""

from __future__ import annotations

import json
import logging
import os
import re

from mqstore.commitlog.errors import ConfigMismatchError
from mqstore.commitlog.mapped_file import write_file_atomically
from mqstore.schedule import format as sfmt

log = logging.getLogger(__name__)

_BARE_KEY = re.compile(r'([{,]\s*)(-?[0-9]{1,10})(\s*:)')
OFFSET_VALUE_MAX = 1 << 62  # a queue offset above this in the file is damage, read as 0


def read_offsets(path: str, level_count: int) -> dict[int, int]:
    """level -> queue offset from delayOffset.json (0 for a level it does not name, or when unreadable)."""
    offsets = {level: 0 for level in range(1, level_count + 1)}
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return offsets
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s unreadable (%s): every level starts at 0", path, exc)
        return offsets
    try:
        table = json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))["offsetTable"]
        items = table.items()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s is not RocketMQ's delay offset table (%s): every level starts at 0", path, exc)
        return offsets
    for key, value in items:
        level = sfmt.parse_java_int(key)
        if level in offsets and type(value) is int and 0 <= value <= OFFSET_VALUE_MAX:
            offsets[level] = value
        else:
            log.warning("%s: entry %r: %r ignored", path, key, value)
    return offsets


def write_offsets(path: str, offsets: dict[int, int]) -> None:
    table = {str(level): int(offset) for level, offset in sorted(offsets.items())}
    write_file_atomically(path, json.dumps({"offsetTable": table}, separators=(",", ":")).encode())


def resolve_levels(path: str, passed: str, explicit: bool, *, has_schedule_queues: bool) -> str:
    """The levels a store uses. Saved (config/delayLevels.json) only when they are not RocketMQ's default: no file
    means the default (as in a store RocketMQ wrote). The saved ones win over a default passed; a different value
    passed explicitly is ConfigMismatchError (due times already dispatched depend on them), and so is a
    non-default value for a store without the file whose schedule topic has queues (written with the default)."""
    if not os.path.exists(path):
        if passed.split() == sfmt.DEFAULT_DELAY_LEVELS.split():
            return sfmt.DEFAULT_DELAY_LEVELS
        if has_schedule_queues:
            if not explicit:
                return sfmt.DEFAULT_DELAY_LEVELS
            raise ConfigMismatchError(f"delay_levels={passed!r} but the store's schedule was written with the "
                                      f"default {sfmt.DEFAULT_DELAY_LEVELS!r}")
        write_file_atomically(path, json.dumps({"delay_levels": passed}).encode())
        return passed
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)["delay_levels"]
        sfmt.parse_levels(saved)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise sfmt.damage(path, "levels", f"not the delay levels mqstore writes ({exc})") from exc
    if saved.split() != passed.split() and explicit:
        raise ConfigMismatchError(f"delay_levels={passed!r} but the store's schedule was written with {saved!r}")
    return saved
