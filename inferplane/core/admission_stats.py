"""Counters of admission decisions and queue exits, for ``/metrics`` and ``/v1/stats``.

Every decision and every queue exit is counted here by class and reason, with the time
each call waited in the queue per class (count, sum, max), so the shells export the same
numbers from the live gateway and the simulator. The snapshot is plain data
(``dataclasses.asdict`` is ready for JSON). Label sets are bounded: reasons are the
admission's fixed codes, classes the three priority classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferplane.core.queueing import QueueExit
from inferplane.core.types import PriorityClass

__all__ = ["AdmissionSnapshot", "AdmissionStats", "QueueWait"]


@dataclass(frozen=True, slots=True)
class QueueWait:
    """Time calls of one class spent queued (all exits: dispatched, evicted, expired...)."""

    count: int
    sum_s: float
    max_s: float


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """Totals since start. Keys: class values; ``rejected`` by reason code."""

    admitted: dict[str, int]  # dispatched at once
    queued: dict[str, int]
    rejected: dict[str, dict[str, int]]  # class -> reason -> count
    exits: dict[str, dict[str, int]]  # class -> exit kind -> count
    queue_wait: dict[str, QueueWait]
    queue_depth: dict[str, int]
    queue_bytes: int


@dataclass(slots=True)
class _Wait:
    count: int = 0
    sum_s: float = 0.0
    max_s: float = 0.0


@dataclass(slots=True)
class AdmissionStats:
    """Mutable counters behind :class:`AdmissionSnapshot`."""

    admitted: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, dict[str, int]] = field(default_factory=dict)
    exits: dict[str, dict[str, int]] = field(default_factory=dict)
    waits: dict[str, _Wait] = field(default_factory=dict)

    def on_admitted(self, priority: PriorityClass) -> None:
        cls = priority.value
        self.admitted[cls] = self.admitted.get(cls, 0) + 1

    def on_queued(self, priority: PriorityClass) -> None:
        cls = priority.value
        self.queued[cls] = self.queued.get(cls, 0) + 1

    def on_rejected(self, priority: PriorityClass, code: str) -> None:
        by_reason = self.rejected.setdefault(priority.value, {})
        by_reason[code] = by_reason.get(code, 0) + 1

    def on_exit(self, out: QueueExit) -> None:
        cls = out.item.priority.value
        kinds = self.exits.setdefault(cls, {})
        kinds[out.kind.value] = kinds.get(out.kind.value, 0) + 1
        wait = self.waits.setdefault(cls, _Wait())
        wait.count += 1
        wait.sum_s += out.waited_s
        wait.max_s = max(wait.max_s, out.waited_s)

    def snapshot(self, depth: dict[str, int], num_bytes: int) -> AdmissionSnapshot:
        return AdmissionSnapshot(
            dict(self.admitted),
            dict(self.queued),
            {c: dict(r) for c, r in self.rejected.items()},
            {c: dict(k) for c, k in self.exits.items()},
            {c: QueueWait(w.count, w.sum_s, w.max_s) for c, w in self.waits.items()},
            depth,
            num_bytes,
        )
