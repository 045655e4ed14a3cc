"""What the loop learned outlives a restart: it comes out of a state as plain values (evidence
only, never a configured default), goes back into a fresh one within the policy as it is now,
and a resumed loop plans (reserve included) at what was learned instead of starting over."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferplane.core.autoscale_knowledge import PoolKnowledge, as_json, knowledge, parse, resume
from inferplane.core.autoscale_learn import Learned
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    GpuOption,
    PoolPolicy,
    PoolSignal,
)

H100 = GpuOption("h100", price_per_hour_usd=4.0, tokens_per_s=1000.0, cold_start_s=60.0)
POLICY = PoolPolicy(pool="m", options=(H100,), max_replicas=4, tick_s=15.0, burst_prior=8.0)
POLICIES = {"m": POLICY}


def _window(
    now_s: float, tokens_per_s: float, replicas: int = 1, slo: float | None = 1.0
) -> PoolSignal:
    return PoolSignal(
        pool="m", now_s=now_s, window_s=15.0, tokens=15.0 * tokens_per_s,
        requests=max(1, round(15.0 * tokens_per_s / 1000)), slo_attainment=slo,
        serving={"h100": replicas},
    )  # fmt: skip


def test_learned_values_round_trip_through_plain_json() -> None:
    learned = {"m": PoolKnowledge(1.6, 1.9, 75.0, 1000.0), "n": PoolKnowledge(0.0, 0.0, None)}
    assert parse(as_json(learned)) == learned


@pytest.mark.parametrize(
    "row",
    [3, {"utilisation": "hot"}, {"utilisation": -1.0}, {"ceiling": float("nan")},
     {"utilisation": True}, {"burst_length_s": False}, {"speed": 1.0}],
)  # fmt: skip
def test_malformed_stored_values_are_refused_with_the_pool_named(row: object) -> None:
    with pytest.raises(ValueError, match="pool 'm'"):
        parse({"m": row})
    with pytest.raises(ValueError, match="object of pools"):
        parse([row])


def test_a_loaded_window_is_learned_and_only_evidence_comes_out() -> None:
    scaler = Autoscaler([POLICY])
    _, idle = scaler.decide([_window(15.0, 100.0)], AutoscalerState())
    assert knowledge(idle, POLICIES)["m"] == PoolKnowledge(0.0, 0.0, None, 1000.0)
    # 1.5x the model carried within the SLO on 2 replicas; the ceiling is still the policy's
    _, state = scaler.decide([_window(15.0, 3000.0, replicas=2)], AutoscalerState())
    assert state.pools["m"].learned == Learned(1.5, 2.0)
    assert knowledge(state, POLICIES)["m"] == PoolKnowledge(1.5, 0.0, None, 1000.0)
    assert knowledge(state, {}) == {}  # a pool no policy names is not kept


def test_a_changed_policy_is_obeyed_on_resume() -> None:
    stored = {"m": PoolKnowledge(1.8, 0.0, 90.0, 1000.0), "gone": PoolKnowledge(1.5)}
    lowered = replace(POLICY, max_utilisation=1.2)
    state = resume(AutoscalerState(), stored, {"m": lowered})
    assert set(state.pools) == {"m"} and state.pools["m"].learned == Learned(1.2, 1.2)
    assert state.pools["m"].episode.length_s == 90.0
    off = replace(POLICY, max_utilisation=None)
    assert resume(AutoscalerState(), stored, {"m": off}).pools["m"].learned == Learned()
    # A run that learned nothing (or with learning off) stores nothing that holds it back:
    # a lowered target and a raised ceiling both apply.
    nothing = {"m": PoolKnowledge(0.0, 0.0, None, 1000.0)}
    raised = replace(POLICY, target_utilisation=0.5, max_utilisation=3.0)
    assert resume(AutoscalerState(), nothing, {"m": raised}).pools["m"].learned == Learned(0, 3)
    # A ceiling lowered by a miss is evidence, and stays (over the target).
    missed = {"m": PoolKnowledge(0.0, 1.1, None, 1000.0)}
    assert resume(AutoscalerState(), missed, POLICIES).pools["m"].learned == Learned(0, 1.1)


def test_fractions_of_another_model_are_rescaled_and_short_bursts_dropped() -> None:
    """Learned against 800 tok/s per replica, 1.5 of it is 1.2 of a model now at 1000 tok/s:
    what a replica carried is the evidence. A burst shorter than a tick was not learned."""
    stored = {"m": PoolKnowledge(1.5, 1.875, 5.0, 800.0)}
    state = resume(AutoscalerState(), stored, POLICIES)
    assert state.pools["m"].learned == Learned(pytest.approx(1.2), pytest.approx(1.5))
    assert state.pools["m"].episode.length_s is None


def test_a_resumed_loop_plans_at_what_it_learned_and_keeps_its_burst_reserve() -> None:
    """A loop that learned its replicas carry 2x the model within the SLO sizes a loaded pool
    at that (a new loop, at the 0.7 target, buys a second replica for 900 tok/s); the burst
    reserve stays priced at the model (the margin for a burst larger than any window seen),
    so at a quiet demand with an 8x burst prior both keep the spare."""
    plain = replace(POLICY, burst_prior=1.0)
    for policy, rate, loaded in ((plain, 900.0, True), (POLICY, 150.0, False)):
        scaler = Autoscaler([policy])
        resumed = resume(AutoscalerState(), {"m": PoolKnowledge(2.0)}, scaler.policies)
        fresh = AutoscalerState()
        for i in range(6):
            # no SLO evidence in these windows: the new loop does not learn here
            window = [_window(15.0 * (i + 1), rate, slo=None)]
            (new, *_), fresh = scaler.decide(window, fresh)
            (old, *_), resumed = scaler.decide(window, resumed)
        if loaded:
            assert new.desired_total == 2 and old.desired_total == 1
            assert "at 0.70" in new.reason and "at 2.00" in old.reason
        else:
            assert new.desired_total == old.desired_total == 2
            assert "burst reserve" in new.reason and "burst reserve" in old.reason
        assert knowledge(resumed, {"m": policy})["m"].utilisation == pytest.approx(2.0)


def test_windows_without_evidence_keep_what_was_learned() -> None:
    """A window with no SLO evidence, and one whose single call carried no tokens (no tokens
    per call, as a max_tokens 0 call served from cache; it used to divide by zero)."""
    state = resume(AutoscalerState(), {"m": PoolKnowledge(1.4, 1.9, 60.0)}, POLICIES)
    scaler = Autoscaler([POLICY])
    assert _window(15.0, 0.0).requests == 1
    _, state = scaler.decide([_window(15.0, 0.0)], state)
    _, state = scaler.decide([_window(30.0, 3000.0, slo=None)], state)
    assert state.pools["m"].learned == Learned(1.4, 1.9)
    assert state.pools["m"].episode.length_s == 60.0
