"""Burst-episode tests: a burst over before a replica bought now would serve buys nothing,
its replicas drain when it ends, lengths are learned, and the loop's properties still hold.

The closed loop (``autoscale_loop.ClosedLoop``) starts what is asked for a cold start later
and drains at once; calls are Poisson per tick (seeded) unless ``exact``.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscale_burst import BurstEpisode, late_for_burst, rise_ratio
from inferplane.core.autoscale_reserve import BurstReserve
from inferplane.core.autoscale_state import PoolMemory
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    PoolPolicy,
    PoolSignal,
    ScaleAction,
    ScaleDecision,
    ScheduleForecast,
)
from inferplane.core.forecast import HoltForecast

from .autoscale_loop import TICK_S, TOKENS_PER_CALL, ClosedLoop, h100, pool_policy

H100 = h100(cold_start_s=45.0)
STEADY, BURST = 8.0, 40.0  # calls/s; a 5x burst


def _policy(**kw: object) -> PoolPolicy:
    base: dict[str, object] = {
        "scale_down_window_s": 30.0, "scale_down_cooldown_s": 30.0, "burst_max_factor": 1.0,
    }  # fmt: skip
    return pool_policy(H100, **{**base, **kw})


def _run(policy: PoolPolicy, rates: list[float], seed: int = 3) -> list[ScaleDecision]:
    return ClosedLoop(Autoscaler([policy]), seed, H100).run(rates)


def _observe(ep: BurstEpisode, calls: int, now: float, surging: bool = True) -> BurstEpisode:
    return ep.observe(
        requests=calls, tokens=calls * TOKENS_PER_CALL, window_s=5.0, now_s=now,
        baseline_tokens_per_s=8.0 * TOKENS_PER_CALL, z=2.0, on_ratio=2.0, off_ratio=1.5,
        surging=surging,
    )  # fmt: skip


def _ups(decisions: list[ScaleDecision], first: int, last: int) -> int:
    return sum(d.action is ScaleAction.UP for d in decisions[first:last])


def test_an_episode_begins_on_a_surge_ends_under_the_off_ratio_and_learns_its_length() -> None:
    ep = _observe(BurstEpisode(), 200, 100.0, surging=False)
    assert not ep.on  # no surge (a ramp): no burst, however high
    ep = _observe(BurstEpisode(), 45, 100.0)
    assert not ep.on  # 45 calls against 40 expected: noise
    ep = _observe(BurstEpisode(), 200, 100.0)
    assert ep.on and ep.start_s == 95.0 and ep.length_s is None
    for t in range(105, 160, 5):
        ep = _observe(ep, 200, float(t))
    assert ep.on
    ep = _observe(ep, 50, 160.0)  # 1.25x the demand it rose from: over
    assert not ep.on and ep.length_s == pytest.approx(60.0) and ep.ended_s == 160.0
    # A single noisy window teaches nothing, and a shorter burst keeps the longest length.
    one = _observe(_observe(ep, 200, 300.0), 40, 305.0)
    assert not one.on and one.length_s == pytest.approx(60.0)
    short = _observe(_observe(_observe(ep, 200, 400.0), 200, 405.0), 40, 410.0)
    assert short.length_s == pytest.approx(60.0)


def test_the_expected_end_is_the_length_then_as_long_again_unless_falling() -> None:
    ep = BurstEpisode(start_s=100.0, base_tokens_per_s=1.0, windows=3)
    assert ep.remaining_s(130.0, prior_length_s=None, falling=False) == math.inf
    assert ep.remaining_s(130.0, prior_length_s=60.0, falling=False) == pytest.approx(30.0)
    assert ep.remaining_s(180.0, prior_length_s=60.0, falling=False) == pytest.approx(80.0)
    assert ep.remaining_s(180.0, prior_length_s=60.0, falling=True) == 0.0
    learned = BurstEpisode(start_s=100.0, base_tokens_per_s=1.0, windows=3, length_s=200.0)
    assert learned.remaining_s(130.0, prior_length_s=60.0, falling=False) == pytest.approx(170.0)
    assert BurstEpisode().remaining_s(130.0, prior_length_s=60.0, falling=False) == 0.0
    flat, falling = [(120.0, 5.0), (125.0, 5.0)], [(170.0, 9.0), (175.0, 5.0)]
    # 30 s left; a replica bought now serves 45 s later and should serve 10 s of the burst.
    assert late_for_burst(ep, 130.0, rates=flat, prior_length_s=60.0, cold_start_s=45.0,
                          min_serve_s=10.0) == pytest.approx(30.0)  # fmt: skip
    assert late_for_burst(ep, 130.0, rates=flat, prior_length_s=300.0, cold_start_s=45.0,
                          min_serve_s=10.0) is None  # fmt: skip
    assert (
        late_for_burst(
            ep, 180.0, rates=falling, prior_length_s=60.0, cold_start_s=0.0, min_serve_s=10.0
        )
        == 0.0
    )  # past its length and falling: its tail
    assert late_for_burst(BurstEpisode(), 130.0, rates=flat, prior_length_s=60.0,
                          cold_start_s=45.0, min_serve_s=10.0) is None  # fmt: skip


def test_a_burst_shorter_than_a_cold_start_and_its_service_buys_nothing() -> None:
    rates = [STEADY] * 36 + [BURST] * 12 + [STEADY] * 24  # 60 s at 5x; cold start 45 s
    told = _run(_policy(burst_length_s=60.0), rates)
    blind = _run(_policy(), rates)
    assert _ups(blind, 36, 60) >= 1  # without a length, the loop chases the burst
    assert _ups(told, 36, 60) == 0  # told it lasts 60 s: nothing bought would serve 45 s of it
    assert sum(d.desired_total for d in told) < sum(d.desired_total for d in blind)
    # A burst expected to last long enough is still bought for.
    long = _run(_policy(burst_length_s=300.0), rates)
    assert _ups(long, 36, 48) >= 1


def test_the_length_is_learned_from_the_first_burst() -> None:
    burst = [BURST] * 12 + [STEADY] * 36
    decisions = _run(_policy(), [STEADY] * 36 + burst + burst)
    assert _ups(decisions, 36, 48) >= 1  # the first: length unknown, bought for
    assert _ups(decisions, 84, 96) == 0  # the second: 60 s long, as the first was


def test_replicas_a_burst_brought_drain_once_it_ends_not_after_the_window() -> None:
    # The scale-down window (300 s) would hold the burst's peak need for 5 minutes; once the
    # burst has ended its needs leave the window and the replicas go after the cooldown.
    policy = _policy(scale_down_window_s=300.0, scale_down_cooldown_s=30.0)
    rates = [STEADY] * 36 + [BURST] * 24 + [STEADY] * 60
    decisions = _run(policy, rates)
    peak = max(d.desired_total for d in decisions)
    before = decisions[35].desired_total
    assert peak > before + 1
    after = [d.desired_total for d in decisions[60:]]
    back = next(i for i, n in enumerate(after) if n <= before + 1)
    assert back * TICK_S <= 90.0, after


def test_a_step_that_outlasts_its_expected_length_is_served() -> None:
    rates = [STEADY] * 36 + [BURST] * 120  # 5x from then on
    decisions = _run(_policy(burst_length_s=60.0), rates)
    assert decisions[-1].desired_total * H100.tokens_per_s * 0.7 >= 0.9 * BURST * TOKENS_PER_CALL


@settings(max_examples=40, deadline=None)
@given(
    lo=st.integers(0, 3),
    span=st.integers(0, 6),
    length=st.one_of(st.none(), st.floats(0, 600)),
    rates=st.lists(st.floats(0, 60), min_size=1, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_bounds_hold_with_burst_lengths(
    lo: int, span: int, length: float | None, rates: list[float], seed: int
) -> None:
    policy = _policy(min_replicas=lo, max_replicas=lo + span, burst_length_s=length)
    for d in _run(policy, rates, seed):
        assert lo <= d.desired_total <= lo + span, d


@settings(max_examples=20, deadline=None)
@given(mean=st.floats(2, 30), seed=st.integers(0, 2**16))
def test_no_flapping_under_steady_load_with_a_burst_length(mean: float, seed: int) -> None:
    rng = random.Random(seed)
    rates = [mean * rng.uniform(0.9, 1.1) for _ in range(150)]
    plain = _run(_policy(), rates, seed)
    told = _run(_policy(burst_length_s=60.0), rates, seed)
    for decisions in (plain, told):
        changes = [d.action for d in decisions if d.action is not ScaleAction.HOLD]
        reversals = sum(a is not b for a, b in itertools.pairwise(changes))
        plain_changes = [d.action for d in plain if d.action is not ScaleAction.HOLD]
        plain_rev = sum(a is not b for a, b in itertools.pairwise(plain_changes))
        assert reversals <= max(1, plain_rev)


def test_a_known_step_is_still_bought_a_cold_start_ahead() -> None:
    policy = _policy(burst_length_s=30.0, max_replicas=40)
    scaler = Autoscaler([policy])
    step_at, low, high = 600.0, STEADY * TOKENS_PER_CALL, BURST * TOKENS_PER_CALL
    forecast = ScheduleForecast(((0.0, low), (step_at, high)))
    state, fleet, now, first_up = AutoscalerState(), {"h100": 1}, 0.0, None
    while now < step_at:
        signal = PoolSignal(
            pool="m", now_s=now, window_s=TICK_S, tokens=low * TICK_S,
            requests=int(STEADY * TICK_S), serving=fleet,
        )  # fmt: skip
        (d,), state = scaler.decide([signal], state, forecasts={"m": forecast})
        if d.action is ScaleAction.UP and now > 100.0 and first_up is None:
            first_up = now
        fleet, now = dict(d.desired), now + TICK_S
    assert first_up is not None and first_up + H100.cold_start_s <= step_at
    assert sum(fleet.values()) * H100.tokens_per_s >= high


def test_burst_settings_are_validated() -> None:
    for bad in (
        {"burst_length_s": -1.0},
        {"burst_min_serve_s": -1.0},
        {"burst_off_ratio": 1.0},
        {"burst_on_ratio": 1.2, "burst_off_ratio": 1.5},
        {"burst_prior_now": 0.5},
        {"burst_prior_now": 9.0, "burst_max_factor": 8.0},
    ):
        with pytest.raises(ValueError):
            _policy(**bad)


def test_the_tail_after_a_burst_ended_buys_nothing() -> None:
    # The burst's calls fall off over a minute: the episode ends early in the fall, and
    # what the falling rate still asks for would come ready when the tail is over.
    fall = [BURST * (1 - i / 12) + STEADY * i / 12 for i in range(12)]
    rates = [STEADY] * 36 + [BURST] * 12 + fall + [STEADY] * 24
    decisions = _run(_policy(burst_length_s=60.0), rates)
    assert _ups(decisions, 36, len(rates)) == 0


def test_a_prior_over_the_demand_now_keeps_one_spare_replica_at_most() -> None:
    rates = [STEADY] * 60
    plain = _run(_policy(), rates)
    spare = _run(_policy(burst_prior_now=5.0, burst_max_factor=8.0), rates)
    big = _run(_policy(burst_prior_now=8.0, burst_max_factor=8.0), rates)
    assert spare[-1].desired_total == plain[-1].desired_total + 1
    assert big[-1].desired_total == plain[-1].desired_total + 1  # capped: one over need
    low = _run(
        _policy(burst_prior_now=5.0, burst_max_factor=8.0), [1.0] * 60
    )  # 5x of 1 call/s fits one replica
    assert low[-1].desired_total == 1


def test_a_rise_ratio_reads_the_lowest_window_of_the_last_cold_start() -> None:
    rates = [(10.0, 2000.0), (15.0, 3000.0), (20.0, 4000.0)]
    ratio = rise_ratio(
        requests=100, tokens=1e5, window_s=5.0, now_s=25.0, rates=rates, within_s=12.0, z=0.0
    )
    assert ratio == pytest.approx(20_000.0 / 3000.0)  # 10.0 s is past the cold start
    assert rise_ratio(requests=100, tokens=1e5, window_s=5.0, now_s=25.0, rates=[],
                      within_s=45.0, z=0.0) == 0.0  # fmt: skip


def test_a_rise_spread_over_windows_begins_a_burst_and_buys_nothing_late() -> None:
    # A 5x rise over six windows (30 s), none of them a surge over the fast forecast (its
    # trend follows), then a minute on: within one cold start (45 s) the rate has doubled,
    # a burst; a replica bought during it would serve less than its cold start of it.
    low, high = 4.0, 20.0
    rise = [low * (high / low) ** (i / 6) for i in range(1, 7)]
    rates = [low] * 36 + rise + [high] * 10 + [low] * 24
    loop = ClosedLoop(Autoscaler([_policy(burst_length_s=60.0)]), 3, H100)
    on = []
    for rate in rates:
        loop.step(rate, exact=True)
        on.append(loop.state.pools["m"].episode.on)
    assert not any(on[:36]) and any(on[36:42])
    bare = ClosedLoop(Autoscaler([_policy()]), 3, H100).run(rates, exact=True)
    assert _ups(bare, 36, 52) >= 1  # without the length prior the loop chases it


def test_a_day_ramp_begins_no_burst() -> None:
    # 2 to 8 calls/s over ten minutes: never doubles within a cold start.
    rates = [2.0 + 6.0 * i / 120 for i in range(121)]
    loop = ClosedLoop(Autoscaler([_policy(burst_length_s=60.0)]), 3, H100)
    for rate in rates:
        loop.step(rate)
        assert not loop.state.pools["m"].episode.on


def test_nothing_is_released_while_a_burst_is_on() -> None:
    # Two replicas, a demand one carries (5,000 tok/s at 0.7 of 10,000 each): the loop lets
    # the second go, unless a burst episode is on (begun at 90 s from 1,000 tok/s; 5,000 is
    # still over its off ratio): a burst can rise again within itself (the emulated day's
    # seed 3 let its spare go 25 s before the real burst came on its ramp).
    policy = _policy()
    signal = PoolSignal(
        pool="m", now_s=100.0, window_s=TICK_S, tokens=5_000.0 * TICK_S, requests=25,
        serving={"h100": 2},
    )  # fmt: skip
    on = BurstEpisode(start_s=90.0, base_tokens_per_s=1_000.0, windows=2)
    decisions = {}
    for name, episode in (("off", BurstEpisode()), ("on", on)):
        state = AutoscalerState({"m": PoolMemory(episode=episode)})
        (decision,), after = Autoscaler([policy]).decide([signal], state)
        assert after.pools["m"].episode.on is episode.on
        decisions[name] = decision
    assert decisions["off"].action is ScaleAction.DOWN and decisions["off"].desired_total == 1
    assert decisions["on"].action is ScaleAction.HOLD and decisions["on"].desired_total == 2
    assert "burst on" in decisions["on"].reason


def _rise_memory(rates: tuple[tuple[float, float], ...], slow_level: float) -> PoolMemory:
    return PoolMemory(
        forecast=HoltForecast(level=rates[-1][1], at_s=rates[-1][0]), rates=rates,
        reserve=BurstReserve(since_s=0.0, quiet=((0.0, 3_000.0),), level_tokens_per_s=slow_level,
                             at_s=rates[-1][0]),
        slow=HoltForecast(level=slow_level, at_s=rates[-1][0], alpha=0.08, beta=0.02),
    )  # fmt: skip


def test_a_burst_under_way_is_not_the_demand_the_prior_on_now_rises_from() -> None:
    # Two replicas of 10,000 tok/s, a quiet level of 3,000 and a prior of 5x on the demand
    # now (up to one replica over need). At a steady 13,000 tok/s the prior asks for a burst
    # of 4 x 3,000 on top: a third replica. The same 13,000 reached from a 4,000 dip within a
    # cold start, over a slow baseline of 6,000 (2.2x: a rise, not yet an episode), is a
    # burst's first windows: the prior scales the 6,000 it rose from and buys nothing (the
    # emulated day's seed 1 bought a third replica this way, 5 s before its episode began).
    policy = _policy(burst_prior_now=5.0, burst_max_factor=8.0, target_utilisation=1.0)
    signal = PoolSignal(
        pool="m", now_s=100.0, window_s=TICK_S, tokens=65 * TOKENS_PER_CALL, requests=65,
        serving={"h100": 2},
    )  # fmt: skip
    steady = tuple((float(t), 13_000.0) for t in range(50, 100, 5))
    rise = (*((float(t), 6_000.0) for t in range(50, 85, 5)),
            (85.0, 4_000.0), (90.0, 8_500.0), (95.0, 11_000.0))  # fmt: skip
    decided = {}
    for name, memory in (("steady", _rise_memory(steady, 13_000.0)),
                         ("rise", _rise_memory(rise, 6_000.0))):  # fmt: skip
        (decided[name],), after = Autoscaler([policy]).decide(
            [signal], AutoscalerState({"m": memory})
        )
        assert not after.pools["m"].episode.on
    assert decided["steady"].action is ScaleAction.UP and decided["steady"].desired_total == 3
    assert "burst reserve" in decided["steady"].reason
    assert decided["rise"].action is ScaleAction.HOLD and decided["rise"].desired_total == 2


def test_the_rise_test_reads_the_windows_of_a_whole_cold_start() -> None:
    # 4 calls/s, then 25% more each window for five windows (3x in 25 s), then flat: no
    # four windows double at the count's lower bound, the cold start's (45 s) do. The loop
    # keeps those windows (10 at the 5 s tick, the one now and one a cold start ago included),
    # and the rise begins a burst on its fifth window; with four windows kept it begins none.
    rates = [4.0] * 36 + [4.0 * 1.25 ** (i + 1) for i in range(5)] + [4.0 * 1.25**5] * 6
    loop = ClosedLoop(Autoscaler([_policy()]), 3, H100)
    on = []
    for rate in rates:
        loop.step(rate, exact=True)
        on.append(loop.state.pools["m"].episode.on)
        kept = loop.state.pools["m"].rates
        assert loop.now - kept[0][0] <= H100.cold_start_s and len(kept) == min(len(on), 10)
    assert not any(on[:36]) and on.index(True) == 36 + 4
