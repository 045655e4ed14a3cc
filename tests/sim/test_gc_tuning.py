"""rare_collections: collection off and the heap frozen within, both restored after; a run
leaves no cyclic garbage for the collector it turns off."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from inferplane.config import load_config
from inferplane.sim.gc_tuning import rare_collections
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import load_scenario

from .helpers import write_scenario


def test_off_within_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with pytest.raises(RuntimeError), rare_collections():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > frozen
        raise RuntimeError("the run failed")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_what_a_run_allocated_is_not_scanned_as_young_after_it() -> None:
    with rare_collections():
        kept = [[i] for i in range(50_000)]  # tracked objects that survive the run
        assert gc.get_count()[0] > 40_000
    assert gc.get_count()[0] < 1_000
    assert len(kept) == 50_000


def test_a_run_with_crashes_and_retries_makes_no_cyclic_garbage(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, duration_s=12, drain_s=10)  # a crash at 8 s, restarted
    sc = load_scenario(path)
    sim = Simulation(sc, load_config(path.parent / sc.fleet), path.parent, "inferplane")
    gc.collect()
    gc.disable()
    try:
        result = sim.run()
        found = gc.collect()
    finally:
        gc.enable()
    assert len(result.records) > 50
    assert any(r.attempts > 1 or r.reason for r in result.records)  # the crash hit calls
    assert found == 0
