"""No garbage-collector passes while a simulation runs.

A run allocates millions of short-lived, acyclic objects (events, views, tuples); reference
counting frees them. CPython's cyclic collector still scans the young generation every 700
net allocations and, every few of those, older generations that hold the whole fleet (block
pools, prefix index, ledger): ~10% of a 1,000-engine run's CPU at the default thresholds,
still ~4% with the young threshold raised 70x (measured: 176 young and 16 middle passes,
1.3 of 29.6 CPU s over 6 simulated s). A run makes no cyclic garbage: a full collection
after a 6-s, 1,000-engine run with the collector off found 0 unreachable objects
(``tests/sim/test_gc_tuning.py`` holds a run with faults and retries to that).
:func:`rare_collections` therefore moves everything built before the run into the
permanent generation (``gc.freeze``) and turns automatic collection off for the run, then
restores both, with the run's survivors moved to the oldest generation unscanned (else the
first allocation after the run scans all of them as young: ~2% of a run); whatever cycles a
run did leave are found by the next full pass.
Results never depend on it (the collector frees only unreachable cycles).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def rare_collections() -> Iterator[None]:
    """Within: the pre-existing heap frozen, automatic collection off; restored after, the
    whole heap then in the oldest generation."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # the run's survivors too, so enabling triggers no pass over all of them
        gc.unfreeze()  # everything to the oldest generation, unscanned
        if enabled:
            gc.enable()
