"""read_only=True: no lock, sees what a writer (in this or another process) has dispatched."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap

import pytest

from mqstore import GetStatus, Message, MessageStore, StoreLockedError
from mqstore.store.config import config_as_dict
from tests.unit.mqstore.conftest import config

RESPONSE_TIMEOUT_S = 60
SEGMENT = config().segment_size_bytes

# A writer process driven line by line over stdin; it answers each command with one line on stdout.
WRITER = textwrap.dedent("""
    import json
    import sys
    from mqstore import FlushMode, Message, MessageStore, StoreConfig

    fields = json.loads(sys.argv[2])
    store = MessageStore.open(sys.argv[1], StoreConfig(**{**fields, "flush_mode": FlushMode(fields["flush_mode"])}))
    print("open", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "put":
            topic, queue_id, first, count, size = args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4])
            for seq in range(first, first + count):
                store.put(Message(topic, (b"%d:" % seq).ljust(size, b"."), queue_id=queue_id, tags="T%d" % (seq % 2)))
            assert store.wait_dispatched(30)
            store.flush()
            print("done", store.max_offset(topic, queue_id), store.stats()["commitlog"]["segments"], flush=True)
        elif command == "close":
            store.close()
            print("closed", flush=True)
            break
""")


class Writer:
    def __init__(self, root):
        settings = json.dumps(config_as_dict(config()))  # the same settings as this process's stores
        self.process = subprocess.Popen([sys.executable, "-c", WRITER, str(root), settings], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.read() == ["open"]

    def read(self) -> list[str]:
        ready, _, _ = select.select([self.process.stdout], [], [], RESPONSE_TIMEOUT_S)
        if not ready:
            self.process.kill()
            pytest.fail(f"writer process did not answer within {RESPONSE_TIMEOUT_S} s")
        line = self.process.stdout.readline()
        if not line:
            pytest.fail(f"writer process died: {self.process.stderr.read()}")
        return line.split()

    def ask(self, command: str) -> list[str]:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(RESPONSE_TIMEOUT_S)
        self.process.stdin.close()
        self.process.stdout.close()
        self.process.stderr.close()


def _bodies(store, topic, queue_id, offset=0, tags=None):
    got = store.get(topic, queue_id, offset, max_count=10_000, tags=tags)
    return got.status, [int(m.body.split(b":")[0]) for m in got.messages]


@pytest.mark.timeout(120)
def test_a_reader_follows_a_writer_in_another_process(store_dir):
    writer = Writer(store_dir)
    try:
        assert writer.ask("put orders 0 0 50 100")[:2] == ["done", "50"]
        with pytest.raises(StoreLockedError):
            MessageStore.open(store_dir, config())
        with MessageStore.open(store_dir, config(), read_only=True) as reader:
            assert reader.topics() == {"orders": [0]}
            assert _bodies(reader, "orders", 0) == (GetStatus.FOUND, list(range(50)))

            done = writer.ask("put orders 0 50 100 3000")  # rolls several 64 KiB segments
            assert done[:2] == ["done", "150"] and int(done[2]) > 3
            assert reader.max_offset("orders", 0) == 150
            assert _bodies(reader, "orders", 0, offset=140) == (GetStatus.FOUND, list(range(140, 150)))
            assert _bodies(reader, "orders", 0, tags="T1")[1] == list(range(1, 150, 2))

            assert writer.ask("put payments 3 0 10 10")[:2] == ["done", "10"]
            assert reader.topics() == {"orders": [0], "payments": [3]}
            got = reader.get("payments", 3, 0)
            assert [m.queue_offset for m in got.messages] == list(range(10))
            message = got.messages[-1]
            assert reader.read_at(message.commitlog_offset) == message
            assert reader.offset_for_time("payments", 3, message.store_timestamp_ms + 1) == 10
            assert reader.get("payments", 3, 10).status is GetStatus.OFFSET_OVERFLOW_ONE

            assert writer.ask("close") == ["closed"]
            assert writer.process.wait(RESPONSE_TIMEOUT_S) == 0
            assert reader.max_offset("orders", 0) == 150
        with MessageStore.open(store_dir, config()) as store:  # the writer's lock went with it
            assert store.put(Message("orders", b"150:")).queue_offset == 150
    finally:
        writer.stop()


def test_a_reader_in_the_same_process_sees_what_is_dispatched(store_dir):
    with MessageStore.open(store_dir, config()) as writer:
        writer.put_batch([Message("t", b"%d:" % i) for i in range(5)])
        assert writer.wait_dispatched(30)
        with MessageStore.open(store_dir, config(), read_only=True) as reader:
            assert _bodies(reader, "t", 0) == (GetStatus.FOUND, list(range(5)))
            writer.put_batch([Message("t", b"%d:" % i + b"x" * 4000) for i in range(5, 60)])
            assert writer.wait_dispatched(30)
            assert _bodies(reader, "t", 0, offset=5) == (GetStatus.FOUND, list(range(5, 60)))
            assert reader.stats()["read_only"] is True and reader.wait_dispatched(1) is True


def test_a_reader_is_not_confused_by_a_segment_the_writer_is_creating(store_dir):
    """MappedFile.create makes the file empty first and sizes it next: a reader may list it in between.

    The writer is closed here, so the empty file stands for that instant without touching a live mapping.
    """
    with MessageStore.open(store_dir, config()) as writer:
        writer.put_batch([Message("t", b"%d:" % i) for i in range(5)])
    segments = sorted(int(path.name) for path in (store_dir / "commitlog").iterdir())
    with MessageStore.open(store_dir, config(), read_only=True) as reader:
        with open(store_dir / "commitlog" / f"{segments[-1] + SEGMENT:020d}", "xb"):
            pass
        assert _bodies(reader, "t", 0) == (GetStatus.FOUND, list(range(5)))
        assert reader.stats()["commitlog"]["max_offset"] >= 5 * 94


def test_a_reader_is_not_confused_by_a_queue_file_the_writer_is_creating(store_dir):
    """The same moment for a new queue: its directory and an empty first file exist, not yet sized."""
    with MessageStore.open(store_dir, config()) as writer:
        writer.put(Message("t", b"0:"))
        assert writer.wait_dispatched(30)
        with MessageStore.open(store_dir, config(), read_only=True) as reader:
            queue_dir = store_dir / "consumequeue" / "new" / "0"
            queue_dir.mkdir(parents=True)
            (queue_dir / f"{0:020d}").touch()
            assert reader.topics() in ({"t": [0]}, {"new": [0], "t": [0]})
            assert reader.max_offset("new", 0) == 0
            assert _bodies(reader, "t", 0) == (GetStatus.FOUND, [0])
