"""The tier's manifest: which objects of a tier a reader may trust, with their sizes and checksums.

A tier is a RocketMQ store laid out in an object store under one prefix, byte for byte as on disk:

    <prefix>/commitlog/<20 digits>                       sealed CommitLog segments, segment_size_bytes each
    <prefix>/consumequeue/<topic>/<queue id>/<20 digits> ConsumeQueue files, full size, entries below the tier's end
    <prefix>/index/<17 digits>                           IndexFiles the store has finished
    <prefix>/abort                                       RocketMQ's crash marker, while queue files lag the log
    <prefix>/tier/manifest.0.json, manifest.1.json       the manifest, in two slots

so that a copy of the prefix is a store RocketMQ 4.4.0 loads (its loader ignores `tier/`). The manifest is written
after every object it lists, and an object is listed only after it was read back and its checksum matched what
was sent: an object not listed (an upload a crash interrupted, a temporary name) is invisible to readers.

Two slots. Generation g is written to `tier/manifest.<g % 2>.json`, over generation g - 2: a write torn by a crash
(an object store may keep the part of a PUT it received) spoils one slot and leaves the other, generation g - 1,
whole. A reader reads both and takes the newest whole one. Each slot is one line of UTF-8 JSON checked by its own
CRC-32, laid out so that it is also plain JSON:

    {"manifest":<DOCUMENT>,"crc32":"<8 lower-case hex digits: CRC-32 of the DOCUMENT's bytes>"}

DOCUMENT, one JSON object:

    FIELD            TYPE                  MEANING
    format           "mqstore-tier"        what the file is
    version          1                     this layout
    generation       int >= 1              one more at each write of the manifest
    written_ms       int                   when it was written (ms since the epoch)
    store            object                segment_size_bytes, consume_queue_entries_per_file, index_slot_count,
                                           index_entry_count_max, record_crc_from_offset (int or null): the store's
                                           format settings, what a reader needs to read the objects
    segments         [[base, crc32], ...]
                                           the CommitLog segments in the tier, by base offset, contiguous, each
                                           sealed (its records end with RocketMQ's end-of-file blank); the CRC-32 is
                                           of the whole object
    queues_end       int or null           every queue's entries below this commitlog offset are in the queue files
                                           listed (null: none yet); at most the tier's end
    queues           {topic: {queue id: [[name, entries, crc32], ...]}}
                                           each queue's files by name; `entries` units (fillers included) hold the
                                           queue's entries below queues_end, the rest of the file is zeros; the
                                           CRC-32 is of those units' bytes (a later upload of the same file with
                                           more entries keeps that prefix, so it still matches)
    index            [[name, size, crc32, end_commitlog_offset], ...]
                                           finished IndexFiles, every entry below end_commitlog_offset

Validity rule: a slot is valid iff (0) it has the wrapper above and its DOCUMENT's CRC-32 matches, (1) DOCUMENT is
a JSON object with the format and version above, (2) every number is an int in its range (offsets and sizes in
0..2^63-1, checksums in 0..2^32-1), (3) segments are sorted and contiguous, (4) queues_end is at most the tier's
end, and null only when no queue file is listed, (5) names are the 20- (queue) or 17-digit (index) names the store
uses and topics are valid topic names, (6) a queue file holds at most consume_queue_entries_per_file units.
Anything else raises CorruptionError with rule `tier.manifest`, naming the manifest's object.

The tier's end is the end of its last segment; every record below it is in the tier. Queue files cover the log up
to queues_end, which the uploader moves up less often than the end (`tier_queue_refresh_bytes`: the last file of
every queue is sent whole each time, so a refresh per segment would send each active queue's 6 MB file per
segment). While queues_end is below the end, the tier also holds RocketMQ's empty `abort` marker at its root, so
that RocketMQ 4.4.0 loading a copy recovers as after a crash: it walks the log and dispatches what the queue files
lack (after a clean load it would not: its start dispatches only records written after it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import validate_topic
from mqstore.commitlog.errors import CorruptionError, InvalidMessageError
from mqstore.consumequeue import format as queue_fmt
from mqstore.indexfile import format as index_fmt
from mqstore.tier.location import crc32

MANIFEST_KEYS = ("tier/manifest.0.json", "tier/manifest.1.json")  # generation g goes to MANIFEST_KEYS[g % 2]
SLOT_HEAD = b'{"manifest":'
SLOT_TAIL_BYTES = len(b',"crc32":"00000000"}')
MANIFEST_FORMAT = "mqstore-tier"
MANIFEST_VERSION = 1
MANIFEST_BYTES_MAX = 1 << 30  # a manifest larger than this is refused rather than parsed
OFFSET_MAX = (1 << 63) - 1
CRC_MAX = (1 << 32) - 1


def segment_key(base_offset: int) -> str:
    return f"commitlog/{fmt.segment_name(base_offset)}"


def queue_key(topic: str, queue_id: int, name: str) -> str:
    return f"consumequeue/{topic}/{queue_id}/{name}"


def index_key(name: str) -> str:
    return f"index/{name}"


@dataclass(frozen=True)
class TierSegment:
    base_offset: int
    crc32: int


@dataclass(frozen=True)
class TierQueueFile:
    name: str
    entries: int  # units written below the tier's end, fillers included
    crc32: int  # of the first entries * 20 bytes


@dataclass(frozen=True)
class TierIndexFile:
    name: str
    size: int
    crc32: int
    end_commitlog_offset: int


@dataclass
class Manifest:
    """A tier's manifest in memory (module docstring)."""

    store: dict
    generation: int = 0
    written_ms: int = 0
    segments: list[TierSegment] = field(default_factory=list)
    queues: dict[tuple[str, int], list[TierQueueFile]] = field(default_factory=dict)
    queues_end: int | None = None  # every queue's entries below it are in its listed files
    index: list[TierIndexFile] = field(default_factory=list)

    @property
    def segment_size_bytes(self) -> int:
        return self.store["segment_size_bytes"]

    @property
    def start(self) -> int | None:
        """The tier's first commitlog offset (its first segment's base), or None when it holds no segment."""
        return self.segments[0].base_offset if self.segments else None

    @property
    def end(self) -> int | None:
        """The end of the tier's last segment: every record below it is in the tier."""
        return self.segments[-1].base_offset + self.segment_size_bytes if self.segments else None

    def segment_at(self, commitlog_offset: int) -> TierSegment | None:
        """The tier's segment holding `commitlog_offset`, or None."""
        if not self.segments:
            return None
        number = (commitlog_offset - self.segments[0].base_offset) // self.segment_size_bytes
        return self.segments[number] if 0 <= number < len(self.segments) and commitlog_offset >= 0 else None

    def queue_file(self, topic: str, queue_id: int, name: str) -> TierQueueFile | None:
        for queue_file in self.queues.get((topic, queue_id), ()):
            if queue_file.name == name:
                return queue_file
        return None

    def object_count(self) -> int:
        return len(self.segments) + sum(len(files) for files in self.queues.values()) + len(self.index)

    def to_json(self) -> bytes:
        queues: dict[str, dict[str, list]] = {}
        for (topic, queue_id), files in sorted(self.queues.items()):
            queues.setdefault(topic, {})[str(queue_id)] = [[f.name, f.entries, f.crc32] for f in files]
        document = {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "generation": self.generation,
            "written_ms": self.written_ms, "store": self.store,
            "segments": [[s.base_offset, s.crc32] for s in self.segments],
            "queues": queues, "queues_end": self.queues_end,
            "index": [[f.name, f.size, f.crc32, f.end_commitlog_offset] for f in self.index],
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    def next_generation(self) -> "Manifest":
        """A copy to write as the next generation (the lists are copied; entries are immutable)."""
        return Manifest(store=dict(self.store), generation=self.generation + 1,
                        written_ms=time.time_ns() // 1_000_000, segments=list(self.segments),
                        queues={name: list(files) for name, files in self.queues.items()}, index=list(self.index),
                        queues_end=self.queues_end)


STORE_FIELDS = ("segment_size_bytes", "consume_queue_entries_per_file", "index_slot_count", "index_entry_count_max")


def store_block(config, record_crc_from: int | None) -> dict:
    """The manifest's `store` object for a store with `config` (a StoreConfig)."""
    block = {name: getattr(config, name) for name in STORE_FIELDS}
    block["record_crc_from_offset"] = record_crc_from
    return block


class _Checks:
    """The validity rule's checks, each raising CorruptionError (rule tier.manifest) naming the manifest."""

    def __init__(self, where: str):
        self.where = where

    def bad(self, reason: str) -> CorruptionError:
        return CorruptionError(f"the tier manifest {self.where} is not valid: {reason}", path=self.where,
                               rule="tier.manifest")

    def number(self, value, what: str, high: int = OFFSET_MAX, low: int = 0) -> int:
        if type(value) is not int or not low <= value <= high:
            raise self.bad(f"{what} must be an int in {low}..{high}, got {value!r}"[:300])
        return value

    def array(self, value, what: str, length: int | None = None) -> list:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            shape = f" of {length}" if length is not None else ""
            raise self.bad(f"{what} must be a list{shape}, got {value!r}"[:300])
        return value


def parse(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes; CorruptionError (rule tier.manifest, `where` its object) when it breaks the rule."""
    checks = _Checks(where)
    if len(raw) > MANIFEST_BYTES_MAX:
        raise checks.bad(f"{len(raw)} bytes, more than {MANIFEST_BYTES_MAX}")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise checks.bad(f"not JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise checks.bad("not a JSON object")
    if document.get("format") != MANIFEST_FORMAT or document.get("version") != MANIFEST_VERSION:
        raise checks.bad(f"format {document.get('format')!r} version {document.get('version')!r}, expected "
                         f"{MANIFEST_FORMAT!r} version {MANIFEST_VERSION}")
    store = document.get("store")
    if not isinstance(store, dict):
        raise checks.bad("store must be an object")
    checks.number(store.get("segment_size_bytes"), "store.segment_size_bytes", 1 << 40, 4096)
    checks.number(store.get("consume_queue_entries_per_file"), "store.consume_queue_entries_per_file", 50_000_000, 1)
    checks.number(store.get("index_slot_count"), "store.index_slot_count", 50_000_000, 1)
    checks.number(store.get("index_entry_count_max"), "store.index_entry_count_max", 100_000_000, 1)
    if store.get("record_crc_from_offset") is not None:
        checks.number(store["record_crc_from_offset"], "store.record_crc_from_offset")
    manifest = Manifest(store=dict(store), generation=checks.number(document.get("generation"), "generation"),
                        written_ms=checks.number(document.get("written_ms"), "written_ms"))
    _parse_segments(checks, document.get("segments"), manifest)
    _parse_queues(checks, document.get("queues"), manifest)
    queues_end = document.get("queues_end")
    if queues_end is None:
        if manifest.queues:
            raise checks.bad("queues_end is null while queue files are listed")
    else:
        manifest.queues_end = checks.number(queues_end, "queues_end", manifest.end or 0)
    _parse_index(checks, document.get("index"), manifest)
    return manifest


def _parse_segments(checks: _Checks, rows, manifest: Manifest) -> None:
    segment_size = manifest.segment_size_bytes
    for row in checks.array(rows, "segments"):
        base, checksum = checks.array(row, "a segment", 2)
        base = checks.number(base, "a segment's base offset")
        if base % segment_size:
            raise checks.bad(f"segment base {base} is not a multiple of the segment size {segment_size}")
        if manifest.segments and base != manifest.segments[-1].base_offset + segment_size:
            raise checks.bad(f"segments are not contiguous: {manifest.segments[-1].base_offset} is followed by "
                             f"{base}")
        manifest.segments.append(TierSegment(base, checks.number(checksum, "a CRC-32", CRC_MAX)))


def _parse_queues(checks: _Checks, queues, manifest: Manifest) -> None:
    entries_per_file = manifest.store["consume_queue_entries_per_file"]
    if not isinstance(queues, dict):
        raise checks.bad("queues must be an object")
    for topic, by_id in queues.items():
        try:
            validate_topic(topic)
        except InvalidMessageError as exc:
            raise checks.bad(f"topic {topic!r}: {exc}") from exc
        if not isinstance(by_id, dict):
            raise checks.bad(f"queues of {topic!r} must be an object")
        for queue_text, rows in by_id.items():
            if not (queue_text.isascii() and queue_text.isdigit() and len(queue_text) <= 7):
                raise checks.bad(f"queue id {queue_text!r} of {topic!r}")
            files: list[TierQueueFile] = []
            for row in checks.array(rows, f"files of {topic}/{queue_text}"):
                name, entries, checksum = checks.array(row, "a queue file", 3)
                if not isinstance(name, str) or queue_fmt.parse_file_name(name) is None:
                    raise checks.bad(f"queue file name {name!r} of {topic}/{queue_text}")
                if queue_fmt.parse_file_name(name) % (entries_per_file * queue_fmt.UNIT_SIZE_BYTES):
                    raise checks.bad(f"queue file name {name} is not a multiple of the file size")
                if files and name <= files[-1].name:
                    raise checks.bad(f"queue files of {topic}/{queue_text} are not sorted at {name}")
                files.append(TierQueueFile(name, checks.number(entries, f"entries of {name}", entries_per_file),
                                           checks.number(checksum, "a CRC-32", CRC_MAX)))
            manifest.queues[(topic, int(queue_text))] = files


def _parse_index(checks: _Checks, rows, manifest: Manifest) -> None:
    for row in checks.array(rows, "index"):
        name, size, checksum, end = checks.array(row, "an index file", 4)
        if not (isinstance(name, str) and len(name) == index_fmt.FILE_NAME_DIGITS
                and index_fmt.parse_file_name(name) is not None):
            raise checks.bad(f"index file name {name!r}")
        if manifest.index and name <= manifest.index[-1].name:
            raise checks.bad(f"index files are not sorted at {name}")
        manifest.index.append(TierIndexFile(
            name, checks.number(size, f"size of {name}", index_fmt.FILE_SIZE_BYTES_MAX),
            checks.number(checksum, "a CRC-32", CRC_MAX), checks.number(end, f"end_commitlog_offset of {name}")))


def slot_bytes(manifest: Manifest) -> bytes:
    """A slot's bytes: the manifest's DOCUMENT in its CRC-checked wrapper (module docstring)."""
    document = manifest.to_json()
    return SLOT_HEAD + document + b',"crc32":"%08x"}' % crc32(document)


def parse_slot(raw: bytes, where: str) -> Manifest:
    """A manifest from a slot's bytes; CorruptionError (rule tier.manifest) for a torn or damaged slot."""
    tail = raw[-SLOT_TAIL_BYTES:]
    if not (raw.startswith(SLOT_HEAD) and len(raw) >= len(SLOT_HEAD) + SLOT_TAIL_BYTES
            and tail.startswith(b',"crc32":"') and tail.endswith(b'"}')):
        raise _Checks(where).bad(f"not a manifest slot ({len(raw)} bytes: torn or damaged)")
    document = raw[len(SLOT_HEAD):-SLOT_TAIL_BYTES]
    listed = tail[len(b',"crc32":"'):-2]
    if not (listed.isascii() and len(listed) == 8 and all(c in b"0123456789abcdef" for c in listed)) \
            or int(listed, 16) != crc32(document):
        raise _Checks(where).bad(f"its CRC-32 {listed[:8]!r} does not match its document (torn or damaged)")
    return parse(document, where)


def read_slots(location) -> list[tuple[str, Manifest | CorruptionError]]:
    """Each slot present in the tier at `location`: (key, its manifest, or the CorruptionError it breaks the rule
    with)."""
    found = []
    for key in MANIFEST_KEYS:
        raw = location.read_all(key)
        if raw is None:
            continue
        try:
            found.append((key, parse_slot(raw, location.display(key))))
        except CorruptionError as exc:
            found.append((key, exc))
    return found


def load(location) -> Manifest | None:
    """The newest whole manifest of the tier at `location` (a TierLocation), or None when it has none yet. A
    spoiled slot beside a whole one is a torn write (or damage `tier verify` reports); two spoiled slots raise."""
    slots = read_slots(location)
    whole = [manifest for _, manifest in slots if isinstance(manifest, Manifest)]
    if whole:
        return max(whole, key=lambda manifest: manifest.generation)
    if len(slots) == 2:
        raise slots[-1][1]
    if slots and not _torn_first_write(slots[0]):
        raise slots[0][1]
    return None


def _torn_first_write(slot) -> bool:
    """Whether the one spoiled slot of a tier can be its first manifest write, torn: generation 1's slot."""
    return slot[0] == MANIFEST_KEYS[1]


def save(location, manifest: Manifest) -> None:
    """Write `manifest` (after the objects it lists) to its generation's slot."""
    assert manifest.generation >= 1
    location.put_bytes(MANIFEST_KEYS[manifest.generation % 2], slot_bytes(manifest))
