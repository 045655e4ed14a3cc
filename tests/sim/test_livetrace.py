"""The simulated side of the fidelity bench: the plain arm and the calibrated arm."""

from __future__ import annotations

from pathlib import Path

from inferplane.config import FleetConfig, parse_config
from inferplane.engine.profiles import load_profile
from inferplane.gateway.priors import prior_from_profile
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.livetrace import shared_prefix_trace, simulate_trace, write_mooncake


def _fleet() -> FleetConfig:
    endpoints = [
        {"name": f"e{i}", "url": f"http://127.0.0.1:{9100 + i}", "gpu": "h100",
         "models": ["llama-3-8b"], "price_per_hour_usd": 2.99, "emulated": {"time_scale": 10.0}}
        for i in range(3)
    ]  # fmt: skip
    return parse_config({"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints})


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    write_mooncake(path, shared_prefix_trace(30, 3.0, seed=5, output_tokens=(8, 32)))
    return path


def test_calibrated_arm_feeds_the_wired_predictor(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    plain, plain_sim = simulate_trace(_fleet(), path)
    fed, fed_sim = simulate_trace(_fleet(), path, calibrated=True)
    assert isinstance(fed_sim, CalibratedSimulation) and fed_sim.feed is not None
    assert not isinstance(plain_sim, CalibratedSimulation)
    assert fed_sim.feed.predictor is fed_sim.policy.predictor  # type: ignore[attr-defined]
    assert len(fed) == len(plain) == 30
    assert all(r.status == 200 for r in fed)
    # Fed: the predictor saw every call end (nothing pending) and learned decode steps;
    # the plain arm's predictor saw nothing.
    fed_predictor = fed_sim.feed.predictor
    plain_predictor = plain_sim.policy.predictor  # type: ignore[attr-defined]
    assert fed_predictor.num_pending() == 0
    assert fed_predictor.decode_steps() is not None
    assert plain_predictor.decode_steps() is None


def test_calibrated_arm_keeps_the_time_scaled_priors(tmp_path: Path) -> None:
    _, sim = simulate_trace(_fleet(), _trace(tmp_path), calibrated=True)
    prior = sim.policy.predictor.prior(sim.fleet.endpoints[0].view(), "llama-3-8b")  # type: ignore[attr-defined]
    hardware = prior_from_profile(load_profile("llama-3-8b", "h100", 1), 1.0)
    # The emulated engine's prior at time scale 10 (not the hardware's, as `set_priors`
    # with its default time scale would give): ten times slower to decode.
    assert prior.decode_base_s == hardware.decode_base_s * 10.0
