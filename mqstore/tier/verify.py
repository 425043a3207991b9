"""`mqstore tier verify`: the objects of a tier checked against its manifest, and repaired from a local copy.

Every object the manifest lists must exist with its size (segments: segment_size_bytes; queue files: the full file;
index files: the listed size) and its CRC-32 (segments and index files: the whole object; queue files: the units
the manifest counts). Each breach is a problem naming the object and the rule:

    tier.object-missing   the object is not there
    tier.object-size      the object's size is not the listed one
    tier.object-crc       the bytes' CRC-32 is not the listed one

A manifest slot that is spoiled beside a whole one (a write a crash tore) is reported apart, not as a problem: the
next upload writes it again. Objects under the store's directories that the manifest does not list (an upload a
crash interrupted, one not listed yet) are counted, not problems. `repair_from` re-uploads each damaged object
from a local store directory whose file still has the listed checksum.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from mqstore.commitlog.errors import CorruptionError, StoreError
from mqstore.consumequeue import format as queue_fmt
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TEMPORARY_MARK, TierLocation, crc32
from mqstore.tier.manifest import MANIFEST_KEYS, Manifest

PROBLEMS_KEPT_MAX = 100  # problems a report lists; the rest are counted


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int  # the object's size
    checked: int  # how many bytes from its start the checksum covers
    crc32: int
    local: str  # its path under a store directory


@dataclass
class TierReport:
    uri: str
    generation: int = 0
    start_offset: int | None = None
    end_offset: int | None = None
    objects: int = 0
    bytes_checked: int = 0
    unlisted: int = 0
    spoiled_slots: list[dict] = field(default_factory=list)  # a manifest slot torn by a crash (the other is whole)
    problem_count: int = 0
    problems: list[dict] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == len(self.repaired)

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def listed_objects(manifest: Manifest) -> list[ListedObject]:
    """Every object `manifest` lists, with what its checksum covers."""
    store = manifest.store
    segment_size = store["segment_size_bytes"]
    queue_bytes = store["consume_queue_entries_per_file"] * queue_fmt.UNIT_SIZE_BYTES
    found = []
    for segment in manifest.segments:
        key = manifest_module.segment_key(segment.base_offset)
        found.append(ListedObject(key, segment_size, segment_size, segment.crc32, key))
    for (topic, queue_id), files in sorted(manifest.queues.items()):
        for queue_file in files:
            key = manifest_module.queue_key(topic, queue_id, queue_file.name)
            found.append(ListedObject(key, queue_bytes, queue_file.entries * queue_fmt.UNIT_SIZE_BYTES,
                                      queue_file.crc32, key))
    for index_file in manifest.index:
        key = manifest_module.index_key(index_file.name)
        found.append(ListedObject(key, index_file.size, index_file.size, index_file.crc32, key))
    return found


def verify_tier(uri: str, *, repair_from: str | None = None, progress=None) -> TierReport:
    """Check every object the tier's manifest lists (module docstring); with `repair_from` (a store directory),
    re-upload the damaged ones whose local copy matches the manifest. Raises CorruptionError for a damaged or
    missing manifest."""
    location = TierLocation.open(uri)
    report = TierReport(uri=location.uri)
    manifest = manifest_module.load(location)
    if manifest is None:
        raise CorruptionError(f"the tier {location.uri} has no manifest ({' or '.join(MANIFEST_KEYS)})",
                              path=location.display(MANIFEST_KEYS[0]), rule="tier.manifest")
    for key, slot in manifest_module.read_slots(location):
        if isinstance(slot, CorruptionError):  # the other slot is whole: this one was torn by a crash, or damaged
            report.spoiled_slots.append({"object": location.display(key), "rule": "tier.manifest",
                                         "message": f"{slot}; generation {manifest.generation} is read from the "
                                                    "other slot, and the next upload writes this one again"})
    report.generation, report.start_offset, report.end_offset = manifest.generation, manifest.start, manifest.end
    objects = listed_objects(manifest)
    report.objects = len(objects)
    present = {info.key: info.size for info in location.list()}
    listed = {listed_object.key for listed_object in objects} | set(MANIFEST_KEYS)
    report.unlisted = sum(1 for key in present if key not in listed and TEMPORARY_MARK not in key)
    bar = progress(sum(o.checked for o in objects), "tier", "B") if progress else None
    try:
        for listed_object in objects:
            problem = _check(location, listed_object, present.get(listed_object.key))
            report.bytes_checked += listed_object.checked
            if bar is not None:
                bar.update(listed_object.checked)
            if problem is None:
                continue
            report.problem_count += 1
            if len(report.problems) < PROBLEMS_KEPT_MAX:
                report.problems.append(problem)
            if repair_from is not None and _repair(location, listed_object, repair_from):
                report.repaired.append(listed_object.key)
    finally:
        if bar is not None:
            bar.close()
    return report


def _check(location: TierLocation, listed_object: ListedObject, size: int | None) -> dict | None:
    where = location.display(listed_object.key)
    if size is None:
        return {"object": where, "offset": 0, "rule": "tier.object-missing", "message": "the object is not there"}
    if size != listed_object.size:
        return {"object": where, "offset": min(size, listed_object.size), "rule": "tier.object-size",
                "message": f"{size} bytes, the manifest lists {listed_object.size}"}
    read, checksum = location.checksum(listed_object.key, size, listed_object.checked)
    if read != listed_object.checked:
        return {"object": where, "offset": read, "rule": "tier.object-size",
                "message": f"it ends at {read}, the manifest lists {listed_object.size} bytes"}
    if checksum != listed_object.crc32:
        return {"object": where, "offset": 0, "rule": "tier.object-crc",
                "message": f"CRC-32 {checksum:#010x} of its first {listed_object.checked} bytes, the manifest lists "
                           f"{listed_object.crc32:#010x}"}
    return None


def _repair(location: TierLocation, listed_object: ListedObject, store_dir: str) -> bool:
    """Re-upload `listed_object` from the store directory's file of the same name, when that file's checked bytes
    have the listed checksum; whether it did."""
    path = os.path.join(store_dir, *listed_object.local.split("/"))
    try:
        with open(path, "rb") as handle:
            data = handle.read(listed_object.size)
    except OSError:
        return False
    if len(data) < listed_object.checked or crc32(data[:listed_object.checked]) != listed_object.crc32:
        return False
    if listed_object.checked < listed_object.size:  # a queue image: the units counted, zeros after them
        data = data[:listed_object.checked] + bytes(listed_object.size - listed_object.checked)
    if len(data) != listed_object.size:
        return False
    try:
        location.put_bytes(listed_object.key, data)
        return _check(location, listed_object, location.size(listed_object.key)) is None
    except StoreError:
        return False
