"""StoreConfig: every setting of a store, checked when it is built.

The fields marked "format" fix the on-disk layout: they are saved in `<root>/config/mqstore.json` when the
store is created. A StoreConfig remembers which fields its caller passed (`explicit_fields`): on reopen those
must match the store (ConfigMismatchError otherwise), and the ones not passed are taken from the store
(mqstore/store/settings.py; docs/decisions/0015-settings-read-from-the-store.md).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field, fields, replace

from mqstore.commitlog import format as fmt
from mqstore.commitlog.errors import ConfigMismatchError, InvalidConfigError, SettingsFileError, StoreIOError
from mqstore.commitlog.mapped_file import write_file_atomically
from mqstore.flush.modes import FlushMode
from mqstore.schedule.format import DEFAULT_DELAY_LEVELS, parse_levels

GIB = 1 << 30
MIB = 1 << 20
CONFIG_FILE_NAME = "mqstore.json"
CONFIG_FORMAT_VERSION = 1
# The most a record adds to its body: the fixed header, the longest topic and properties, the blank after it.
MESSAGE_OVERHEAD_MAX_BYTES = (fmt.RECORD_SIZE_FIXED + fmt.TOPIC_LENGTH_MAX + fmt.PROPERTIES_LENGTH_MAX
                              + fmt.END_FILE_MIN_BLANK_LENGTH)


def default_host() -> str:
    """This machine's IPv4 address as its name resolves, or 127.0.0.1 when it does not resolve to one."""
    try:
        address = socket.gethostbyname(socket.gethostname())
        socket.inet_pton(socket.AF_INET, address)
        return address
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Settings of a store. Units are in the names; the docstring of each field gives its default and why.

    A config remembers the fields its caller passed (`explicit_fields`): opening a store checks those format
    fields against the store and takes the others from it. `dataclasses.replace` passes every field, so a
    config made by it counts all of them as passed; `adopting` keeps the original's.
    """

    def __new__(cls, **passed):
        config = super().__new__(cls)
        object.__setattr__(config, "_explicit_fields", frozenset(passed))
        return config

    segment_size_bytes: int = GIB
    """format. 1 GiB, RocketMQ's CommitLog segment size: few files, long sequential runs."""

    consume_queue_entries_per_file: int = 300_000
    """format. 300 000 entries (6 MB files), RocketMQ's default."""

    record_crc: bool = True
    """format. every record ends with RocketMQ 5's whole-record CRC property (`__CRC32#`, 20 bytes): damage to
    a header, topic or properties is found, not only damage to the body (which BODYCRC covers)."""

    index_enabled: bool = True
    """build IndexFiles (find by key, msg id or UNIQ_KEY); every message gets a UNIQ_KEY (RocketMQ's default).
    Saved in the store: an open that does not pass it keeps the store's choice; a writer passing it saves it."""

    index_slot_count: int = 5_000_000
    """format of index files (checked against them). hash slots per IndexFile (RocketMQ's maxHashSlotNum)."""

    index_entry_count_max: int = 20_000_000
    """format of index files (checked against them). entries per IndexFile before a new one starts (RocketMQ's
    maxIndexNum); a file is 420 MB."""

    max_message_size_bytes: int = 4 * MIB
    """4 MiB, RocketMQ's maxMessageSize: a larger body is refused. Not given, it is lowered to what a smaller
    segment can hold."""

    max_queues_per_topic: int = 1024
    """queue ids run 0..1023; bounds the directories a topic can create."""

    flush_mode: FlushMode = FlushMode.ASYNC
    """ASYNC: a put is acknowledged once in the page cache (RocketMQ's default)."""

    flush_interval_ms: int = 500
    """ASYNC: how often the flusher looks at the CommitLog (RocketMQ's flushIntervalCommitLog)."""

    flush_least_pages: int = 4
    """ASYNC: flush only when at least this many 4 KiB pages are dirty (RocketMQ's flushCommitLogLeastPages)."""

    flush_thorough_interval_ms: int = 10_000
    """ASYNC: flush whatever is dirty at least this often (RocketMQ's flushCommitLogThoroughInterval)."""

    sync_flush_timeout_ms: int = 5000
    """SYNC: a put whose bytes are not on disk by then returns FLUSH_DISK_TIMEOUT (its message stays stored)."""

    flush_consume_queue_interval_ms: int = 1000
    """how often ConsumeQueues (and the index) are flushed, in both modes (RocketMQ's flushIntervalConsumeQueue)."""

    max_dispatch_lag_bytes: int = 0
    """0: puts never wait for dispatch. Else a put that leaves more than this many log bytes undispatched waits
    until dispatch is within three quarters of it, so messages become visible to get() within a bounded lag while
    a producer puts flat out (with dispatch_process=False dispatch shares the interpreter and, unbounded, falls
    behind by seconds)."""

    dispatch_process: bool = True
    """build the ConsumeQueues and the index in a child process of their own (mqstore/store/dispatch_process.py) instead
    of a thread of the writer's: producers then do not share the interpreter lock with dispatch, which keeps up with
    them where the thread falls seconds behind (docs/decisions/0025-dispatch-process-by-default.md). The writer's
    reads follow what the child writes, as a read_only store does. Opening starts the child and waits until it runs
    (0.25-0.5 s; closing 0.1 s): False for short-lived stores, or where sys.executable cannot run Python."""

    warm_segments: bool = False
    """pre-fault the next segment's pages in the background (madvise MADV_POPULATE_WRITE) so first writes into it
    are cheap, and with ASYNC flushing the segment being written too, up to 32 MiB ahead of the writer; the zero
    pages are written back like data (such a store takes the disk of whole segments: docs/storage.md)."""

    write_fault_readahead: bool = True
    """whether a put's page fault in the segment being written may read around (the kernel's readahead on a fault
    fills `read_ahead_kb` of the file, 8 MiB on this project's machine, in the faulting thread). With False the
    segment being written is advised MADV_RANDOM and each fault fills its own page: no put waits the 16-40 ms
    that filling 8 MiB of fresh pages took here, at the price of a fault every page (bench/README.md "Where long
    puts come from": with one producer 10-47% fewer puts a second and a 2-3x higher p99, and far fewer puts
    over 5 ms). Segments the writer has left get readahead back. Not a format setting."""

    file_reserved_hours: float = 72
    """segments last modified longer ago than this are expired (RocketMQ's fileReservedTime)."""

    delete_when_hour: int = 4
    """the local hour at which expired segments are removed (RocketMQ's deleteWhen "04")."""

    disk_max_used_space_ratio: float = 0.75
    """over this disk usage, expired segments go at once, whatever the hour (RocketMQ's diskMaxUsedSpaceRatio)."""

    disk_clean_forcibly_ratio: float = 0.85
    """with delete_unexpired_on_disk_pressure (RocketMQ's cleanFileForciblyEnable, for a store that owns its disk),
    over this disk usage the oldest segments go even if not expired, logged at WARNING (diskSpaceCleanForciblyRatio);
    without it, unused."""

    delete_unexpired_on_disk_pressure: bool = False
    """False: a disk shared with other programs filling up never deletes unexpired messages (put: DISK_FULL)."""

    disk_full_ratio: float = 0.90
    """over this disk usage, put() returns PutStatus.DISK_FULL until space is freed."""

    archive_dir: str | None = None
    """when set, removed segments are moved to <archive_dir>/commitlog/ instead of deleted."""

    tier_uri: str | None = field(default=None, repr=False)
    """None: no tier. Else an object store location (`s3://bucket/prefix`, `gs://...`, `file:///dir`, a local path)
    opened through pyarrow's filesystems, to which the writer uploads sealed segments and the queue and index files
    they complete, as a RocketMQ store under that prefix (docs/tier.md); reads of what left local disk go to it.
    Saved in the store's config/tier.json only when it carries no credentials (user info, secret query values),
    which are never written or logged; an open without tier_uri uses the saved one (mqstore/store/tiering.py)."""

    tier_upload_interval_ms: int = 1000
    """how often the tier uploader looks for sealed segments not in the tier yet."""

    tier_backoff_max_ms: int = 60_000
    """the longest wait between retries of a failed upload (the waits double from 0.5 s up to this)."""

    tier_queue_refresh_bytes: int = 8 * GIB
    """how far the tier's log may run ahead of its ConsumeQueue files (the manifest's queues_end) before they are
    sent again: each refresh sends the last file of every queue that grew, whole (6 MB by default), so refreshing
    every 8 GiB of log costs 16 active queues 1.2% more upload than the log itself (docs/tier.md); reads of the
    tier walk the log above queues_end."""

    tier_verify_uploads: bool = True
    """read every uploaded object back and compare its CRC-32 before the manifest lists it (and before retention
    may delete the local copy); False trusts the object store's write, at half the traffic."""

    tier_upload_process: bool = True
    """run the tier uploader in a child process of its own (mqstore/tier/upload_process.py) instead of a thread of
    the writer's: its reads, CRCs and writes then cost the writer's process nothing (docs/tier.md, "What it costs";
    docs/decisions/0057-tier-uploader-process.md). The child starts in the background, is started again if it
    dies, and is stopped at close after the object in flight; False where sys.executable cannot run Python."""

    tier_cache_bytes: int = 64 * MIB
    """bound of the cache of tier blocks (256 KiB each) that reads of the tier's history share: a consumer reading
    on, or gets near one another, cost one range read per block; 64 MiB holds 256 blocks, several busy consumers'
    read-ahead, at a small fraction of a broker's memory. 0: no cache (every read of the tier is a request)."""

    tier_local_retention_bytes: int | None = None
    """with a tier: None keeps uploaded segments on local disk until they expire (file_reserved_hours); a number
    bounds the local CommitLog to about that many bytes, removing the oldest uploaded segments early (they stay
    readable from the tier). Segments not in the tier yet are never removed for it."""

    clean_interval_ms: int = 10_000
    """how often retention checks the disk and the rules (RocketMQ's cleanResourceInterval)."""

    store_host: str = field(default_factory=default_host)
    """IPv4 address written as STOREHOST and used in message ids; this machine's address by default."""

    store_port: int = 10911
    """port written with store_host; 10911 is a RocketMQ broker's default listen port."""

    born_host: str | None = None
    """IPv4 address written as BORNHOST of messages put through this store; None means store_host."""

    born_port: int = 0
    """port written with born_host (a producer's ephemeral port in RocketMQ; 0 for an embedded producer)."""

    preallocate_segments: bool = True
    """reserve a segment's disk (posix_fallocate) 4-64 MiB ahead of the writer, so a full disk makes put() return
    DISK_FULL instead of killing the process with SIGBUS; False leaves segments sparse (docs/storage.md)."""

    check_crc_on_recover: bool = True
    """verify body CRCs while recovery walks the log (RocketMQ's checkCRCOnRecover)."""

    check_crc_on_dispatch: bool = False
    """verify each body CRC while dispatching (RocketMQ does not: the writer computed it moments ago)."""

    timer_precision_ms: int = 10
    """width of a timer-wheel slot (RocketMQ's timerPrecisionMs, default 1000 there): a timer fires up to this late
    (plus the service's lag); 10 ms keeps firing error p99 under 50 ms. Saved with the wheel (docs/timer.md)."""

    timer_max_delay_ms: int = 40 * 24 * 3600 * 1000
    """the longest delay a timer message may ask for (RocketMQ's timerMaxDelaySec, 3 days there); 40 days.
    Longer ones are refused with InvalidMessageError."""

    timer_log_file_size_bytes: int = 100 * MIB
    """size of each TimerLog file (RocketMQ's mappedFileSizeTimerLog, 100 MiB: about 2 million timers)."""

    delay_levels: str = DEFAULT_DELAY_LEVELS
    """the delays of levels 1, 2, ... for messages put with a DELAY level (RocketMQ's messageDelayLevel, default
    "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"). Saved with the store (docs/schedule.md)."""

    def __post_init__(self) -> None:
        _check_int("segment_size_bytes", self.segment_size_bytes, 4096, 1 << 40)
        _check_int("consume_queue_entries_per_file", self.consume_queue_entries_per_file, 1, 50_000_000)
        _check_int("max_message_size_bytes", self.max_message_size_bytes, 0, (1 << 31) - 1024)
        _check_int("max_queues_per_topic", self.max_queues_per_topic, 1, 1 << 20)
        _check_int("index_slot_count", self.index_slot_count, 1, 50_000_000)
        _check_int("index_entry_count_max", self.index_entry_count_max, 4, 100_000_000)
        if not isinstance(self.flush_mode, FlushMode):
            raise InvalidConfigError(f"flush_mode must be a FlushMode, got {self.flush_mode!r}")
        _check_int("flush_interval_ms", self.flush_interval_ms, 1, 3_600_000)
        _check_int("flush_least_pages", self.flush_least_pages, 0, 1 << 20)
        _check_int("flush_thorough_interval_ms", self.flush_thorough_interval_ms, 0, 86_400_000)
        _check_int("sync_flush_timeout_ms", self.sync_flush_timeout_ms, 1, 3_600_000)
        _check_int("flush_consume_queue_interval_ms", self.flush_consume_queue_interval_ms, 1, 3_600_000)
        _check_int("max_dispatch_lag_bytes", self.max_dispatch_lag_bytes, 0, 1 << 50)
        for name in ("dispatch_process", "warm_segments", "write_fault_readahead", "preallocate_segments",
                     "check_crc_on_dispatch", "check_crc_on_recover", "index_enabled", "record_crc",
                     "delete_unexpired_on_disk_pressure", "tier_verify_uploads", "tier_upload_process"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        fixed = MESSAGE_OVERHEAD_MAX_BYTES
        if "max_message_size_bytes" not in self.explicit_fields and self.max_message_size_bytes + fixed > \
                self.segment_size_bytes:  # not given: what the segments can hold
            object.__setattr__(self, "max_message_size_bytes", max(0, self.segment_size_bytes - fixed))
        if self.max_message_size_bytes + fixed > self.segment_size_bytes:
            raise InvalidConfigError(
                f"segment_size_bytes={self.segment_size_bytes} cannot hold a message of max_message_size_bytes="
                f"{self.max_message_size_bytes} (needs {self.max_message_size_bytes + fixed} bytes)")
        for name in ("store_host", "born_host"):
            value = getattr(self, name)
            if value is None and name == "born_host":
                continue
            try:
                socket.inet_pton(socket.AF_INET, value)
            except (OSError, TypeError) as exc:
                raise InvalidConfigError(f"{name} must be an IPv4 address, got {value!r}") from exc
        _check_int("store_port", self.store_port, 0, 65535)
        _check_int("delete_when_hour", self.delete_when_hour, 0, 23)
        _check_int("clean_interval_ms", self.clean_interval_ms, 1, 86_400_000)
        if not isinstance(self.file_reserved_hours, (int, float)) or isinstance(self.file_reserved_hours, bool) \
                or not 0 <= self.file_reserved_hours <= 1_000_000:
            raise InvalidConfigError("file_reserved_hours must be a number in 0..1000000, got "
                                     f"{self.file_reserved_hours!r}")
        for name in ("disk_max_used_space_ratio", "disk_clean_forcibly_ratio", "disk_full_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value <= 1.0:
                raise InvalidConfigError(f"{name} must be a number in (0, 1], got {value!r}")
        if self.archive_dir is not None and not isinstance(self.archive_dir, str):
            raise InvalidConfigError(f"archive_dir must be a str or None, got {self.archive_dir!r}")
        if self.tier_uri is not None and (not isinstance(self.tier_uri, str) or not self.tier_uri):
            raise InvalidConfigError("tier_uri must be a non-empty str or None")
        if self.tier_uri is not None and self.archive_dir is not None:
            raise InvalidConfigError("archive_dir and tier_uri cannot both be set: with a tier, retention keeps what "
                                     "it removes from local disk in the tier")
        _check_int("tier_upload_interval_ms", self.tier_upload_interval_ms, 1, 3_600_000)
        _check_int("tier_backoff_max_ms", self.tier_backoff_max_ms, 1, 86_400_000)
        _check_int("tier_queue_refresh_bytes", self.tier_queue_refresh_bytes, 0, 1 << 50)
        _check_int("tier_cache_bytes", self.tier_cache_bytes, 0, 1 << 40)
        if self.tier_local_retention_bytes is not None:
            _check_int("tier_local_retention_bytes", self.tier_local_retention_bytes, 0, 1 << 60)
        _check_int("born_port", self.born_port, 0, 65535)
        _check_int("timer_precision_ms", self.timer_precision_ms, 1, 60_000)
        _check_int("timer_max_delay_ms", self.timer_max_delay_ms, 0, 1 << 53)
        try:
            parse_levels(self.delay_levels)
        except ValueError as exc:
            raise InvalidConfigError(f"delay_levels: {exc}") from exc
        _check_int("timer_log_file_size_bytes", self.timer_log_file_size_bytes, 4096, 1 << 31)

    @property
    def explicit_fields(self) -> frozenset:
        """The names of the fields the caller passed; the others hold their defaults."""
        return self.__dict__.get("_explicit_fields", frozenset())

    def adopting(self, **values) -> "StoreConfig":
        """A copy with `values` taken from a store: the fields passed explicitly stay the same set."""
        adopted = replace(self, **values)
        object.__setattr__(adopted, "_explicit_fields", self.explicit_fields)
        return adopted

    def format_fields(self) -> dict:
        """The fields that fix the on-disk format, as saved in the store."""
        return {name: getattr(self, name) for name in FORMAT_FIELDS}


FORMAT_FIELDS = ("segment_size_bytes", "consume_queue_entries_per_file", "record_crc")
# Saved beside them: `record_crc_from_offset`, the log offset from which every record carries a record CRC (0 for
# a store made with record_crc; the log's end when mqstore first opened a store written without).
RECORD_CRC_FROM_KEY = "record_crc_from_offset"
# index_slot_count and index_entry_count_max fix the size of index files too; they are checked against the
# index files themselves when the index is opened (a store may run with the index off, or rebuild it).
# Saved too, for a later open that is not given them; not checked here (see above): store_settings.py takes
# them as one candidate for the index files' sizes.
INDEX_SIZES_SAVED = ("index_slot_count", "index_entry_count_max")
# Whether the store keeps an index: saved too, so that a later open not given it keeps the store as it was made
# (with the index on, every new message also gets a UNIQ_KEY). A writer given it explicitly saves the new choice.
INDEX_ENABLED_KEY = "index_enabled"
assert set(FORMAT_FIELDS) <= {f.name for f in fields(StoreConfig)}


def _check_int(name: str, value, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidConfigError(f"{name} must be an int in {low}..{high}, got {value!r}")


def save_or_check_format(config_dir: str, config: StoreConfig, *, writable: bool, new_log: bool = True) -> dict:
    """Save the format fields of a new store, or check them against a store's saved ones; returns the saved
    settings. `new_log`: the store has no CommitLog data yet (record CRCs, when on, start at offset 0;
    otherwise the opener records where they start once it knows the log's end, `save_record_crc_from`)."""
    path = os.path.join(config_dir, CONFIG_FILE_NAME)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        settings = {"format_version": CONFIG_FORMAT_VERSION, **config.format_fields(),
                    **{name: getattr(config, name) for name in INDEX_SIZES_SAVED},
                    INDEX_ENABLED_KEY: config.index_enabled}
        if writable:
            if config.record_crc and new_log:
                settings[RECORD_CRC_FROM_KEY] = 0
            write_file_atomically(path, json.dumps(settings, indent=2).encode())
        return settings
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        saved = json.loads(raw)
        if not isinstance(saved, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise SettingsFileError(f"store settings file is not a JSON object: {exc}", path=path,
                                rule="config.json") from exc
    if saved.get("format_version") != CONFIG_FORMAT_VERSION:
        raise ConfigMismatchError(f"{path}: format_version {saved.get('format_version')!r} is not "
                                  f"{CONFIG_FORMAT_VERSION}")
    differences = [f"{name}: store has {saved.get(name)!r}, config has {value!r}"
                   for name, value in config.format_fields().items() if name in saved and saved[name] != value]
    if differences:
        raise ConfigMismatchError(f"the store at {os.path.dirname(config_dir)} was created with other format "
                                  "settings: " + "; ".join(differences))
    start = saved.get(RECORD_CRC_FROM_KEY)
    if start is not None and (type(start) is not int or start < 0):
        raise SettingsFileError(f"{RECORD_CRC_FROM_KEY} must be an offset, got {start!r}", path=path,
                                rule="config.json")
    chosen = INDEX_ENABLED_KEY in config.explicit_fields
    if writable and chosen and saved.get(INDEX_ENABLED_KEY) != config.index_enabled:
        saved = {**saved, INDEX_ENABLED_KEY: config.index_enabled}  # the caller's new choice is the store's now
        write_file_atomically(path, json.dumps(saved, indent=2).encode())
    return saved


def save_record_crc_from(config_dir: str, settings: dict, offset: int) -> dict:
    """Record that every record from `offset` on carries a record CRC (a store first written without them)."""
    assert offset >= 0 and settings.get(RECORD_CRC_FROM_KEY) is None
    settings = {**settings, "record_crc": True, RECORD_CRC_FROM_KEY: offset}
    write_file_atomically(os.path.join(config_dir, CONFIG_FILE_NAME), json.dumps(settings, indent=2).encode())
    return settings


def config_as_dict(config: StoreConfig) -> dict:
    result = asdict(config)
    result["flush_mode"] = config.flush_mode.value
    return result
