"""``inferplane simulate`` routes with a predictor fed like the gateway's: the core router
learns each GPU's real decode speed from the calls it simulates, and is wired from the fleet
config (its routing section and profile priors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferplane.config import parse_config
from inferplane.sim.baselines import Inferplane
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import parse_scenario

MODEL = "llama-3-8b"


def _fleet(**routing: Any) -> Any:
    endpoints = [
        {"name": name, "url": f"http://127.0.0.1:{9400 + i}", "gpu": gpu,
         "price_per_hour_usd": price, "models": [MODEL]}
        for i, (name, gpu, price) in enumerate([("fast", "h100", 2.99), ("slow", "a100", 1.79)])
    ]  # fmt: skip
    return parse_config(
        {"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints, "routing": routing}
    )


def _scenario() -> Any:
    return parse_scenario(
        {"name": "cal", "fleet": "(in memory)", "duration_s": 20, "drain_s": 30, "seed": 2,
         "workload": [{"name": "chat", "kind": "chat", "rate_rps": 2.0,
                       "prompt_tokens": {"median": 500, "sigma": 0.2, "max_tokens": 1000},
                       "output_tokens": {"median": 200, "sigma": 0.2, "max_tokens": 400}}]}
    )  # fmt: skip


def test_the_core_router_learns_from_the_calls_it_simulates() -> None:
    factors = {}
    for cls in (Simulation, CalibratedSimulation):
        sim = cls(_scenario(), _fleet(), Path("."), "inferplane")
        assert isinstance(sim.policy, Inferplane)
        result = sim.run()
        assert result.records
        predictor = sim.policy.predictor
        assert predictor.num_pending() == 0  # every dispatched call was settled
        now = sim.q.now_s
        factors[cls] = [predictor.tpot_factor(n, now) for n in ("fast", "slow")]
    # Unfed, the calibration never moves off 1; fed, it learned from observed decode speed.
    assert factors[Simulation] == [1.0, 1.0]
    assert any(abs(f - 1.0) > 1e-3 for f in factors[CalibratedSimulation])


def test_plain_and_calibrated_runs_share_the_fleet_configs_routing_section() -> None:
    fleet = _fleet(affinity_ttl_s=7.5)
    for cls in (Simulation, CalibratedSimulation):
        sim = cls(_scenario(), fleet, Path("."), "inferplane")
        assert isinstance(sim.policy, Inferplane)
        assert sim.policy.config.affinity_ttl_s == 7.5
