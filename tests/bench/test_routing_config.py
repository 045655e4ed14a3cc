"""The routing benchmark's gateway config (bench/routing.py ``_gateway_config``): what it
writes is a valid fleet config, and the admission's workflow timer is in model time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from routing import _gateway_config

from inferplane.config import load_config
from inferplane.core.admission_config import WorkflowConfig

ENDPOINTS = [
    {"name": "e0", "url": "http://127.0.0.1:9000", "models": ["m"], "gpu": "h100",
     "price_per_hour_usd": 2.0},
]  # fmt: skip


def _args(time_scale: float, no_ejection: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        time_scale=time_scale, health_timeout_s=5.0, unhealthy_after=3, no_ejection=no_ejection
    )


@pytest.mark.parametrize("time_scale", [1.0, 4.0])
def test_a_workflow_is_abandoned_after_the_same_model_time_at_any_time_scale(
    time_scale: float, tmp_path: Path
) -> None:
    """At time scale 4 a 2.5 model-second tool pause takes 10 s: the gateway's abandon
    timer (wall seconds) is stretched with it, so it still means 10 model seconds."""
    path = _gateway_config("precise", ENDPOINTS, 8080, _args(time_scale), tmp_path)
    config = load_config(path)
    default_s = WorkflowConfig().abandon_after_s
    assert config.admission.workflows.abandon_after_s == pytest.approx(default_s * time_scale)
    assert config.gateway.port == 8080


def test_the_least_loaded_policy_and_no_ejection_are_written(tmp_path: Path) -> None:
    path = _gateway_config("least-loaded", ENDPOINTS, 8080, _args(4.0, True), tmp_path)
    config = load_config(path)
    assert not config.reliability.breaker.enabled
    assert config.routing.weights.load == 1.0
    assert config.routing.weights.kv_cache == 0.0
