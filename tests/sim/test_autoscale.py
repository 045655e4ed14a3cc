"""The simulator drives the core's autoscaler: scale-up ahead of a step, drains, bounds, seeds."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import pytest

from inferplane.config import FleetConfig, parse_config
from inferplane.core.autoscaler import PoolPolicy, ScheduleForecast
from inferplane.engine.sizing import gpu_option
from inferplane.sim.autoscale import QueueRule, gpu_hours, replica_spend_usd
from inferplane.sim.records import Outcome
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import Scenario, parse_scenario
from inferplane.sim.summary import summarise_run

MODEL = "llama-3-8b"


def fleet(
    num: int, *, min_replicas: int = 1, max_replicas: int = 6, tick_s: float = 5
) -> FleetConfig:
    endpoints = [
        {"name": f"h100-{i}", "url": f"http://127.0.0.1:{9300 + i}", "gpu": "h100",
         "price_per_hour_usd": 2.99, "models": [MODEL]}
        for i in range(num)
    ]  # fmt: skip
    pool = {"model": MODEL, "gpus": ["h100"], "min_replicas": min_replicas,
            "max_replicas": max_replicas, "scale_down_window_s": 30,
            "scale_down_cooldown_s": 20}  # fmt: skip
    return parse_config(
        {"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints,
         "autoscale": {"enabled": True, "tick_s": tick_s, "pools": [pool]}}
    )  # fmt: skip


def chat(name: str, rate_rps: float, start_s: float = 0.0, stop_s: float | None = None) -> Any:
    src = {"name": name, "kind": "chat", "rate_rps": rate_rps, "start_s": start_s,
           "prompt_tokens": {"median": 4000, "sigma": 0.2, "max_tokens": 8000},
           "output_tokens": {"median": 40, "sigma": 0.2, "max_tokens": 80},
           "slo": {"ttft_s": 2.0, "e2e_s": 30.0}}  # fmt: skip
    if stop_s is not None:
        src["stop_s"] = stop_s
    return src


def scenario(duration_s: float, *sources: Any, seed: int = 3) -> Scenario:
    return parse_scenario(
        {"name": "autoscale", "fleet": "(in memory)", "duration_s": duration_s, "drain_s": 60,
         "seed": seed, "clients": {"timeout_s": 60, "max_retries": 0},
         "workload": list(sources)}
    )  # fmt: skip


def run(sc: Scenario, config: FleetConfig, mode: str, **kw: Any) -> Simulation:
    sim = Simulation(sc, config, Path("."), "least-loaded", autoscale=mode, **kw)
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


STEP_S = 40.0
WORK_TOKENS = 4040  # prompt plus output of one call, as the sensor counts its work


def step_scenario() -> Scenario:
    return scenario(60, chat("base", 0.5), chat("step", 8.0, start_s=STEP_S))


@pytest.mark.slow
def test_scales_up_ahead_of_a_forecast_step_by_the_cold_start() -> None:
    cold_s = gpu_option(MODEL, "h100").cold_start_s
    forecast = ScheduleForecast(((0.0, 0.5 * WORK_TOKENS), (STEP_S, 8.5 * WORK_TOKENS)))
    ahead = run(step_scenario(), fleet(1), "inferplane", forecasts={MODEL: forecast})
    late = run(step_scenario(), fleet(1), "inferplane")
    first_up = min(p.time_s for p in ahead.scaler.timeline if p.desired > 1)  # type: ignore[union-attr]
    assert first_up <= STEP_S - cold_s
    at_step = next(p for p in ahead.scaler.timeline if p.time_s >= STEP_S)  # type: ignore[union-attr]
    assert at_step.serving > 1  # the new replicas serve when the step comes
    waiting_ahead = max(s.num_waiting for s in ahead.result.samples)  # type: ignore[attr-defined]
    waiting_late = max(s.num_waiting for s in late.result.samples)  # type: ignore[attr-defined]
    assert waiting_ahead < waiting_late


def test_scale_down_drains_without_failing_calls() -> None:
    sc = scenario(100, chat("busy", 8.0, stop_s=30), chat("trickle", 0.3))
    sim = run(sc, fleet(5, min_replicas=1), "inferplane")
    stopped = [ep for ep in sim.fleet.endpoints if ep.stopped_s is not None]
    assert len(stopped) >= 3
    records = sim.result.records  # type: ignore[attr-defined]
    assert {r.outcome for r in records} == {Outcome.SUCCESS}
    for ep in stopped:  # every call it took finished before it stopped
        assert ep.stopped_s is not None and ep.in_flight == 0
        ends = [r.finish_s for r in records if r.endpoint == ep.name]
        assert all(t is not None and t <= ep.stopped_s for t in ends)
    # The fleet config's endpoints go last: the youngest drain first, h100-0 stays.
    assert sim.fleet.by_name["h100-0"].stopped_s is None


@pytest.mark.slow
def test_replicas_stay_within_min_and_max() -> None:
    sc = scenario(60, chat("flood", 12.0, stop_s=30))
    for mode in ("inferplane", "queue-hpa"):
        sim = run(sc, fleet(2, min_replicas=2, max_replicas=4), mode)
        timeline = sim.scaler.timeline  # type: ignore[union-attr]
        assert all(2 <= p.desired <= 4 for p in timeline)
        assert all(2 <= p.serving + p.starting <= 4 for p in timeline)
        if mode == "inferplane":  # its demand term asks for more than max
            assert max(p.desired for p in timeline) == 4
        live = [ep for ep in sim.fleet.endpoints if ep.stopped_s is None and not ep.draining]
        assert 2 <= len(live) <= 4


@pytest.mark.slow
def test_same_seed_same_run_and_spend_adds_up() -> None:
    sc = scenario(80, chat("busy", 8.0, stop_s=30), chat("trickle", 0.3))
    a, b = run(sc, fleet(1), "inferplane"), run(sc, fleet(1), "inferplane")
    assert a.scaler.timeline == b.scaler.timeline  # type: ignore[union-attr]
    assert a.result.records == b.result.records  # type: ignore[attr-defined]
    assert len(a.fleet.endpoints) > 1  # it did scale
    other = run(scenario(80, chat("busy", 8.0, stop_s=30), chat("trickle", 0.3), seed=4),
                fleet(1), "inferplane")  # fmt: skip
    assert other.result.records != a.result.records  # type: ignore[attr-defined]
    end = a.result.end_s  # type: ignore[attr-defined]
    summary = summarise_run(a.result, sc)  # type: ignore[attr-defined]
    assert abs(summary["spend_usd"] - replica_spend_usd(a.fleet, end)) < 1e-6
    assert gpu_hours(a.fleet, end) < len(a.fleet.endpoints) * end / 3600


def test_fixed_fleet_when_off() -> None:
    sc = scenario(20, chat("busy", 8.0))
    sim = run(sc, fleet(1), "off")
    assert sim.scaler is None and len(sim.fleet.endpoints) == 1


def test_queue_rule_scales_on_waiting_calls_and_stabilises_down() -> None:
    policy = PoolPolicy(MODEL, (gpu_option(MODEL, "h100"),), min_replicas=1, max_replicas=10)
    rule, history = QueueRule(target_waiting_per_replica=5, stabilisation_s=300), deque()
    assert rule.desired(policy, 0, 0.0, history) == 1
    assert rule.desired(policy, 23, 15.0, history) == 5  # ceil(23 / 5)
    assert rule.desired(policy, 0, 30.0, history) == 5  # held by the window
    assert rule.desired(policy, 0, 316.0, history) == 1  # the 5 left the window
    assert rule.desired(policy, 500, 330.0, history) == 10  # max bound


def test_scenario_names_who_sizes_the_pools() -> None:
    config = fleet(1)  # autoscale enabled in the fleet config
    base = {"name": "a", "fleet": "(in memory)", "duration_s": 1, "workload": [chat("c", 1.0)]}
    assert Simulation(parse_scenario(base), config, Path("."), "least-loaded").scaler is not None
    off = parse_scenario({**base, "autoscale": "off"})
    assert Simulation(off, config, Path("."), "least-loaded").scaler is None
    hpa = parse_scenario({**base, "autoscale": "queue-hpa"})
    assert Simulation(hpa, config, Path("."), "least-loaded").scaler is not None
    # An explicit argument (what the benches pass) wins over the scenario's field.
    assert Simulation(hpa, config, Path("."), "least-loaded", autoscale="off").scaler is None
    with pytest.raises(ValueError, match="autoscale"):
        parse_scenario({**base, "autoscale": "hpa"})


@pytest.mark.slow
def test_an_unannounced_step_is_seen_between_ticks_and_extrapolated() -> None:
    # The step at 37 s falls early in the 35-40 s window: waiting for the tick at 40 s
    # would lose seconds of a cold start; the watch sees it a second or two in.
    sc = scenario(60, chat("base", 0.5), chat("step", 8.0, start_s=STEP_S - 3.0))
    sim = run(sc, fleet(1, max_replicas=12, tick_s=5), "inferplane")
    scaler = sim.scaler
    assert scaler is not None
    # (calls from nothing at the start read as a surge too: the forecast knew no traffic)
    early = [t for t in scaler.early_ticks if t > 30.0]
    assert early and STEP_S - 3.0 < early[0] < STEP_S
    up = next(p for p in scaler.timeline if p.desired > 1)
    assert up.time_s == early[0]  # not the periodic tick at 40 s
    assert "surge" in up.reason
    assert up.desired >= 3  # extrapolated: more than the window's diluted rate needs
    # The period restarts from the early tick: no short window (a noisy rate) after it.
    times = [p.time_s for p in scaler.timeline]
    after = times[times.index(early[0]) + 1]
    assert after == pytest.approx(early[0] + 5.0)
    # A step looks like a steep ramp at first: bought at most twice over (surge_max_factor),
    # not run away to max_replicas.
    assert max(p.desired for p in scaler.timeline) < 12
    # The queue-length loop has no watch: it ticks on its period only.
    hpa = run(sc, fleet(1, max_replicas=12, tick_s=5), "queue-hpa")
    assert hpa.scaler is not None and not hpa.scaler.early_ticks
    assert all(p.time_s % 5 == 0 for p in hpa.scaler.timeline)


def test_policy_overrides_reach_the_loops_made_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferplane.sim import scale_loop

    config = fleet(1).autoscale
    plain = scale_loop.make_loop(config, "inferplane")
    monkeypatch.setattr(scale_loop, "POLICY_OVERRIDES", {"burst_prior": 3.0})
    tuned = scale_loop.make_loop(config, "inferplane")
    assert plain is not None and tuned is not None
    assert plain.policies[MODEL].burst_prior == 1.0
    assert tuned.policies[MODEL].burst_prior == 3.0
    assert tuned.policies[MODEL].max_replicas == plain.policies[MODEL].max_replicas
