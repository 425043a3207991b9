"""Scans of a store's tier: the records of the segments a tier's manifest lists, read with range reads and decoded
by the same walk and decoder as a local scan (mqstore/store/scan_read.py), so every check on untrusted bytes
applies and a CorruptionError names the tier object and the position in it.

`scan_store("s3://bucket/prefix?...")` reads a store from its tier alone (no local copy, no writer: every listed
segment is sealed, so the walk of each ends at its end-of-segment blank); `MessageStore.scan()` of a store whose
history retention moved to its tier reads the tier's segments below the local log first. Each segment is read
from start to blank in TIER_READ_CHUNK_BYTES range reads, the next read in flight while the current chunk is
decoded; the filters (topics, queues, offsets, times) are applied to every row, and segments wholly outside an
offset range are not read. A topic filter does not read through the tier's ConsumeQueue files yet: it reads the
whole log in range and keeps the topic's rows.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pyarrow as pa

from mqstore.commitlog import format as fmt
from mqstore.commitlog.arrow_decode import BUFFER_PAD_BYTES, NEXT_BLANK, NEXT_MORE, Decoder, locate_records
from mqstore.commitlog.errors import CorruptionError
from mqstore.store.scan_options import RowFilter
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.manifest import Manifest

TIER_READ_CHUNK_BYTES = 16 * 1024 * 1024  # one range read of a scan (a record longer than this is read whole)


def is_tier_uri(root) -> bool:
    """Whether a scan's `root` names a tier (a URI) rather than a store directory."""
    return isinstance(root, str) and "://" in root


def tier_bases(manifest: Manifest, row_filter: RowFilter, below: int | None = None) -> list[int]:
    """The base offsets of the tier's segments that may hold rows of `row_filter`, below `below` when given."""
    size = manifest.segment_size_bytes
    low = row_filter.offset_lo or 0
    high = row_filter.offset_hi
    return [segment.base_offset for segment in manifest.segments
            if segment.base_offset + size > low and (high is None or segment.base_offset < high)
            and (below is None or segment.base_offset < below)]


def tier_batches(location: TierLocation, manifest: Manifest, bases: list[int], schema: pa.Schema,
                 row_filter: RowFilter, label: str | None) -> Iterator[pa.RecordBatch]:
    """The rows of the tier's segments at `bases`, in log order."""
    if row_filter.is_empty() or not bases:
        return
    decoder = Decoder(schema, row_filter, label, manifest.store.get("record_crc_from_offset"))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqstore-tier-scan") as fetcher:
        for base in bases:
            yield from _read_segment(decoder, location, base, manifest.segment_size_bytes, fetcher)


def _fetch(handle, location: TierLocation, key: str, size: int, at: int, length: int) -> bytes:
    """`length` bytes at `at` of the object, clipped to its size (CorruptionError when it is shorter)."""
    length = max(0, min(length, size - at))
    return location.read_range(key, size, at, length, handle) if length else b""


def _padded(data: bytes) -> np.ndarray:
    buf = np.zeros(len(data) + BUFFER_PAD_BYTES, dtype=np.uint8)
    buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    return buf


def _read_segment(decoder: Decoder, location: TierLocation, base: int, size: int, fetcher) -> Iterator[pa.RecordBatch]:
    """Decode one sealed segment object from its start to its blank, TIER_READ_CHUNK_BYTES at a time: while a
    chunk is decoded, the bytes after it are read; the next chunk is the current one's unfinished record and
    them."""
    key = manifest_module.segment_key(base)
    path = location.display(key)
    segment_end = base + size
    with location.open_input(key, size) as handle:
        position = base
        data = _fetch(handle, location, key, size, 0, TIER_READ_CHUNK_BYTES)
        while True:
            buf, length = _padded(data), len(data)
            read_to = position + length  # the object's bytes below this are read
            ahead = fetcher.submit(_fetch, handle, location, key, size, read_to - base, TIER_READ_CHUNK_BYTES) \
                if read_to < segment_end else None
            positions, following, state = locate_records(buf, length, position, segment_end, lenient=False,
                                                         path=path)
            if len(positions):
                yield from decoder.decode(buf, positions, positions + position, np.full(len(positions), segment_end),
                                          path)
            if state == NEXT_BLANK:
                return
            need = 0
            if state == NEXT_MORE:
                record_size = fmt.I32.unpack_from(buf, following)[0] if following + 4 <= length else 0
                if position + following + max(record_size, fmt.END_FILE_MIN_BLANK_LENGTH) > segment_end:
                    raise CorruptionError(f"the record at commitlog offset {position + following} runs past the end "
                                          "of its segment", path=path, offset=position + following - base,
                                          rule="commitlog.2")
                need = record_size
            if ahead is None:
                raise CorruptionError(f"the sealed segment's records end at commitlog offset {position + following} "
                                      "without its end-of-segment blank", path=path,
                                      offset=position + following - base, rule="tier.sealed")
            data = bytes(buf[following:length]) + ahead.result()
            if len(data) < need:  # one record longer than a chunk: read the rest of it
                data += _fetch(handle, location, key, size, read_to - base + len(data) - (length - following),
                               need - len(data))
            position += following
