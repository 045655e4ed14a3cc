"""What the loop learned outlives a restart: it comes out of a state as plain values, goes
back into a fresh one within the policy as it is now, and a resumed loop plans (reserve
included) at what was learned instead of starting over at the target."""

from __future__ import annotations

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


def _window(now_s: float, tokens_per_s: float, replicas: int = 1) -> PoolSignal:
    return PoolSignal(
        pool="m", now_s=now_s, window_s=15.0, tokens=15.0 * tokens_per_s,
        requests=max(1, round(15.0 * tokens_per_s / 1000)), slo_attainment=1.0,
        serving={"h100": replicas},
    )  # fmt: skip


def test_learned_values_round_trip_through_plain_json() -> None:
    learned = {"m": PoolKnowledge(1.6, 1.9, 75.0), "n": PoolKnowledge(0.7, 2.0, None)}
    assert parse(as_json(learned)) == learned


@pytest.mark.parametrize(
    "stored",
    [[], {"m": 3}, {"m": {"utilisation": "hot"}}, {"m": {"utilisation": -1.0}},
     {"m": {"utilisation": float("nan")}}, {"m": {"utilisation": True}}, {"m": {"speed": 1.0}}],
)  # fmt: skip
def test_malformed_stored_values_are_refused_with_the_pool_named(stored: object) -> None:
    with pytest.raises(ValueError, match="learned autoscaler values"):
        parse(stored)


def test_a_loaded_window_is_learned_and_comes_out_of_the_state() -> None:
    scaler = Autoscaler([POLICY])
    state = AutoscalerState()
    # 1.5x the model carried within the SLO on 2 replicas
    _, state = scaler.decide([_window(15.0, 3000.0, replicas=2)], state)
    learned = knowledge(state)["m"]
    assert learned.utilisation == pytest.approx(1.5) and learned.ceiling == 2.0


def test_resume_clamps_to_the_policy_as_it_is_now() -> None:
    stored = {"m": PoolKnowledge(1.8, 2.0, 90.0), "gone": PoolKnowledge(1.5, 2.0, None)}
    lowered = PoolPolicy(pool="m", options=(H100,), max_utilisation=1.2)
    state = resume(AutoscalerState(), stored, {"m": lowered})
    assert set(state.pools) == {"m"}
    assert knowledge(state)["m"] == PoolKnowledge(1.2, 1.2, 90.0)
    off = PoolPolicy(pool="m", options=(H100,), max_utilisation=None)
    assert knowledge(resume(AutoscalerState(), stored, {"m": off}))["m"].utilisation == 0.0
    under = {"m": PoolKnowledge(0.1, 0.2, None)}  # never under the target
    assert knowledge(resume(AutoscalerState(), under, {"m": POLICY}))["m"] == PoolKnowledge(
        0.7, 0.7, None
    )


def test_a_resumed_loop_plans_and_reserves_at_what_it_learned() -> None:
    """A quiet pool with an 8x burst prior: a new loop keeps a spare replica for the burst
    (the reserve priced at one replica's modelled throughput); a loop that learned its
    replicas carry 2x the model within the SLO knows one replica holds that reserve."""
    scaler = Autoscaler([POLICY])
    resumed = resume(AutoscalerState(), {"m": PoolKnowledge(2.0, 2.0, None)}, scaler.policies)
    fresh = AutoscalerState()
    for i in range(6):
        window = [_window(15.0 * (i + 1), 150.0)]
        (new, *_), fresh = scaler.decide(window, fresh)
        (old, *_), resumed = scaler.decide(window, resumed)
    assert new.desired_total == 2 and "burst reserve" in new.reason
    assert old.desired_total == 1
    assert old.need_tokens_per_s < new.need_tokens_per_s
    assert knowledge(resumed)["m"].utilisation == pytest.approx(2.0)  # idle windows keep it


def test_learned_is_not_lost_by_windows_without_evidence() -> None:
    """An idle window (here one whose single call carried no tokens: no tokens per call, as
    a max_tokens 0 call served from cache; it used to divide by zero) keeps what was learned."""
    state = resume(AutoscalerState(), {"m": PoolKnowledge(1.4, 1.9, 60.0)}, {"m": POLICY})
    scaler = Autoscaler([POLICY])
    assert _window(15.0, 0.0).requests == 1
    assert not scaler.surging(_window(15.0, 0.0), state)
    _, state = scaler.decide([_window(15.0, 0.0)], state)
    assert state.pools["m"].learned == Learned(1.4, 1.9)
    assert state.pools["m"].episode.length_s == 60.0
