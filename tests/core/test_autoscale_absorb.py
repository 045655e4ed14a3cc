"""The burst reserve sized by the SLO (core/autoscale_absorb.py): the least capacity whose
queue keeps its wait within the SLO's room until a replica bought for the burst serves, at
what the fleet has carried within its SLO over the model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscale_absorb import Carried, queue_horizon_s, slo_capacity, slo_reserve
from inferplane.core.autoscaler import Autoscaler, AutoscalerState, PoolPolicy, PoolSignal

from .autoscale_loop import TOKENS_PER_CALL, ClosedLoop, h100, pool_policy

H100 = h100(cold_start_s=45.0)  # 10,000 tok/s a replica


def _worst_wait_s(capacity: float, burst: float, backlog: float, within_s: float) -> float:
    """The longest queue wait of a fluid queue served at ``capacity`` under ``burst`` for
    ``within_s`` on ``backlog``, stepped (not the closed form the module uses)."""
    queue, worst = backlog, backlog / capacity
    steps = 2000
    for _ in range(steps):
        queue = max(0.0, queue + (burst - capacity) * within_s / steps)
        worst = max(worst, queue / capacity)
    return worst


@settings(max_examples=200, deadline=None)
@given(
    burst=st.floats(100.0, 1e5),
    wait_s=st.floats(0.1, 30.0),
    within_s=st.floats(1.0, 300.0),
    backlog_share=st.floats(0.0, 1.0),
)
def test_the_capacity_found_keeps_the_wait_within_the_slo_and_no_less_does(
    burst: float, wait_s: float, within_s: float, backlog_share: float
) -> None:
    backlog = backlog_share * burst * wait_s  # a backlog the SLO still has room for
    c = slo_capacity(burst, wait_s=wait_s, within_s=within_s, backlog_tokens=backlog)
    assert 0 < c <= burst
    assert _worst_wait_s(c, burst, backlog, within_s) <= wait_s * (1 + 1e-6)
    if c < burst * (1 - 1e-6):  # 1% less capacity lets some call wait past the SLO
        assert _worst_wait_s(0.99 * c, burst, backlog, within_s) > wait_s


def test_no_room_or_a_backlog_over_the_room_reserves_the_whole_burst() -> None:
    assert slo_capacity(8000.0, wait_s=0.0, within_s=50.0) == 8000.0
    assert slo_capacity(8000.0, wait_s=3.0, within_s=0.0) == 8000.0
    assert slo_capacity(8000.0, wait_s=3.0, within_s=50.0, backlog_tokens=30_000.0) == 8000.0
    assert slo_capacity(0.0, wait_s=3.0, within_s=50.0) == 0.0
    # The emulated fleet's quiet prior, 8 x 973 tok/s, 1.2% over one engine's 7,697 tok/s:
    # a 3 s TTFT budget over a 51 s cold start and tick carries it on the one engine.
    assert slo_capacity(8 * 973.0, wait_s=3.0, within_s=51.0) < 7697.0
    # A short burst queues only while it lasts: more room per second of it.
    assert slo_capacity(8000.0, wait_s=3.0, within_s=10.0) == pytest.approx(8000 * 10 / 13)


def test_the_queue_builds_for_a_cold_start_and_tick_or_the_whole_of_a_burst_not_bought_for() -> (
    None
):
    kw = {"cold_start_s": 46.0, "tick_s": 5.0, "min_serve_s": 46.0}
    assert queue_horizon_s(burst_length_s=None, **kw) == 51.0  # unknown: the loop buys
    assert queue_horizon_s(burst_length_s=120.0, **kw) == 51.0  # long enough to buy for
    assert queue_horizon_s(burst_length_s=60.0, **kw) == 60.0  # over before one would serve
    assert queue_horizon_s(burst_length_s=5.0, **kw) == 5.0


def _carried(c: Carried, **kw: object) -> Carried:
    base: dict[str, object] = {
        "requests": 400, "tokens": 400 * TOKENS_PER_CALL, "window_s": 5.0, "now_s": 100.0,
        "modelled_tokens_per_s": 20_000.0, "backlog_tokens": 0.0, "slo_attainment": 1.0,
        "slo_target": 0.95, "wait_s": 3.0, "z": 2.0, "span_s": 30.0, "memory_s": 600.0,
    }  # fmt: skip
    return c.observe(**{**base, **kw})  # type: ignore[arg-type]


def test_carried_counts_only_windows_within_the_slo_and_their_backlog_within_the_wait() -> None:
    shown = _carried(Carried())  # 80,000 tok/s on 20,000 modelled, calls at their lower bound
    low = (math.sqrt(400) - 1.0) ** 2 * TOKENS_PER_CALL / 5.0
    assert shown.ratio_at(100.0, 600.0) == pytest.approx(low / 20_000.0)
    assert shown.ratio_at(100.0, 600.0) > 3.5
    for miss in ({"slo_attainment": 0.9}, {"slo_attainment": None},
                 {"backlog_tokens": 4.0 * low}, {"requests": 0, "tokens": 0.0}):  # fmt: skip
        assert _carried(Carried(), **miss).ratio_at(100.0, 600.0) == 1.0, miss
    # A lower window keeps the higher ratio; it is forgotten after the window, never below 1.
    later = _carried(shown, now_s=200.0, requests=100, tokens=100 * TOKENS_PER_CALL)
    assert later.ratio_at(200.0, 600.0) == shown.ratio_at(100.0, 600.0)
    assert later.ratio_at(701.0, 600.0) == 1.0
    under = _carried(Carried(), requests=40, tokens=40 * TOKENS_PER_CALL)  # 0.4x the model
    assert under.ratio_at(100.0, 600.0) == 1.0


def _over_span(c: Carried, n: int, **kw: object) -> Carried:
    """``n`` windows of 25 calls (5,000 tok/s each) on 4,000 tok/s modelled, 5 s apart."""
    for i in range(n):
        c = _carried(c, requests=25, tokens=25 * TOKENS_PER_CALL, now_s=5.0 * (i + 1),
                     modelled_tokens_per_s=4000.0, **kw)  # fmt: skip
    return c


def test_a_span_of_windows_shows_what_one_windows_few_calls_cannot() -> None:
    # 25 calls a window read at their lower bound are 16: 3,200 tok/s, under the model's 4,000.
    assert _over_span(Carried(), 1).ratio_at(5.0, 600.0) == 1.0
    # Six windows, 150 calls: (sqrt(150) - 1)^2 / 150 = 0.84 of 1.25x the model.
    six = _over_span(Carried(), 6).ratio_at(30.0, 600.0)
    assert six == pytest.approx((math.sqrt(150) - 1) ** 2 / 150 * 1.25)
    assert six > 1.0
    # The span is the last span_s only; a window out of the SLO ends the run.
    assert _over_span(Carried(), 6, span_s=5.0).ratio_at(30.0, 600.0) == 1.0
    broken = _carried(_over_span(Carried(), 5), now_s=27.0, slo_attainment=0.5, requests=25,
                      tokens=25 * TOKENS_PER_CALL, modelled_tokens_per_s=4000.0)  # fmt: skip
    assert broken.run == () and broken.ratio_at(27.0, 600.0) == pytest.approx(
        _over_span(Carried(), 5).ratio_at(25.0, 600.0)
    )


def test_the_reserve_is_the_burst_without_a_wait_and_scales_with_what_was_carried() -> None:
    off = pool_policy(H100)
    on = pool_policy(H100, burst_slo_wait_s=3.0)
    kw = {"backlog_tokens": 0.0, "burst_length_s": None}
    assert slo_reserve(off, 12_000.0, carried_ratio=3.0, **kw) == 12_000.0  # type: ignore[arg-type]
    one = slo_reserve(on, 12_000.0, carried_ratio=1.0, **kw)  # type: ignore[arg-type]
    assert one == pytest.approx(12_000.0 * 50 / 53)  # 45 s cold start + 5 s tick
    assert slo_reserve(on, 12_000.0, carried_ratio=2.0, **kw) == pytest.approx(one / 2)  # type: ignore[arg-type]
    assert slo_reserve(on, 12_000.0, carried_ratio=0.5, **kw) == pytest.approx(one)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="burst_slo_wait_s"):
        pool_policy(H100, burst_slo_wait_s=-1.0)


def _steady(policy: PoolPolicy) -> int:
    """The most replicas the loop holds under a steady 1.2 calls/s (1,200 tok/s)."""
    loop = ClosedLoop(Autoscaler([policy]), 3, H100)
    return max(d.desired_total for d in loop.run([1.2] * 80, exact=True))


def test_a_prior_a_few_percent_over_one_replica_buys_no_spare_the_slo_absorbs() -> None:
    # burst_prior 8.5 x the quiet 1,200 tok/s = 10,200: 2% over one replica's 10,000 tok/s.
    base = {"burst_prior": 8.5, "burst_max_factor": 10.0,
            "scale_down_window_s": 30.0, "scale_down_cooldown_s": 30.0}  # fmt: skip
    assert _steady(pool_policy(H100, **base)) == 2
    assert _steady(pool_policy(H100, burst_slo_wait_s=3.0, **base)) == 1
    # 3 s of room over a 50 s cold start and tick does not stretch to a prior 8% over.
    more = {**base, "burst_prior": 9.0}
    assert _steady(pool_policy(H100, burst_slo_wait_s=3.0, **more)) == 2


def test_the_loop_learns_what_its_replicas_carried_only_with_a_burst_wait() -> None:
    signal = PoolSignal(
        pool="m", now_s=5.0, window_s=5.0, tokens=300 * TOKENS_PER_CALL, requests=300,
        slo_attainment=1.0, serving={"h100": 2},
    )  # fmt: skip
    for wait_s, carried in ((None, False), (3.0, True)):
        scaler = Autoscaler([pool_policy(H100, burst_slo_wait_s=wait_s)])
        _, state = scaler.decide([signal], AutoscalerState())
        ratio = state.pools["m"].carried.ratio_at(5.0, math.inf)
        assert (ratio > 2.5) is carried, (wait_s, ratio)  # 60,000 tok/s on 20,000 modelled
