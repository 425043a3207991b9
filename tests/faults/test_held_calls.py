"""The disk's calls seen from other threads: a flush syncs the file it was meant for even when another thread closes
its descriptor meanwhile, and a SYNC put's write that stalls does not stop the process's other threads.

Each test runs a scenario of tests/faults/scenarios.py in a process with disk_double.c preloaded, which holds
one fdatasync or pwrite of a chosen file.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a writer process each


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_a_flush_syncs_its_own_file_when_the_descriptor_is_closed_meanwhile(tmp_path, run_scenario, native):
    """A SYNC flush is held inside fdatasync while another thread closes the segment and its descriptor number is
    given to another file: the sync lands on the segment all the same, never on the other file."""
    report = run_scenario("fd_reuse", tmp_path / "store", "SYNC", native=native)
    assert report["held"]
    assert report["synced"] == report["segment"], f"the flush synced {report['synced']}"


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_a_stalled_write_of_a_sync_put_lets_other_threads_run(tmp_path, run_scenario, native):
    """A SYNC put's pwrite stalls (the double holds it): another thread of the process must be able to run Python
    meanwhile (here: to end the stall). A pwrite that keeps the interpreter lock stops every thread until the
    disk answers."""
    report = run_scenario("write_stall", tmp_path / "store", "SYNC", native=native)
    assert report["released_by_another_thread"], "no other thread ran while a put's write stalled"
    assert report["put"] == "PUT_OK"
