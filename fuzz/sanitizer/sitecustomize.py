"""Make `mqstore.commitlog._native` the sanitizer build named by MQSTORE_NATIVE_LIBRARY, in every Python process.

`make test-asan` puts this directory on PYTHONPATH, so that Python's `site` imports this file at start-up in the
test process and in every process it starts (the crash tests' writer processes, the fuzz harnesses). The editable
install maps `mqstore.commitlog` to the repository's commitlog/ directory, whose `_native` is the normal build; the
finder below answers for that one module name first and loads the file MQSTORE_NATIVE_LIBRARY names instead. A
missing file is an error, never a silent fall-back to the normal build: a sanitizer pass that ran the normal build
would prove nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

MODULE_NAME = "mqstore.commitlog._native"
LIBRARY = os.environ.get("MQSTORE_NATIVE_LIBRARY", "")


class SanitizerBuildFinder(importlib.abc.MetaPathFinder):
    """Finds MODULE_NAME at LIBRARY, and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE_NAME:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, LIBRARY)
        return importlib.util.spec_from_file_location(fullname, LIBRARY, loader=loader)


if LIBRARY:
    if not os.path.isfile(LIBRARY):
        raise ImportError(f"MQSTORE_NATIVE_LIBRARY={LIBRARY!r} is not a file: build it with `make test-asan`")
    LIBRARY = os.path.abspath(LIBRARY)
    sys.meta_path.insert(0, SanitizerBuildFinder())
