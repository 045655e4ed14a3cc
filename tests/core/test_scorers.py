"""Routing scorers, table-driven per axis, plus the [0, 1] property of the weighted total."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.predictor import LatencyEstimate
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.scorers import (
    PoolStats,
    Scorer,
    ScoringContext,
    score_affinity,
    score_all,
    score_cost,
    score_headroom,
    score_kv_cache,
    score_latency,
    score_load,
    score_priority,
    score_warm,
    slow_start_weight,
)
from inferplane.core.types import CallContext, EndpointState, EndpointView, PriorityClass
from tests.core.routing_helpers import call, view


def _est(ttft_s: float = 0.1, wait_s: float = 0.0, tpot_s: float = 0.01) -> LatencyEstimate:
    return LatencyEstimate(ttft_s, tpot_s, wait_s, ttft_s - wait_s, ttft_s, tpot_s)


def _ctx(
    views: list[EndpointView],
    c: CallContext | None = None,
    *,
    est: dict[str, LatencyEstimate] | None = None,
    cached: dict[str, int] | None = None,
    saved: dict[str, float] | None = None,
    affinity: str | None = None,
    prefix: bool = True,
    cfg: RoutingConfig | None = None,
    now: float = 0.0,
) -> tuple[ScoringContext, PoolStats]:
    names = [v.name for v in views]
    ctx = ScoringContext(
        call=c or call(),
        now=now,
        cfg=cfg or RoutingConfig(),
        estimates=est or {n: _est() for n in names},
        cached_tokens=cached or {},
        saved_s=saved or {},
        usd_per_token={v.name: v.info.price_per_hour_usd / 3600 / 1000 for v in views},
        affinity_endpoint=affinity,
        has_prefix_data=prefix,
    )
    return ctx, PoolStats.of(ctx, views)


def _score(fn: Scorer, views: list[EndpointView], **kw: object) -> dict[str, float]:
    ctx, pool = _ctx(views, **kw)  # type: ignore[arg-type]
    return {v.name: fn(ctx, pool, v).score for v in views}


def test_kv_cache_axis() -> None:
    a, b, c = view("a"), view("b"), view("c")
    scores = _score(
        score_kv_cache,
        [a, b, c],
        est={"a": _est(), "b": _est(ttft_s=2.1, wait_s=2.0), "c": _est()},
        cached={"a": 500, "b": 1000},
        saved={"a": 0.02, "b": 0.04},
    )
    assert scores == {"a": 0.5, "b": 0.0, "c": 0.0}  # b is hot: waits 2 s to save 0.04 s
    assumed = _score(score_kv_cache, [a], cached={"a": 800}, saved={"a": 0.1}, prefix=False)
    assert assumed == {"a": 0.8}  # a workflow's previous endpoint, no prefix index
    assert _score(score_kv_cache, [a], prefix=False) == {"a": 0.0}


def test_hot_spot_rule_has_a_knob() -> None:
    views = [view("a"), view("b")]
    est = {"a": _est(), "b": _est(ttft_s=1.1, wait_s=1.0)}
    kw = {"est": est, "cached": {"b": 1000}, "saved": {"b": 0.5}}
    assert _score(score_kv_cache, views, **kw)["b"] == 0.0
    lenient = RoutingConfig(affinity_penalty_ratio=2.5)
    assert _score(score_kv_cache, views, cfg=lenient, **kw)["b"] == 1.0


def test_hot_spot_rule_compares_ttft_not_wait() -> None:
    """The holder waits 0.5 s longer than the idle engine, more than the 0.3 s of prefill
    its cache saves; but the idle engine must prefill those 0.3 s itself, so the holder's
    TTFT is only 0.2 s worse and it keeps its bonus. Comparing waits (the old rule) took
    the bonus away and sent the call to an engine holding none of its blocks."""
    views = [view("holder"), view("idle")]
    est = {"holder": _est(ttft_s=0.52, wait_s=0.5), "idle": _est(ttft_s=0.32, wait_s=0.0)}
    kw = {"est": est, "cached": {"holder": 1000}, "saved": {"holder": 0.3}}
    assert _score(score_kv_cache, views, **kw)["holder"] == 1.0
    ctx, pool = _ctx(views, **kw)  # type: ignore[arg-type]
    assert "TTFT +0.200s <= saves 0.300s" in score_kv_cache(ctx, pool, views[0]).reason
    slower = {**est, "holder": _est(ttft_s=0.72, wait_s=0.7)}  # 0.4 s worse: hot
    assert _score(score_kv_cache, views, **{**kw, "est": slower})["holder"] == 0.0


def test_a_hot_holder_keeps_its_bonus_while_it_meets_the_budget_with_room() -> None:
    """Past the TTFT ratio, the holder keeps the prefix bonus while its prediction uses at
    most ``affinity_budget_use`` of the call's budget: a customer's second call, arriving
    while the first still prefills on the holder, used to tie on TTFT and go cold."""
    views = [view("holder"), view("idle")]
    est = {"holder": _est(ttft_s=1.5, wait_s=1.4), "idle": _est(ttft_s=0.8, wait_s=0.0)}
    kw = {"est": est, "cached": {"holder": 1000}, "saved": {"holder": 0.6}}  # +0.7 > 0.6
    assert _score(score_kv_cache, views, **kw)["holder"] == 0.0  # no budget: the ratio rule
    roomy = call(ttft_budget_s=3.0)  # the holder uses 50% of it
    ctx, pool = _ctx(views, roomy, **kw)  # type: ignore[arg-type]
    kept = score_kv_cache(ctx, pool, views[0])
    assert kept.score == 1.0
    assert "TTFT +0.700s > saves 0.600s, within budget" in kept.reason
    tight = call(ttft_budget_s=1.6)  # 94% of it: hot after all
    ctx, pool = _ctx(views, tight, **kw)  # type: ignore[arg-type]
    lost = score_kv_cache(ctx, pool, views[0])
    assert (lost.score, lost.reason) == (0.0, "hot: TTFT +0.700s > saves 0.600s, 94% of budget")
    off = RoutingConfig(affinity_budget_use=0.0)
    assert _score(score_kv_cache, views, c=roomy, cfg=off, **kw)["holder"] == 0.0
    assert _score(score_affinity, views, c=roomy, affinity="holder", **kw)["holder"] == 1.0


def test_load_axis_is_relative_to_the_pool() -> None:
    views = [view("a", in_flight=2), view("b", in_flight=10), view("c", waiting=14, running=4)]
    assert _score(score_load, views) == {"a": 1.0, "b": 0.5, "c": pytest.approx(1 / 3)}
    assert _score(score_load, [view("x", in_flight=3), view("y", running=3)]) == {
        "x": 1.0,
        "y": 1.0,
    }


@pytest.mark.parametrize(("kv", "expected"), [(0.0, 1.0), (0.25, 0.75), (1.0, 0.0), (1.5, 0.0)])
def test_headroom_axis(kv: float, expected: float) -> None:
    assert _score(score_headroom, [view("a", kv=kv)])["a"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("ttft_s", "budget_s", "expected"),
    [(0.2, 1.0, 1.0), (0.5, 1.0, 1.0), (0.75, 1.0, 0.5), (1.01, 1.0, 0.0), (0.6, None, 1.0)],
)
def test_latency_axis_against_budget(
    ttft_s: float, budget_s: float | None, expected: float
) -> None:
    scores = _score(
        score_latency, [view("a")], c=call(ttft_budget_s=budget_s), est={"a": _est(ttft_s)}
    )
    assert scores["a"] == pytest.approx(expected)


def test_latency_axis_without_budget_is_relative() -> None:
    scores = _score(score_latency, [view("a"), view("b")], est={"a": _est(0.1), "b": _est(0.6)})
    assert scores["a"] == 1.0
    assert scores["b"] == pytest.approx(0.5)  # 0.5 s extra = one latency_scale_s


def test_latency_axis_end_to_end_deadline() -> None:
    c = call(deadline_s=1.0, max_tokens=101)  # 0.1 s TTFT + 100 x 0.01 s = 1.1 s: misses
    assert _score(score_latency, [view("a")], c=c, est={"a": _est(0.1)})["a"] == 0.0
    c = call(deadline_s=3.0, max_tokens=101)
    assert _score(score_latency, [view("a")], c=c, est={"a": _est(0.1)})["a"] == 1.0


def test_cost_axis_prefers_cheapest_per_token() -> None:
    views = [view("a", price=2.0), view("b", price=4.0), view("free", price=0.0)]
    assert _score(score_cost, views[:2]) == {"a": 1.0, "b": 0.5}
    assert _score(score_cost, views)["a"] == 0.0 and _score(score_cost, views)["free"] == 1.0


@pytest.mark.parametrize(
    ("since_s", "aggression", "expected"),
    [(0.0, 1.0, 0.1), (15.0, 1.0, 0.5), (30.0, 1.0, 1.0), (99.0, 1.0, 1.0), (7.5, 2.0, 0.5)],
)
def test_slow_start_ramp(since_s: float, aggression: float, expected: float) -> None:
    cfg = RoutingConfig(slow_start_window_s=30.0, slow_start_aggression=aggression)
    assert slow_start_weight(since_s, cfg) == pytest.approx(expected)
    warming = view("w", state=EndpointState.WARMING, since_s=100.0)
    assert _score(score_warm, [warming], cfg=cfg, now=100.0 + since_s)["w"] == pytest.approx(
        expected
    )
    assert _score(score_warm, [view("r")], cfg=cfg)["r"] == 1.0


@pytest.mark.parametrize(
    ("priority", "kv", "waiting", "expected"),
    [
        (PriorityClass.STANDARD, 0.9, 5, 1.0),
        (PriorityClass.SHEDDABLE, 0.9, 5, 1.0),
        (PriorityClass.CRITICAL, 0.0, 0, 1.0),
        (PriorityClass.CRITICAL, 0.4, 0, 0.5),
        (PriorityClass.CRITICAL, 0.4, 1, 0.25),
        (PriorityClass.CRITICAL, 0.9, 0, 0.0),
    ],
)
def test_priority_axis(priority: PriorityClass, kv: float, waiting: int, expected: float) -> None:
    v = view("a", kv=kv, waiting=waiting)
    assert _score(score_priority, [v], c=call(priority=priority))["a"] == pytest.approx(expected)


def test_affinity_axis() -> None:
    views = [view("a"), view("b")]
    est = {"a": _est(), "b": _est(ttft_s=0.4, wait_s=0.3)}
    assert _score(score_affinity, views, est=est) == {"a": 0.0, "b": 0.0}
    kept = _score(score_affinity, views, est=est, affinity="b", saved={"b": 0.5})
    assert kept == {"a": 0.0, "b": 1.0}
    hot = _score(score_affinity, views, est=est, affinity="b", saved={"b": 0.1})
    assert hot == {"a": 0.0, "b": 0.0}


_VIEW = st.builds(
    lambda i, f, w, r, kv, p, s: view(
        f"e{i}", in_flight=f, waiting=w, running=r, kv=kv, price=p, state=s, since_s=0.0
    ),
    st.integers(0, 1000),
    st.integers(0, 300),
    st.integers(0, 300),
    st.integers(0, 300),
    st.floats(-1.0, 2.0),
    st.floats(0.0, 100.0),
    st.sampled_from([EndpointState.READY, EndpointState.WARMING]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_VIEW, min_size=1, max_size=6, unique_by=lambda v: v.name),
    st.floats(0.0, 100.0),
    st.sampled_from(list(PriorityClass)),
    st.one_of(st.none(), st.floats(0.001, 10.0)),
)
def test_every_score_in_unit_interval(
    views: list[EndpointView], wait_s: float, priority: PriorityClass, budget: float | None
) -> None:
    est = {v.name: _est(ttft_s=wait_s + 0.1 * i, wait_s=wait_s) for i, v in enumerate(views)}
    c = call(priority=priority, ttft_budget_s=budget)
    ctx, _ = _ctx(views, c, est=est, cached={views[0].name: 700}, affinity=views[-1].name)
    for total, axes in score_all(ctx, views, RoutingConfig().weights.as_dict()).values():
        assert 0.0 <= total <= 1.0
        assert len(axes) == 9  # every axis, kv_claim included
        assert all(0.0 <= a.score <= 1.0 and a.reason for a in axes)
