"""The simulator's event queue: a heap in a total order and the virtual clock it drives.

Every event is keyed ``(time_s, priority, seq)``: time first, then a fixed priority per event
kind (faults before engine steps before arrivals before samples, so what happens "at the same
instant" always happens in the same order), then an insertion counter, so two runs with the
same seed pop events in exactly the same order. The clock only moves when an event is popped,
which is how the simulator leaps over quiet time.
"""

from __future__ import annotations

import enum
import heapq
from typing import Any


class EventKind(enum.IntEnum):
    """What an event is; the value is its priority among events at the same instant."""

    FAULT = 0  # state changes first: a crash at t fails what is in flight at t
    ENGINE = 1  # engine steps that end at t, so finished work frees capacity first
    POLL = 2  # the admission queue dispatches into capacity freed at this instant
    TIMEOUT = 3  # client deadlines, after completions at the same instant
    ARRIVAL = 4  # new calls see the fleet as it is after everything above
    SAMPLE = 5  # observations last, after the instant has settled


_KINDS = tuple(sorted(EventKind))


class EventQueue:
    """A min-heap of ``(time_s, kind, seq, payload)`` and the virtual clock ``now_s``."""

    __slots__ = ("_heap", "_seq", "now_s")

    def __init__(self, start_s: float = 0.0) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now_s = start_s

    def push(self, time_s: float, kind: EventKind, payload: Any = None) -> None:
        """Schedule an event; times before the clock are clamped to now (never back in time)."""
        t = time_s if time_s > self.now_s else self.now_s
        self._seq += 1
        heapq.heappush(self._heap, (t, int(kind), self._seq, payload))

    def pop(self) -> tuple[float, EventKind, Any]:
        """Remove the earliest event and move the clock to it."""
        t, kind, _, payload = heapq.heappop(self._heap)
        self.now_s = t
        return t, _KINDS[kind], payload

    def peek_time(self) -> float | None:
        """Time of the earliest event, or None when the queue is empty."""
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
