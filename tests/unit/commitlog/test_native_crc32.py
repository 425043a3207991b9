"""mq_crc32 (commitlog/csrc/crc32.c) gives zlib.crc32's values on every path this CPU can run (vpclmul: AVX-512
carry-less-multiply folding; pclmul: 128-bit folding; zlib), for every length 0..4096 and random lengths to 64 KiB,
at every alignment, with random starting values and chained calls; and crc32_use() switches the path that
crc32 and the scans take."""

from __future__ import annotations

import random
import zlib

import pytest
from mqstore.commitlog import _native

PATHS = _native.crc32_paths()


@pytest.fixture
def rng():
    seed = random.randrange(2**32)
    print("seed", seed)
    return random.Random(seed)


def test_paths_are_listed_slowest_first_and_the_best_is_taken():
    assert PATHS[0] == "zlib" and set(PATHS) <= {"zlib", "pclmul", "vpclmul"}
    assert list(PATHS) == sorted(PATHS, key=["zlib", "pclmul", "vpclmul"].index)
    assert _native.crc32_path() == PATHS[-1]


@pytest.mark.parametrize("path", PATHS)
def test_every_length_to_4096_at_every_alignment_is_zlibs(path, rng):
    data = rng.randbytes(4096 + 64)
    for length in range(4097):
        start = length % 64 if length % 2 else (length // 2) % 64  # every alignment, for short and long lengths
        chunk = data[start : start + length]
        value = rng.getrandbits(32)
        assert _native.crc32_with(path, chunk, value) == zlib.crc32(chunk, value), (path, length, start, value)
        assert _native.crc32_with(path, chunk) == zlib.crc32(chunk), (path, length, start)


@pytest.mark.parametrize("path", PATHS)
def test_random_lengths_to_64k_and_chained_calls_are_zlibs(path, rng):
    data = rng.randbytes((1 << 16) + 64)
    view = memoryview(data)
    for _ in range(400):
        start, length, value = rng.randrange(64), rng.randrange((1 << 16) + 1), rng.getrandbits(32)
        chunk = view[start : start + length]
        assert _native.crc32_with(path, chunk, value) == zlib.crc32(chunk, value), (path, start, length, value)
    for _ in range(50):  # a CRC taken in pieces, each piece's value the next one's start
        cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 6)))
        value = 0
        for low, high in zip([0] + cuts, cuts + [len(data)]):
            value = _native.crc32_with(path, view[low:high], value)
        assert value == zlib.crc32(data), (path, cuts)


def test_long_inputs_and_the_other_entry_points_are_zlibs(rng):
    for length in (1 << 16, (1 << 20) + 13, 3 * (1 << 20) + 64):
        data = rng.randbytes(length)
        expected = zlib.crc32(data)
        assert all(_native.crc32_with(path, data) == expected for path in PATHS)
        assert _native.crc32_held(data) == expected
        assert _native.crc32(data) == expected  # the call that lets go of the GIL
        assert _native.crc32_zlib(data) == expected
        cut = rng.randrange(length)
        assert _native.crc32_held(data[cut:], _native.crc32_held(data[:cut])) == expected
    assert _native.crc32_held(b"") == 0 and _native.crc32_held(b"", 12345) == 12345
    assert all(_native.crc32_with(path, b"", 12345) == 12345 for path in PATHS)


@pytest.mark.parametrize("path", PATHS)
def test_crc32_use_switches_the_path_crc32_takes(path, rng):
    data = rng.randbytes(5000)
    best = _native.crc32_path()
    try:
        assert _native.crc32_use(path) == best
        assert _native.crc32_path() == path
        assert _native.crc32(data, 7) == _native.crc32_held(data, 7) == zlib.crc32(data, 7)
    finally:
        assert _native.crc32_use(None) == path
    assert _native.crc32_path() == best


def test_unknown_paths_are_refused():
    with pytest.raises(ValueError, match="no crc32 path named"):
        _native.crc32_with("sse9", b"abc")
    with pytest.raises(ValueError, match="no crc32 path named"):
        _native.crc32_use("sse9")
    assert _native.crc32_path() == PATHS[-1]
