"""Makes a `file://` tier's segment objects leave the machine, for bench/tier_upload.py's "objects leave" row.

    python bench/tier_sink.py TIER_URI

Every POLL_S it reads the tier's manifest and deletes the `commitlog/` objects it lists (verified by then), as if
the bytes had gone over the network to an object store elsewhere: a tier on tmpfs otherwise keeps every uploaded
byte in this machine's memory, and that memory's allocation competes with the writer's own page faults (the
"copies kept" stand-in row measures it). On SIGTERM it exits, printing the objects and bytes it deleted as one JSON
line. It runs in a process of its own and 10 nicer, as the uploader does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mqstore.tier import manifest as manifest_module  # noqa: E402
from mqstore.tier.location import TierLocation  # noqa: E402

POLL_S = 0.2
NICE = 10


def main() -> int:
    location = TierLocation.open(sys.argv[1])
    os.nice(NICE)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    deleted: set[str] = set()
    total = 0
    while not stopping:
        manifest = manifest_module.load(location)
        for segment in manifest.segments if manifest is not None else []:
            key = manifest_module.segment_key(segment.base_offset)
            if key not in deleted:
                path = location.path(key)  # a local path: the tier is file://
                total += os.path.getsize(path)
                os.unlink(path)
                deleted.add(key)
        time.sleep(POLL_S)
    print(json.dumps({"objects": len(deleted), "bytes": total}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
