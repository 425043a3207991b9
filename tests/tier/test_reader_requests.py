"""What the tier reader asks the tier for: a read of bytes none of which are cached is one range read, and gives
the same bytes as reads served from the cache in whole or in part; on an object store the reader keeps an open
handle for every object it has read (opening an S3 object costs a HEAD), so a cold read of an object read before is
one request, however many objects the tier holds past a filesystem's bound; on a filesystem (each handle a file
descriptor) it keeps at most a few."""

from __future__ import annotations

import random

from mqstore import MessageStore
from mqstore.tier.location import OPEN_INPUTS_MAX_FILESYSTEM, OPEN_INPUTS_MAX_OBJECT_STORE, TierLocation
from mqstore.tier.reader import TierReader
from tests.tier.test_reads import offload
from tests.tier.test_uploader import tier_config

SEGMENTS = OPEN_INPUTS_MAX_FILESYSTEM + 4  # more objects than a filesystem's handles
BLOCK = 4096


def test_a_cold_read_is_one_range_read_and_reads_the_same_bytes_as_cached_ones(tier_uri):
    rng = random.Random(46)
    location = TierLocation.open(tier_uri)
    data = rng.randbytes(10 * BLOCK + 100)
    location.put_bytes("commitlog/object", data)
    reader = TierReader(location, {}, cache_bytes=4 * BLOCK, block_bytes=BLOCK)
    reads = [(BLOCK - 10, 20), (5 * BLOCK + 1, 3 * BLOCK), (0, len(data)), (10 * BLOCK, 100)]
    reads += [(position, rng.randint(1, 3 * BLOCK)) for position in (rng.randrange(len(data) - 3 * BLOCK)
                                                                     for _ in range(60))]
    for position, length in reads:
        before = reader.stats()
        cold = before["cache_blocks"] == 0
        assert reader.read_bytes("commitlog/object", len(data), position, length) == data[position:position + length]
        after = reader.stats()
        if cold:  # nothing cached: one range read, whatever the number of blocks
            assert after["range_reads"] - before["range_reads"] == 1, (position, length)
        if rng.random() < 0.3:
            reader.close()  # cache and handles gone: the next read is cold
    assert reader.stats()["block_hits"] > 0 and reader.stats()["cache_bytes_peak"] <= 4 * BLOCK


def test_an_object_stores_handles_outlast_a_filesystems_bound(tmp_path, tier_uri):
    rng = random.Random(47)
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri, file_reserved_hours=0)) as store:
        first = 0
        while store.stats()["tier"]["segments"] < SEGMENTS:
            offload(store, rng, 600, first)
            first += 600
    object_store = tier_uri.startswith("s3://")
    assert TierLocation.open(tier_uri).open_inputs_max == (OPEN_INPUTS_MAX_OBJECT_STORE if object_store
                                                           else OPEN_INPUTS_MAX_FILESYSTEM)
    with MessageStore.open(root, tier_config(tier_uri, tier_cache_bytes=0), read_only=True) as store:
        reader = store._tier_reader
        starts = [segment.base_offset for segment in reader.manifest().segments]
        assert len(starts) >= SEGMENTS
        passes = []
        for _ in range(2):  # each object's first record, twice over: with no cache every read is a range read
            before = reader.stats()
            messages = [store.read_at(start) for start in starts]
            after = reader.stats()
            passes.append({name: after[name] - before[name] for name in ("range_reads", "objects_opened")})
            assert [message.commitlog_offset for message in messages] == starts
        assert passes[0]["range_reads"] == passes[1]["range_reads"] >= len(starts)  # a long record takes two
        assert passes[0]["objects_opened"] == len(starts) and len(reader._handles) <= reader.handles_max
        if object_store:  # every handle kept: the second pass opened nothing (no HEAD), one GET a read
            assert passes[1]["objects_opened"] == 0 and len(reader._handles) == len(starts)
        else:  # the least recently used handles went: the second pass opened every object again
            assert passes[1]["objects_opened"] == len(starts)
            assert len(reader._handles) == OPEN_INPUTS_MAX_FILESYSTEM
