"""The error tree: one base, the ValueError mixins, and CorruptionError's file and offset."""

from __future__ import annotations

import pytest

from mqstore.commitlog import errors


@pytest.mark.parametrize("name", ["InvalidMessageError", "InvalidConfigError", "ConfigMismatchError",
                                  "StoreClosedError", "StoreLockedError", "ReadOnlyStoreError", "CorruptionError",
                                  "StoreIOError", "SegmentFullError"])
def test_every_error_is_a_store_error_with_a_docstring(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.StoreError) and cls.__doc__
    assert name in errors.__doc__


def test_refusals_are_value_errors_and_nothing_else_is():
    assert issubclass(errors.InvalidMessageError, ValueError) and issubclass(errors.InvalidConfigError, ValueError)
    assert not issubclass(errors.CorruptionError, ValueError) and not issubclass(errors.StoreClosedError, ValueError)


def test_corruption_error_carries_path_offset_and_rule():
    error = errors.CorruptionError("bad", path="/x/seg", offset=12, rule="3")
    assert (error.path, error.offset, error.rule) == ("/x/seg", 12, "3")
    assert str(error) == "bad (file /x/seg, offset 12)"
    assert str(errors.CorruptionError("bad", offset=7)) == "bad (offset 7)"
    assert str(errors.CorruptionError("bad", path="p")) == "bad (file p)"
