"""The tier manifest: its bytes round-trip, and every breach of its validity rule is a CorruptionError naming the
manifest and the rule (mqstore/tier/manifest.py)."""

from __future__ import annotations

import json

import pytest
from mqstore.commitlog.errors import CorruptionError

from mqstore import StoreConfig
from mqstore.tier import manifest as manifest_module
from mqstore.tier.manifest import Manifest, TierIndexFile, TierQueueFile, TierSegment

SEGMENT = 1 << 16
WHERE = "s3://bucket/prefix/tier/manifest.json"


def sample() -> Manifest:
    config = StoreConfig(segment_size_bytes=SEGMENT, consume_queue_entries_per_file=100, index_slot_count=10,
                         index_entry_count_max=40)
    manifest = Manifest(store=manifest_module.store_block(config, 0), generation=3, written_ms=1_795_000_000_000)
    manifest.segments = [TierSegment(SEGMENT * 2, 0xDEADBEEF), TierSegment(SEGMENT * 3, 7)]
    manifest.queues = {("orders", 0): [TierQueueFile("00000000000000000000", 100, 1),
                                       TierQueueFile("00000000000000002000", 12, 2)],
                       ("%RETRY%group", 3): [TierQueueFile("00000000000000000000", 5, 3)]}
    manifest.index = [TierIndexFile("20261128104500123", 1000, 9, SEGMENT * 3 + 10)]
    manifest.queues_end = SEGMENT * 3
    return manifest


def test_a_manifest_reads_back_as_written():
    manifest = sample()
    again = manifest_module.parse(manifest.to_json(), WHERE)
    assert again == manifest
    assert (again.start, again.end) == (SEGMENT * 2, SEGMENT * 4)
    assert again.segment_at(SEGMENT * 3 + 5) == TierSegment(SEGMENT * 3, 7)
    assert again.segment_at(SEGMENT * 2 - 1) is None and again.segment_at(SEGMENT * 4) is None
    assert again.object_count() == 6


def test_the_manifest_bytes_are_the_documented_layout():
    document = json.loads(sample().to_json())
    assert document["format"] == "mqstore-tier" and document["version"] == 1
    assert document["segments"] == [[SEGMENT * 2, 0xDEADBEEF], [SEGMENT * 3, 7]]
    assert document["queues"]["orders"]["0"][1] == ["00000000000000002000", 12, 2]
    assert document["index"] == [["20261128104500123", 1000, 9, SEGMENT * 3 + 10]]
    assert document["queues_end"] == SEGMENT * 3
    assert document["store"]["segment_size_bytes"] == SEGMENT and document["store"]["record_crc_from_offset"] == 0


def broken(change) -> bytes:
    document = json.loads(sample().to_json())
    change(document)
    return json.dumps(document).encode()


@pytest.mark.parametrize("raw, reason", [
    (b"{not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (broken(lambda d: d.update(version=2)), "version 2"),
    (broken(lambda d: d.update(generation=-1)), "generation"),
    (broken(lambda d: d.update(generation=True)), "generation"),
    (broken(lambda d: d["store"].update(segment_size_bytes="64k")), "segment_size_bytes"),
    (broken(lambda d: d["segments"].__setitem__(1, [SEGMENT * 5, 7])), "not contiguous"),
    (broken(lambda d: d["segments"].__setitem__(0, [SEGMENT * 2 + 1, 7])), "not a multiple"),
    (broken(lambda d: d["segments"].__setitem__(0, [SEGMENT * 2, 1 << 32])), "CRC-32"),
    (broken(lambda d: d["segments"].__setitem__(0, [SEGMENT * 2])), "list of 2"),
    (broken(lambda d: d["queues"].update({"bad/topic": {}})), "topic"),
    (broken(lambda d: d["queues"]["orders"].update({"x": []})), "queue id"),
    (broken(lambda d: d["queues"]["orders"]["0"].reverse()), "not sorted"),
    (broken(lambda d: d["queues"]["orders"]["0"][0].__setitem__(1, 101)), "entries"),
    (broken(lambda d: d["queues"]["orders"]["0"][1].__setitem__(0, "00000000000000000020")), "multiple of the file"),
    (broken(lambda d: d["index"][0].__setitem__(0, "../../etc/passwd")), "index file name"),
    (broken(lambda d: d.update(queues_end=SEGMENT * 4 + 1)), "queues_end"),
    (broken(lambda d: d.update(queues_end=None)), "queues_end is null"),
    (broken(lambda d: d["index"][0].__setitem__(1, 1 << 40)), "size"),
])
def test_a_manifest_breaking_the_rule_is_refused_with_its_name(raw, reason):
    with pytest.raises(CorruptionError) as caught:
        manifest_module.parse(raw, WHERE)
    assert caught.value.rule == "tier.manifest" and caught.value.path == WHERE
    assert reason in str(caught.value)


class Slots:
    """A stand-in tier holding the manifest slots' bytes."""

    def __init__(self, **slots):
        self.slots = slots

    def read_all(self, key):
        return self.slots.get(key)

    def display(self, key):
        return f"mem://{key}"


def test_the_newest_whole_slot_is_the_manifest():
    first, second = sample(), sample().next_generation()
    first_key, second_key = (manifest_module.MANIFEST_KEYS[m.generation % 2] for m in (first, second))
    both = {first_key: manifest_module.slot_bytes(first), second_key: manifest_module.slot_bytes(second)}
    assert manifest_module.load(Slots(**both)).generation == second.generation
    torn = dict(both, **{second_key: both[second_key][:-5]})
    assert manifest_module.load(Slots(**torn)).generation == first.generation
    flipped = bytearray(both[second_key])
    flipped[40] ^= 1
    assert manifest_module.load(Slots(**dict(both, **{second_key: bytes(flipped)}))).generation == first.generation
    with pytest.raises(CorruptionError) as caught:
        manifest_module.load(Slots(**{first_key: b"{", second_key: bytes(flipped)}))
    assert caught.value.rule == "tier.manifest"
    assert manifest_module.load(Slots()) is None


def test_a_torn_first_write_is_no_manifest_and_any_other_lone_spoiled_slot_is_damage():
    first_write = Manifest(store=sample().store, generation=1)
    key = manifest_module.MANIFEST_KEYS[1]
    assert manifest_module.load(Slots(**{key: manifest_module.slot_bytes(first_write)[:10]})) is None
    with pytest.raises(CorruptionError):
        manifest_module.load(Slots(**{manifest_module.MANIFEST_KEYS[0]: b"garbage"}))
