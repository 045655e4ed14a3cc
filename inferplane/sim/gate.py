"""Admission in virtual time: what stands between a simulated client and the router.

Three gates, one interface, so a scenario compares admission rules on the same workload:

- ``CoreGate``: the policy core's ``Admission`` (quotas, early rejection against the
  predicted TTFT and deadline, shedding by capacity, the bounded EDF queue with late
  binding), wired exactly as the gateway wires it: ``admit`` on arrival, ``poll`` when an
  engine frees capacity or a queued call's expiry comes due, ``cancel`` when the client
  gives up, ``on_finish`` when an admitted call ends.
- ``OpenGate``: no admission control (FCFS): every call goes straight to an engine, whose
  own queue is unbounded.
- ``PriorityShedGate``: the Kubernetes inference extension's rule (REFERENCE §5): a
  sheddable call gets 429 while the pool's saturation, the mean over its endpoints of
  ``max(waiting / 5, kv_use / 0.8)`` from scraped metrics, is at least 1; everything
  else is admitted. Its 429 carries no Retry-After (``retry_after_s`` 0).

Every answer is one of the core's decision values (``Admit``, ``Enqueue``, ``Reject``).
Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from inferplane.core.admission import (
    Admission,
    AdmissionDecision,
    Admit,
    CapacityFn,
    PoolLookup,
    Reject,
)
from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.capacity import AdmissionPredictor, pool_capacity, scraped_saturation
from inferplane.core.queueing import QueueExit
from inferplane.core.types import CallContext, EndpointView, PriorityClass

#: Admission rule of each simulated policy (routing-only policies have none: FCFS).
GATED_POLICIES = {"inferplane": "core", "fcfs": "open", "priority-shed": "priority-shed"}
_ADMIT = Admit("admitted", 0.0, None)


class Gate(Protocol):
    """The admission hooks the simulator calls, as the gateway calls the core's."""

    def admit(
        self, call: CallContext, pool: Sequence[EndpointView], now: float
    ) -> AdmissionDecision: ...

    def poll(self, now: float, pool_for: PoolLookup) -> list[QueueExit]: ...

    def cancel(self, request_id: str, now: float) -> QueueExit | None: ...

    def on_finish(
        self,
        call: CallContext,
        now: float,
        num_tokens: int,
        success: bool,
        num_output_tokens: int = 0,
    ) -> None: ...

    def next_expiry_s(self) -> float | None: ...

    def queued(self) -> int: ...


class OpenGate:
    """No admission control: admit everything, queue nothing (FCFS at the engines)."""

    def admit(
        self, call: CallContext, pool: Sequence[EndpointView], now: float
    ) -> AdmissionDecision:
        return _ADMIT

    def poll(self, now: float, pool_for: PoolLookup) -> list[QueueExit]:
        return []

    def cancel(self, request_id: str, now: float) -> QueueExit | None:
        return None

    def on_finish(
        self,
        call: CallContext,
        now: float,
        num_tokens: int,
        success: bool,
        num_output_tokens: int = 0,
    ) -> None:
        return None

    def next_expiry_s(self) -> float | None:
        return None

    def queued(self) -> int:
        return 0


class PriorityShedGate(OpenGate):
    """Sheddable calls get 429 while the pool is saturated; the rest are admitted."""

    def __init__(self, queue_threshold: float = 5.0, kv_threshold: float = 0.8) -> None:
        self._queue_threshold = queue_threshold
        self._kv_threshold = kv_threshold

    def admit(
        self, call: CallContext, pool: Sequence[EndpointView], now: float
    ) -> AdmissionDecision:
        if call.priority is not PriorityClass.SHEDDABLE:
            return _ADMIT
        sat = scraped_saturation(pool, self._queue_threshold, self._kv_threshold)
        if sat >= 1.0:
            return Reject("saturated", f"pool saturation {sat:.2f} >= 1", 0, 429, sat)
        return Admit("admitted", sat, None)


class CoreGate:
    """The policy core's admission controller."""

    def __init__(
        self,
        config: AdmissionConfig,
        predictor: AdmissionPredictor,
        capacity: CapacityFn = pool_capacity,
    ) -> None:
        self.admission = Admission(config, predictor, capacity=capacity)

    def admit(
        self, call: CallContext, pool: Sequence[EndpointView], now: float
    ) -> AdmissionDecision:
        return self.admission.admit(call, pool, now)

    def poll(self, now: float, pool_for: PoolLookup) -> list[QueueExit]:
        return self.admission.poll(now, pool_for)

    def cancel(self, request_id: str, now: float) -> QueueExit | None:
        return self.admission.cancel(request_id, now)

    def on_finish(
        self,
        call: CallContext,
        now: float,
        num_tokens: int,
        success: bool,
        num_output_tokens: int = 0,
    ) -> None:
        self.admission.on_finish(
            call, now, num_tokens=num_tokens, success=success, num_output_tokens=num_output_tokens
        )

    def next_expiry_s(self) -> float | None:
        return self.admission.next_expiry_s()

    def queued(self) -> int:
        return len(self.admission.queue)


def make_gate(
    policy: str,
    config: AdmissionConfig,
    predictor: AdmissionPredictor,
    capacity: CapacityFn = pool_capacity,
) -> Gate:
    """The admission gate of a simulated policy (FCFS for routing-only baselines);
    ``capacity`` is how the core's admission sizes a pool (the simulator's kept sums)."""
    kind = GATED_POLICIES.get(policy, "open")
    if kind == "core":
        return CoreGate(config, predictor, capacity)
    if kind == "priority-shed":
        return PriorityShedGate(config.queue_threshold, config.kv_threshold)
    return OpenGate()
