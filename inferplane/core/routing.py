"""The routing pipeline: filter, predict, score along every axis, pick; and moving the work.

``route(call, endpoints, now, rng, ...)`` is the seam the gateway and the simulator call:

1. filters (:mod:`inferplane.core.filters`): model served, state accepts work, context
   fits, not excluded;
2. predictions (:mod:`inferplane.core.predictor`): TTFT and TPOT of this call on each
   candidate, given what its prefix cache already holds (prefix index match, or for a
   workflow's previous endpoint without prefix data, an assumed reuse share);
3. the warm filter: latency-bound calls skip warming replicas while a ready one meets
   their budget;
4. scorers (:mod:`inferplane.core.scorers`), weighted per pool, mean in [0, 1];
5. the picker: max score, ties broken by a seeded hash of the endpoint name (so the ranking
   does not depend on the order endpoints are listed in), or with a softmax temperature the
   primary drawn at random in proportion to exp(score / T).

The answer ranks every candidate (primary, then fallbacks for failover) with per-axis
scores and reasons. ``choose_target`` moves the work between models of a route: the first
target whose best endpoint meets the budget, else the best prediction overall.
``least_loaded`` is the baseline kept for comparison. Pure: the RNG and ``now`` are inputs.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from inferplane.core.filters import apply_filters, prefer_meeting_budget, prefer_warm
from inferplane.core.predictor import LatencyEstimate, LatencyPredictor
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.scorers import (
    PoolStats,
    ScoringContext,
    active_axes,
    budget_use,
    explain,
    load_of,
    score_columns,
    score_kv_claim,
    weighted_totals,
)
from inferplane.core.types import (
    AxisScore,
    CallContext,
    EndpointView,
    RankedEndpoint,
    RouteDecision,
)

__all__ = [
    "ClaimSource",
    "PrefixMatcher",
    "TargetChoice",
    "choose_target",
    "eligible",
    "least_loaded",
    "load_of",
    "route",
]

_DEFAULT_CONFIG = RoutingConfig()
_PREDICTORS: dict[int, LatencyPredictor] = {}
_MAX_LISTED_REFUSALS = 4


class PrefixMatcher(Protocol):
    """What routing needs of a prefix index: leading blocks of ``keys`` held per endpoint."""

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]: ...


class ClaimSource(Protocol):
    """A prefix index that also knows the KV its endpoints' recent sessions claim.

    Checked structurally (``hasattr(index, "kv_claims")``), not ``@runtime_checkable``: a
    runtime-checkable Protocol keeps mypyc from compiling this module (``make compiled``).
    """

    def kv_claims(self, endpoints: Iterable[str], now: float) -> dict[str, float]: ...


def eligible(call: CallContext, endpoints: Sequence[EndpointView]) -> list[EndpointView]:
    """Endpoints that pass the stage-one filters."""
    return apply_filters(call, endpoints)[0]


def route(
    call: CallContext,
    endpoints: Sequence[EndpointView],
    now: float,
    rng: random.Random,
    *,
    config: RoutingConfig | None = None,
    predictor: LatencyPredictor | None = None,
    prefix_index: PrefixMatcher | None = None,
    affinity_endpoint: str | None = None,
    exclude: Collection[str] = (),
    live_workflows: Mapping[str, int] | None = None,
) -> RouteDecision:
    """Rank the endpoints that can take ``call``, best first, with per-axis reasons.

    Without a predictor a shared one with priors only (uncalibrated) is used; without a
    prefix index the KV-cache axis is neutral. ``exclude`` names endpoints already tried.
    Every ranked endpoint carries its total score and predicted TTFT; the first
    ``cfg.explain_top`` also carry their per-axis scores with reasons (formatting them for
    every candidate on every call would cost more than the decision itself).
    A workflow's first call (one without an affine endpoint) is a new session, placed by
    KV memory (the ``kv_claim`` axis, next to ``kv_cache``): what each endpoint's
    recent sessions claim, from a prefix index that is a :class:`ClaimSource`, plus the
    blocks of this prompt it lacks.
    Without claims, ``live_workflows`` (workflows whose context each endpoint holds) count
    as load for it instead.
    """
    cfg = config or _DEFAULT_CONFIG
    pred = predictor or _shared_predictor(cfg)
    candidates, refused = apply_filters(call, endpoints, exclude)
    if not candidates:
        why = _refusals(refused)
        return RouteDecision((), f"no endpoint can serve model {call.model!r}{why}")
    cached, has_prefix = _cached_tokens(call, candidates, cfg, prefix_index, affinity_endpoint)
    estimates: dict[str, LatencyEstimate] = {}
    uses: dict[str, float | None] = {}
    meets: dict[str, bool] = {}
    num_prompt, model = call.num_prompt_tokens, call.model
    for view in candidates:
        name = view.info.name
        estimate = pred.predict(view, model, num_prompt - cached[name], now)
        estimates[name] = estimate
        use = uses[name] = budget_use(call, estimate, now, cfg)
        meets[name] = use is None or use <= 1.0
    candidates, dropped = prefer_warm(call, candidates, meets)
    candidates, missing = prefer_meeting_budget(call, candidates, meets, uses)
    dropped += missing
    if len(candidates) == 1 and cfg.explain_top == 0:
        return _only_candidate(candidates[0].name, estimates, meets, refused + dropped, rng)
    if dropped:
        kept = {v.info.name for v in candidates}
        estimates = {n: e for n, e in estimates.items() if n in kept}
    claims = _claim_costs(call, cached, cfg, prefix_index, affinity_endpoint, now)
    ctx = ScoringContext(
        call=call,
        now=now,
        cfg=cfg,
        estimates=estimates,
        cached_tokens=cached,
        saved_s={v.name: pred.prefill_s(v, model, cached[v.name], now) for v in candidates},
        usd_per_token={v.name: _usd_per_token(v, model, pred, now) for v in candidates},
        affinity_endpoint=affinity_endpoint,
        has_prefix_data=has_prefix,
        budget_uses=uses,
        extra_load={} if claims else _session_load(call, affinity_endpoint, live_workflows),
        claim_cost_blocks=claims,
    )
    pool = PoolStats.of(ctx, candidates)
    active = active_axes(cfg.weights_for(model))
    if not claims:  # the axis would score every endpoint 1: leave the totals as they were
        active = tuple(a for a in active if a[0] is not score_kv_claim)
    columns = score_columns(ctx, pool, candidates, active)
    totals = weighted_totals(candidates, active, columns)
    order = _pick(totals, rng, cfg.softmax_temperature)
    by_name = {v.info.name: v for v in candidates}
    ranked = tuple(
        RankedEndpoint(
            n,
            totals[n],
            explain(ctx, pool, by_name[n], active) if i < cfg.explain_top else (),
            estimates[n].ttft_s,
            meets[n],
        )
        for i, n in enumerate(order)
    )
    column = next(i for i, v in enumerate(candidates) if v.info.name == order[0])
    best = [(axis.name, scores[column]) for (axis, _), scores in zip(active, columns, strict=True)]
    why = _reason(ranked[0], best, refused + dropped, cfg.softmax_temperature)
    return RouteDecision(ranked, why)


def _only_candidate(
    name: str,
    estimates: Mapping[str, LatencyEstimate],
    meets: Mapping[str, bool],
    refused: Sequence[tuple[str, str]],
    rng: random.Random,
) -> RouteDecision:
    """One endpoint left: nothing to rank, so no scores (the RNG advances as in ``_pick``)."""
    rng.getrandbits(64)
    ranked = RankedEndpoint(name, 1.0, (), estimates[name].ttft_s, meets[name])
    return RouteDecision((ranked,), f"only candidate: {name}{_refusals(refused)}")


def _shared_predictor(cfg: RoutingConfig) -> LatencyPredictor:
    """A priors-only predictor per predictor config, reused (``predict`` keeps no state
    beyond a memo of resolved priors)."""
    found = _PREDICTORS.get(id(cfg.predictor))
    if found is None or found.config is not cfg.predictor:
        if len(_PREDICTORS) >= 64:
            _PREDICTORS.clear()
        found = _PREDICTORS[id(cfg.predictor)] = LatencyPredictor(cfg.predictor)
    return found


def _cached_tokens(
    call: CallContext,
    views: Sequence[EndpointView],
    cfg: RoutingConfig,
    prefix_index: PrefixMatcher | None,
    affinity_endpoint: str | None,
) -> tuple[dict[str, int], bool]:
    """Prompt tokens each candidate already caches, and whether prefix data was used."""
    prompt = max(0, call.num_prompt_tokens)
    cached = dict.fromkeys((v.name for v in views), 0)
    if prefix_index is not None and call.prompt_block_keys:
        blocks = prefix_index.match(call.prompt_block_keys, list(cached))
        for name in cached:
            cached[name] = min(prompt, max(0, blocks.get(name, 0)) * cfg.block_size)
        return cached, True
    if affinity_endpoint in cached:
        cached[affinity_endpoint] = int(prompt * cfg.affinity_reuse_fraction)
    return cached, False


def _claim_costs(
    call: CallContext,
    cached: Mapping[str, int],
    cfg: RoutingConfig,
    prefix_index: PrefixMatcher | None,
    affinity_endpoint: str | None,
    now: float,
) -> dict[str, float]:
    """A new session's KV placement cost per candidate, in blocks: the KV the endpoint's
    recent sessions claim, plus ``claim_uncached_weight`` x the prompt blocks it lacks (a
    shared prefix copied to one more engine costs its memory there for as long as the
    sessions of its kind run). Empty for any other call."""
    keys = call.prompt_block_keys
    if call.workflow_id is None or affinity_endpoint is not None or not keys:
        return {}
    if prefix_index is None or not hasattr(prefix_index, "kv_claims"):
        return {}
    claims = cast(ClaimSource, prefix_index).kv_claims(cached, now)
    weight, size, num_blocks = cfg.claim_uncached_weight, cfg.block_size, len(keys)
    return {
        name: claims.get(name, 0.0) + weight * max(0, num_blocks - tokens // size)
        for name, tokens in cached.items()
    }


def _session_load(
    call: CallContext, affinity_endpoint: str | None, live: Mapping[str, int] | None
) -> Mapping[str, float]:
    if not live or call.workflow_id is None or affinity_endpoint is not None:
        return {}
    return {name: float(n) for name, n in live.items()}


def _usd_per_token(view: EndpointView, model: str, pred: LatencyPredictor, now: float) -> float:
    usd_per_s = view.info.price_per_hour_usd / 3600.0
    return usd_per_s / pred.throughput_tokens_per_s(view, model, now)


def _tie_key(salt: bytes, name: str) -> bytes:
    return hashlib.blake2b(name.encode("utf-8"), digest_size=8, key=salt).digest()


def _pick(scores: Mapping[str, float], rng: random.Random, temperature: float) -> list[str]:
    """Names best first; equal scores in a seeded order that ignores the input order.

    The tie key (a keyed hash of the name) is only computed when scores actually tie; the
    RNG is drawn from the same way either way, so decisions do not depend on it.
    """
    salt = rng.getrandbits(64).to_bytes(8, "big")
    rounded = {n: round(s, 9) for n, s in scores.items()}
    if len(set(rounded.values())) == len(rounded):
        order = sorted(rounded, key=rounded.__getitem__, reverse=True)
    else:
        order = sorted(rounded, key=lambda n: (-rounded[n], _tie_key(salt, n)))
    if temperature <= 0 or len(order) < 2:
        return order
    top = scores[order[0]]
    weights = [math.exp((scores[n] - top) / temperature) for n in order]
    cumulative = list(itertools.accumulate(weights))
    index = min(bisect.bisect_right(cumulative, rng.random() * cumulative[-1]), len(order) - 1)
    return [order[index], *order[:index], *order[index + 1 :]]


def _refusals(refused: Sequence[tuple[str, str]]) -> str:
    if not refused:
        return ""
    listed = ", ".join(f"{n}: {r}" for n, r in refused[:_MAX_LISTED_REFUSALS])
    more = len(refused) - _MAX_LISTED_REFUSALS
    return f"; filtered {listed}" + (f" (+{more} more)" if more > 0 else "")


def _reason(
    primary: RankedEndpoint,
    axis_scores: Sequence[tuple[str, float]],
    refused: Sequence[tuple[str, str]],
    temp: float,
) -> str:
    best = sorted(axis_scores, key=lambda a: -a[1])[:3]
    axes = ", ".join(f"{axis} {score:.2f}" for axis, score in best)
    picker = f"softmax T={temp:g}" if temp > 0 else "max score"
    return f"{picker}: {primary.name} {primary.score:.2f} ({axes}){_refusals(refused)}"


@dataclass(frozen=True, slots=True)
class TargetChoice:
    """Which model of a route serves the call, its routing decision, and why."""

    model: str | None
    decision: RouteDecision
    fell_back: bool
    reason: str


def choose_target(
    targets: Sequence[str], decisions: Mapping[str, RouteDecision], allow_fallback: bool = True
) -> TargetChoice:
    """Moving the work: the first target (in route order) whose best endpoint meets the
    budget; if none does, the target with the best predicted TTFT. Without
    ``allow_fallback`` only the first target is considered."""
    tried = list(targets if allow_fallback else targets[:1])
    misses: list[str] = []
    for i, model in enumerate(tried):
        decision = decisions.get(model)
        if decision is None or not decision.ranked:
            misses.append(f"{model}: no endpoint")
            continue
        best = decision.ranked[0]
        if best.meets_budget:
            why = "; ".join(misses)
            reason = f"target {model}" + (f" (fallback: {why})" if i else "")
            return TargetChoice(model, decision, i > 0, reason)
        misses.append(f"{model}: misses budget (TTFT {_fmt_s(best.predicted_ttft_s)})")
    usable = [(m, decisions[m]) for m in tried if m in decisions and decisions[m].ranked]
    if not usable:
        why = "; ".join(misses) or "no targets"
        return TargetChoice(None, RouteDecision((), f"no target can serve: {why}"), False, why)
    model, decision = min(usable, key=lambda md: _ttft_key(md[1]))
    reason = f"no target meets the budget ({'; '.join(misses)}); best TTFT on {model}"
    return TargetChoice(model, decision, model != tried[0], reason)


def _ttft_key(decision: RouteDecision) -> float:
    ttft = decision.ranked[0].predicted_ttft_s
    return math.inf if ttft is None else ttft


def _fmt_s(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}s"


def least_loaded(
    call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
) -> RouteDecision:
    """Baseline: eligible endpoints by load (fewest outstanding first), ties at random."""
    candidates = eligible(call, endpoints)
    if not candidates:
        return RouteDecision((), f"no endpoint can serve model {call.model!r}")
    keyed = [(load_of(ep), rng.random(), ep) for ep in candidates]
    keyed.sort(key=lambda item: (item[0], item[1]))
    ranked = tuple(
        RankedEndpoint(
            ep.name,
            1.0 / (1.0 + load),
            (AxisScore("load", 1.0 / (1.0 + load), f"{load:.0f} outstanding"),),
        )
        for load, _, ep in keyed
    )
    return RouteDecision(ranked, "least-loaded")
