"""Which classes the engines' headroom protects now, and how much a lower class may add.

Admission holds a lower class in the gateway queue while the predicted wait at the best
endpoint exceeds its cap (``HeadroomConfig``), so that a higher-class call arriving next
meets its TTFT budget. A hold with nothing to protect only delays work: a fleet serving
standard calls alone was held at a fixed 1 s of engine queue, queued hundreds of calls at
0.7x load and shed some, while its engines idled between dispatches. So the caps follow
the demand actually seen:

* a class is held only while a call of a higher class arrived within ``demand_window_s``;
* its wait cap is ``budget_share`` x the mean TTFT budget (EWMA) of those higher-class
  calls, or the configured ``max_wait_s`` while none of them carried a budget;
* decode is protected too: every prefill chunk an engine runs stalls the decodes in its
  batch (a 2048-token chunk of a 70B model takes 0.55 s on 4 x A100: 20x a decode step),
  so an engine kept busy prefilling lower-class work decodes a critical answer of a few
  hundred tokens past a 30 s deadline, however short its queue. Higher-class calls with
  deadlines need a time per output token of about (deadline - TTFT budget) / output
  tokens: the mean time left (EWMA) over the long answers among them (a high quantile of
  their output tokens: an estimate that jumps up halfway to a longer answer and decays
  by 2% per shorter one); a lower class is held while the best predicted TPOT of the pool
  (calibrated on observed TPOT, so it includes that interference) is over ``tpot_share``
  x that need.

The same demand decides the slot and KV holds: a class keeps ``slot_share``/``kv_share``
of an endpoint free only while a higher class had a call within ``demand_window_s``; a
fleet serving standard calls alone fills its engines (on 16-slot engines a fixed 80% hold
left standard traffic 4 slots per engine and refused work at 0.7x load).
:class:`HeldConfigs` turns the demand into the admission config in force now.

Pure: ``now`` and each call's budgets are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.core.admission_config import AdmissionConfig, HeadroomConfig, PerClass
from inferplane.core.types import PriorityClass

__all__ = ["HeadroomDemand", "HeldConfigs"]

_ORDER = (PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE)
_ALPHA = 0.1  # weight of one call in its class's means
_UP, _DOWN = 0.5, 0.02  # the long-answer estimate: quick to rise, slow to fall


@dataclass(slots=True)
class _Seen:
    last_s: float
    budget_s: float | None = None  # EWMA of the TTFT budgets carried (None: none yet)
    decode_s: float | None = None  # EWMA of the time left to decode (deadline - TTFT budget)
    tokens: float | None = None  # high quantile of the output tokens of those calls

    def tpot_need_s(self) -> float | None:
        if self.decode_s is None or self.tokens is None:
            return None
        return self.decode_s / max(1.0, self.tokens)


def _ewma(old: float | None, value: float) -> float:
    return value if old is None else old + _ALPHA * (value - old)


def _high(old: float | None, value: float) -> float:
    if old is None:
        return value
    return old + (_UP if value > old else _DOWN) * (value - old)


def _usable(x: float | None) -> float | None:
    """``x`` when it is a positive finite number, else None."""
    return x if x is not None and math.isfinite(x) and x > 0 else None


class HeadroomDemand:
    """Recent arrivals per class, and the caps they imply (module docstring)."""

    def __init__(self, config: HeadroomConfig) -> None:
        self.config = config
        self._seen: dict[PriorityClass, _Seen] = {}

    def note(
        self,
        priority: PriorityClass,
        ttft_budget_s: float | None,
        now: float,
        *,
        e2e_budget_s: float | None = None,
        num_output_tokens: int = 0,
    ) -> None:
        """A call of ``priority`` arrived now with those budgets (seconds left; None: none)
        for about ``num_output_tokens`` of output."""
        seen = self._seen.get(priority)
        if seen is None:
            seen = self._seen[priority] = _Seen(now)
        seen.last_s = max(seen.last_s, now)
        ttft_s = _usable(ttft_budget_s)
        if ttft_s is not None:
            seen.budget_s = _ewma(seen.budget_s, ttft_s)
        e2e_s = _usable(e2e_budget_s)
        if e2e_s is not None and num_output_tokens > 0 and e2e_s > (ttft_s or 0.0):
            seen.decode_s = _ewma(seen.decode_s, e2e_s - (ttft_s or 0.0))
            seen.tokens = _high(seen.tokens, float(num_output_tokens))

    def wait_caps(self, now: float) -> PerClass:
        """The predicted engine wait each class may dispatch into now (inf: not held)."""
        caps = [math.inf, math.inf, math.inf]
        for i, prio in enumerate(_ORDER[1:], start=1):
            active = self._active(_ORDER[:i], now)
            if not active:
                continue
            budgets = [s.budget_s for s in active if s.budget_s is not None]
            if budgets:
                caps[i] = self.config.budget_share.of(prio) * min(budgets)
            else:
                caps[i] = self.config.max_wait_s.of(prio)
        return PerClass(critical=caps[0], standard=caps[1], sheddable=caps[2])

    def tpot_caps(self, now: float) -> PerClass:
        """The best predicted TPOT each class may dispatch into now (inf: not held)."""
        caps = [math.inf, math.inf, math.inf]
        for i, prio in enumerate(_ORDER[1:], start=1):
            needs = [n for s in self._active(_ORDER[:i], now) if (n := s.tpot_need_s())]
            if needs:
                caps[i] = self.config.tpot_share.of(prio) * min(needs)
        return PerClass(critical=caps[0], standard=caps[1], sheddable=caps[2])

    def _active(self, classes: tuple[PriorityClass, ...], now: float) -> list[_Seen]:
        window_s = self.config.demand_window_s
        return [
            s for c in classes if (s := self._seen.get(c)) is not None
            and now - s.last_s <= window_s
        ]  # fmt: skip


class HeldConfigs:
    """The admission config in force now: the holds of the demand seen, as config values.

    ``slots_config`` zeroes the slot and KV shares of classes with no demand above them; at
    most four such configs exist, so capacity caches keyed by config identity stay warm.
    ``held_config`` adds the wait caps (cached per caps, bounded: budgets drift).
    """

    def __init__(self, config: AdmissionConfig, demand: HeadroomDemand) -> None:
        self.config = config
        self.demand = demand
        self._held: dict[PerClass, AdmissionConfig] = {}
        self._slots: dict[tuple[bool, bool], AdmissionConfig] = {}

    def held_config(self, now: float) -> AdmissionConfig:
        caps = self.demand.wait_caps(now)
        found = self._held.get(caps)
        if found is None:
            if len(self._held) >= 64:
                self._held.clear()
            base = self._slots_for(_held_mask(caps))
            head = base.headroom.model_copy(update={"max_wait_s": caps})
            found = self._held[caps] = base.model_copy(update={"headroom": head})
        return found

    def slots_config(self, now: float) -> AdmissionConfig:
        return self._slots_for(_held_mask(self.demand.wait_caps(now)))

    def _slots_for(self, mask: tuple[bool, bool]) -> AdmissionConfig:
        found = self._slots.get(mask)
        if found is None:
            head = self.config.headroom
            shares = {
                name: PerClass(
                    critical=getattr(head, name).critical,
                    standard=getattr(head, name).standard if mask[0] else 0.0,
                    sheddable=getattr(head, name).sheddable if mask[1] else 0.0,
                )
                for name in ("slot_share", "kv_share")
            }
            head = head.model_copy(update=shares)
            found = self._slots[mask] = self.config.model_copy(update={"headroom": head})
        return found


def _held_mask(caps: PerClass) -> tuple[bool, bool]:
    """Whether standard and sheddable are held now (a finite wait cap: higher demand)."""
    return (not math.isinf(caps.standard), not math.isinf(caps.sheddable))
