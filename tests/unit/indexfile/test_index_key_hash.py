"""The key hash (Java String.hashCode, RocketMQ's abs) in its scalar and vector forms, and file names."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from mqstore.commitlog.format import java_string_hash
from mqstore.indexfile import format as fmt


@pytest.mark.parametrize("text, java_hash", [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("Aa", 2112),  # the classic collision with "BB"
    ("BB", 2112),
    ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
    ("TopicTest#key-0", java_string_hash("TopicTest#key-0")),
])
def test_java_hash_values(text, java_hash):
    assert java_string_hash(text) == java_hash


def test_index_key_hash_is_rocketmq_abs():
    assert fmt.index_key_hash("polygenelubricants") == 0  # Math.abs(MIN_VALUE) < 0 -> 0
    negative = "orders#key-3"
    assert fmt.index_key_hash(negative) == abs(java_string_hash(negative))
    assert fmt.index_key("orders", "k 1") == "orders#k 1"


def test_vector_hash_matches_scalar_on_random_keys():
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    alphabet = "abcXYZ019#-_ %|" + "é€漢😀"  # ASCII, 2-byte, 3-byte and 4-byte (surrogate pair) UTF-8
    keys = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(3000)]
    keys += ["polygenelubricants", "GydZG_", ""]
    encoded = [key.encode("utf-8") for key in keys]
    expected = [fmt.index_key_hash(key) for key in keys]
    assert fmt.index_key_hashes(encoded).tolist() == expected
    assert fmt.index_key_hashes(encoded).dtype == np.int64


def test_vector_hash_invalid_utf8_is_replaced_like_java():
    raw = b"t#\xff\xfeabc"
    assert fmt.index_key_hashes([raw]).tolist() == [fmt.index_key_hash(raw.decode("utf-8", "replace"))]


def test_vector_hash_crosses_chunks_and_oversized_keys():
    long_key = b"x" * (fmt.HASH_CHUNK_BYTES_MAX + 5)
    keys = [b"orders#%d" % i for i in range(fmt.HASH_CHUNK_BYTES_MAX // 8)] + [long_key, b"a", b""]
    expected = [fmt.index_key_hash(key.decode("ascii")) for key in keys]
    assert fmt.index_key_hashes(keys).tolist() == expected
    assert fmt.index_key_hashes([]).tolist() == []


def test_time_diff_follows_rocketmq():
    assert fmt.time_diff_s(5_000, 0) == 0  # no beginTimestamp yet
    assert fmt.time_diff_s(1_700_000_001_999, 1_700_000_000_000) == 1
    assert fmt.time_diff_s(1_699_999_999_000, 1_700_000_000_000) == 0  # clock went back: clamped
    assert fmt.time_diff_s(2**62, 1) == fmt.TIME_DIFF_MAX


def test_file_names_sort_by_creation_and_never_repeat():
    stamp = int(time.mktime((2026, 11, 22, 6, 16, 35, 0, 0, -1))) * 1000 + 995
    assert fmt.file_name(stamp) == "20261122061635995"
    assert fmt.parse_file_name("20261122061635995") == 20261122061635995
    for bad in ("2026112206163599", "2026112206163599x", "20261122061635995.creating", "00000000000000000000"):
        assert fmt.parse_file_name(bad) is None
    assert fmt.next_file_name(stamp, None) == "20261122061635995"
    assert fmt.next_file_name(stamp, "20261122061635995") == "20261122061635996"
    assert fmt.next_file_name(stamp - 5000, "20261122061635999") == "20261122061636000"
    assert fmt.next_file_name(stamp + 1, "20261122061635995") == "20261122061635996"
