"""Routing scorers: one opinion in [0, 1] per axis per endpoint, each with its reason.

The seven axes of the design plus queue load (llm-d's queue scorer):

=========  =============================================================================
kv_cache   share of the prompt already cached there (prefix index match; without an
           index, the assumed reuse on the workflow's previous endpoint)
load       1 / (1 + outstanding requests over the pool's least / ``load_scale``)
headroom   HBM headroom: 1 - KV-cache usage
latency    predicted TTFT (and end-to-end) against the call's budget: 1 within
           ``budget_comfort`` of it, 0 past it; without a budget, 1 / (1 + extra TTFT
           over the pool's best / ``latency_scale_s``)
cost       USD per output token (price / throughput), cheapest / this
warm       1 when ready; warming endpoints ramp up (Envoy slow start, REFERENCE §4)
priority   critical calls prefer endpoints with KV headroom and no queue
affinity   1 on the endpoint that served the workflow's previous call
=========  =============================================================================

Affinity without hot spots: an endpoint keeps its prefix and workflow bonus only while its
predicted extra wait, over the least-waiting candidate, is at most
``affinity_penalty_ratio`` times the prefill time its cache saves (both from the
predictor). Pool-wide figures (least wait, cheapest token, load range) are computed once
in :class:`ScoringContext`, so every scorer is a pure function of (context, endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from inferplane.core.predictor import LatencyEstimate
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.types import (
    AxisScore,
    CallContext,
    EndpointState,
    EndpointView,
    PriorityClass,
)


def load_of(view: EndpointView) -> float:
    """Outstanding work: the larger of what the gateway sent and what the engine reports."""
    return float(max(view.in_flight, view.load.num_waiting + view.load.num_running))


def budget_use(
    call: CallContext, estimate: LatencyEstimate, now: float, cfg: RoutingConfig
) -> float | None:
    """Share of the call's latency budget the prediction uses (> 1: misses); None: no budget."""
    uses: list[float] = []
    if call.ttft_budget_s is not None:
        left_s = call.ttft_budget_s - max(0.0, now - call.arrival_s)
        uses.append(_ratio(estimate.ttft_s, left_s))
    if call.deadline_s is not None:
        num_out = min(call.max_tokens, cfg.max_output_tokens_estimate)
        uses.append(_ratio(estimate.e2e_s(num_out), call.deadline_s - now))
    return max(uses) if uses else None


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

    @staticmethod
    def _min(values: Sequence[float]) -> float:
        return min(values) if values else 0.0

    def min_wait_s(self) -> float:
        return self._min([e.wait_s for e in self.estimates.values()])

    def min_ttft_s(self) -> float:
        return self._min([e.ttft_s for e in self.estimates.values()])

    def min_usd_per_token(self) -> float:
        return self._min(list(self.usd_per_token.values()))


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Pool-wide aggregates the relative scorers need."""

    min_wait_s: float
    min_ttft_s: float
    min_usd_per_token: float
    min_load: float
    max_load: float

    @classmethod
    def of(cls, ctx: ScoringContext, views: Sequence[EndpointView]) -> PoolStats:
        loads = [load_of(v) for v in views] or [0.0]
        return cls(
            ctx.min_wait_s(), ctx.min_ttft_s(), ctx.min_usd_per_token(), min(loads), max(loads)
        )


def keeps_affinity(ctx: ScoringContext, pool: PoolStats, name: str) -> tuple[bool, str]:
    """The hot-spot rule: extra wait there must not exceed ratio x the prefill it saves."""
    estimate = ctx.estimates.get(name)
    if estimate is None:
        return False, "no prediction"
    penalty_s = estimate.wait_s - pool.min_wait_s
    saved_s = ctx.saved_s.get(name, 0.0)
    limit_s = ctx.cfg.affinity_penalty_ratio * saved_s
    if penalty_s <= limit_s:
        return True, f"wait +{penalty_s:.3f}s <= saves {saved_s:.3f}s"
    return False, f"hot: wait +{penalty_s:.3f}s > saves {saved_s:.3f}s"


Scorer = Callable[[ScoringContext, PoolStats, EndpointView], AxisScore]


def score_kv_cache(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    cached = ctx.cached_tokens.get(view.name, 0)
    if cached <= 0 or ctx.call.num_prompt_tokens <= 0:
        return AxisScore("kv_cache", 0.0, "no cached prefix" if ctx.has_prefix_data else "no data")
    kept, why = keeps_affinity(ctx, pool, view.name)
    if not kept:
        return AxisScore("kv_cache", 0.0, why)
    frac = min(1.0, cached / ctx.call.num_prompt_tokens)
    how = "cached" if ctx.has_prefix_data else "assumed cached (workflow)"
    return AxisScore("kv_cache", frac, f"{cached} tokens {how} ({frac:.0%}); {why}")


def score_load(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    load = load_of(view)
    extra = max(0.0, load - pool.min_load)
    score = 1.0 / (1.0 + extra / ctx.cfg.load_scale)
    return AxisScore("load", score, f"{load:.0f} outstanding (+{extra:.0f})")


def score_headroom(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    kv = min(1.0, max(0.0, view.load.kv_usage))
    return AxisScore("headroom", 1.0 - kv, f"KV {kv:.0%} used")


def score_latency(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    estimate = ctx.estimates[view.name]
    use = budget_use(ctx.call, estimate, ctx.now, ctx.cfg)
    if use is None:
        extra_s = max(0.0, estimate.ttft_s - pool.min_ttft_s)
        score = 1.0 / (1.0 + extra_s / ctx.cfg.latency_scale_s)
        return AxisScore("latency", score, f"TTFT {estimate.ttft_s:.3f}s (+{extra_s:.3f}s)")
    comfort = ctx.cfg.budget_comfort
    if use > 1.0:
        score = 0.0
    elif use <= comfort or comfort >= 1.0:
        score = 1.0
    else:
        score = (1.0 - use) / (1.0 - comfort)
    verdict = "misses" if use > 1.0 else "meets"
    return AxisScore("latency", score, f"TTFT {estimate.ttft_s:.3f}s {verdict} budget ({use:.0%})")


def score_cost(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    usd = ctx.usd_per_token.get(view.name, 0.0)
    cheapest = pool.min_usd_per_token
    score = 1.0 if usd <= cheapest or usd <= 0 else cheapest / usd
    return AxisScore("cost", score, f"${usd * 1e6:.3f} per 1M tokens")


def score_warm(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    if view.state is EndpointState.READY:
        return AxisScore("warm", 1.0, "ready")
    if view.state is EndpointState.WARMING:
        since_s = ctx.now - view.state_since_s
        weight = slow_start_weight(since_s, ctx.cfg)
        return AxisScore("warm", weight, f"warming {since_s:.1f}s: slow start {weight:.2f}")
    return AxisScore("warm", 0.0, f"state {view.state.value}")


def score_priority(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    if ctx.call.priority is not PriorityClass.CRITICAL:
        return AxisScore("priority", 1.0, f"{ctx.call.priority.value}: no preference")
    kv = min(1.0, max(0.0, view.load.kv_usage))
    room = max(0.0, 1.0 - kv / ctx.cfg.critical_kv_limit)
    score = room / (1.0 + view.load.num_waiting)
    return AxisScore("priority", score, f"critical: KV {kv:.0%}, {view.load.num_waiting} queued")


def score_affinity(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
    if ctx.affinity_endpoint is None:
        return AxisScore("affinity", 0.0, "no workflow affinity")
    if view.name != ctx.affinity_endpoint:
        return AxisScore("affinity", 0.0, "not the workflow's endpoint")
    kept, why = keeps_affinity(ctx, pool, view.name)
    return AxisScore("affinity", 1.0 if kept else 0.0, f"workflow's endpoint; {why}")


SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("kv_cache", score_kv_cache),
    ("load", score_load),
    ("headroom", score_headroom),
    ("latency", score_latency),
    ("cost", score_cost),
    ("warm", score_warm),
    ("priority", score_priority),
    ("affinity", score_affinity),
)


def score_all(
    ctx: ScoringContext, views: Sequence[EndpointView], weights: Mapping[str, float]
) -> dict[str, tuple[float, tuple[AxisScore, ...]]]:
    """Per endpoint: the weighted mean score in [0, 1] and every axis that has weight."""
    pool = PoolStats.of(ctx, views)
    active = [(fn, w) for axis, fn in SCORERS if (w := weights.get(axis, 0.0)) > 0]
    total_w = sum(w for _, w in active)
    out: dict[str, tuple[float, tuple[AxisScore, ...]]] = {}
    for view in views:
        axes: list[AxisScore] = []
        raw = 0.0
        for fn, w in active:
            axis = fn(ctx, pool, view)
            if not 0.0 <= axis.score <= 1.0:
                axis = _clamped(axis)
            axes.append(axis)
            raw += axis.score * w
        out[view.name] = (min(1.0, max(0.0, raw / total_w)) if total_w > 0 else 0.0, tuple(axes))
    return out


def _clamped(axis: AxisScore) -> AxisScore:
    score = 0.0 if axis.score != axis.score else min(1.0, max(0.0, axis.score))  # NaN -> 0
    return AxisScore(axis.axis, score, axis.reason)
