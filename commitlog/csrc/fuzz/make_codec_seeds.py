"""Seeds for the codec fuzz target: real records, one a file, each after a flags byte (see fuzz_codec.c).

    python commitlog/csrc/fuzz/make_codec_seeds.py OUT_DIR [STORE_DIR ...]

Takes the records of the given stores (RocketMQ's fixture store, say) and of a small store it writes itself
(records of every shape the writer makes: record CRCs on and off, tags, keys, unicode properties, empty and
large bodies), at most SEEDS_PER_STORE from each. From some of them it makes large-record seeds too (flags bit 4,
fuzz_codec.c): the same topic and properties after a body of up to 2 GiB of zeros, in a record that a segment
larger than 2 GiB could hold.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from mqstore.commitlog import format as fmt  # noqa: E402

SEEDS_PER_STORE = 300
FLAG_VALUES = (0, 1, 3, 9)  # no check; CRCs checked; and the index size; and record CRCs required
LARGE_FLAG = 16  # fuzz_codec.c: EXTRA, HEAD_LENGTH, the record's head, its tail
LARGE_SEEDS_PER_STORE = 12
# TOTALSIZE of the large seeds: just under 2^31, and a few smaller sizes of more than 1 GiB. Each is a record of
# a valid shape (the body as long as the size leaves), so the CRCs are not checked (a 2 GiB CRC costs a second).
LARGE_SIZES = (0x7FFFFFFF, 0x7FFFFF00, 0x7FF00000, 0x40000001)


def large_seeds(record: bytes) -> list[bytes]:
    """The record's tail (TOPICLENGTH to the end) after a body grown to make each of LARGE_SIZES; head = header."""
    body_length = int.from_bytes(record[fmt.OFFSET_BODY_LENGTH : fmt.OFFSET_BODY], "big", signed=True)
    tail = record[fmt.OFFSET_BODY + body_length :]
    seeds = []
    for size in LARGE_SIZES:
        header = bytearray(record[: fmt.HEADER_SIZE])
        header[0:4] = size.to_bytes(4, "big")
        header[fmt.OFFSET_BODY_LENGTH : fmt.OFFSET_BODY] = (size - fmt.HEADER_SIZE - len(tail)).to_bytes(4, "big")
        extra = size - len(header)
        seeds.append(bytes((LARGE_FLAG,)) + extra.to_bytes(4, "big") + len(header).to_bytes(2, "big") + header + tail)
    return seeds


def records_of(store_dir: str):
    """The message records of a store's commitlog, as bytes, in log order."""
    directory = os.path.join(store_dir, "commitlog")
    for name in sorted(os.listdir(directory)):
        if fmt.parse_segment_name(name) is None:
            continue
        with open(os.path.join(directory, name), "rb") as handle:
            data = handle.read()
        position = 0
        while position + 8 <= len(data):
            size, magic = fmt.BLANK.unpack_from(data, position)
            if magic not in (fmt.MESSAGE_MAGIC_CODE, fmt.MESSAGE_MAGIC_CODE_V2) or not 0 < size <= len(data) - position:
                break
            yield data[position : position + size]
            position += size


def written_store(root: str) -> list[str]:
    """Two logs written by the project's CommitLog (record CRCs off and on), with records of every shape."""
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.commitlog.message import Message
    from mqstore.commitlog.unique_key import UniqueKeyGenerator

    stores = []
    host = fmt.encode_host("10.0.0.7", 10911)
    for record_crc in (False, True):
        path = os.path.join(root, f"store-{int(record_crc)}")
        log = CommitLog(os.path.join(path, "commitlog"), 1 << 20, writable=True, max_message_size_bytes=65536,
                        max_queues_per_topic=8, born_host_raw=host, store_host_raw=host, preallocate=False,
                        record_crc=record_crc)
        if record_crc:
            log.unique_keys = UniqueKeyGenerator(host[:4])
        for i in range(40):
            body = bytes((i * 7 + j) % 256 for j in range((0, 1, 17, 100, 1000, 3000)[i % 6]))
            log.append(log.prepare(Message("fuzz", body, queue_id=i % 4, tags="TagA" if i % 2 else None,
                                           keys=[f"k{i}"] if i % 3 == 0 else (),
                                           properties={"naïve": "välue"} if i % 5 == 0 else {})))
        log.close()
        stores.append(path)
    return stores


def main(argv: list[str]) -> int:
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    count = 0
    with tempfile.TemporaryDirectory() as scratch:
        for store in [*argv[2:], *written_store(scratch)]:
            if not os.path.isdir(os.path.join(store, "commitlog")):
                print(f"make_codec_seeds: no commitlog in {store}, skipped", file=sys.stderr)
                continue
            for number, record in enumerate(records_of(store)):
                if number >= SEEDS_PER_STORE:
                    break
                flags = FLAG_VALUES[number % len(FLAG_VALUES)]
                with open(os.path.join(out, f"seed-{count:05d}"), "wb") as handle:
                    handle.write(bytes((flags,)) + record)
                count += 1
                if number < LARGE_SEEDS_PER_STORE and record[4:8] == fmt.MESSAGE_MAGIC_CODE.to_bytes(4, "big"):
                    for seed in large_seeds(record):
                        with open(os.path.join(out, f"seed-{count:05d}"), "wb") as handle:
                            handle.write(seed)
                        count += 1
    print(f"make_codec_seeds: {count} seeds in {out}")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
