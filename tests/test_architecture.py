"""The layers import one way, and the public API is locked.

    mqstore.commitlog  <-  mqstore.consumequeue, mqstore.indexfile, mqstore.flush  <-  mqstore.store
    mqstore.consumequeue, mqstore.indexfile  <-  mqstore.tier  <-  mqstore.store
    mqstore.commitlog  <-  mqstore.timer, mqstore.schedule  <-  mqstore.store
    mqstore.store      <-  mqstore.consumer  <-  mqstore.cli
    mqstore.consumer   <-  mqstore.lease (the group's committed offsets)
    mqstore.store      <-  mqstore.spark

The Spark source and the command line use the store's public surface (the `mqstore` package and
`mqstore.store`) and the formats, never each other; the store imports neither. The one arrow the other way is
the store's `consumer()` factory, which imports mqstore.consumer inside the call. The top-level modules of the
`mqstore` package (`__init__`, `__main__`, `demo`, `aio`) may use every layer. commitlog/, consumequeue/, indexfile/
and flush/ sit at the top of the repository and install as mqstore.commitlog, ...; nothing imports them by
their folder names, and no library module imports `bench`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {  # repository folder -> the package it installs as
    "commitlog": "mqstore.commitlog",
    "consumequeue": "mqstore.consumequeue",
    "indexfile": "mqstore.indexfile",
    "flush": "mqstore.flush",
    "mqstore": "mqstore",
}
FORMATS = {"mqstore.commitlog", "mqstore.consumequeue", "mqstore.indexfile"}
ENGINE = FORMATS | {"mqstore.flush", "mqstore.store", "mqstore.tier", "mqstore.timer", "mqstore.schedule"}
ALLOWED = {  # layer -> the layers it may import
    "mqstore.commitlog": {"mqstore.commitlog"},
    "mqstore.consumequeue": {"mqstore.commitlog", "mqstore.consumequeue"},
    "mqstore.indexfile": {"mqstore.commitlog", "mqstore.indexfile"},
    "mqstore.flush": {"mqstore.commitlog", "mqstore.flush"},
    "mqstore.tier": FORMATS | {"mqstore.tier"},  # the object store side; it knows a store only as an argument
    "mqstore.timer": FORMATS | {"mqstore.timer"},  # knows a store only as an argument, like the tier
    "mqstore.schedule": FORMATS | {"mqstore.schedule"},  # delay levels (RocketMQ 4.4.0): like the timer
    "mqstore.store": ENGINE | {"mqstore.consumer"},
    "mqstore.consumer": ENGINE | {"mqstore", "mqstore.consumer"},
    "mqstore.lease": ENGINE | {"mqstore", "mqstore.consumer", "mqstore.lease"},
    "mqstore.spark": ENGINE | {"mqstore", "mqstore.spark"},
    "mqstore.cli": ENGINE | {"mqstore", "mqstore.consumer", "mqstore.cli"},
    "mqstore": ENGINE | {"mqstore", "mqstore.consumer", "mqstore.lease", "mqstore.spark", "mqstore.cli"},
}
LAYERS = sorted(ALLOWED, key=len, reverse=True)
OLD_NAMES = {"commitlog", "consumequeue", "indexfile", "flush", "bench"}
PUBLIC_API = [
    "ConfigMismatchError",
    "CorruptionError",
    "FlushFailedError",
    "FlushMode",
    "GetResult",
    "GetStatus",
    "InvalidConfigError",
    "InvalidMessageError",
    "Message",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "ReadOnlyStoreError",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "StoredMessage",
]


def module_name(path: Path) -> str:
    """The dotted name a repository file installs as."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = FOLDERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in a module, function-level and relative imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            found.append((node.lineno, node.args[0].value))
    return found


def layer_of(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def _modules():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path


def test_every_layer_is_walked():
    walked = {layer_of(module_name(path)) for path in _modules()}
    assert walked == set(ALLOWED)


@pytest.mark.parametrize("path", list(_modules()), ids=[str(p.relative_to(ROOT)) for p in _modules()])
def test_imports_go_one_way(path):
    module = module_name(path)
    layer = layer_of(module)
    wrong = []
    for line, target in imported_modules(path, module):
        top = target.split(".")[0]
        if top in OLD_NAMES:
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} (a folder name, not an installed package)")
        elif top == "mqstore" and layer_of(target) not in ALLOWED[layer]:
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({layer} may not use {layer_of(target)})")
    assert wrong == []


def test_the_import_walker_sees_every_form(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import mqstore.store.engine\nfrom mqstore.consumequeue import x\nfrom . import sibling\n"
                      "def f():\n    from ..indexfile.format import y\n    __import__('mqstore.flush.modes')\n"
                      "    importlib.import_module('mqstore')\n")
    assert imported_modules(module, "mqstore.commitlog.m") == [
        (1, "mqstore.store.engine"), (2, "mqstore.consumequeue.x"), (3, "mqstore.commitlog.sibling"),
        (5, "mqstore.indexfile.format.y"), (6, "mqstore.flush.modes"), (7, "mqstore")]


def test_the_layer_rule_rejects_an_upward_import():
    assert layer_of("mqstore.store.engine") == "mqstore.store"
    assert layer_of("mqstore.spark.options") not in ALLOWED["mqstore.cli"]
    assert layer_of("mqstore.cli.common") not in ALLOWED["mqstore.spark"]
    assert layer_of("mqstore.store.engine") not in ALLOWED["mqstore.commitlog"]


def test_public_api_is_locked_and_sorted():
    import mqstore

    assert mqstore.__all__ == PUBLIC_API
    assert mqstore.__all__ == sorted(mqstore.__all__)
    assert all(hasattr(mqstore, name) for name in mqstore.__all__)


def _scripts():
    for folder in ("tests", "bench"):
        yield from sorted((ROOT / folder).rglob("*.py"))
    yield from sorted((ROOT / "commitlog" / "csrc").rglob("*.py"))


def test_tests_and_benchmarks_import_installed_names_only():
    """A folder name (`import commitlog`) would load a second copy of a module, and of the compiled core, whose
    classes and state differ from the installed ones."""
    folders = OLD_NAMES - {"bench"}
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}" for path in _scripts()
             for line, target in imported_modules(path, "tests.m") if target.split(".")[0] in folders]
    assert wrong == []


@pytest.mark.parametrize("child", ["mqstore.store.dispatch_process", "mqstore.tier.upload_process"])
def test_a_child_process_module_does_not_import_the_store_engine(child):
    """The package's MessageStore is imported at its first use: the children the store starts import their own
    module (and so the package) and not the engine, which would add about 0.3 s to every start."""
    import subprocess
    import sys

    program = f"import sys, {child}; print(sorted(m for m in sys.modules if m.startswith('mqstore.store.engine')))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_public_names_resolve_as_before():
    import mqstore
    from mqstore.store.engine import MessageStore
    from mqstore.store.reads import GetResult, GetStatus

    assert (mqstore.MessageStore, mqstore.GetResult, mqstore.GetStatus) == (MessageStore, GetResult, GetStatus)
    assert set(mqstore.__all__) <= set(dir(mqstore))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        mqstore.NoSuchName  # noqa: B018 - the access is the test
