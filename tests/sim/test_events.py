"""The event queue: a total order on (time, priority, seq) and a clock that never goes back."""

from __future__ import annotations

import random

from inferplane.sim.events import EventKind, EventQueue


def test_pops_in_time_then_priority_then_insertion_order() -> None:
    rng = random.Random(1)
    items = [(rng.choice([0.0, 1.0, 2.5]), rng.choice(list(EventKind)), i) for i in range(200)]
    q = EventQueue()
    for t, kind, i in items:
        q.push(t, kind, i)
    popped = [q.pop() for _ in range(len(items))]
    expected = sorted(items, key=lambda it: (it[0], int(it[1]), it[2]))
    assert [(t, k, p) for t, k, p in popped] == expected
    assert not q


def test_clock_follows_pops_and_past_times_are_clamped() -> None:
    q = EventQueue()
    q.push(5.0, EventKind.ARRIVAL, "a")
    assert q.peek_time() == 5.0
    q.pop()
    assert q.now_s == 5.0
    q.push(1.0, EventKind.ARRIVAL, "late")  # scheduled in the past: runs now, not back in time
    t, kind, payload = q.pop()
    assert (t, kind, payload) == (5.0, EventKind.ARRIVAL, "late")
    assert q.peek_time() is None


def test_same_instant_kinds_run_faults_first_and_samples_last() -> None:
    q = EventQueue()
    for kind in reversed(list(EventKind)):
        q.push(3.0, kind)
    kinds = [q.pop()[1] for _ in range(len(EventKind))]
    assert kinds[0] is EventKind.FAULT
    assert kinds[-1] is EventKind.SAMPLE
    assert kinds.index(EventKind.ENGINE) < kinds.index(EventKind.ARRIVAL)
