"""Learned utilisation: the loop plans hotter while the SLO holds at load, and a miss resets it
and lowers the ceiling, so a closed loop whose SLO breaks above some load settles, not flaps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.autoscale_learn import Learned, learn_utilisation
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    GpuOption,
    PoolPolicy,
    PoolSignal,
    ScaleAction,
)

H100 = GpuOption("h100", price_per_hour_usd=4.0, tokens_per_s=1000.0, cold_start_s=60.0)


def _learn(
    learned: Learned, slo: float | None, load: float = 0.6, backlog: float = 0.0, most: float = 0.9
) -> Learned:
    return learn_utilisation(
        learned, target=0.7, most=most, step=0.05, slo_target=0.95, slo_attainment=slo,
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


def test_a_good_window_raises_it_to_the_load_it_carried_even_past_the_model() -> None:
    """The pool served 1.8x its modelled throughput within the SLO: plan for that at once
    (cached prompts make the model underprice the work), never past the ceiling."""
    learned = _learn(Learned(), 1.0, load=1.8, most=2.0)
    assert learned.utilisation == pytest.approx(1.8)
    assert _learn(learned, 1.0, load=2.6, most=2.0).utilisation == pytest.approx(2.0)
    assert _learn(learned, 1.0, load=1.2, most=2.0).utilisation == pytest.approx(1.85)


def test_a_miss_at_load_lowers_the_ceiling_under_the_load_it_missed_at() -> None:
    after = _learn(Learned(1.8, 2.0), 0.5, load=1.3, most=2.0)
    assert after.utilisation == 0.7 and after.ceiling == pytest.approx(1.25)
    idle_miss = _learn(Learned(1.8, 2.0), 0.5, load=0.2, most=2.0)  # not about load
    assert idle_miss.ceiling == pytest.approx(1.75)


def test_idle_backlogged_or_unmeasured_windows_do_not_raise_it() -> None:
    start = Learned(0.8, 0.9)
    assert _learn(start, 1.0, load=0.2).utilisation == 0.8
    assert _learn(start, 1.0, backlog=100.0).utilisation == 0.8
    assert _learn(start, None).utilisation == 0.8
    assert _learn(start, 0.96).utilisation == 0.8  # within SLO, but not clearly


def test_a_miss_resets_to_the_target_and_lowers_the_ceiling() -> None:
    after = _learn(Learned(0.85, 0.9), 0.5, load=0.9)
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
