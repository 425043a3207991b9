"""mq_crc32 (commitlog/csrc/crc32.c: carry-less-multiply folding for 64 bytes and more, zlib below) gives
zlib.crc32's values: every length 0..4096 at every alignment mod 16, with random starting values, and long inputs."""

from __future__ import annotations

import random
import zlib

from mqstore.commitlog import _native


def test_every_length_to_4096_is_zlibs():
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    data = rng.randbytes(4096 + 16)
    for length in range(4097):
        start = length % 16
        chunk = data[start : start + length]
        value = rng.getrandbits(32)
        assert _native.crc32_held(chunk, value) == zlib.crc32(chunk, value), (length, value)
        assert _native.crc32_held(chunk) == zlib.crc32(chunk), length
        assert _native.crc32_zlib(chunk, value) == zlib.crc32(chunk, value), length


def test_long_inputs_and_chained_calls_are_zlibs():
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    for length in (1 << 16, (1 << 20) + 13, 3 * (1 << 20) + 64):
        data = rng.randbytes(length)
        assert _native.crc32_held(data) == zlib.crc32(data)
        assert _native.crc32(data) == zlib.crc32(data)  # the call that lets go of the GIL
        cut = rng.randrange(length)
        assert _native.crc32_held(data[cut:], _native.crc32_held(data[:cut])) == zlib.crc32(data)
    assert _native.crc32_held(b"") == 0 and _native.crc32_held(b"", 12345) == 12345
