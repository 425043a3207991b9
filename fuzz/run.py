"""Run one harness under atheris: `python -m fuzz.run NAME [libFuzzer options] [CORPUS_DIR ...]`.

NAME is a module of this package with `one_input(data)`: put_path, message_type, flush_gate, codec, finalizers
or timer_link. The modules
of mqstore and of the harnesses are instrumented for atheris's Python coverage; the compiled core runs as built
(`make fuzz-python` runs it with the AddressSanitizer + UndefinedBehaviorSanitizer build). libFuzzer's options
pass through: -max_total_time=SECONDS, -runs=N, -artifact_prefix=DIR/ (where a failing input is written).

A finding (an AssertionError: the two codecs disagree, or an invariant broke) stops the run with the input written
as a crash file, as libFuzzer does. With MQSTORE_FUZZ_KEEP_GOING=DIR the run goes on instead: each new kind of
finding (the first line of its message, numbers left out) is written to DIR once, input and message, and the
harness starts again from fresh state. A crash of the process (a sanitizer report, a signal) always stops it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys

HARNESSES = ("put_path", "message_type", "flush_gate", "codec", "finalizers", "timer_link")
FINDING_KINDS_MAX = 200  # distinct findings a keep-going run records before it stops recording


def check_compiled_core() -> None:
    """The harnesses compare the compiled core with the pure-Python codec: refuse to run without it, or with another
    build than MQSTORE_NATIVE_LIBRARY names (fuzz/sanitizer/sitecustomize.py loads that one)."""
    from mqstore.commitlog import native

    if native.NATIVE is None:
        raise SystemExit("the compiled core is not loaded (MQSTORE_NATIVE=0, or it failed to import): nothing to fuzz")
    library = os.environ.get("MQSTORE_NATIVE_LIBRARY")
    if library and os.path.realpath(native.NATIVE.__file__) != os.path.realpath(library):
        raise SystemExit(f"the compiled core is {native.NATIVE.__file__}, not {library}")


def keep_going(harness, directory: str):
    """`harness.one_input`, recording each kind of finding in `directory` instead of stopping."""
    os.makedirs(directory, exist_ok=True)
    seen: set[str] = set()

    def one_input(data: bytes) -> None:
        try:
            harness.one_input(data)
        except AssertionError as exc:
            if hasattr(harness, "close"):
                harness.close()  # the state the finding left is not trusted
            kind = re.sub(r"-?\d+", "N", str(exc).splitlines()[0] if str(exc) else "")[:120]
            if kind in seen or len(seen) >= FINDING_KINDS_MAX:
                return
            seen.add(kind)
            name = hashlib.sha1(data).hexdigest()[:16]
            with open(os.path.join(directory, f"finding-{name}"), "wb") as handle:
                handle.write(data)
            with open(os.path.join(directory, f"finding-{name}.txt"), "w") as handle:
                handle.write(f"{exc}\n")
            print(f"FINDING {name}: {str(exc)[:300]}", file=sys.stderr, flush=True)

    return one_input


def main(argv: list[str]) -> None:
    import atheris

    if len(argv) < 2 or argv[1] not in HARNESSES:
        raise SystemExit(f"usage: python -m fuzz.run {{{','.join(HARNESSES)}}} [libFuzzer options] [CORPUS_DIR ...]")
    name = argv[1]
    with atheris.instrument_imports(include=["mqstore", "fuzz"]):  # before anything imports them
        harness = importlib.import_module(f"fuzz.{name}")
    check_compiled_core()
    findings = os.environ.get("MQSTORE_FUZZ_KEEP_GOING")
    atheris.Setup([argv[0], *argv[2:]], keep_going(harness, findings) if findings else harness.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
