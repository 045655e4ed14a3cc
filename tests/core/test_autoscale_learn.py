"""Learned utilisation: the loop plans hotter while the SLO holds at load, and a miss resets it
and lowers the ceiling, so a closed loop whose SLO breaks above some load settles, not flaps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscale_learn import MIN_KV_USE, Learned, learn_utilisation
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    GpuOption,
    PoolPolicy,
    PoolSignal,
    ScaleAction,
)

H100 = GpuOption("h100", price_per_hour_usd=4.0, tokens_per_s=1000.0, cold_start_s=60.0)


def _learn(learned: Learned, slo: float | None, load: float = 0.8, backlog: float = 0.0) -> Learned:
    return learn_utilisation(
        learned, target=0.7, most=0.9, step=0.05, slo_target=0.95, slo_attainment=slo,
        backlog_tokens=backlog, load_fraction=load, hot_fraction=0.5,
    )  # fmt: skip


def test_good_windows_at_load_raise_it_to_the_ceiling() -> None:
    learned = Learned()
    seen = []
    for _ in range(8):
        learned = _learn(learned, 1.0)
        seen.append(learned.utilisation)
    assert seen[0] == pytest.approx(0.75) and seen == sorted(seen)
    assert max(seen) == pytest.approx(0.9) and learned.ceiling == 0.9


def test_idle_backlogged_or_unmeasured_windows_do_not_raise_it() -> None:
    start = Learned(0.8, 0.9)
    assert _learn(start, 1.0, load=0.2).utilisation == 0.8
    assert _learn(start, 1.0, backlog=100.0).utilisation == 0.8
    assert _learn(start, None).utilisation == 0.8
    assert _learn(start, 0.96).utilisation == 0.8  # within SLO, but not clearly


def test_a_miss_resets_to_the_target_and_lowers_the_ceiling() -> None:
    after = _learn(Learned(0.85, 0.9), 0.5)
    assert after.utilisation == 0.7 and after.ceiling == pytest.approx(0.8)
    for _ in range(10):
        after = _learn(after, 1.0)
    assert after.utilisation == pytest.approx(0.8)
    assert _learn(Learned(0.7, 0.7), 0.1).ceiling == 0.7  # never under the target


def test_off_without_a_ceiling_above_the_target() -> None:
    for most in (None, 0.7, 0.5):
        learned = learn_utilisation(
            Learned(0.85, 0.9), target=0.7, most=most, step=0.05, slo_target=0.95,
            slo_attainment=1.0, backlog_tokens=0.0, load_fraction=0.9, hot_fraction=0.5,
        )  # fmt: skip
        assert learned.utilisation == 0.7


@settings(max_examples=25, deadline=None)
@given(mean=st.floats(1500, 6000), breaks_at=st.floats(0.72, 0.95))
def test_closed_loop_settles_when_the_slo_breaks_above_a_load(
    mean: float, breaks_at: float
) -> None:
    """The SLO holds while each replica carries at most ``breaks_at`` of its modelled
    throughput: the loop learns up to it, misses at most a few times, then stops changing."""
    policy = PoolPolicy("m", (H100,), max_replicas=40, scale_down_window_s=60.0)
    scaler = Autoscaler([policy])
    state, fleet, actions = AutoscalerState(), {"h100": 1}, []
    misses = 0
    for i in range(400):
        load = mean / (fleet.get("h100", 0) * H100.tokens_per_s)
        slo = 1.0 if load <= breaks_at else 0.5
        misses += slo < 1.0 and i > 0
        signal = PoolSignal("m", 15.0 * i, 15.0, mean * 15.0, 100, serving=fleet,
                            slo_attainment=slo)  # fmt: skip
        (d,), state = scaler.decide([signal], state)
        actions.append(d.action)
        fleet = dict(d.desired)
    assert misses <= 6
    assert all(a is ScaleAction.HOLD for a in actions[-200:])  # settled: no flapping
    final_load = mean / (fleet["h100"] * H100.tokens_per_s)
    assert final_load <= breaks_at  # it settled where the SLO holds


def _kv(learned: Learned, slo: float | None, kv: float | None, load: float = 0.8) -> Learned:
    return learn_utilisation(
        learned, target=0.7, most=0.9, step=0.05, slo_target=0.95, slo_attainment=slo,
        backlog_tokens=0.0, load_fraction=load, hot_fraction=0.5, kv_use=kv,
        kv_plan_use=0.8, kv_most=1.5,
    )  # fmt: skip


def test_kv_room_at_load_raises_it_at_once_up_to_the_cap() -> None:
    """0.8 of the modelled throughput served with the fullest KV cache at 0.5: room to
    0.8 x 0.8 / 0.5 = 1.28 of it; at KV 0.2 the extrapolation (3.2) is capped at 1.5."""
    assert _kv(Learned(), 1.0, 0.5).utilisation == pytest.approx(1.28)
    assert _kv(Learned(), 1.0, 0.2).utilisation == pytest.approx(1.5)
    # a full cache shows no room: the step as before
    assert _kv(Learned(), 1.0, 0.9).utilisation == pytest.approx(0.75)
    # without a report, under MIN_KV_USE, cold, or not clearly within SLO: no jump
    assert _kv(Learned(), 1.0, None).utilisation == pytest.approx(0.75)
    assert _kv(Learned(), 1.0, MIN_KV_USE / 2).utilisation == pytest.approx(0.75)
    assert _kv(Learned(), 1.0, 0.2, load=0.3).utilisation == pytest.approx(0.7)
    assert _kv(Learned(), 0.96, 0.2).utilisation == pytest.approx(0.7)
    # the step alone stops at max_utilisation; a KV jump's gain is kept by later windows
    learned = Learned()
    for _ in range(10):
        learned = _kv(learned, 1.0, 0.9)
    assert learned.utilisation == pytest.approx(0.9)
    assert _kv(_kv(Learned(), 1.0, 0.2), 1.0, 0.9).utilisation == pytest.approx(1.5)


def test_a_miss_after_a_kv_jump_puts_the_ceiling_under_the_load_that_missed() -> None:
    jumped = _kv(Learned(), 1.0, 0.2)
    missed = _kv(jumped, 0.5, 0.95, load=1.2)
    assert missed.utilisation == 0.7 and missed.ceiling == pytest.approx(1.15)
    assert _kv(missed, 1.0, 0.2).utilisation == pytest.approx(1.15)  # not probed again
    # a miss in a cold window says nothing of the load: one step down, as before
    assert _kv(jumped, 0.5, 0.1, load=0.3).ceiling == pytest.approx(1.45)


@settings(max_examples=25, deadline=None)
@given(true_capacity=st.floats(0.8, 1.4), kv_reads=st.floats(0.3, 1.0))
def test_closed_loop_with_kv_evidence_misses_a_few_times_then_settles(
    true_capacity: float, kv_reads: float
) -> None:
    """Each replica keeps the SLO up to ``true_capacity`` of its modelled throughput; its KV
    reads ``kv_reads`` x load / true capacity (under 1: the extrapolation reads high). The
    loop misses at most a few times, then stops changing, and never plans over the cap."""
    policy = PoolPolicy("m", (H100,), max_replicas=40, scale_down_window_s=60.0)
    scaler = Autoscaler([policy])
    state, fleet, misses, changes = AutoscalerState(), {"h100": 1}, 0, []
    for i in range(400):
        load = 3000.0 / (fleet.get("h100", 0) * H100.tokens_per_s)
        slo = 1.0 if load <= true_capacity else 0.5
        misses += slo < 1.0 and i > 0
        kv = min(1.0, kv_reads * load / true_capacity)
        signal = PoolSignal("m", 15.0 * i, 15.0, 3000.0 * 15.0, 100, serving=fleet,
                            slo_attainment=slo, kv_use=kv)  # fmt: skip
        (decision,), state = scaler.decide([signal], state)
        if decision.action is not ScaleAction.HOLD:
            changes.append(i)
        fleet = decision.desired
        assert state.pools["m"].learned.utilisation <= 1.5 + 1e-9
    assert misses <= 4
    assert not [i for i in changes if i > 200]
