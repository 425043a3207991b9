"""A pytest plugin for `make test-asan` (`-p asan_check`): refuse to run unless the compiled core the tests import is
the sanitizer build and the AddressSanitizer runtime is loaded, and name both in the report header."""

from __future__ import annotations

import os

import pytest


def _loaded_libraries() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


def pytest_configure(config):
    library = os.environ.get("MQSTORE_NATIVE_LIBRARY", "")
    if not library:
        raise pytest.UsageError("asan_check: MQSTORE_NATIVE_LIBRARY is not set (run through `make test-asan`)")
    from mqstore.commitlog import _native

    if os.path.realpath(_native.__file__) != os.path.realpath(library):
        raise pytest.UsageError(f"asan_check: the tests import {_native.__file__}, not the sanitizer build {library}")
    if "asan" not in _loaded_libraries():  # libasan.so (gcc) or libclang_rt.asan (clang)
        raise pytest.UsageError("asan_check: the AddressSanitizer runtime is not loaded (LD_PRELOAD)")


def pytest_report_header(config):
    from mqstore.commitlog import _native

    return f"compiled core: {_native.__file__} (AddressSanitizer + UndefinedBehaviorSanitizer)"
