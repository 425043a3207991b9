"""kill -9 of a writer while it uploads to its tier: nothing acknowledged is lost, nothing listed is partial.

The writer (tests/crash/tier_writer_process.py) puts planned messages and uploads every sealed segment at once,
while retention removes from local disk every segment the tier's manifest lists. The test kills it at a random
moment (during start-up, or after a random number of acknowledgements: the uploads run all the time, so kills
land in object writes, read-backs and manifest writes alike), then checks:

  * the manifest, when there is one, is valid, and `verify_tier` finds every object it lists whole (size and
    CRC-32): an interrupted upload is never listed;
  * the tier's end never moves back, and the tier and the local log together hold the log without a gap (the
    tier's end is at or past the local log's first segment);
  * every put acknowledged by any writer so far is readable, byte for byte, at its commitlog offset, from the
    local segment or else from the tier's object, and no seq is stored twice;
then starts the next writer on the same store and tier, which recovers the store and, before it puts, reads every
acknowledged put back through the store (`--check`): get() of its queue returns it and query(key) finds it, from
local disk or from the tier, so recovery kept the queue and index entries of what left local disk (trials that kill
the writer during start-up are checked by the next one). At the end a writer that is not killed uploads everything
sealed, the same checks hold, and one more writer, killed after its check, reads everything back once more. Series
against a file:// tier (in `make test`) and moto's S3 server on 127.0.0.1 (marked long: `make test-long`).
`MQSTORE_LONG_CRASH_SWEEP=1` runs many more trials.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mqstore.commitlog.message import decode_message

from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation
from mqstore.tier.verify import verify_tier
from tests.conftest import wait_until
from tests.crash.checks import body_seq, planned_message

LONG = os.environ.get("MQSTORE_LONG_CRASH_SWEEP") == "1"
TRIALS = 150 if LONG else 5  # per series
pytestmark = pytest.mark.timeout(3 * 3600 if LONG else 600)
ACKS_BEFORE_KILL_MAX = 600
EARLY_KILL_PROBABILITY = 0.15
LAST_WRITER_PUTS = 300
CHECK_WAIT_PER_PUT_S = 0.005  # Writer.assert_checked's bound, added to 60 s for each acknowledged put to check
SEGMENT = 64 * 1024
SEED = int(os.environ.get("MQSTORE_CRASH_SEED", "20261128"))
WRITER = Path(__file__).resolve().parent / "tier_writer_process.py"
REPO = Path(__file__).resolve().parents[2]


class Writer:
    """A tier writer process and the lines it printed."""

    def __init__(self, root: Path, uri: str, generation: int, count: int | None = None, check: list | None = None,
                 thread: bool = False):
        self.lines: list[str] = []
        env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
        extra = [] if count is None else ["--count", str(count)]
        extra += ["--thread"] if thread else []
        if check:
            acked_path = root.parent / f"acked-{generation}.txt"
            acked_path.write_text("".join(" ".join(map(str, entry)) + "\n" for entry in check))
            extra += ["--check", str(acked_path)]
        self.stderr_path = root.parent / f"writer-{generation}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen([sys.executable, str(WRITER), str(root), uri, "--generation",
                                             str(generation), *extra], stdout=subprocess.PIPE, stderr=stderr, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            self.lines.append(raw.decode().strip())

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def acks(self) -> int:
        return sum(1 for line in self.lines if line.startswith("ACK"))

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._reader.join()

    def acked(self) -> list[tuple[int, int, int, int]]:
        """(seq, commitlog offset, size, queue offset) of each acknowledged put."""
        return [tuple(int(part) for part in line.split()[1:5]) for line in self.lines if line.startswith("ACK")]

    def checked(self) -> tuple[int, int] | None:
        """(acknowledged puts read back, of them lost) once the --check is done, else None."""
        for line in self.lines:
            if line.startswith("CHECKED"):
                return int(line.split()[1]), int(line.split()[2])
        return None

    def assert_checked(self, count: int, label: str) -> None:
        """Wait for the --check of `count` acknowledged puts; every one read back. The wait grows with the count:
        a check reads each put through get() and query(), about 0.4 ms each on a quiet 2-core machine, and a
        long sweep reaches 45,000 puts while other work may share the cores."""
        assert wait_until(lambda: self.checked() is not None or self.process.poll() is not None,
                          timeout_s=60 + count * CHECK_WAIT_PER_PUT_S), f"{label}: the writer's check did not end"
        lost = [line for line in self.lines if line.startswith("LOST")]
        assert self.checked() == (count, 0), \
            f"{label}: {self.checked()} {lost} exit {self.process.poll()}: {self.stderr_tail()}"


def record_bytes(root: Path, location: TierLocation, manifest, offset: int, size: int) -> bytes | None:
    """The `size` bytes at commitlog `offset`: from the local segment, else from the tier's object."""
    base = offset - offset % SEGMENT
    path = root / "commitlog" / f"{base:020d}"
    if path.exists():
        with open(path, "rb") as handle:
            handle.seek(offset - base)
            return handle.read(size)
    if manifest is not None and manifest.segment_at(offset) is not None:
        return location.read_range(manifest_module.segment_key(base), SEGMENT, offset - base, size)
    return None


def local_bases(root: Path) -> list[int]:
    directory = root / "commitlog"
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if directory.exists() else []


def check_store(root: Path, uri: str, acked: list, previous_end: int | None, label: str) -> int | None:
    location = TierLocation.open(uri)
    manifest = manifest_module.load(location)
    local = local_bases(root)
    if manifest is not None:
        report = verify_tier(uri)
        assert report.ok, f"{label}: the tier lists damaged objects: {report.problems}"
        assert previous_end is None or manifest.end >= previous_end, f"{label}: the tier's end moved back"
        assert not local or manifest.end >= local[0], f"{label}: a gap between the tier and the local log"
    else:
        assert not local or local[0] == 0, f"{label}: local segments removed with no manifest"
    seen = {}
    for seq, offset, size, _ in acked:
        raw = record_bytes(root, location, manifest, offset, size)
        assert raw is not None and len(raw) == size, f"{label}: acknowledged seq {seq} at {offset} is gone"
        message = decode_message(raw, 0, size, offset, check_crc=True)
        planned = planned_message(seq, keys=True)
        assert (message.topic, message.body, message.keys) == (planned.topic, planned.body, planned.keys), label
        assert body_seq(message.body) == seq and seen.setdefault(seq, offset) == offset, label
    return manifest.end if manifest is not None else previous_end


def run_series(tmp_path: Path, uri: str, seed: int, thread: bool = False) -> None:
    """Kill writers (whose uploader is a process, or with `thread` a thread) and check what each acknowledged."""
    rng = random.Random(seed)
    print(f"[tier-kill] seed={seed} uri={uri.split('?')[0]} uploader={'thread' if thread else 'process'}")
    root = tmp_path / "store"
    acked: list = []
    end = None
    checks = 0
    for trial in range(TRIALS):
        writer = Writer(root, uri, generation=trial + 1, check=acked, thread=thread)
        if rng.random() < EARLY_KILL_PROBABILITY:
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            if acked:
                writer.assert_checked(len(acked), f"trial {trial}")
                checks += 1
            target = rng.randint(1, ACKS_BEFORE_KILL_MAX)
            assert wait_until(lambda: writer.acks() >= target or writer.process.poll() is not None), \
                f"trial {trial}: the writer made {writer.acks()} acks"
        writer.kill()
        acked += writer.acked()
        end = check_store(root, uri, acked, end, f"trial {trial}")
    writer = Writer(root, uri, generation=TRIALS + 1, count=LAST_WRITER_PUTS, check=acked,
                    thread=thread)  # then it only uploads
    writer.assert_checked(len(acked), "the last writer")
    assert wait_until(lambda: writer.acks() >= LAST_WRITER_PUTS)
    location = TierLocation.open(uri)

    log_end = max(offset + size for _, offset, size, _ in acked + writer.acked())
    sealed_end = log_end - log_end % SEGMENT  # the segment holding the log's end is never uploaded

    def caught_up() -> bool:
        manifest = manifest_module.load(location)
        return manifest is not None and manifest.end >= sealed_end

    assert wait_until(caught_up, timeout_s=60), f"the last writer did not upload up to {sealed_end}: " \
        f"{writer.stderr_tail()}"
    writer.kill()
    acked += writer.acked()
    check_store(root, uri, acked, end, "after the last writer")
    writer = Writer(root, uri, generation=TRIALS + 2, count=0, check=acked, thread=thread)
    writer.assert_checked(len(acked), "after the last writer")
    writer.kill()
    print(f"[tier-kill] {TRIALS} kills, {len(acked)} acknowledged puts checked, read back through get() and "
          f"query() after {checks + 2} recoveries")


@pytest.mark.parametrize("thread", [False, True], ids=["uploader-process", "uploader-thread"])
def test_kills_during_uploads_to_a_directory_lose_nothing(tmp_path, thread):
    run_series(tmp_path, (tmp_path / "tier").as_uri(), SEED + 2 * thread, thread)


@pytest.mark.long  # about 15 s (an S3 client in every writer): make test keeps the directory series above
def test_kills_during_uploads_to_s3_lose_nothing(tmp_path, s3_server):
    run_series(tmp_path, s3_server.uri(f"kill-{os.getpid()}"), SEED + 1)
