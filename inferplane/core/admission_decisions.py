"""What admission answers for one call: admit now, queue, or reject (values, no logic)."""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.core.queueing import QueueExit, QueueItem

__all__ = ["AdmissionDecision", "Admit", "Enqueue", "Reject"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Dispatch now: route the call on current state."""

    reason: str
    saturation: float
    predicted_ttft_s: float | None


@dataclass(frozen=True, slots=True)
class Enqueue:
    """The call waits in the queue; ``evicted`` calls were pushed out for it (answer them)."""

    reason: str
    saturation: float
    predicted_ttft_s: float | None
    item: QueueItem
    evicted: tuple[QueueExit, ...] = ()


@dataclass(frozen=True, slots=True)
class Reject:
    """Refused now: answer ``status`` with ``Retry-After: retry_after_s`` and the reason."""

    code: str  # machine-readable reason (X-Inferplane-Reason, metrics label)
    message: str
    retry_after_s: int
    status: int = 429
    saturation: float = 0.0


AdmissionDecision = Admit | Enqueue | Reject
