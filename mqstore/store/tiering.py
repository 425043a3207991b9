"""A store's tier, as its opener finds it: the URI saved in the store, and the reader of the tier's history.

`config/tier.json` tells a store opened without `tier_uri` (read_only opens, the command line, a writer reopened
without it) where its tier is. The writer saves it when opened with a tier_uri, in UTF-8 JSON:

    FIELD     TYPE             MEANING
    format    "mqstore-tier-uri"
    version   1
    uri       str or null      the tier's URI, when it carries no secret (no user info, no secret query value:
                               mqstore/tier/location.py's SECRET_QUERY_KEYS); null when it does: it is never written
    shown     str              the URI with its secrets masked (TierLocation.uri), for messages

Credentials come from pyarrow's usual configuration (AWS_* environment variables, the credentials file, an
instance's role), never from this file. With `uri` null an opener without tier_uri warns that the store's history
below its local log is in a tier it cannot name, and reads stop at the local log's start. The file is advisory:
a damaged one is reported (SettingsFileError) and a writer given a tier_uri writes it again.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse

from mqstore.commitlog.errors import SettingsFileError, StoreIOError
from mqstore.commitlog.mapped_file import write_file_atomically
from mqstore.store.config import StoreConfig
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import SECRET_QUERY_KEYS, TierLocation
from mqstore.tier.reader import TierReader

log = logging.getLogger(__name__)

TIER_FILE_NAME = "tier.json"  # under the store's config/ directory
TIER_FILE_FORMAT = "mqstore-tier-uri"
TIER_FILE_VERSION = 1
TIER_FILE_BYTES_MAX = 64 * 1024  # a larger file is refused rather than parsed


def tier_file_path(root: str) -> str:
    return os.path.join(root, "config", TIER_FILE_NAME)


def has_secrets(uri: str) -> bool:
    """Whether a tier URI carries credentials: user info, or a value of a secret query parameter."""
    parts = urllib.parse.urlsplit(uri)
    if "@" in parts.netloc:
        return True
    return any(key.lower() in SECRET_QUERY_KEYS for key, _ in
               urllib.parse.parse_qsl(parts.query, keep_blank_values=True))


def read_saved_tier(root: str) -> dict | None:
    """The store's `config/tier.json` as {"uri": str | None, "shown": str}, or None when it has none."""
    path = tier_file_path(root)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(TIER_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        saved = json.loads(raw) if len(raw) <= TIER_FILE_BYTES_MAX else None
    except (ValueError, UnicodeDecodeError):
        saved = None
    if not (isinstance(saved, dict) and saved.get("format") == TIER_FILE_FORMAT
            and saved.get("version") == TIER_FILE_VERSION and isinstance(saved.get("shown"), str)
            and (saved.get("uri") is None or (isinstance(saved["uri"], str) and saved["uri"]))):
        raise SettingsFileError(f"the store's tier file is not a {TIER_FILE_FORMAT} document (version "
                                f"{TIER_FILE_VERSION}, uri and shown); open the store with tier_uri to write it "
                                "again", path=path, rule="config.tier")
    return {"uri": saved["uri"], "shown": saved["shown"]}


def save_tier(root: str, location: TierLocation, uri: str) -> None:
    """Write `config/tier.json` for a writer opened with `uri` (module docstring), when it says something new."""
    document = {"format": TIER_FILE_FORMAT, "version": TIER_FILE_VERSION,
                "uri": None if has_secrets(uri) else location.uri, "shown": location.uri}
    try:
        current = read_saved_tier(root)
    except SettingsFileError:
        current = None
    if current == {"uri": document["uri"], "shown": document["shown"]}:
        return
    write_file_atomically(tier_file_path(root), json.dumps(document, indent=2).encode())


def adopt_saved_tier(root: str, config: StoreConfig) -> StoreConfig:
    """`config` with the store's saved tier URI when it was given none (module docstring)."""
    if config.tier_uri is not None:
        return config
    saved = read_saved_tier(root)
    if saved is None:
        return config
    if saved["uri"] is None:
        log.warning("the store at %s has a tier, %s, whose URI carries credentials and was not saved: pass tier_uri "
                    "(--tier-uri) to read what is no longer on local disk", root, saved["shown"])
        return config
    if config.archive_dir is not None:
        log.warning("the store at %s has a tier (%s), not used: this open sets archive_dir", root, saved["shown"])
        return config
    return config.adopting(tier_uri=saved["uri"])


def open_tier_reader(config: StoreConfig, location: TierLocation, codec) -> TierReader:
    """The reader of the tier at `location` for a store of `config` (its format settings, its cache bound)."""
    fields = {name: getattr(config, name) for name in manifest_module.STORE_FIELDS}
    return TierReader(location, fields, cache_bytes=config.tier_cache_bytes, codec=codec)
