"""rare_collections: thresholds raised and the heap frozen within, both restored after."""

from __future__ import annotations

import gc

import pytest

from inferplane.sim.gc_tuning import RUN_GEN0_THRESHOLD, rare_collections


def test_raised_within_and_restored_after_even_on_error() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with pytest.raises(RuntimeError), rare_collections():
        assert gc.get_threshold() == (RUN_GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > frozen
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
