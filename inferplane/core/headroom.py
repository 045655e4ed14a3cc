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
  hundred tokens past a 30 s deadline, however short its queue. A higher-class call with
  a deadline needs a time per output token of (deadline - TTFT budget) / output tokens;
  the class's need is a low estimate of those (the tightest calls: in decode rate, it
  moves halfway toward a tighter call and by 2% toward a looser one). A lower class is held while no
  endpoint's predicted TPOT with one more call (calibrated on observed TPOT, so it
  includes that interference) is within its cap: the TPOT of a batch of one (the floor
  no hold can go under) plus ``tpot_share`` of the slack between that floor and the
  need. The share of the *slack*, not of the need: on engines whose batch of one already
  takes most of the need (16-slot emulated engines with deadlines 2x the full-batch
  time) a share of the need sat under the floor and held lower classes at any load.

The same demand decides the slot and KV holds: a class keeps ``slot_share``/``kv_share``
of an endpoint free only while a higher class had a call within ``demand_window_s``; a
fleet serving standard calls alone fills its engines (on 16-slot engines a fixed 80% hold
left standard traffic 4 slots per engine and refused work at 0.7x load).
:class:`HeldConfigs` turns the demand into the admission config in force now.

Pure: ``now`` and each call's budgets are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from inferplane.core.admission_config import AdmissionConfig, HeadroomConfig, PerClass
from inferplane.core.predictor import LatencyEstimate
from inferplane.core.routing_config import EndpointPrior
from inferplane.core.types import PriorityClass

__all__ = ["HeadroomDemand", "HeldConfigs", "decode_cap_s", "decode_held"]

_ORDER = (PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE)
_ALPHA = 0.1  # weight of one call in its class's means
_QUICK, _SLOW = 0.5, 0.02  # the need's low estimate: quick to fall, slow to rise


@dataclass(slots=True)
class _Seen:
    last_s: float
    budget_s: float | None = None  # EWMA of the TTFT budgets carried (None: none yet)
    need_s: float | None = None  # low estimate of the TPOT their deadlines need


def _ewma(old: float | None, value: float) -> float:
    return value if old is None else old + _ALPHA * (value - old)


def _low(old: float | None, value: float) -> float:
    """The need's low estimate: moved in decode rate (1 / need), halfway toward a tighter
    call's and 2% toward a looser one's (a jump from 100 to 1100 tokens in the same time
    meets halfway at 600 tokens' rate, not at a halfway need, which stays 2.5x looser)."""
    if old is None:
        return value
    rate, new_rate = 1.0 / old, 1.0 / value
    rate += (_QUICK if new_rate > rate else _SLOW) * (new_rate - rate)
    return 1.0 / rate


def decode_cap_s(need_s: float, floor_s: float, share: float) -> float:
    """The TPOT a lower class may push an endpoint to: its batch-of-one TPOT ``floor_s``
    plus ``share`` of the slack up to the higher classes' ``need_s`` (none: the floor)."""
    if math.isinf(need_s):
        return math.inf
    return floor_s + min(1.0, share) * max(0.0, need_s - floor_s)


def decode_held(
    need_s: float, share: float, endpoints: Iterable[tuple[LatencyEstimate, EndpointPrior]]
) -> bool:
    """Whether a lower class is held: no endpoint's predicted TPOT with one more call is
    within :func:`decode_cap_s` (``endpoints``: each one's estimate now and its prior)."""
    if math.isinf(need_s):
        return False
    held = False
    for est, prior in endpoints:
        one_s = prior.decode_base_s + prior.decode_per_seq_s  # a batch of one, uncalibrated
        floor_s = one_s * est.tpot_s / est.raw_tpot_s if est.raw_tpot_s > 0 else est.tpot_s
        if est.tpot_s <= decode_cap_s(need_s, floor_s, share):
            return False
        held = True
    return held


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
            seen.need_s = _low(seen.need_s, (e2e_s - (ttft_s or 0.0)) / num_output_tokens)

    def wait_caps(self, now: float) -> PerClass:
        """The predicted engine wait each class may dispatch into now (inf: not held)."""
        return PerClass(critical=math.inf, standard=self._cap(1, now), sheddable=self._cap(2, now))

    def held_mask(self, now: float) -> tuple[bool, bool]:
        """Whether standard and sheddable are held now: ``wait_caps``' finite entries, without
        building the config value (admission asks on every call)."""
        return (not math.isinf(self._cap(1, now)), not math.isinf(self._cap(2, now)))

    def demand_above(self, priority: PriorityClass, now: float) -> bool:
        """Whether a call of a class above ``priority`` arrived within the demand window."""
        return bool(self._active(_ORDER[: _ORDER.index(priority)], now))

    def _cap(self, i: int, now: float) -> float:
        """The wait cap of the ``i``-th class in priority order (0: critical, never held)."""
        active = self._active(_ORDER[:i], now)
        if not active:
            return math.inf
        budgets = [s.budget_s for s in active if s.budget_s is not None]
        if budgets:
            return self.config.budget_share.of(_ORDER[i]) * min(budgets)
        return self.config.max_wait_s.of(_ORDER[i])

    def tpot_needs(self, now: float) -> PerClass:
        """The TPOT the higher classes' deadlines need, per class (inf: not held)."""
        needs = [math.inf, math.inf, math.inf]
        for i, _prio in enumerate(_ORDER[1:], start=1):
            found = [s.need_s for s in self._active(_ORDER[:i], now) if s.need_s is not None]
            if found:
                needs[i] = min(found)
        return PerClass(critical=needs[0], standard=needs[1], sheddable=needs[2])

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
        return self._slots_for(self.demand.held_mask(now))

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
