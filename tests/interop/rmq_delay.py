"""`RmqDelay.java` (beside this file) run like `rmq`: RocketMQ 4.4.0's store putting delay-level messages, and
listing the SCHEDULE_TOPIC_XXXX ConsumeQueue units (tag code = due time) as RocketMQ reads or rebuilds them.

Compiled on first use against the jars of ../shared/rocketmq-4.4.0/lib (and its fastjson stand-in, which makes
RocketMQ write `{}` as delayOffset.json) into a cache keyed by the sources' hash; run with tests/rocketmq.py's
isolation (a private network namespace, or turns) and time bound.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from tests.rocketmq import RMQ_CALL_TIMEOUT_S, Rmq, RmqError

SOURCE = Path(__file__).resolve().parent / "RmqDelay.java"
JAVA_OPTIONS = ("--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
                "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-exports",
                "java.base/jdk.internal.ref=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
_compiling = threading.Lock()


class RmqDelay(Rmq):
    """An Rmq whose command runs RmqDelay (`put`, `units`) instead of `rmq`."""

    def __init__(self, rmq: Rmq):
        super().__init__(rmq.home)
        self.rmq = rmq

    def compile(self) -> None:
        with _compiling:
            if self._compiled:
                return
            lib = sorted(str(path) for path in (self.home / "lib").glob("*.jar"))
            stand_in = self.home / "src" / "com" / "alibaba" / "fastjson" / "JSON.java"
            digest = hashlib.sha256(SOURCE.read_bytes() + stand_in.read_bytes()).hexdigest()[:16]
            cache = Path(os.environ.get("RMQ_CACHE", Path(tempfile.gettempdir()) / f"rmq-delay-{os.getuid()}"))
            classes = cache / digest
            if not (classes / "RmqDelay.class").exists():
                classes.mkdir(parents=True, exist_ok=True)
                for sources, path in (([str(stand_in)], ""), ([str(SOURCE)], ":".join(lib))):
                    done = subprocess.run(["javac", "-nowarn", "-cp", f"{path}:{classes}", "-d", str(classes),
                                           *sources], capture_output=True, text=True, timeout=RMQ_CALL_TIMEOUT_S)
                    if done.returncode != 0:
                        raise RmqError(f"RmqDelay.java did not compile: {done.stderr[-3000:]}")
            (cache / "home").mkdir(exist_ok=True)
            script = cache / f"rmq-delay-{digest}.sh"
            script.write_text("#!/bin/sh\nexec java " + " ".join(JAVA_OPTIONS) + f" -Duser.home={cache / 'home'} "
                              f"-cp {':'.join(lib)}:{classes} RmqDelay \"$@\"\n")
            script.chmod(0o755)
            self.command = str(script)
            self._compiled = True

    def put(self, store: Path, config, count: int, levels: list[int]) -> list[tuple[int, int, int, int]]:
        """RocketMQ puts `count` delayed messages; their (index, level, commitlog_offset, store_timestamp_ms)."""
        stdout = self.run("put", store, config.segment_size_bytes, config.consume_queue_entries_per_file, count,
                          *levels)
        return [tuple(int(word) for word in line.split()[1:]) for line in stdout.splitlines()
                if line.startswith("ACK ")]

    def units(self, store: Path, config) -> list[tuple[int, int, int, int, int]]:
        """RocketMQ's SCHEDULE_TOPIC_XXXX units: (queue_id, queue_offset, commitlog_offset, size, tags_code)."""
        stdout = self.run("units", store, config.segment_size_bytes, config.consume_queue_entries_per_file)
        return [tuple(int(word) for word in line.split()[1:]) for line in stdout.splitlines()
                if line.startswith("UNIT ")]

    def run_for(self, store: Path, config, milliseconds: int) -> None:
        """RocketMQ opens `store` and runs (its ScheduleMessageService delivering) for `milliseconds`."""
        self.run("run", store, config.segment_size_bytes, config.consume_queue_entries_per_file, milliseconds)
