"""Seeds for the codec fuzz target: real records, one a file, each after a flags byte (see fuzz_codec.c).

    python commitlog/csrc/fuzz/make_codec_seeds.py OUT_DIR [STORE_DIR ...]

Takes the records of the given stores (RocketMQ's fixture store, say) and of a small store it writes itself
(records of every shape the writer makes: record CRCs on and off, tags, keys, unicode properties, empty and
large bodies), at most SEEDS_PER_STORE from each.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from mqstore.commitlog import format as fmt  # noqa: E402

SEEDS_PER_STORE = 300
FLAG_VALUES = (0, 1, 3, 9)  # no check; CRCs checked; and the index size; and record CRCs required


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
    print(f"make_codec_seeds: {count} seeds in {out}")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
