"""Burst reserve tests: spare warm capacity from a prior or from the bursts seen, within the
bounds, without flapping on a steady load, and shrinking again when bursts stop.

Signals carry Poisson call counts (seeded), so the noise is the one real arrivals have; the
closed loop starts what is asked for a cold start later and drains at once.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscale_reserve import BurstReserve, burst_ratio, slow_baseline
from inferplane.core.autoscaler import Autoscaler, PoolPolicy, ScaleAction, ScaleDecision
from inferplane.core.forecast import HoltForecast

from .autoscale_loop import TICK_S, TOKENS_PER_CALL, ClosedLoop, h100, poisson, pool_policy

H100 = h100(cold_start_s=45.0)


def _policy(**kw: object) -> PoolPolicy:
    base: dict[str, object] = {
        "scale_down_window_s": 30.0, "scale_down_cooldown_s": 30.0, "burst_memory_s": 120.0,
    }  # fmt: skip
    return pool_policy(H100, **{**base, **kw})


def _loop(policy: PoolPolicy, seed: int) -> ClosedLoop:
    return ClosedLoop(Autoscaler([policy]), seed, H100)


def test_burst_ratio_reads_counts_at_their_poisson_lower_bound() -> None:
    assert burst_ratio(0, 10.0, 2.0) == 0.0
    assert burst_ratio(10, 0.0, 2.0) == 0.0
    assert burst_ratio(100, 20.0, 2.0) == pytest.approx(81.0 / 20.0)  # (10 - 1)^2 / 20
    assert burst_ratio(100, 20.0, 0.0) == pytest.approx(5.0)
    # The noise of a steady count rarely reaches 1/0.7, where the reserve starts to matter.
    rng = random.Random(5)
    for expected in (2.0, 10.0, 40.0):
        high = sum(burst_ratio(poisson(rng, expected), expected, 2.0) > 1 / 0.7
                   for _ in range(2000))  # fmt: skip
        assert high <= 10, (expected, high)


def test_the_learned_factor_holds_then_decays_towards_one() -> None:
    r = BurstReserve().observe(
        requests=100, tokens=1e5, window_s=5.0, now_s=10.0, baseline_tokens_per_s=4000.0,
        memory_s=60.0, z=0.0, max_factor=8.0,
    )  # fmt: skip
    assert r.factor_at(10.0, 60.0) == pytest.approx(5.0)
    assert r.factor_at(70.0, 60.0) == pytest.approx(3.0)  # one half-life: 1 + 4 / 2
    assert r.peak_at(70.0, 60.0) == pytest.approx(1e4)
    factors = [r.factor_at(10.0 + 30.0 * i, 60.0) for i in range(40)]
    assert all(a >= b for a, b in itertools.pairwise(factors))
    assert factors[-1] < 1.01
    # Capped by the highest rate seen: twice the demand asks for no more than that rate.
    assert r.reserve_tokens_per_s(1e4, 10.0, prior=1.0, memory_s=60.0) == pytest.approx(2e4)
    assert BurstReserve().reserve_tokens_per_s(100.0, 0.0, prior=3.0, memory_s=60.0) == 300.0


@settings(max_examples=40, deadline=None)
@given(
    lo=st.integers(0, 3),
    span=st.integers(0, 6),
    prior=st.floats(1.0, 8.0),
    rates=st.lists(st.floats(0, 80.0), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_the_reserve_stays_within_min_and_max(
    lo: int, span: int, prior: float, rates: list[float], seed: int
) -> None:
    loop = _loop(_policy(min_replicas=lo, max_replicas=lo + span, burst_prior=prior), seed)
    for d in loop.run(rates):
        assert lo <= d.desired_total <= lo + span, d


def _reversals(decisions: list[ScaleDecision]) -> int:
    moves = [d.action for d in decisions if d.action is not ScaleAction.HOLD]
    return sum(a is not b for a, b in itertools.pairwise(moves))


@settings(max_examples=15, deadline=None)
@given(calls_per_s=st.floats(3.0, 40.0), prior=st.floats(1.0, 8.0), seed=st.integers(0, 2**16))
def test_no_flapping_under_steady_load_with_a_reserve(
    calls_per_s: float, prior: float, seed: int
) -> None:
    # The surge detector off: its rare false surges (a window 3 sigmas high) are tested in
    # test_autoscaler_surge; here only the reserve's own effect on a steady load counts.
    # A stabilisation window of 5 minutes, as in test_autoscaler's steady-load test.
    kw: dict[str, object] = {"surge_z": math.inf, "early_surge_z": math.inf,
                             "scale_down_window_s": 300.0}  # fmt: skip
    decisions = _loop(_policy(burst_prior=prior, **kw), seed).run([calls_per_s] * 200)
    # The same calls without a reserve (the plain loop's forecast has its own noise).
    plain = _loop(_policy(burst_max_factor=1.0, **kw), seed).run([calls_per_s] * 200)
    # Past the first minute: no flapping. At a replica boundary (the reserve within a few
    # percent of a replica's capacity) a Poisson window may add one up-and-down over the
    # 1000 s run, as the plain loop's own forecast noise may: never a cycle. The plain loop
    # alone may reverse twice near its own boundary (4 calls/s, seed 77: up at 145 s, down
    # at 645 s, up at 825 s, with or without the reserve): the reserve adds at most one.
    plain_reversals = _reversals(plain[12:])
    assert _reversals(decisions[12:]) <= max(1, plain_reversals)
    assert _reversals(decisions[12:]) <= plain_reversals + 1
    # Without a prior, a steady load teaches no burst: no reserve beyond the plain need.
    if prior == 1.0:
        assert sum("burst reserve" in d.reason for d in decisions) <= 2


@settings(max_examples=20, deadline=None)
@given(calls_per_s=st.floats(2.0, 20.0), prior=st.floats(1.5, 5.0))
def test_a_prior_keeps_warm_capacity_for_a_burst_of_its_size(
    calls_per_s: float, prior: float
) -> None:
    uncapped = _loop(_policy(burst_prior=prior, reserve_max_replicas=40), seed=0)
    uncapped.run([calls_per_s] * 30, exact=True)
    # The step comes: the capacity already serving carries it (reserve_utilisation 1).
    observed = round(calls_per_s * TICK_S) / TICK_S * TOKENS_PER_CALL
    assert uncapped.ready_tokens_per_s >= prior * observed * 0.999
    plain = _loop(_policy(), seed=0)
    plain.run([calls_per_s] * 30, exact=True)
    # By default the prior holds at most one replica over the plain loop's size.
    capped = _loop(_policy(burst_prior=prior), seed=0)
    capped.run([calls_per_s] * 30, exact=True)
    one = H100.tokens_per_s
    assert plain.ready_tokens_per_s <= capped.ready_tokens_per_s
    assert capped.ready_tokens_per_s <= plain.ready_tokens_per_s + one
    assert capped.ready_tokens_per_s >= min(
        prior * observed * 0.999, plain.ready_tokens_per_s + one
    )


def test_the_prior_scales_the_quiet_demand_not_the_demand_now() -> None:
    # A quiet hour at 3 calls/s, then demand climbs smoothly (no window a surge or a burst)
    # to 7x: the prior of 5 keeps warm capacity for 5x the quiet demand; at the top the
    # demand's own need is larger and the reserve adds nothing (a prior on the demand now
    # would ask for 5x the top).
    quiet, top = 3.0, 21.0
    rates = [quiet] * 30 + [quiet + (top - quiet) * i / 120 for i in range(120)] + [top] * 30
    tuned = _loop(_policy(burst_prior=5.0), seed=0).run(rates, exact=True)
    plain = _loop(_policy(burst_max_factor=1.0), seed=0).run(rates, exact=True)
    assert tuned[29].desired_total * H100.tokens_per_s >= 5.0 * quiet * TOKENS_PER_CALL
    assert tuned[29].desired_total > plain[29].desired_total
    assert [d.desired_total for d in tuned[-10:]] == [d.desired_total for d in plain[-10:]]


def test_the_quiet_demand_is_the_lowest_level_over_its_window() -> None:
    def observe(r: BurstReserve, t: float, tokens_per_s: float) -> BurstReserve:
        return r.observe(
            requests=max(1, int(tokens_per_s / 1e3)), tokens=5.0 * tokens_per_s, window_s=5.0,
            now_s=t, baseline_tokens_per_s=tokens_per_s, memory_s=60.0, z=2.0,
            max_factor=8.0, quiet_window_s=240.0, level_time_constant_s=1e-9,  # level = rate
        )  # fmt: skip

    r = observe(BurstReserve(), 0.0, 5e3)
    assert r.quiet_tokens_per_s == pytest.approx(5e3)
    for t, rate in ((100.0, 2e3), (200.0, 9e3), (210.0, 4e4)):  # a burst only raises the level
        r = observe(r, t, rate)
    assert r.quiet_tokens_per_s == pytest.approx(2e3)
    r = observe(r, 360.0, 9e3)
    assert r.quiet_tokens_per_s == pytest.approx(9e3)  # 2e3 at 100 s is over 240 s old
    # The prior scales the quiet demand, capped as asked; the learned part scales the demand.
    assert r.reserve_tokens_per_s(3e4, 360.0, prior=3.0, memory_s=1e-9) == pytest.approx(2.7e4)
    capped = r.reserve_tokens_per_s(3e4, 360.0, prior=3.0, memory_s=1e-9,
                                    prior_cap_tokens_per_s=1e4)  # fmt: skip
    assert capped == pytest.approx(1e4)


def test_the_quiet_level_settles_before_it_counts() -> None:
    # A pool that starts near idle: its first windows say little about the quiet demand.
    r = BurstReserve()
    for i in range(30):  # 150 s: 0.2 calls/s for 20 s, then 4 calls/s
        rate = 200.0 if i < 4 else 4e3
        r = r.observe(
            requests=max(1, int(rate * 5 / 1e3)), tokens=5.0 * rate, window_s=5.0,
            now_s=5.0 * i, baseline_tokens_per_s=rate, memory_s=60.0, z=2.0, max_factor=8.0,
            quiet_window_s=1e5, level_time_constant_s=60.0,
        )  # fmt: skip
    assert r.quiet_tokens_per_s is not None
    assert r.quiet_tokens_per_s > 0.5 * 4e3


def test_a_burst_seen_once_leaves_a_reserve_for_the_next_then_shrinks() -> None:
    steady, burst = [8.0] * 24, [40.0] * 12  # 5x for 60 s
    loop = _loop(_policy(), seed=11)
    plain = _loop(_policy(burst_max_factor=1.0), seed=11)  # learns nothing
    for lp in (loop, plain):
        lp.run(steady + burst + [8.0] * 12)
    # A minute after the burst, the learned reserve is warm for most of another one.
    assert loop.ready_tokens_per_s >= 0.7 * 40.0 * TOKENS_PER_CALL
    assert loop.ready_tokens_per_s > plain.ready_tokens_per_s
    # When bursts stop, the reserve decays (half-life 120 s) back to the plain loop's size.
    after = loop.run([8.0] * 240)
    tail = [d.desired_total for d in after[-60:]]
    plain_tail = [d.desired_total for d in plain.run([8.0] * 240)[-60:]]
    assert max(tail) <= max(plain_tail) + 1
    assert sum(tail) / len(tail) <= sum(plain_tail) / len(plain_tail) + 0.5
    sizes = [d.desired_total for d in after]
    assert sizes[-1] < max(sizes)


def test_reserve_settings_are_validated() -> None:
    for bad in (
        {"burst_prior": 0.5},
        {"burst_prior": 9.0},
        {"burst_memory_s": -1.0},
        {"reserve_utilisation": 0.0},
        {"reserve_utilisation": 1.5},
        {"burst_z": -1.0},
        {"quiet_window_s": -1.0},
        {"reserve_max_replicas": -1},
    ):
        with pytest.raises(ValueError):
            _policy(**bad)
    assert math.isclose(_policy().reserve_utilisation, 1.0)


def test_a_burst_does_not_inflate_the_demand_the_reserve_multiplies() -> None:
    # 4 calls/s, then 5x for 60 s, then back; prior 5: the reserve covers 5x the demand a
    # burst rises from, not 5x the burst (that would ask for 25x the steady load).
    rates = [4.0] * 30 + [20.0] * 12 + [4.0] * 30
    tuned = _loop(_policy(burst_prior=5.0), seed=0).run(rates, exact=True)
    plain = _loop(_policy(burst_max_factor=1.0), seed=0).run(rates, exact=True)
    steady = 4.0 * TOKENS_PER_CALL
    for d, p in zip(tuned, plain, strict=True):
        # The slow baseline, its input clipped, stays under 2x the steady load over a 60 s
        # burst (its trend over the horizon included).
        assert d.need_tokens_per_s <= max(p.need_tokens_per_s, 5.0 * 2.0 * steady) + 1.0, d
    # Before the burst the reserve was warm for it (5x at full utilisation).
    assert tuned[29].desired_total * H100.tokens_per_s >= 5.0 * steady


def test_idle_windows_before_the_first_call_leave_the_slow_baseline_unset() -> None:
    idle = slow_baseline(
        HoltForecast(), tokens=0.0, requests=0, window_s=5.0, now_s=5.0, time_constant_s=60.0
    )
    assert idle.at_s is None
    first = slow_baseline(
        idle, tokens=10_000.0, requests=10, window_s=5.0, now_s=10.0, time_constant_s=60.0
    )
    assert math.isclose(first.level, 2000.0)  # the first calls, as they are: not clipped from 0


def test_a_loop_started_before_its_traffic_sizes_the_reserve_from_the_demand_now() -> None:
    # Two idle windows (the loop started before the load), then 3 calls/s: burst_prior_now 5
    # keeps warm capacity for 5x the demand within a minute (the reserve holds at most one
    # replica over the need), not for 5x a baseline that creeps up from 0.
    rates = [0.0] * 2 + [3.0] * 14
    tuned = _loop(_policy(burst_prior_now=5.0), seed=0).run(rates, exact=True)
    plain = _loop(_policy(burst_max_factor=1.0), seed=0).run(rates, exact=True)
    assert tuned[-1].desired_total == plain[-1].desired_total + 1
    # The burst on top of the demand is 4x the quiet demand (here the level while it rose
    # from the idle start), so the reserve asks for more than one replica: the spare.
    assert tuned[-1].need_tokens_per_s > H100.tokens_per_s


def test_the_prior_on_the_demand_now_follows_a_ramp_without_the_slow_lag() -> None:
    # A morning ramp from 1.2 to 4 calls/s over a minute: 5x the demand passes one replica
    # (10,000 tok/s) ~20 s in, and the spare is bought within the ramp. The slow baseline
    # (time constant 60 s, its input clipped) lags the ramp by about a minute: sized from it,
    # the spare came only after the ramp (on the emulated fleet, 6 s before the burst).
    rates = [0.0] + [1.2 + 2.8 * i / 12 for i in range(13)] + [4.0] * 6
    tuned = _loop(_policy(burst_prior_now=5.0), seed=0).run(rates, exact=True)
    plain = _loop(_policy(burst_max_factor=1.0), seed=0).run(rates, exact=True)
    assert tuned[9].desired_total == plain[9].desired_total + 1
    assert all(t.desired_total >= p.desired_total for t, p in zip(tuned, plain, strict=True))


def test_on_a_ramp_the_prior_on_the_demand_now_holds_one_spare_at_most() -> None:
    # From a quiet 2.5 calls/s to 30 over five minutes: the spare is one replica over what
    # the loop holds without a reserve, never more; at the top the demand's own need covers a
    # burst from the quiet demand (30,000 + 4 x 2,500 tok/s), so no spare is paid on top.
    rates = [2.5] * 24 + [2.5 + 27.5 * i / 60 for i in range(61)] + [30.0] * 24
    tuned = _loop(_policy(burst_prior_now=5.0), seed=0).run(rates, exact=True)
    plain = _loop(_policy(burst_max_factor=1.0), seed=0).run(rates, exact=True)
    assert all(t.desired_total <= p.desired_total + 1 for t, p in zip(tuned, plain, strict=True))
    assert tuned[23].desired_total == plain[23].desired_total + 1  # 5 x 2,500 > one replica
    assert tuned[-1].desired_total == plain[-1].desired_total
