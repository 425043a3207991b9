"""`mqstore tier verify`: a tier checked against its manifest; each kind of damage found, named by object and rule,
and repaired from a local copy where one exists."""

from __future__ import annotations

import json
import random

import pytest

from mqstore import MessageStore
from mqstore.cli.commands import main
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from tests.conftest import wait_until
from tests.tier.test_uploader import put_messages, sealed_end, tier_config


@pytest.fixture
def uploaded(tmp_path, tier_uri):
    """A store whose sealed segments are in the tier: (store directory, tier URI, manifest)."""
    root = tmp_path / "store"
    with MessageStore.open(root, tier_config(tier_uri)) as store:
        put_messages(store, random.Random(41), 500)
        end = sealed_end(store)
        assert wait_until(lambda: store.stats()["tier"]["uploaded_end"] == end)
    return root, tier_uri, manifest_module.load(TierLocation.open(tier_uri))


def verify(capsys, *args) -> tuple[int, dict]:
    code = main(["tier", "verify", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_intact_tier_verifies(uploaded, capsys):
    _, uri, manifest = uploaded
    code, report = verify(capsys, uri)
    assert code == 0 and report["ok"] and report["problem_count"] == 0
    assert report["objects"] == manifest.object_count() and report["end_offset"] == manifest.end
    assert "testing" not in json.dumps(report)  # the URI's keys are not shown


def test_damaged_objects_are_named_and_repaired_from_the_local_copy(uploaded, capsys):
    root, uri, manifest = uploaded
    location = TierLocation.open(uri)
    segment_size = manifest.segment_size_bytes
    flipped_key = manifest_module.segment_key(manifest.segments[1].base_offset)
    flipped = bytearray(location.read_range(flipped_key, segment_size, 0, segment_size))
    flipped[1000] ^= 0x40
    location.put_bytes(flipped_key, bytes(flipped))
    short_key = manifest_module.segment_key(manifest.segments[2].base_offset)
    location.put_bytes(short_key, location.read_range(short_key, segment_size, 0, 100))
    (topic, queue_id), files = sorted(manifest.queues.items())[0]
    missing_key = manifest_module.queue_key(topic, queue_id, files[0].name)
    location.delete(missing_key)
    code, report = verify(capsys, uri)
    assert code == 1 and report["problem_count"] == 3
    found = {problem["object"].rsplit("/", 3)[-1] if "consumequeue" not in problem["object"] else "queue":
             problem["rule"] for problem in report["problems"]}
    assert found == {flipped_key.split("/")[-1]: "tier.object-crc", short_key.split("/")[-1]: "tier.object-size",
                     "queue": "tier.object-missing"}
    code, report = verify(capsys, uri, "--repair-from", root)
    assert code == 0 and sorted(report["repaired"]) == sorted([flipped_key, short_key, missing_key])
    code, report = verify(capsys, uri)
    assert code == 0 and report["problem_count"] == 0


def test_a_damaged_object_without_a_local_copy_stays_a_problem(uploaded, capsys, tmp_path):
    _, uri, manifest = uploaded
    location = TierLocation.open(uri)
    key = manifest_module.segment_key(manifest.segments[0].base_offset)
    location.put_bytes(key, bytes(manifest.segment_size_bytes))
    code, report = verify(capsys, uri, "--repair-from", tmp_path / "nothing-here")
    assert code == 1 and report["repaired"] == [] and report["problems"][0]["rule"] == "tier.object-crc"


def test_a_tier_without_a_manifest_is_an_error(tmp_path, capsys):
    code = main(["tier", "verify", str(tmp_path / "empty")])
    assert code == 1 and "has no manifest" in capsys.readouterr().err
