"""The error tree: one base, every subclass found by walking the project, the ValueError mixins, and
CorruptionError's file and offset."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from mqstore.commitlog import errors

PACKAGES = ("mqstore", "mqstore.commitlog", "mqstore.consumequeue", "mqstore.indexfile", "mqstore.flush")
NEEDS_PYSPARK = "mqstore.spark"  # modules under this prefix import pyspark (the `spark` extra)


def _import_every_module() -> None:
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, package_name + "."):
            if module.name.endswith(".__main__"):  # runs the command line when imported
                continue
            if module.name.startswith(NEEDS_PYSPARK):
                try:
                    import pyspark  # noqa: F401
                except ImportError:
                    continue
            importlib.import_module(module.name)


def _project_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        if sub.__module__.split(".")[0] == "mqstore":
            found.append(sub)
        found.extend(_project_subclasses(sub))
    return found


_import_every_module()
STORE_ERRORS = sorted(set(_project_subclasses(errors.StoreError)), key=lambda cls: cls.__name__)


def test_the_walk_finds_errors_outside_commitlog_errors():
    names = {cls.__name__ for cls in STORE_ERRORS}
    assert {"SegmentWriteError", "DispatchProcessError", "CorruptionError"} <= names


@pytest.mark.parametrize("cls", STORE_ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_has_a_docstring_and_a_place_in_the_drawn_tree(cls):
    assert cls.__doc__ and cls.__doc__.strip()
    assert f"+-- {cls.__name__} " in errors.__doc__, f"{cls.__module__}.{cls.__name__} is missing from the tree"


def test_refusals_are_value_errors_and_nothing_else_is():
    value_errors = {cls.__name__ for cls in STORE_ERRORS if issubclass(cls, ValueError)}
    assert value_errors <= {"InvalidMessageError", "OversizedLineError", "InvalidConfigError", "CommitLogSourceError"}
    assert {"InvalidMessageError", "InvalidConfigError"} <= value_errors


def test_corruption_error_carries_path_offset_and_rule():
    error = errors.CorruptionError("bad", path="/x/seg", offset=12, rule="commitlog.3")
    assert (error.path, error.offset, error.rule) == ("/x/seg", 12, "commitlog.3")
    assert not error.length_sound and not error.not_a_record
    assert issubclass(errors.QueueGapError, errors.CorruptionError)
    assert str(error) == "bad (file /x/seg, offset 12)"
    assert str(errors.CorruptionError("bad", offset=7)) == "bad (offset 7)"
    assert str(errors.CorruptionError("bad", path="p")) == "bad (file p)"


def test_every_rule_names_its_format_and_no_code_branches_on_one():
    """CorruptionError.rule is "<format>.<rule>" wherever it is set, and library code reads the typed flags or
    classes (length_sound, not_a_record, QueueGapError), never the rule string."""
    import pathlib
    import re

    root = pathlib.Path(errors.__file__).resolve().parent.parent
    formats = "commitlog|consumequeue|indexfile|checkpoint|config|offsets|tier|timer|schedule|lease"
    for package in ("commitlog", "consumequeue", "indexfile", "flush", "mqstore"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            for rule in re.findall(r'\brule=f?"([^"]*)"', text):
                named = re.fullmatch(rf"({formats}|{{format_name}})\.[a-z0-9{{}}-]+", rule)
                assert named, f"{path.name}: rule={rule!r}"
            assert not re.search(r"\.rule\s*(==|!=|\bin\b|\bnot in\b)", text), f"{path.name} branches on a rule"
