"""Imports go one way (commitlog <- consumequeue, indexfile, flush <- mqstore), and the public API is locked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("commitlog", "consumequeue", "indexfile", "flush", "mqstore")
ALLOWED = {
    "commitlog": {"commitlog"},
    "consumequeue": {"commitlog", "consumequeue"},
    "indexfile": {"commitlog", "indexfile"},
    "flush": {"commitlog", "flush"},
    "mqstore": set(PROJECT_PACKAGES),
}
PUBLIC_API = [
    "ConfigMismatchError",
    "CorruptionError",
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


def imported_packages(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module, function-level imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, package if node.level else (node.module or "").split(".")[0]))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def _modules():
    for package in PROJECT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def test_every_package_is_walked():
    walked = {package for package, _ in _modules()}
    assert walked >= {"commitlog", "consumequeue", "indexfile", "mqstore"}
    assert sum(1 for _ in _modules()) >= 15


@pytest.mark.parametrize("package, path", list(_modules()), ids=[str(p.relative_to(ROOT)) for _, p in _modules()])
def test_no_upward_imports(package, path):
    upward = [f"{path.relative_to(ROOT)}:{line} imports {target}"
              for line, target in imported_packages(path, package)
              if target in PROJECT_PACKAGES and target not in ALLOWED[package]]
    assert upward == []


def test_the_import_walker_sees_every_form(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import mqstore.engine\nfrom consumequeue import x\nfrom . import sibling\n"
                      "def f():\n    from indexfile.format import y\n    __import__('flush.modes')\n"
                      "    importlib.import_module('mqstore')\n")
    assert imported_packages(module, "commitlog") == [
        (1, "mqstore"), (2, "consumequeue"), (3, "commitlog"), (5, "indexfile"), (6, "flush"), (7, "mqstore")]


def test_public_api_is_locked_and_sorted():
    import mqstore

    assert mqstore.__all__ == PUBLIC_API
    assert mqstore.__all__ == sorted(mqstore.__all__)
    assert all(hasattr(mqstore, name) for name in mqstore.__all__)
