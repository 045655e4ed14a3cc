"""Routing scorers: one opinion in [0, 1] per axis per endpoint, and the reason for it.

The seven axes of the design plus queue load (llm-d's queue scorer):

=========  =============================================================================
kv_cache   share of the prompt already cached there (prefix index match; without an
           index, the assumed reuse on the workflow's previous endpoint)
load       1 / (1 + outstanding requests over the pool's least / ``load_scale``); a
           workflow's first call also counts the live workflows an endpoint holds
headroom   HBM headroom: 1 - KV-cache usage
latency    predicted TTFT (and end-to-end) against the call's budget: 1 within
           ``budget_comfort`` of it, 0 past it; without a budget, 1 / (1 + extra TTFT
           over the pool's best / ``latency_scale_s``)
cost       USD per output token (price / throughput), cheapest / this
warm       1 when ready; warming endpoints ramp up (Envoy slow start, REFERENCE §4)
priority   critical calls prefer endpoints with KV headroom and no queue
affinity   1 on the endpoint that served the workflow's previous call
kv_claim   a workflow's first call (a new session): 1 / (1 +
           placement cost over the pool's least / ``claim_scale_blocks``), the cost being
           the KV blocks the endpoint's recent sessions claim plus
           ``claim_uncached_weight`` x the blocks of this prompt it lacks
           (:mod:`inferplane.core.kv_claims`); 1 for other calls
=========  =============================================================================

Affinity without hot spots: an endpoint keeps its prefix and workflow bonus only while its
predicted TTFT, over the candidate with the best predicted TTFT, is at most
``affinity_penalty_ratio`` times the prefill time its cache saves (both from the
predictor). TTFT, not wait: the alternative must prefill what the holder has cached, so
comparing waits alone (as this rule once did) left a holder as soon as it was no faster,
spending the saved prefill on another engine and its queue (21% of shared-prefix calls
went to an engine holding none of their blocks). Past that ratio the bonus stays while the
holder's prediction uses at most ``affinity_budget_use`` of the call's latency budget: the
caller still gets what it asked for, and a cold copy would cost the fleet the prefill again
(at ratio 1 alone, a customer's second call, arriving while the first still prefilled on the
holder, tied on TTFT and went cold: 6 of 236 shared-prefix calls, 3 points of hit rate, as
many points as the routers led by). Pool-wide figures (best TTFT, cheapest
token, load range) are computed once in :class:`PoolStats`, so every scorer is a pure
function of (context, pool, endpoint).

Scores and reasons are split, because routing runs on every call and only the few
endpoints it ranks first are ever explained: each :class:`Axis` has a numbers function
(one call per route over all endpoints, no strings) and an explanation function that
formats the same figures on demand. :func:`score_columns` is the hot path; :func:`explain` and the
``score_<axis>`` callables (an :class:`AxisScore` with its reason) build the words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from inferplane.core.routing_config import ScorerWeights
from inferplane.core.scoring_context import (
    PoolStats,
    ScoringContext,
    budget_use,
    keeps_affinity,
    keeps_bonus,
    load_of,
    slow_start_weight,
)
from inferplane.core.types import AxisScore, EndpointState, EndpointView, PriorityClass

__all__ = [
    "AXES",
    "SCORERS",
    "Axis",
    "PoolStats",
    "Scorer",
    "ScoringContext",
    "active_axes",
    "budget_use",
    "explain",
    "keeps_affinity",
    "load_of",
    "score_affinity",
    "score_all",
    "score_columns",
    "score_cost",
    "score_headroom",
    "score_kv_cache",
    "score_kv_claim",
    "score_latency",
    "score_load",
    "score_priority",
    "score_warm",
    "slow_start_weight",
    "weighted_totals",
]


#: A number function: scores of the endpoints (same order), unclamped. One call per axis
#: per route, looping inside, because a Python call per (axis, endpoint) costs more than
#: the arithmetic.
Numbers = Callable[[ScoringContext, PoolStats, Sequence[EndpointView]], list[float]]
#: An explanation function: the same figures as words.
Words = Callable[[ScoringContext, PoolStats, EndpointView], str]
#: A scorer as tests and tools call it: the score with its reason.
Scorer = Callable[[ScoringContext, PoolStats, EndpointView], AxisScore]


def _clamp(score: float) -> float:
    if 0.0 <= score <= 1.0:
        return score
    return 0.0 if score != score else min(1.0, max(0.0, score))  # NaN -> 0


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis: its name, its numbers (hot path) and its explanation (on demand)."""

    name: str
    numbers: Numbers
    words: Words

    def __call__(self, ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> AxisScore:
        score = _clamp(self.numbers(ctx, pool, (view,))[0])
        return AxisScore(self.name, score, self.words(ctx, pool, view))


# -- kv_cache ------------------------------------------------------------------------------


def _kv_cache(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    prompt = ctx.call.num_prompt_tokens
    get = ctx.cached_tokens.get
    out = []
    for view in views:
        name = view.info.name
        cached = get(name, 0)
        if cached <= 0 or prompt <= 0 or not keeps_bonus(ctx, pool, name):
            out.append(0.0)
        else:
            out.append(min(1.0, cached / prompt))
    return out


def _kv_cache_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    cached = ctx.cached_tokens.get(view.name, 0)
    if cached <= 0 or ctx.call.num_prompt_tokens <= 0:
        return "no cached prefix" if ctx.has_prefix_data else "no data"
    kept, why = keeps_affinity(ctx, pool, view.name)
    if not kept:
        return why
    frac = min(1.0, cached / ctx.call.num_prompt_tokens)
    how = "cached" if ctx.has_prefix_data else "assumed cached (workflow)"
    return f"{cached} tokens {how} ({frac:.0%}); {why}"


# -- load, headroom ------------------------------------------------------------------------


def _load(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    least, scale, extra = pool.min_load, ctx.cfg.load_scale, ctx.extra_load
    if extra:
        return [1.0 / (1.0 + max(0.0, ctx.load(v) - least) / scale) for v in views]
    return [
        1.0 / (1.0 + max(0.0, max(v.in_flight, v.load.num_waiting + v.load.num_running) - least)
        / scale)
        for v in views
    ]  # fmt: skip


def _load_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    load, extra = ctx.load(view), ctx.extra_load.get(view.name, 0.0)
    live = f", {extra:.0f} live workflows" if extra else ""
    return f"{load:.0f} outstanding{live} (+{max(0.0, load - pool.min_load):.0f})"


def _headroom(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    return [1.0 - min(1.0, max(0.0, v.load.kv_usage)) for v in views]


def _headroom_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    return f"KV {min(1.0, max(0.0, view.load.kv_usage)):.0%} used"


# -- latency -------------------------------------------------------------------------------


def _latency(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    comfort, scale_s, best_s = ctx.cfg.budget_comfort, ctx.cfg.latency_scale_s, pool.min_ttft_s
    out = []
    for view in views:
        name = view.info.name
        use = ctx.budget_use(name)
        if use is None:
            extra_s = max(0.0, ctx.estimates[name].ttft_s - best_s)
            out.append(1.0 / (1.0 + extra_s / scale_s))
        elif use > 1.0:
            out.append(0.0)
        elif use <= comfort or comfort >= 1.0:
            out.append(1.0)
        else:
            out.append((1.0 - use) / (1.0 - comfort))
    return out


def _latency_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    ttft_s = ctx.estimates[view.name].ttft_s
    use = ctx.budget_use(view.name)
    if use is None:
        return f"TTFT {ttft_s:.3f}s (+{max(0.0, ttft_s - pool.min_ttft_s):.3f}s)"
    verdict = "misses" if use > 1.0 else "meets"
    return f"TTFT {ttft_s:.3f}s {verdict} budget ({use:.0%})"


# -- cost, warm, priority, affinity --------------------------------------------------------


def _cost(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    cheapest, get = pool.min_usd_per_token, ctx.usd_per_token.get
    out = []
    for view in views:
        usd = get(view.info.name, 0.0)
        out.append(1.0 if usd <= cheapest or usd <= 0 else cheapest / usd)
    return out


def _cost_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    return f"${ctx.usd_per_token.get(view.name, 0.0) * 1e6:.3f} per 1M tokens"


def _warm_one(ctx: ScoringContext, view: EndpointView) -> float:
    if view.state is EndpointState.READY:
        return 1.0
    if view.state is EndpointState.WARMING:
        return slow_start_weight(ctx.now - view.state_since_s, ctx.cfg)
    return 0.0


def _warm(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    ready = EndpointState.READY
    return [1.0 if v.state is ready else _warm_one(ctx, v) for v in views]


def _warm_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    if view.state is EndpointState.READY:
        return "ready"
    if view.state is EndpointState.WARMING:
        since_s = ctx.now - view.state_since_s
        return f"warming {since_s:.1f}s: slow start {slow_start_weight(since_s, ctx.cfg):.2f}"
    return f"state {view.state.value}"


def _priority(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    if ctx.call.priority is not PriorityClass.CRITICAL:
        return [1.0] * len(views)
    limit = ctx.cfg.critical_kv_limit
    return [
        max(0.0, 1.0 - min(1.0, max(0.0, v.load.kv_usage)) / limit) / (1.0 + v.load.num_waiting)
        for v in views
    ]


def _priority_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    if ctx.call.priority is not PriorityClass.CRITICAL:
        return f"{ctx.call.priority.value}: no preference"
    kv = min(1.0, max(0.0, view.load.kv_usage))
    return f"critical: KV {kv:.0%}, {view.load.num_waiting} queued"


def _affinity(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    target = ctx.affinity_endpoint
    return [
        1.0 if v.info.name == target and keeps_bonus(ctx, pool, v.info.name) else 0.0 for v in views
    ]


def _affinity_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    if ctx.affinity_endpoint is None:
        return "no workflow affinity"
    if view.name != ctx.affinity_endpoint:
        return "not the workflow's endpoint"
    return f"workflow's endpoint; {keeps_affinity(ctx, pool, view.name)[1]}"


def _kv_claim(ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView]) -> list[float]:
    costs = ctx.claim_cost_blocks
    if not costs:
        return [1.0] * len(views)
    least, scale = pool.min_claim_cost_blocks, ctx.cfg.claim_scale_blocks
    return [1.0 / (1.0 + max(0.0, costs.get(v.info.name, 0.0) - least) / scale) for v in views]


def _kv_claim_words(ctx: ScoringContext, pool: PoolStats, view: EndpointView) -> str:
    cost = ctx.claim_cost_blocks.get(view.name)
    if cost is None:
        return "not a new session"
    extra = max(0.0, cost - pool.min_claim_cost_blocks)
    return f"new session: KV placement cost {cost:.0f} blocks (+{extra:.0f})"


score_kv_cache = Axis("kv_cache", _kv_cache, _kv_cache_words)
score_load = Axis("load", _load, _load_words)
score_headroom = Axis("headroom", _headroom, _headroom_words)
score_latency = Axis("latency", _latency, _latency_words)
score_cost = Axis("cost", _cost, _cost_words)
score_warm = Axis("warm", _warm, _warm_words)
score_priority = Axis("priority", _priority, _priority_words)
score_affinity = Axis("affinity", _affinity, _affinity_words)
score_kv_claim = Axis("kv_claim", _kv_claim, _kv_claim_words)

AXES: tuple[Axis, ...] = (
    score_kv_cache,
    score_load,
    score_headroom,
    score_latency,
    score_cost,
    score_warm,
    score_priority,
    score_affinity,
    score_kv_claim,
)
SCORERS: tuple[tuple[str, Scorer], ...] = tuple((a.name, a) for a in AXES)

#: The axes with weight, and their weights, in ``AXES`` order.
ActiveAxes = tuple[tuple[Axis, float], ...]
_ACTIVE_CACHE: dict[int, tuple[ScorerWeights, ActiveAxes]] = {}
_MAX_ACTIVE_CACHE = 256


def active_axes(weights: ScorerWeights | Mapping[str, float]) -> ActiveAxes:
    """Axes with a positive weight (memoised per ``ScorerWeights`` object)."""
    if isinstance(weights, ScorerWeights):
        hit = _ACTIVE_CACHE.get(id(weights))
        if hit is not None and hit[0] is weights:
            return hit[1]
        active = active_axes(weights.as_dict())
        if len(_ACTIVE_CACHE) >= _MAX_ACTIVE_CACHE:
            _ACTIVE_CACHE.clear()
        _ACTIVE_CACHE[id(weights)] = (weights, active)
        return active
    return tuple((a, w) for a in AXES if (w := weights.get(a.name, 0.0)) > 0)


def score_columns(
    ctx: ScoringContext, pool: PoolStats, views: Sequence[EndpointView], active: ActiveAxes
) -> list[list[float]]:
    """The hot path: per active axis, the endpoints' scores in [0, 1] (no reasons)."""
    columns = []
    for axis, _ in active:
        scores = axis.numbers(ctx, pool, views)
        columns.append([s if 0.0 <= s <= 1.0 else _clamp(s) for s in scores])
    return columns


def weighted_totals(
    views: Sequence[EndpointView], active: ActiveAxes, columns: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Per endpoint, the weighted mean of its axis scores, in [0, 1]."""
    total_w = sum(w for _, w in active)
    if total_w <= 0:
        return {v.name: 0.0 for v in views}
    raw = [0.0] * len(views)
    for (_, w), scores in zip(active, columns, strict=True):
        raw = [r + s * w for r, s in zip(raw, scores, strict=True)]
    return {v.info.name: min(1.0, max(0.0, r / total_w)) for v, r in zip(views, raw, strict=True)}


def explain(
    ctx: ScoringContext, pool: PoolStats, view: EndpointView, active: ActiveAxes
) -> tuple[AxisScore, ...]:
    """Every active axis of one endpoint, with its score and reason."""
    return tuple(axis(ctx, pool, view) for axis, _ in active)


def score_all(
    ctx: ScoringContext, views: Sequence[EndpointView], weights: Mapping[str, float]
) -> dict[str, tuple[float, tuple[AxisScore, ...]]]:
    """Per endpoint: the weighted mean score in [0, 1] and every axis that has weight."""
    pool = PoolStats.of(ctx, views)
    active = active_axes(weights)
    totals = weighted_totals(views, active, score_columns(ctx, pool, views, active))
    return {v.name: (totals[v.name], explain(ctx, pool, v, active)) for v in views}
