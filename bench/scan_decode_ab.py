"""The compiled Arrow decoder (commitlog/csrc/arrow_core.c) of this tree against another build's, in one process,
alternated: ns a row of `arrow_columns` over every record of the first 32 MiB of a store's log ("full") and over
one topic's records among them ("topic": a quarter of the rows of bench/users_rows.py's store, interleaved).

    .venv/bin/python bench/users_rows.py '{"worker": "build", "root": "STORE", "count": 1000000}'
    .venv/bin/python bench/scan_decode_ab.py STORE OTHER_BUILD/_native.cpython-311-x86_64-linux-gnu.so [--rounds 25]

The other build is a copy of another checkout's commitlog/_native*.so (loaded under its own name beside this
tree's). Both decoders read the same mapped pages in the same process, one after the other each round, so a busy
machine slows both alike; the medians and minima of the rounds are printed and written to
bench/results/scan_decode_ab.md (--out to choose; markdown, not a bench/report.py table: the numbers compare two
builds of one run). Decision 0049 has the numbers and the reading.
"""

from __future__ import annotations

import argparse
import importlib.util
import mmap
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mqstore.commitlog import _native as this_build  # noqa: E402
from mqstore.commitlog import arrow_decode  # noqa: E402
from mqstore.commitlog import format as fmt  # noqa: E402

LOG_BYTES = 32 * 1024 * 1024
TOPIC = "T0"


def _record_sets(root: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    path = os.path.join(root, "commitlog", fmt.segment_name(0))
    fd = os.open(path, os.O_RDONLY)
    try:
        mapped = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    finally:
        os.close(fd)
    length = min(LOG_BYTES, len(mapped) - arrow_decode.BUFFER_PAD_BYTES)
    positions, _, _ = arrow_decode.locate_records(mapped[:length + arrow_decode.BUFFER_PAD_BYTES], length, 0,
                                                  len(mapped), lenient=False, path=path)
    topic_at = positions + fmt.OFFSET_BODY + arrow_decode.FastLayout(mapped, positions, positions).body_length
    wanted = TOPIC.encode()
    keep = mapped[topic_at] == len(wanted)
    for k, byte in enumerate(wanted):
        keep &= mapped[topic_at + 1 + k] == byte
    return mapped, {"full": positions, "topic": positions[keep]}


def _ns_a_row(module, mapped: np.ndarray, positions: np.ndarray, topic: bytes | None) -> float:
    """As scan() calls it: a topic's records with the topic and sizes their ConsumeQueue units give."""
    sizes = arrow_decode.big_endian_ints(mapped, positions, 4, ">i4") if topic else None
    began = time.perf_counter()
    for at in range(0, len(positions), arrow_decode.BATCH_RECORDS_MAX):
        part = np.ascontiguousarray(positions[at:at + arrow_decode.BATCH_RECORDS_MAX])
        expect = None if sizes is None else np.ascontiguousarray(sizes[at:at + arrow_decode.BATCH_RECORDS_MAX])
        if module.arrow_columns(mapped, part, part, None, None, None, None, None, None, topic, expect, None) is None:
            raise SystemExit("the compiled decoder left these records to Python: not the common kind")
    return (time.perf_counter() - began) / len(positions) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("other_build")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scan_decode_ab.md"))
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("_native", args.other_build)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    mapped, sets = _record_sets(args.root)
    builds = {"other": other, "this": this_build}
    times = {(build, kind): [] for build in builds for kind in sets}
    for _ in range(args.rounds):
        for build, module in builds.items():
            for kind, positions in sets.items():
                times[(build, kind)].append(_ns_a_row(module, mapped, positions,
                                                              TOPIC.encode() if kind == "topic" else None))
    lines = [f"`.venv/bin/python bench/scan_decode_ab.py STORE OTHER_BUILD --rounds {args.rounds}` "
             f"({len(sets['full'])} records, {len(sets['topic'])} of topic {TOPIC}); ns a row, median (min):", "",
             "| decoder | full | topic | topic / full |", "|---|---:|---:|---:|"]
    for build in builds:
        medians = {kind: statistics.median(times[(build, kind)]) for kind in sets}
        lines.append(f"| {build} | " + " | ".join(f"{medians[k]:.0f} ({min(times[(build, k)]):.0f})" for k in sets)
                     + f" | {medians['topic'] / medians['full']:.2f} |")
    print("\n".join(lines))
    with open(args.out, "w") as out:
        out.write("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
