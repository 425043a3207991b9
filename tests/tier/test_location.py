"""Tier locations: objects written whole, read by range, short objects reported, URIs shown without secrets."""

from __future__ import annotations

import os

import pytest
from mqstore.commitlog.errors import CorruptionError, InvalidConfigError

from mqstore.tier.location import TEMPORARY_MARK, TierLocation, crc32, redacted


def test_a_uri_is_shown_without_its_secrets():
    uri = ("s3://AKIA:hunter2@bucket/prefix?endpoint_override=127.0.0.1:9000&access_key=AKIA&secret_key=hunter2"
           "&session_token=tokvalue123&region=us-east-1")
    shown = redacted(uri)
    assert "hunter2" not in shown and "AKIA" not in shown and "tokvalue123" not in shown
    assert shown.startswith("s3://bucket/prefix?") and "endpoint_override=127.0.0.1:9000" in shown
    assert "region=us-east-1" in shown


def test_an_object_is_written_read_by_range_and_listed(tier_uri):
    location = TierLocation.open(tier_uri)
    data = os.urandom(3 * 1024 * 1024 + 17)
    size, checksum = location.put_chunks("commitlog/00000000000000000000", (data[:1000], data[1000:]))
    assert (size, checksum) == (len(data), crc32(data))
    assert location.size("commitlog/00000000000000000000") == len(data)
    assert location.read_range("commitlog/00000000000000000000", len(data), 123_456, 789) == data[123_456:124_245]
    assert location.checksum("commitlog/00000000000000000000", len(data)) == (len(data), crc32(data))
    assert location.checksum("commitlog/00000000000000000000", len(data), 5000) == (5000, crc32(data[:5000]))
    location.put_bytes("tier/manifest.json", b"{}")
    assert [(info.key, info.size) for info in location.list()] == [
        ("commitlog/00000000000000000000", len(data)), ("tier/manifest.json", 2)]
    assert location.read_all("tier/nothing") is None and location.size("tier/nothing") is None
    assert TEMPORARY_MARK not in str(location.list())


def test_an_object_shorter_than_its_manifest_says_is_corruption_naming_it(tier_uri):
    location = TierLocation.open(tier_uri)
    location.put_bytes("commitlog/00000000000000065536", b"x" * 100)
    with pytest.raises(CorruptionError) as caught:
        location.read_range("commitlog/00000000000000065536", 200, 50, 100)
    assert caught.value.rule == "tier.object-size" and caught.value.offset == 100
    assert caught.value.path.endswith("/commitlog/00000000000000065536")
    with pytest.raises(CorruptionError) as caught:
        location.read_range("commitlog/00000000000000131072", 200, 0, 10)
    assert caught.value.rule == "tier.object-missing"


def test_a_temporary_object_left_by_a_killed_writer_is_removed(tmp_path):
    location = TierLocation.open(str(tmp_path / "tier"))  # a plain path is a local directory
    location.put_bytes("commitlog/00000000000000000000", b"whole")
    (tmp_path / "tier" / "commitlog" / f"00000000000000065536{TEMPORARY_MARK}abc").write_bytes(b"half")
    assert location.remove_leftovers("commitlog") == 1
    assert [info.key for info in location.list()] == ["commitlog/00000000000000000000"]


def test_a_scheme_nothing_opens_is_a_config_error():
    with pytest.raises(InvalidConfigError):
        TierLocation.open("nosuchscheme://bucket/prefix")
    with pytest.raises(InvalidConfigError):
        TierLocation.open("")


def test_a_store_without_a_tier_opens_without_importing_pyarrow(tmp_path):
    """Recovery imports this module on every open; pyarrow comes with the first location, not with the module
    (its import cost every open about 0.1 s)."""
    import subprocess
    import sys

    program = ("import sys\n"
               "from mqstore import Message, MessageStore, StoreConfig\n"
               f"with MessageStore.open({str(tmp_path / 'store')!r}, StoreConfig(dispatch_process=False)) as store:\n"
               "    store.put(Message('t', b'x'))\n"
               "print(sorted(name for name in sys.modules if name.split('.')[0] == 'pyarrow'))\n"
               "from mqstore.tier.location import TierLocation\n"
               f"TierLocation.open({str(tmp_path / 'tier')!r})\n"
               "print('pyarrow.fs' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
