"""The error tree: one base, the ValueError mixins, and CorruptionError's file and offset."""

from __future__ import annotations

import pytest

from commitlog import errors


@pytest.mark.parametrize("name", ["InvalidMessageError", "InvalidConfigError", "ConfigMismatchError",
                                  "StoreClosedError", "StoreLockedError", "ReadOnlyStoreError", "CorruptionError",
                                  "StoreIOError", "SegmentFullError", "QueueGapError"])
def test_every_error_is_a_store_error_with_a_docstring(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.StoreError) and cls.__doc__
    assert name in errors.__doc__


def test_refusals_are_value_errors_and_nothing_else_is():
    assert issubclass(errors.InvalidMessageError, ValueError) and issubclass(errors.InvalidConfigError, ValueError)
    assert not issubclass(errors.CorruptionError, ValueError) and not issubclass(errors.StoreClosedError, ValueError)


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
    formats = "commitlog|consumequeue|indexfile|checkpoint|config|offsets"
    for package in ("commitlog", "consumequeue", "indexfile", "flush", "mqstore"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            for rule in re.findall(r'\brule=f?"([^"]*)"', text):
                named = re.fullmatch(rf"({formats}|{{format_name}})\.[a-z0-9{{}}-]+", rule)
                assert named, f"{path.name}: rule={rule!r}"
            assert not re.search(r"\.rule\s*(==|!=|\bin\b|\bnot in\b)", text), f"{path.name} branches on a rule"
