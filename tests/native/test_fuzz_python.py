"""A short pass of each Python-level fuzz harness (fuzz/, `make fuzz-python` runs them under atheris): a few hundred
random inputs each, through the compiled core and the pure-Python codec side by side, without atheris; and the proof
that a harness fails when the compiled side lies. Under `make test-asan` the same pass runs with the sanitizer
build."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from mqstore.commitlog import native

ROOT = Path(__file__).resolve().parents[2]
INPUTS = {"put_path": 600, "message_type": 2000, "flush_gate": 500, "codec": 2000, "finalizers": 150,
          "timer_link": 3000}  # 1-3 s each
INPUT_BYTES_MAX = 400


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_a_short_pass_of_each_harness_finds_nothing(name):
    # In a process of its own: the finalizers harness collects garbage after every input, which in the test
    # suite's process (a heap of thousands of tests) took 36-45 s instead of 4.
    seed = random.randrange(2**32)
    print("seed", seed)
    completed = subprocess.run([sys.executable, "-c", SHORT_PASS, name, str(seed), str(INPUTS[name])], cwd=ROOT,
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.split() == ["inputs", str(INPUTS[name])], completed.stdout + completed.stderr


SHORT_PASS = """
import importlib, random, sys
name, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
harness = importlib.import_module(f"fuzz.{name}")
rng = random.Random(seed)
done = 0
try:
    for _ in range(count):
        data = rng.randbytes(rng.randrange(%d))
        try:
            harness.one_input(data)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\\ninput: {data.hex()}") from exc
        done += 1
finally:
    if hasattr(harness, "close"):
        harness.close()
print("inputs", done)
""" % INPUT_BYTES_MAX


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_codec_harness_reports_a_compiled_decoder_that_differs(monkeypatch):
    from fuzz import codec

    honest = codec.COMPILED

    class Lying:
        """The compiled codec, but decode_record returns the message with its queue id moved by one."""

        def __getattr__(self, name):
            return getattr(honest, name)

        @staticmethod
        def decode_record(*args):
            message = honest.decode_record(*args)
            if message is None:
                return None
            return type(message)((*message[:3], message[3] + 1, *message[4:]))

    monkeypatch.setattr(codec, "COMPILED", Lying())
    rng = random.Random(1)
    with pytest.raises(AssertionError, match="decode_record"):
        for _ in range(2000):
            codec.one_input(rng.randbytes(rng.randrange(INPUT_BYTES_MAX)))


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_put_path_harness_reports_a_compiled_store_that_differs(monkeypatch):
    from fuzz import put_path

    class Lying:
        """The compiled codec's store, but every put's queue offset is reported one higher."""

        def __init__(self, store):
            self.store = store

        def __getattr__(self, name):
            return getattr(self.store, name)

        def put(self, message):
            result = self.store.put(message)
            return result._replace(queue_offset=result.queue_offset + 1)

    honest_init = put_path.Pair.__init__

    def lying_init(self):
        honest_init(self)
        self.stores["compiled"] = Lying(self.stores["compiled"])

    monkeypatch.setattr(put_path.Pair, "__init__", lying_init)
    rng = random.Random(1)
    try:
        with pytest.raises(AssertionError, match=r"operation \d+ \(put\)"):
            for _ in range(500):
                put_path.one_input(rng.randbytes(rng.randrange(INPUT_BYTES_MAX)))
    finally:
        put_path.close()


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_flush_gate_harness_reports_a_gate_that_forgets_an_advance(monkeypatch):
    from fuzz import flush_gate

    class Forgetful:
        """A FlushGate whose advance() lets go of the lead but never moves `durable`."""

        def __init__(self, gate):
            self.gate = gate

        def __getattr__(self, name):
            return getattr(self.gate, name)

        def advance(self, durable, keep):
            return self.gate.advance(self.gate.durable, False)

    class Codec:
        @staticmethod
        def flush_gate(durable):
            return Forgetful(native.NATIVE.flush_gate(durable))

    monkeypatch.setattr(flush_gate, "native", type("Native", (), {"NATIVE": Codec}))
    rng = random.Random(1)
    with pytest.raises(AssertionError, match="highest advance"):
        for _ in range(2000):
            flush_gate.one_input(rng.randbytes(rng.randrange(INPUT_BYTES_MAX)))


@pytest.mark.slow  # a subprocess importing atheris and instrumenting every mqstore module: 5-10 s
@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_atheris_runner_runs_a_harness(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (the `fuzz` extra: pip install -e '.[fuzz]')")
    done = subprocess.run([sys.executable, "-m", "fuzz.run", "codec", "-runs=300", f"-artifact_prefix={tmp_path}/"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Done 300 runs" in done.stderr


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_timer_link_harness_reports_a_compiled_link_that_differs(monkeypatch):
    from fuzz import timer_link

    honest = timer_link.COMPILED

    class Lying:
        """The compiled core, but timer_link links each slot's first unit to the slot's last but one."""

        def __getattr__(self, name):
            return getattr(honest, name)

        @staticmethod
        def timer_link(*args):
            result = honest.timer_link(*args)
            if result[0] == "linked" and result[1] > 0:
                units = args[11]
                units[4:12] = (int.from_bytes(units[4:12], "big", signed=True) - 52).to_bytes(8, "big", signed=True)
            return result

    monkeypatch.setattr(timer_link, "COMPILED", Lying())
    rng = random.Random(1)
    with pytest.raises(AssertionError, match="timer_link: units differ"):
        for _ in range(3000):
            timer_link.one_input(rng.randbytes(rng.randrange(INPUT_BYTES_MAX)))


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_the_timer_link_harness_reports_a_read_map_that_differs(monkeypatch):
    from fuzz import timer_link

    honest = timer_link.COMPILED

    class Lying:
        """The compiled core, but map_read_keep_lock takes a file one byte shorter than the size asked for the
        right one (a size check off by one) and hands back its bytes padded to the size asked."""

        def __getattr__(self, name):
            return getattr(honest, name)

        @staticmethod
        def map_read_keep_lock(path, size):
            result = honest.map_read_keep_lock(path, size)
            if isinstance(result, int) and result == size - 1 and result > 0:
                return memoryview(os.pread(timer_link._MAP_FILE.fileno(), result, 0) + b"\0")
            return result

    monkeypatch.setattr(timer_link, "COMPILED", Lying())
    rng = random.Random(1)
    with pytest.raises(AssertionError, match="map_read_keep_lock mapped a size the file does not have"):
        for _ in range(3000):
            timer_link.one_input(rng.randbytes(rng.randrange(INPUT_BYTES_MAX)))
