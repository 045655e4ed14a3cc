"""The tracing and autoscale config sections: defaults off, clear validation errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferplane.gateway.observability_config import (
    AutoscaleConfig,
    PoolScaleConfig,
    TracingConfig,
)


def test_defaults_are_off() -> None:
    assert TracingConfig().enabled is False and TracingConfig().otlp_endpoint is None
    assert AutoscaleConfig().enabled is False and AutoscaleConfig().pools == ()


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "m", "gpus": []},
        {"model": "m", "gpus": ["h100"], "min_replicas": 3, "max_replicas": 2},
        {"model": "m", "gpus": ["h100"], "target_utilisation": 0},
        {"model": "m", "gpus": ["h100"], "unknown": 1},
        {"model": "m", "gpus": ["h100"], "burst_prior": 0.5},
        {"model": "m", "gpus": ["h100"], "burst_prior": 9, "burst_max_factor": 8},
        {"model": "m", "gpus": ["h100"], "burst_memory_s": -1},
        {"model": "m", "gpus": ["h100"], "quiet_window_s": 0},
        {"model": "m", "gpus": ["h100"], "reserve_max_replicas": -1},
        {"model": "m", "gpus": ["h100"], "burst_length_s": -1},
        {"model": "m", "gpus": ["h100"], "burst_prior_now": 9, "burst_max_factor": 8},
        {"model": "m", "gpus": ["h100"], "burst_min_serve_s": -1},
        {"model": "m", "gpus": ["h100"], "max_utilisation": 4.5},
        {"model": "m", "gpus": ["h100"], "utilisation_step": 0},
        {"model": "m", "gpus": ["h100"], "burst_slo_wait_s": -1},
    ],
)
def test_bad_pools_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PoolScaleConfig.model_validate(bad)


def test_burst_reserve_knobs_reach_the_core_policy() -> None:
    pool = {"model": "llama-3-8b", "gpus": ["h100"], "burst_prior": 3, "burst_memory_s": 600}
    (policy,) = AutoscaleConfig.model_validate({"enabled": True, "pools": [pool]}).policies()
    assert (policy.burst_prior, policy.burst_memory_s, policy.memory_s) == (3.0, 600.0, 600.0)
    (default,) = AutoscaleConfig.model_validate({"pools": [{**pool, "burst_prior": 1}]}).policies()
    assert default.burst_prior == 1.0 and default.burst_max_factor == 8.0
    assert default.reserve_max_replicas == 1 and default.quiet_window_s is None


def test_quiet_window_and_reserve_cap_reach_the_core_policy() -> None:
    pool = {"model": "llama-3-8b", "gpus": ["h100"], "burst_prior": 8,
            "quiet_window_s": 3600, "reserve_max_replicas": 2}  # fmt: skip
    (policy,) = AutoscaleConfig.model_validate({"enabled": True, "pools": [pool]}).policies()
    assert (policy.quiet_s, policy.reserve_max_replicas) == (3600.0, 2)


def test_learned_utilisation_knobs_reach_the_core_policy() -> None:
    pool = {"model": "llama-3-8b", "gpus": ["h100"], "max_utilisation": None,
            "utilisation_step": 0.05}  # fmt: skip
    (policy,) = AutoscaleConfig.model_validate({"enabled": True, "pools": [pool]}).policies()
    assert (policy.max_utilisation, policy.utilisation_step) == (None, 0.05)
    (default,) = AutoscaleConfig.model_validate(
        {"pools": [{**pool, "max_utilisation": 2.5}]}
    ).policies()
    assert default.max_utilisation == 2.5


def test_sampling_ratio_is_bounded() -> None:
    with pytest.raises(ValidationError):
        TracingConfig(sample_ratio=1.5)


def test_burst_length_and_min_serve_reach_the_core_policy() -> None:
    pool = {"model": "llama-3-8b", "gpus": ["h100"], "burst_length_s": 90, "burst_min_serve_s": 20,
            "burst_prior_now": 5}  # fmt: skip
    (policy,) = AutoscaleConfig.model_validate({"enabled": True, "pools": [pool]}).policies()
    assert (policy.burst_length_s, policy.burst_min_serve_s) == (90.0, 20.0)
    assert policy.burst_prior_now == 5.0
    plain = {"model": "llama-3-8b", "gpus": ["h100"]}
    (default,) = AutoscaleConfig.model_validate({"pools": [plain]}).policies()
    assert default.burst_length_s is None and default.burst_min_serve_s is None
    assert default.burst_prior_now == 1.0


def test_burst_slo_wait_reaches_the_core_policy() -> None:
    pool = {"model": "llama-3-8b", "gpus": ["h100"], "burst_slo_wait_s": 3}
    (policy,) = AutoscaleConfig.model_validate({"enabled": True, "pools": [pool]}).policies()
    assert policy.burst_slo_wait_s == 3.0
    plain = {"model": "llama-3-8b", "gpus": ["h100"]}
    (default,) = AutoscaleConfig.model_validate({"pools": [plain]}).policies()
    assert default.burst_slo_wait_s is None
