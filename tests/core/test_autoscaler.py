"""Autoscaler tests: bounds, no flapping, scaling ahead of a known step, cost-aware GPU choice.

The loop is driven like a body drives it: each tick the "actuator" applies the previous
decision (optionally after a cold start), so properties hold for the closed loop, not only
for one call.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    GpuOption,
    HoltForecast,
    PoolPolicy,
    PoolSignal,
    ScaleAction,
    ScaleDecision,
    ScheduleForecast,
)

H100 = GpuOption("h100", price_per_hour_usd=4.0, tokens_per_s=1000.0, cold_start_s=60.0)
A100 = GpuOption("a100", price_per_hour_usd=1.6, tokens_per_s=300.0, cold_start_s=60.0)


def _policy(**kw: object) -> PoolPolicy:
    base: dict[str, object] = {"pool": "m", "options": (H100,), "min_replicas": 1}
    base.update(kw)
    return PoolPolicy(**base)  # type: ignore[arg-type]


def _signal(now: float, rate: float, serving: dict[str, int], **kw: object) -> PoolSignal:
    return PoolSignal(pool="m", now_s=now, window_s=15.0, tokens=rate * 15.0, serving=serving, **kw)  # type: ignore[arg-type]


def _run(
    scaler: Autoscaler,
    rates: list[float],
    start: dict[str, int],
    tick_s: float = 15.0,
    **signal_kw: object,
) -> list[ScaleDecision]:
    """Closed loop with an instant actuator: the fleet becomes what was decided."""
    state, fleet, out = AutoscalerState(), dict(start), []
    for i, rate in enumerate(rates):
        decisions, state = scaler.decide([_signal(i * tick_s, rate, fleet, **signal_kw)], state)
        out.append(decisions[0])
        fleet = dict(decisions[0].desired)
    return out


@settings(max_examples=60, deadline=None)
@given(
    lo=st.integers(0, 3),
    span=st.integers(0, 5),
    start=st.integers(0, 12),
    rates=st.lists(st.floats(0, 20_000), min_size=1, max_size=30),
    backlog=st.floats(0, 1e6),
    slo=st.one_of(st.none(), st.floats(0, 1)),
)
def test_never_below_min_or_above_max(
    lo: int, span: int, start: int, rates: list[float], backlog: float, slo: float | None
) -> None:
    scaler = Autoscaler([_policy(options=(H100, A100), min_replicas=lo, max_replicas=lo + span)])
    start_fleet = {"h100": start} if start else {}
    for d in _run(scaler, rates, start_fleet, backlog_tokens=backlog, slo_attainment=slo):
        assert lo <= d.desired_total <= lo + span, d
        assert all(n > 0 for n in d.desired.values())
        assert d.reason


@settings(max_examples=25, deadline=None)
@given(mean=st.floats(200, 6000), seed=st.integers(0, 2**16))
def test_no_flapping_under_steady_load(mean: float, seed: int) -> None:
    rng = random.Random(seed)
    scaler = Autoscaler([_policy(max_replicas=20, scale_down_window_s=300.0)])
    rates = [mean * rng.uniform(0.9, 1.1) for _ in range(120)]
    decisions = _run(scaler, rates, {"h100": 1})
    changes = [d.action for d in decisions if d.action is not ScaleAction.HOLD]
    # It may size up at first, but never reverses direction under a steady load.
    assert ScaleAction.DOWN not in changes or ScaleAction.UP not in changes
    # A few steps up while it finds the size (a rare noisy peak may add one late): a
    # ratchet, not a flap.
    assert len(changes) <= 3
    # And the size serves the load at the target utilisation.
    assert decisions[-1].desired_total * H100.tokens_per_s * 0.7 >= mean * 0.9


@settings(max_examples=25, deadline=None)
@given(
    step_at=st.floats(600, 3000),
    cold=st.floats(30, 400),
    low=st.floats(500, 2000),
    factor=st.floats(2, 5),
)
def test_scales_up_ahead_of_a_known_step_by_the_cold_start(
    step_at: float, cold: float, low: float, factor: float
) -> None:
    option = GpuOption("h100", 4.0, 1000.0, cold_start_s=cold)
    tick_s = 15.0
    scaler = Autoscaler([_policy(options=(option,), max_replicas=30, tick_s=tick_s)])
    forecast = ScheduleForecast(((0.0, low), (step_at, low * factor)))
    state, fleet = AutoscalerState(), {"h100": 1}
    first_up_at, size_before = None, None
    ready_by_step = 0  # replicas asked for at least one cold start before the step
    now = 0.0
    while now < step_at:
        rate = low  # observed demand stays low until the step itself
        decisions, state = scaler.decide(
            [_signal(now, rate, fleet)], state, forecasts={"m": forecast}
        )
        d = decisions[0]
        if size_before is None:
            size_before = d.desired_total
        elif d.desired_total > size_before and first_up_at is None:
            first_up_at = now
        if now + cold <= step_at:
            ready_by_step = d.desired_total
        fleet = dict(d.desired)
        now += tick_s
    assert first_up_at is not None
    # Started at least one cold start before the step, so the replicas serve when it comes.
    assert first_up_at + cold <= step_at
    # Not only the first: every replica the step needs was asked for a cold start ahead, so
    # the fleet that is ready when the step comes serves it (not one still starting).
    need = low * factor * 0.999
    assert ready_by_step * option.tokens_per_s * 0.7 >= need, (ready_by_step, fleet)
    assert sum(fleet.values()) * option.tokens_per_s * 0.7 >= need


def test_holt_forecast_scales_up_on_a_ramp_before_capacity_is_exceeded() -> None:
    scaler = Autoscaler([_policy(max_replicas=50)])
    rates = [100.0 + 20.0 * i for i in range(60)]  # +20 tok/s every 15 s
    decisions = _run(scaler, rates, {"h100": 1})
    for d, rate in zip(decisions, rates, strict=True):
        assert d.desired_total * H100.tokens_per_s > rate  # never behind the observed demand
    ahead = [d.demand_tokens_per_s - r for d, r in zip(decisions[10:], rates[10:], strict=True)]
    assert min(ahead) > 0  # the trend puts the forecast ahead of the observation


def test_holt_learns_a_trend_and_forgets_a_spike() -> None:
    h = HoltForecast()
    for i in range(30):
        h = h.update(10.0 * i, float(i))
    assert abs(h.trend_per_s - 10.0) < 0.5
    assert h.peak_tokens_per_s(29.0, 39.0) > 10.0 * 29 + 50


def test_cost_aware_choice_buys_the_cheapest_capacity_for_the_gap() -> None:
    scaler = Autoscaler([_policy(options=(H100, A100), max_replicas=40)])
    # A small gap: one A100 ($1.6/h) is cheaper than one H100 ($4/h).
    (small,), _ = scaler.decide([_signal(0.0, 150.0, {"h100": 0})], AutoscalerState())
    assert small.desired == {"a100": 1}
    # A big demand: H100 is cheaper per token ($1.11 vs $1.48 per M tokens), so mostly H100s.
    (big,), _ = scaler.decide([_signal(0.0, 7000.0, {})], AutoscalerState())
    assert big.desired.get("h100", 0) >= 9
    assert big.desired.get("a100", 0) <= 2
    assert big.action is ScaleAction.UP and "need" in big.reason


def test_scale_down_drains_costliest_per_token_first_after_the_window() -> None:
    policy = _policy(options=(H100, A100), max_replicas=10, scale_down_window_s=60.0)
    scaler = Autoscaler([policy])
    state = AutoscalerState()
    fleet = {"h100": 2, "a100": 2}
    actions = []
    for i in range(12):
        (d,), state = scaler.decide([_signal(15.0 * i, 100.0, fleet)], state)
        actions.append(d.action)
        if d.action is ScaleAction.DOWN:
            assert d.desired.get("a100", 0) <= fleet.get("a100", 0)
            # A100s (costlier per token) go before H100s.
            if d.desired.get("h100", 0) < fleet["h100"]:
                assert d.desired.get("a100", 0) == 0
        fleet = dict(d.desired)
    assert ScaleAction.DOWN in actions
    assert sum(fleet.values()) == 1


def test_no_scale_down_while_demand_rises_to_what_the_replica_would_serve() -> None:
    # Two replicas held by an hour of 1,000 tok/s; the need then falls under one replica.
    # Flat at 150 tok/s, the spare goes when the window lets it; rising (150 -> 400 over
    # three windows: 5 tok/s per s, ~1,000 tok/s within the 75 s a replica takes to come
    # back), it stays.
    scaler = Autoscaler([_policy(max_replicas=4, scale_down_window_s=60.0)])
    flat = _run(scaler, [1000.0] * 4 + [150.0] * 4, {"h100": 2})
    rising = _run(scaler, [1000.0] * 4 + [150.0, 150.0, 200.0, 400.0], {"h100": 2})
    assert flat[-1].action is ScaleAction.DOWN and flat[-1].desired_total == 1
    assert all(d.action is ScaleAction.HOLD for d in rising)
    assert rising[-1].desired_total == 2 and "rising to" in rising[-1].reason
    # The guard buys nothing: the same rise from one replica is left to the forecast.
    from_one = _run(scaler, [150.0, 150.0, 200.0, 400.0], {"h100": 1})
    assert all(d.desired_total == 1 for d in from_one)


def test_scale_down_waits_for_the_cooldown_after_a_scale_up() -> None:
    scaler = Autoscaler([_policy(max_replicas=10, scale_down_window_s=15.0)])
    (up,), state = scaler.decide([_signal(0.0, 3000.0, {"h100": 1})], AutoscalerState())
    assert up.action is ScaleAction.UP
    (held,), state = scaler.decide([_signal(60.0, 0.0, dict(up.desired))], state)
    assert held.action is ScaleAction.HOLD and "cooling" in held.reason
    (down,), _ = scaler.decide([_signal(200.0, 0.0, dict(up.desired))], state)
    assert down.action is ScaleAction.DOWN and down.desired_total == 1


def test_backlog_and_slo_misses_add_capacity() -> None:
    scaler = Autoscaler([_policy(max_replicas=10)])
    (calm,), _ = scaler.decide([_signal(0.0, 500.0, {"h100": 1})], AutoscalerState())
    (backlog,), _ = scaler.decide(
        [_signal(0.0, 500.0, {"h100": 1}, backlog_tokens=60_000.0)], AutoscalerState()
    )
    assert backlog.desired_total > calm.desired_total
    assert "backlog" in backlog.reason
    (slo,), _ = scaler.decide(
        [_signal(0.0, 600.0, {"h100": 1}, slo_attainment=0.5)], AutoscalerState()
    )
    assert slo.desired_total > calm.desired_total and "SLO" in slo.reason


def test_starting_replicas_count_so_the_loop_does_not_overshoot() -> None:
    scaler = Autoscaler([_policy(max_replicas=10)])
    (first,), state = scaler.decide([_signal(0.0, 2000.0, {"h100": 1})], AutoscalerState())
    added = first.desired["h100"] - 1
    assert added >= 2
    signal = _signal(15.0, 2000.0, {"h100": 1}, starting={"h100": added})
    (second,), _ = scaler.decide([signal], state)
    assert second.action is ScaleAction.HOLD
    assert second.desired_total == first.desired_total


def test_policy_validation() -> None:
    for bad in (
        {"options": ()},
        {"min_replicas": 3, "max_replicas": 2},
        {"target_utilisation": 0.0},
        {"options": (GpuOption("x", 1.0, 0.0, 1.0),)},
    ):
        try:
            _policy(**bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_unknown_pools_are_ignored() -> None:
    scaler = Autoscaler([_policy()])
    other = PoolSignal(pool="other", now_s=0.0, window_s=15.0, tokens=1e6)
    decisions, state = scaler.decide([other], AutoscalerState())
    assert decisions == [] and not state.pools
