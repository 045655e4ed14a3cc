"""The simulator's scaling loop state: sensor, core state, the HPA baseline rule, the timeline.

:class:`ScaleLoop` is what :mod:`inferplane.sim.autoscale` drives on its control ticks, free
of the event machinery: it senses a pool from the counts it is fed, asks the core's
:class:`~inferplane.core.autoscaler.Autoscaler` (or :class:`QueueRule`, production-stack's
KEDA rule on waiting calls, as an HPA evaluates it) and records each decision as a
:class:`FleetPoint`.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferplane.core.autoscale_sensor import PoolSensor
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    Forecast,
    PoolPolicy,
    PoolSignal,
    ScaleDecision,
)
from inferplane.gateway.observability_config import AutoscaleConfig
from inferplane.sim.ledger import Call
from inferplane.sim.records import Outcome

__all__ = [
    "DEFAULT_TOKENS_PER_CALL",
    "FleetPoint",
    "PoolCounts",
    "QueueRule",
    "ScaleLoop",
    "ScalePolicy",
    "make_loop",
    "within_slo",
]


#: Tokens one waiting call stands for before any call has been seen (the gateway's figure).
DEFAULT_TOKENS_PER_CALL = 1000.0

#: :class:`~inferplane.core.autoscaler.PoolPolicy` fields set on every pool's policy of the
#: loops made from now on in this process: core knobs the config section does not carry
#: (the burst reserve's), for a bench that compares them (``bench/autoscale.py``).
POLICY_OVERRIDES: dict[str, Any] = {}


class ScalePolicy(enum.Enum):
    """Who sizes the pools of a run."""

    OFF = "off"  # the fleet config's endpoints, fixed
    INFERPLANE = "inferplane"  # the core's autoscaler
    QUEUE = "queue-hpa"  # production-stack's KEDA rule on waiting calls


@dataclass(frozen=True, slots=True)
class QueueRule:
    """production-stack's KEDA rule as an HPA evaluates it.

    KEDA's Prometheus scaler on ``vllm:num_requests_waiting`` with an average-value target:
    desired = ceil(waiting calls / target per replica), bounded by min and max; scale-up is
    immediate, scale-down follows the largest desired count of the stabilisation window
    (the HPA's default 300 s; None: the pool's ``scale_down_window_s``, the window the core's
    loop uses, so a compressed day compresses both alike). One GPU type: the pool's first.

    Against production-stack's tutorial ScaledObject (``tutorials/assets/values-20-keda.yaml``:
    threshold 5, ``pollingInterval`` 15 s, ``minReplicaCount`` 1, ``cooldownPeriod`` 360 s):
    the threshold and minimum are the same; polling is the body's tick (15 s by default,
    the benches' own tick when they compress the day); ``cooldownPeriod`` only delays the
    last replica's removal to zero, which a minimum of 1 never does. Waiting calls are summed
    over the engines (the tutorial's query leaves one series per engine) plus the calls
    queued at the gateway's gate, which would wait at the engines without it. Not modelled,
    both in the rule's favour: the HPA's 10% tolerance and its scale-up rate limit (4 pods or
    100% per 15 s). Behind inferplane's admission, calls it refuses never become waiting
    calls: the rule sees the overload only as it queues.
    """

    target_waiting_per_replica: float = 5.0
    stabilisation_s: float | None = None

    def desired(
        self,
        policy: PoolPolicy,
        waiting_calls: float,
        now: float,
        history: deque[tuple[float, int]],
    ) -> int:
        raw = math.ceil(waiting_calls / self.target_waiting_per_replica - 1e-9)
        history.append((now, min(policy.max_replicas, max(policy.min_replicas, raw))))
        window_s = (
            policy.scale_down_window_s if self.stabilisation_s is None else self.stabilisation_s
        )
        while history and history[0][0] < now - window_s:
            history.popleft()
        return max(n for _, n in history)


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """One pool at one control tick: replicas by state and what the loop asked for."""

    time_s: float
    pool: str
    serving: int
    starting: int
    draining: int
    desired: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """Replicas of one pool now, by GPU type."""

    serving: dict[str, int]
    starting: dict[str, int]
    draining: int
    waiting_calls: int  # scraped engine queues


class ScaleLoop:
    """The loop's state over one run: sensor, core state, HPA history and the timeline."""

    def __init__(
        self,
        config: AutoscaleConfig,
        policy: ScalePolicy,
        forecasts: Mapping[str, Forecast] | None = None,
        rule: QueueRule | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.policies = {p.pool: replace(p, **POLICY_OVERRIDES) for p in config.policies()}
        self.core = Autoscaler(list(self.policies.values()))
        self.state = AutoscalerState()
        self.forecasts = forecasts
        self.rule = rule or QueueRule()
        self.sensor = PoolSensor()
        self.timeline: list[FleetPoint] = []
        self.decisions: list[ScaleDecision] = []
        self._history: dict[str, deque[tuple[float, int]]] = {}
        self._seen: dict[str, tuple[float, int]] = {}  # pool -> (tokens, calls) so far
        self.early_ticks: list[float] = []  # when a surge seen between ticks ticked at once

    def on_arrival(self, pool: str) -> None:
        """A call arrived: demand is offered calls at the mean work per call served so far.

        Counted on arrival, not when served: a saturated pool serves no more than its
        capacity and rejects the rest, so work served alone would hide the demand that needs
        more replicas (and would see it a call's duration late)."""
        if pool in self.policies:
            self.sensor.on_arrival(pool, self.tokens_per_call(pool))

    def on_served(self, pool: str, num_tokens: float) -> None:
        """An engine finished an attempt that took ``num_tokens`` of work (uncached + output)."""
        if pool in self.policies:
            tokens, calls = self._seen.get(pool, (0.0, 0))
            self._seen[pool] = (tokens + num_tokens, calls + 1)

    def on_finish(self, pool: str, ok: bool) -> None:
        if pool in self.policies:
            self.sensor.on_finish(pool, ok)

    def tokens_per_call(self, pool: str) -> float:
        tokens, calls = self._seen.get(pool, (0.0, 0))
        return tokens / calls if calls else DEFAULT_TOKENS_PER_CALL

    def _signals(
        self,
        now: float,
        counts: Mapping[str, PoolCounts],
        queued: Mapping[str, int],
        restart: bool = True,
    ) -> list[PoolSignal]:
        signals = []
        for pool, c in counts.items():
            backlog = (c.waiting_calls + queued.get(pool, 0)) * self.tokens_per_call(pool)
            signals.append(
                self.sensor.signal(
                    pool, now, c.serving, c.starting, backlog, self.config.tick_s,
                    restart=restart,
                )
            )  # fmt: skip
        return signals

    def surging(
        self, now: float, counts: Mapping[str, PoolCounts], queued: Mapping[str, int]
    ) -> bool:
        """Whether the window so far already shows a surge in some pool (inferplane only)."""
        if self.policy is not ScalePolicy.INFERPLANE:
            return False
        signals = self._signals(now, counts, queued, restart=False)
        return any(self.core.surging(s, self.state) for s in signals)

    def decide(
        self, now: float, counts: Mapping[str, PoolCounts], queued: Mapping[str, int]
    ) -> dict[str, dict[str, int]]:
        """Desired replicas per pool and GPU type; ``queued``: pool -> calls at the gate."""
        out: dict[str, dict[str, int]] = {}
        reasons: dict[str, str] = {}
        if self.policy is ScalePolicy.INFERPLANE:
            signals = self._signals(now, counts, queued)
            self.decisions, self.state = self.core.decide(signals, self.state, self.forecasts)
            for d in self.decisions:
                out[d.pool] = dict(d.desired)
                reasons[d.pool] = d.reason
        elif self.policy is ScalePolicy.QUEUE:
            for pool, c in counts.items():
                policy = self.policies[pool]
                waiting = c.waiting_calls + queued.get(pool, 0)
                history = self._history.setdefault(pool, deque())
                n = self.rule.desired(policy, waiting, now, history)
                out[pool] = {policy.options[0].gpu: n}
                reasons[pool] = f"{waiting} waiting calls"
        for pool, c in counts.items():
            self.timeline.append(
                FleetPoint(
                    now, pool, sum(c.serving.values()), sum(c.starting.values()), c.draining,
                    sum(out.get(pool, {}).values()), reasons.get(pool, ""),
                )
            )  # fmt: skip
        return out


def make_loop(
    config: AutoscaleConfig, name: str | None, forecasts: Mapping[str, Forecast] | None = None
) -> ScaleLoop | None:
    """The run's loop: ``name`` a :class:`ScalePolicy` value, None for the config's choice."""
    policy = ScalePolicy(name or ("inferplane" if config.enabled else "off"))
    return None if policy is ScalePolicy.OFF else ScaleLoop(config, policy, forecasts)


def within_slo(call: Call, now: float, outcome: Outcome) -> bool:
    """Whether a call that ends at ``now`` met its source's SLO (as the summary counts it)."""
    if outcome is not Outcome.SUCCESS:
        return False
    slo = call.info.slo
    if slo.ttft_s is not None and (
        call.first_token_s is None or call.first_token_s - call.arrival_s > slo.ttft_s
    ):
        return False
    return slo.e2e_s is None or now - call.arrival_s <= slo.e2e_s
