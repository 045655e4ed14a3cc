"""Adaptive throttling (SRE formula over a sliding window) and the hedging decision."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.throttle import (
    AdaptiveThrottle,
    HedgeConfig,
    SlidingCounter,
    ThrottleConfig,
    hedge_after_s,
    hedge_ttft_s,
    should_hedge,
)
from inferplane.core.types import PriorityClass


def _fill(t: AdaptiveThrottle, now: float, requests: int, accepts: int) -> None:
    rng = random.Random(0)
    for i in range(requests):
        t.admit(now, rng)
        if i < accepts:
            t.record_accept(now)


@pytest.mark.parametrize(
    ("requests", "accepts", "expected"),
    [
        (0, 0, 0.0),
        (100, 100, 0.0),
        (100, 50, 0.0),  # K = 2: half accepted is still fine
        (100, 40, (100 - 80) / 101),
        (100, 0, 100 / 101),
        (10, 1, (10 - 2) / 11),
    ],
)
def test_probability_follows_the_sre_formula(requests: int, accepts: int, expected: float) -> None:
    t = AdaptiveThrottle(ThrottleConfig(k=2.0, window_s=120.0))
    _fill(t, 10.0, requests, accepts)
    assert t.totals(10.0) == (requests, accepts)
    assert t.probability(10.0) == pytest.approx(expected)


def test_history_leaves_the_window() -> None:
    t = AdaptiveThrottle(ThrottleConfig(window_s=120.0))
    _fill(t, 0.0, 100, 0)
    assert t.probability(60.0) > 0.9
    assert t.probability(130.0) == 0.0  # all of it is older than the window
    assert t.totals(130.0) == (0, 0)


def test_rejections_are_seeded_and_carry_retry_after() -> None:
    def run(seed: int) -> list[bool]:
        t = AdaptiveThrottle(ThrottleConfig(min_retry_after_s=1.0, max_retry_after_s=10.0))
        _fill(t, 0.0, 200, 20)
        rng = random.Random(seed)
        decisions = [t.admit(1.0, rng) for _ in range(200)]
        for d in decisions:
            assert (d.retry_after_s is not None) is d.reject
            if d.reject:
                assert 1.0 <= d.retry_after_s <= 10.0
        return [d.reject for d in decisions]

    first = run(7)
    assert first == run(7)
    share = sum(first) / len(first)
    assert 0.6 < share < 0.95  # p starts near (200-40)/201 and grows as rejections count


def test_healthy_backends_are_never_throttled() -> None:
    t = AdaptiveThrottle()
    rng = random.Random(1)
    for i in range(500):
        assert not t.admit(i * 0.1, rng).reject
        t.record_accept(i * 0.1)


def test_recovery_lowers_the_probability() -> None:
    t = AdaptiveThrottle(ThrottleConfig(window_s=120.0))
    _fill(t, 0.0, 100, 0)
    before = t.probability(1.0)
    _fill(t, 1.0, 100, 100)
    assert t.probability(1.0) < before
    assert t.probability(1.0) == pytest.approx(max(0.0, (200 - 2 * 100) / 201))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.booleans()), max_size=200))
def test_probability_is_a_probability(events: list[tuple[float, bool]]) -> None:
    t = AdaptiveThrottle(ThrottleConfig(window_s=60.0))
    rng = random.Random(3)
    for now, accepted in sorted(events):
        t.admit(now, rng)
        if accepted:
            t.record_accept(now)
        assert 0.0 <= t.probability(now) < 1.0


def test_sliding_counter_buckets_expire() -> None:
    c = SlidingCounter(window_s=10.0, num_fields=2, num_buckets=10)
    c.add(0.5, 0)
    c.add(5.5, 1, 3.0)
    assert c.totals(9.0) == (1.0, 3.0)
    assert c.totals(11.0) == (0.0, 3.0)
    assert c.totals(16.0) == (0.0, 0.0)
    with pytest.raises(ValueError):
        SlidingCounter(0.0, 1)


HEDGE = HedgeConfig(min_delay_s=0.05, default_delay_s=1.0, p95_over_mean=1.5)


@pytest.mark.parametrize(
    ("priority", "predicted", "now", "first", "sent", "hedge"),
    [
        (PriorityClass.CRITICAL, 0.2, 0.31, False, 0, True),  # past 1.5 x 0.2
        (PriorityClass.CRITICAL, 0.2, 0.29, False, 0, False),  # not yet
        (PriorityClass.CRITICAL, 0.2, 5.0, True, 0, False),  # token arrived
        (PriorityClass.CRITICAL, 0.2, 5.0, False, 1, False),  # already hedged once
        (PriorityClass.STANDARD, 0.2, 5.0, False, 0, False),  # class not hedged
        (PriorityClass.CRITICAL, None, 0.9, False, 0, False),  # no prediction: default 1 s
        (PriorityClass.CRITICAL, None, 1.0, False, 0, True),
        (PriorityClass.CRITICAL, 0.001, 0.04, False, 0, False),  # the floor
        (PriorityClass.CRITICAL, 0.001, 0.05, False, 0, True),
    ],
)
def test_hedge_decision(
    priority: PriorityClass,
    predicted: float | None,
    now: float,
    first: bool,
    sent: int,
    hedge: bool,
) -> None:
    d = should_hedge(
        priority, 0.0, now, predicted, first_token_seen=first, hedges_sent=sent, config=HEDGE
    )
    assert d.hedge is hedge, d.reason


def test_hedge_after() -> None:
    assert hedge_after_s(PriorityClass.SHEDDABLE, 0.1, HEDGE) is None
    assert hedge_after_s(PriorityClass.CRITICAL, 0.4, HEDGE) == pytest.approx(0.6)
    assert hedge_after_s(PriorityClass.CRITICAL, float("inf"), HEDGE) == 1.0
    assert hedge_after_s(PriorityClass.CRITICAL, 0.4, HedgeConfig(max_hedges=0)) is None


def test_hedge_ttft_scales_the_raw_prediction_by_the_pools_median_factor() -> None:
    # One degraded engine (factor 5) does not move the median of a healthy pool...
    assert hedge_ttft_s(0.2, [1.0, 1.1, 0.9, 5.0, 1.0]) == pytest.approx(0.2)
    # ...a pool slower than its profile everywhere does.
    assert hedge_ttft_s(0.2, [2.0, 2.2, 1.8]) == pytest.approx(0.4)
    assert hedge_ttft_s(0.2, []) == pytest.approx(0.2)
    assert hedge_ttft_s(None, [2.0]) is None
