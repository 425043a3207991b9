"""Each name of the compiled module is defined once. module.c adds several C files' method tables to one module,
and a later table's function of the same name replaces an earlier one without a word (a timer helper named
write_at once replaced the CommitLog's write_at, with other semantics)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from mqstore.commitlog import native

SOURCES = Path(__file__).resolve().parents[2] / "commitlog" / "csrc"


def _module_names() -> list[str]:
    """Every name the module gets: the entries of the method tables module.c adds, and the objects added by name."""
    texts = {path.name: path.read_text() for path in SOURCES.glob("*.c")}
    tables = set(re.findall(r"PyModule_AddFunctions\(module, (\w+)\)", texts["module.c"])) | {"module_methods"}
    names = []
    for text in texts.values():
        for table in tables:
            found = re.search(r"PyMethodDef " + table + r"\[\] = \{(.*?)\n\};", text, re.S)
            if found:
                names += re.findall(r'^\s*\{"(\w+)",', found.group(1), re.M)
        names += re.findall(r'PyModule_AddObjectRef\(module, "(\w+)"', text)
    return names


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled core is not built (or MQSTORE_NATIVE=0)")
def test_every_name_of_the_compiled_module_is_defined_once():
    names = _module_names()
    assert len(names) > 30 and {"write_at", "pwrite_keep_lock", "timer_link", "Appender"} <= set(names)
    assert [name for name, count in Counter(names).items() if count > 1] == []
    assert [name for name in names if not hasattr(native.NATIVE, name)] == []
