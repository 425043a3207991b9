"""Hostile lengths near 2^31 and 2^32 in a sparse 4 GiB + 1 MiB segment, through every read path of both codecs.

tests/native/hostile.py writes each case (TOTALSIZE, BODYLENGTH, TOPICLENGTH and PROPERTIESLENGTH at each side of
the boundaries of their fields, records at positions around 2^31, 2^32 and the segment's end) and decodes it by
offset (read_at's path), by an index's size (get's path: decode_run; the timer's enqueue: record_values) and by
the dispatch scan (scan_segment), in
a child process per codec: a codec that crashes fails the test instead of ending pytest. Both codecs must give
the same outcome for every case, and every outcome must be a message or a CorruptionError, never another error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native import hostile

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 300


def _matrix(test):
    """The tests of the case matrix: two child processes of a few seconds each, shared by the module."""
    return pytest.mark.slow(test)


def _outcomes(codec: str, segment: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "tests.native.hostile", codec, str(segment)], cwd=ROOT,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, f"{codec} codec: exit {done.returncode}\n{done.stderr[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[dict]]:
    segment = tmp_path_factory.mktemp("hostile") / "00000000012884905984"
    hostile.make_segment(str(segment))
    return {codec: _outcomes(codec, segment) for codec in ("python", "native")}


@_matrix
def test_every_case_runs_to_its_end_on_both_codecs(outcomes):
    expected = sum(1 for _ in hostile.hostile_cases()) + sum(1 for _ in hostile.edge_cases())
    assert expected > 3000
    assert len(outcomes["python"]) == expected
    assert len(outcomes["native"]) == expected


@_matrix
def test_the_codecs_agree_on_every_case(outcomes):
    for reference, native in zip(outcomes["python"], outcomes["native"], strict=True):
        assert native == reference


@_matrix
def test_a_hostile_case_is_a_corruption_error_or_a_refusal(outcomes):
    for case in outcomes["native"]:
        for path in ("read", "indexed", "values"):
            assert case[path][0] in ("ok", "CorruptionError"), (path, case)
        assert case["scan"][0] == "batch", case


@_matrix
def test_the_record_that_wrapped_int32_is_refused_by_rule_3(outcomes):
    # TOTALSIZE 0x7FFFFFFF, BODYLENGTH TOTALSIZE - 91, TOPICLENGTH 255 at the segment's start: the PROPERTIESLENGTH
    # position is 0x7FFFFFFC + 256, past 2^31 (an int32 made it negative, and the read went 2 GiB before the map)
    for case, (position, pieces) in zip(outcomes["native"], hostile.hostile_cases()):
        head, (tail_at, tail) = pieces[0][1], pieces[1]
        if position == 0 and head[:4] == b"\x7f\xff\xff\xff" and tail_at == 0x7FFFFFFC and tail[0] == 255:
            assert case["read"][0] == "CorruptionError" and "[rule 3]" in case["read"][1], case
            assert "TOPICLENGTH 255" in case["read"][1], case
            return
    pytest.fail("the case is not in the list")


@_matrix
def test_small_records_across_2_31_and_2_32_and_at_the_end_decode(outcomes):
    edge = outcomes["native"][-sum(1 for _ in hostile.edge_cases()):]
    accepted = [case["position"] for case in edge if case["read"][0] == "ok"]
    assert accepted == [(1 << 31) - 50, (1 << 32) - 50, (1 << 32) + 7, hostile.SEGMENT_BYTES - 105]
    for case in edge:
        assert case["indexed"][0] == case["read"][0]


def _with_record_crc(digits_value: int) -> tuple[bytearray, int]:
    """A record with the record-CRC pair whose 10 digits (least significant first) hold `digits_value` (the
    placeholder's digits when None) and the record's CRC as the real value."""
    from mqstore.commitlog import format as fmt

    properties = b"a\x01b\x02" + fmt.RECORD_CRC_PLACEHOLDER
    body = b"body"
    size = 88 + len(body) + 2 + 2 + len(properties)
    record = bytearray(hostile.header(size, len(body), 0, fmt.body_crc(body)) + body + b"\x01T"
                       + len(properties).to_bytes(2, "big") + properties)
    crc = fmt.crc32(bytes(record[: size - fmt.RECORD_CRC_LENGTH])) & 0x7FFFFFFF
    record[size - 11 : size - 1] = str(digits_value(crc)).rjust(10, "0")[::-1].encode()
    return record, crc


def test_record_crc_digits_are_compared_in_full_not_in_32_bits():
    # ten digits hold up to 9,999,999,999: the CRC + 2^32 is another value, which the Python path rejects (rule 6)
    from mqstore.commitlog import _native
    from mqstore.commitlog.errors import CorruptionError
    from mqstore.commitlog.message import StoredMessage, decode_message

    good, _ = _with_record_crc(lambda crc: crc)
    assert _native.decode_record(good, 0, len(good), 0, True, -1, StoredMessage) == decode_message(
        good, 0, len(good), 0, check_crc=True)
    bad, _ = _with_record_crc(lambda crc: crc + (1 << 32))
    with pytest.raises(CorruptionError, match="rule 6"):
        decode_message(bad, 0, len(bad), 0, check_crc=True)
    assert _native.decode_record(bad, 0, len(bad), 0, True, -1, StoredMessage) is None  # handed to the reference
    assert _native.decode_run(bad, 0, [0], [len(bad)], 0, -1, None, None, 0, None, [], StoredMessage) == 0
