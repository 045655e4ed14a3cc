"""What the routing scorers see: one call's pool-wide inputs (:class:`ScoringContext`), the
pool's aggregates (:class:`PoolStats`), and the rules several axes share: outstanding load,
budget use, Envoy slow start, and the hot-spot rule (split from
:mod:`inferplane.core.scorers`, which re-exports them). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferplane.core.predictor import LatencyEstimate
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.types import CallContext, EndpointView


def load_of(view: EndpointView) -> float:
    """Outstanding work: the larger of what the gateway sent and what the engine reports."""
    return float(max(view.in_flight, view.load.num_waiting + view.load.num_running))


def budget_use(
    call: CallContext, estimate: LatencyEstimate, now: float, cfg: RoutingConfig
) -> float | None:
    """Share of the call's latency budget the prediction uses (> 1: misses); None: no budget."""
    use: float | None = None
    if call.ttft_budget_s is not None:
        use = _ratio(estimate.ttft_s, call.ttft_budget_s - max(0.0, now - call.arrival_s))
    if call.deadline_s is not None:
        num_out = min(call.max_tokens, cfg.max_output_tokens_estimate)
        e2e = _ratio(estimate.e2e_s(num_out), call.deadline_s - now)
        use = e2e if use is None else max(use, e2e)
    return use


def _ratio(need_s: float, left_s: float) -> float:
    if left_s <= 0:
        return float("inf")
    return need_s / left_s


def slow_start_weight(since_s: float, cfg: RoutingConfig) -> float:
    """Envoy slow start: max(min weight, (time since ready / window) ^ (1 / aggression))."""
    frac = min(1.0, max(0.0, since_s) / cfg.slow_start_window_s)
    ramp: float = frac ** (1.0 / cfg.slow_start_aggression)
    return max(cfg.slow_start_min_weight, ramp)


@dataclass(frozen=True, slots=True)
class ScoringContext:
    """One call's pool-wide inputs to the scorers (built once per route)."""

    call: CallContext
    now: float
    cfg: RoutingConfig
    estimates: Mapping[str, LatencyEstimate]
    cached_tokens: Mapping[str, int]
    saved_s: Mapping[str, float]  # prefill time the endpoint's cache saves this call
    usd_per_token: Mapping[str, float]
    affinity_endpoint: str | None = None
    has_prefix_data: bool = False
    #: ``budget_use`` per endpoint when the caller already computed it (else recomputed).
    budget_uses: Mapping[str, float | None] = field(default_factory=dict)
    #: Added to an endpoint's outstanding requests on the load axis (live workflows, for a
    #: workflow's first call: their contexts will claim that endpoint's KV memory).
    extra_load: Mapping[str, float] = field(default_factory=dict)
    #: A workflow's first call: per endpoint, the KV placement cost in blocks (what its
    #: sessions claim plus the weighted blocks this prompt lacks there); empty otherwise.
    claim_cost_blocks: Mapping[str, float] = field(default_factory=dict)

    def load(self, view: EndpointView) -> float:
        return load_of(view) + self.extra_load.get(view.info.name, 0.0)

    def budget_use(self, name: str) -> float | None:
        if name in self.budget_uses:
            return self.budget_uses[name]
        return budget_use(self.call, self.estimates[name], self.now, self.cfg)

    def min_ttft_s(self) -> float:
        return min((e.ttft_s for e in self.estimates.values()), default=0.0)

    def min_usd_per_token(self) -> float:
        return min(self.usd_per_token.values(), default=0.0)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Pool-wide aggregates the relative scorers need."""

    min_ttft_s: float
    min_usd_per_token: float
    min_load: float
    max_load: float
    min_claim_cost_blocks: float = 0.0

    @classmethod
    def of(cls, ctx: ScoringContext, views: Sequence[EndpointView]) -> PoolStats:
        loads = [ctx.load(v) for v in views] or [0.0]
        costs = ctx.claim_cost_blocks
        least = min((costs.get(v.info.name, 0.0) for v in views), default=0.0) if costs else 0.0
        return cls(ctx.min_ttft_s(), ctx.min_usd_per_token(), min(loads), max(loads), least)


def keeps_bonus(ctx: ScoringContext, pool: PoolStats, name: str) -> bool:
    estimate = ctx.estimates.get(name)
    if estimate is None:
        return False
    limit_s = ctx.cfg.affinity_penalty_ratio * ctx.saved_s.get(name, 0.0)
    if estimate.ttft_s - pool.min_ttft_s <= limit_s:
        return True
    use = ctx.budget_use(name)
    return use is not None and use <= ctx.cfg.affinity_budget_use


def keeps_affinity(ctx: ScoringContext, pool: PoolStats, name: str) -> tuple[bool, str]:
    """The hot-spot rule: the TTFT penalty there, over the best candidate's predicted TTFT,
    must not exceed ratio x the prefill its cache saves, unless the endpoint still meets
    the call's budget with room to spare (``affinity_budget_use``)."""
    estimate = ctx.estimates.get(name)
    if estimate is None:
        return False, "no prediction"
    penalty_s = estimate.ttft_s - pool.min_ttft_s
    saved_s = ctx.saved_s.get(name, 0.0)
    if not keeps_bonus(ctx, pool, name):
        use = ctx.budget_use(name)
        of_budget = "" if use is None else f", {use:.0%} of budget"
        return False, f"hot: TTFT +{penalty_s:.3f}s > saves {saved_s:.3f}s{of_budget}"
    if penalty_s <= ctx.cfg.affinity_penalty_ratio * saved_s:
        return True, f"TTFT +{penalty_s:.3f}s <= saves {saved_s:.3f}s"
    return True, f"TTFT +{penalty_s:.3f}s > saves {saved_s:.3f}s, within budget"
