"""put_batch while another thread changes what it was given (issue #29, part 3: encode_run's references).

encode_run (commitlog/csrc/codec.c) copies a batch's bodies and tails into the log with the GIL let go: into the
segment's mapping when the run is over 256 KiB, or into a scratch buffer it then writes with pwrite (the store's
default, `warm_segments=False`). Meanwhile another thread here gives the messages new bodies, replaces and clears
the list passed to put_batch, and, while encode_run runs, replaces and clears the very lists of bodies and tails
it was passed, then allocates blocks of the same sizes filled with 0xEE, so that memory freed under the copy is
reused at once. Every record in the log afterwards must be one message as it was at some moment: a body that is
exactly one version of one message (each body says which), its BODYCRC and record CRC right, its place the one
put_batch reported. Run it under AddressSanitizer with PYTHONMALLOC=malloc to see a stale read as a report.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import threading
import time

import numpy as np
import pytest
from mqstore.commitlog import _native
from mqstore.commitlog import format as fmt
from mqstore.commitlog.message import decode_message

from mqstore import Message, MessageStore, StoreConfig

ROUNDS = 60
MESSAGES_PER_BATCH = 16
BODY_BYTES_MIN, BODY_BYTES_MAX = 24_000, 64_000  # a batch: over encode_run's 256 KiB, so it lets go of the GIL
SEGMENT_BYTES = 8 << 20
BODY_HEAD = struct.Struct(">III")  # message number, version, length: what each body says it is


def body(number: int, version: int, length: int) -> bytes:
    """The body of version `version` of message `number`: its head, then bytes that follow from the head."""
    pattern = (np.arange(length - BODY_HEAD.size, dtype=np.int64) * (2 * number + 1) + version) % 251
    return BODY_HEAD.pack(number, version, length) + pattern.astype(np.uint8).tobytes()


class Mutator(threading.Thread):
    """Changes the current batch's messages, the list passed to put_batch and encode_run's lists, until stopped."""

    def __init__(self, rng: random.Random):
        super().__init__(daemon=True)
        self.rng = rng
        self.lock = threading.Lock()
        self.messages: list | None = None  # the list passed to put_batch (set for the length of the call)
        self.runs: tuple | None = None  # encode_run's (bodies, tails) while it runs
        self.issued: set[tuple[int, int]] = set()  # every (message, version) a body was made for
        self.versions = 0
        self.stop = threading.Event()
        self.steps = 0
        self.steps_in_runs = 0  # steps taken while encode_run ran

    def new_body(self, number: int) -> bytes:
        with self.lock:  # both threads make bodies
            self.versions += 1
            version = self.versions
            self.issued.add((number, version))
            length = self.rng.randrange(BODY_BYTES_MIN, BODY_BYTES_MAX)
        return body(number, version, length)

    def run(self) -> None:
        while not self.stop.is_set():
            messages, runs = self.messages, self.runs
            if messages is None and runs is None:
                time.sleep(0)  # between two puts: let the writer have the GIL
                continue
            self.steps += 1
            self.mutate(messages, runs)

    def mutate(self, messages, runs) -> None:
        rng = self.rng
        choice = rng.random()
        if messages and choice < 0.3:
            message = rng.choice(messages)
            message.body = self.new_body(BODY_HEAD.unpack_from(message.body)[0])
        elif messages and choice < 0.5:  # every body: then encode_run's lists may hold the last references
            for message in messages:
                message.body = self.new_body(BODY_HEAD.unpack_from(message.body)[0])
        elif messages and choice < 0.55:
            messages.clear()
        elif messages and choice < 0.6:
            number = rng.randrange(1 << 20)
            messages[rng.randrange(len(messages))] = Message(topic="T", body=self.new_body(number))
        if runs is not None:
            self.steps_in_runs += 1
            bodies, tails = runs
            if rng.random() < 0.2:
                bodies.clear()
                tails.clear()
            freed = []
            for items in (bodies, tails):
                for k in range(len(items)):  # equal bytes, other objects: the old ones may go
                    freed.append(len(items[k]))
                    items[k] = bytes(bytearray(items[k]))
            garbage = [b"\xee" * length for length in freed]  # the sizes just freed: their memory again, at once
            del garbage


class CodecSpy:
    """The compiled codec, with encode_run telling the mutator which lists it was passed while it runs."""

    def __init__(self, codec, mutator: Mutator):
        self._codec, self._mutator = codec, mutator

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def encode_run(self, *args):
        self._mutator.runs = (args[12], args[13])
        try:
            return self._codec.encode_run(*args)
        finally:
            self._mutator.runs = None


def _records(root) -> list[tuple[int, object]]:
    """(commitlog offset, message) of every record in the log, each checked with its CRCs."""
    found = []
    directory = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(directory)):
        base = fmt.parse_segment_name(name)
        with open(os.path.join(directory, name), "rb") as handle:
            data = handle.read()
        position = 0
        while position + 8 <= len(data):
            size, magic = fmt.BLANK.unpack_from(data, position)
            if magic != fmt.MESSAGE_MAGIC_CODE:
                break  # a blank or the end of the written log
            found.append((base + position, decode_message(data, position, len(data) - position, base + position,
                                                         path=name, check_crc=True, record_crc_from=0)))
            position += size
    return found


@pytest.mark.parametrize("warm_segments", [False, True], ids=["pwrite", "mapping"])
def test_put_batch_stores_consistent_messages_while_another_thread_changes_its_input(tmp_path, warm_segments):
    seed = int(os.environ.get("MQSTORE_THREAD_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"seed {seed} (MQSTORE_THREAD_SEED={seed} repeats it)")
    rng = random.Random(seed)
    mutator = Mutator(random.Random(rng.random()))
    config = StoreConfig(segment_size_bytes=SEGMENT_BYTES, max_message_size_bytes=BODY_BYTES_MAX,
                         dispatch_process=False, index_enabled=False, record_crc=True, warm_segments=warm_segments)
    reported = {}
    refused = 0
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # thread switches between most bytecodes of the put's Python parts too
    mutator.start()
    try:
        with MessageStore.open(str(tmp_path / "store"), config) as store:
            log = store._commitlog
            if log.codec is not _native:
                pytest.skip("the store runs the pure-Python codec (MQSTORE_NATIVE=0): it does not call encode_run")
            log.codec = CodecSpy(_native, mutator)
            for number in range(ROUNDS):
                batch = [Message(topic="T", body=mutator.new_body(number * MESSAGES_PER_BATCH + i))
                         for i in range(MESSAGES_PER_BATCH)]
                mutator.messages = batch
                try:
                    results = store.put_batch(batch)
                except ValueError as exc:  # encode_run's lists were cleared before it started: nothing written
                    assert "goes past the bodies or tails" in str(exc), seed
                    results = []
                    refused += 1
                finally:
                    mutator.messages = None
                for result in results:
                    assert result.status.name == "PUT_OK", (seed, result)
                    reported[result.commitlog_offset] = result.size_bytes
            log.codec = _native
    finally:
        mutator.stop.set()
        mutator.join()
        sys.setswitchinterval(switch_interval)
    records = _records(str(tmp_path / "store"))
    assert len(records) >= len(reported) > ROUNDS, (seed, len(records), len(reported))
    for offset, message in records:
        number, version, length = BODY_HEAD.unpack_from(message.body)
        assert (number, version) in mutator.issued, (seed, offset, number, version)
        assert message.body == body(number, version, length), (seed, offset, number, version)
        assert message.topic == "T" and message.size_bytes == reported.get(offset, message.size_bytes), (seed, offset)
    assert set(reported) <= {offset for offset, _ in records}, seed
    print(f"{len(records)} records checked; the other thread made {mutator.steps} steps ({mutator.steps_in_runs} while "
          f"encode_run ran) and {mutator.versions} bodies; {refused} batches refused")
