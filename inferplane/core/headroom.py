"""Which classes the engines' headroom protects now, and how much wait a lower class may add.

Admission holds a lower class in the gateway queue while the predicted wait at the best
endpoint exceeds its cap (``HeadroomConfig``), so that a higher-class call arriving next
meets its TTFT budget. A hold with nothing to protect only delays work: a fleet serving
standard calls alone was held at a fixed 1 s of engine queue, queued hundreds of calls at
0.7x load and shed some, while its engines idled between dispatches. So the caps follow
the demand actually seen:

* a class is held only while a call of a higher class arrived within ``demand_window_s``;
* its cap is ``budget_share`` x the mean TTFT budget (EWMA) of those higher-class calls,
  or the configured ``max_wait_s`` while none of them carried a budget.

Pure: ``now`` and each call's budget are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.core.admission_config import HeadroomConfig, PerClass
from inferplane.core.types import PriorityClass

__all__ = ["HeadroomDemand"]

_ORDER = (PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE)
_BUDGET_ALPHA = 0.1  # weight of one call's TTFT budget in its class's mean


@dataclass(slots=True)
class _Seen:
    last_s: float
    budget_s: float | None = None  # EWMA of the TTFT budgets carried (None: none yet)


class HeadroomDemand:
    """Recent arrivals per class, and the wait caps they imply (module docstring)."""

    def __init__(self, config: HeadroomConfig) -> None:
        self.config = config
        self._seen: dict[PriorityClass, _Seen] = {}

    def note(self, priority: PriorityClass, ttft_budget_s: float | None, now: float) -> None:
        """A call of ``priority`` arrived now, with that TTFT budget (None: none)."""
        seen = self._seen.get(priority)
        if seen is None:
            seen = self._seen[priority] = _Seen(now)
        seen.last_s = max(seen.last_s, now)
        if ttft_budget_s is not None and math.isfinite(ttft_budget_s) and ttft_budget_s > 0:
            old = seen.budget_s
            seen.budget_s = (
                ttft_budget_s if old is None else old + _BUDGET_ALPHA * (ttft_budget_s - old)
            )

    def wait_caps(self, now: float) -> PerClass:
        """The predicted engine wait each class may dispatch into now (inf: not held)."""
        caps = [math.inf, math.inf, math.inf]
        for i, prio in enumerate(_ORDER[1:], start=1):
            caps[i] = self._cap(prio, _ORDER[:i], now)
        return PerClass(critical=caps[0], standard=caps[1], sheddable=caps[2])

    def _cap(self, prio: PriorityClass, higher: tuple[PriorityClass, ...], now: float) -> float:
        cfg = self.config
        active = [
            s for h in higher if (s := self._seen.get(h)) is not None
            and now - s.last_s <= cfg.demand_window_s
        ]  # fmt: skip
        if not active:
            return math.inf
        budgets = [s.budget_s for s in active if s.budget_s is not None]
        if not budgets:
            return cfg.max_wait_s.of(prio)
        return cfg.budget_share.of(prio) * min(budgets)
