"""A short pass of each Python-level fuzz harness (fuzz/, `make fuzz-python` runs them under atheris): a few hundred
random inputs each, through the compiled core and the pure-Python codec side by side, without atheris. Under
`make test-asan` the same pass runs with the sanitizer build."""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
from pathlib import Path

import pytest
from mqstore.commitlog import native

ROOT = Path(__file__).resolve().parents[2]
INPUTS = {"put_path": 600, "message_type": 2000, "flush_gate": 500, "codec": 2000}  # a second or two each
INPUT_BYTES_MAX = 400


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_a_short_pass_of_each_harness_finds_nothing(name):
    seed = random.randrange(2**32)
    print("seed", seed)
    harness = importlib.import_module(f"fuzz.{name}")
    rng = random.Random(seed)
    try:
        for _ in range(INPUTS[name]):
            data = rng.randbytes(rng.randrange(INPUT_BYTES_MAX))
            try:
                harness.one_input(data)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\ninput: {data.hex()}") from exc
    finally:
        if hasattr(harness, "close"):
            harness.close()


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
def test_the_atheris_runner_runs_a_harness(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (the `fuzz` extra: pip install -e '.[fuzz]')")
    done = subprocess.run([sys.executable, "-m", "fuzz.run", "codec", "-runs=300", f"-artifact_prefix={tmp_path}/"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Done 300 runs" in done.stderr
