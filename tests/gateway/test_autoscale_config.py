"""The autoscale config's per-GPU replica values: a real deployment's model has no emulated
profile, so its pool gives one replica's throughput, cold start and price per GPU type."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferplane.config import ConfigError, parse_config
from inferplane.engine.sizing import gpu_option
from inferplane.gateway.autoscale import AutoscaleConfig, PoolScaleConfig
from inferplane.gateway.observability_config import GpuReplicaConfig

REAL = "meta-llama/Llama-3.1-8B-Instruct"  # served by vLLM, no emulated profile
H100 = {"tokens_per_s": 9000.0, "cold_start_s": 180.0, "price_per_hour_usd": 3.6}


def test_a_model_without_a_profile_is_sized_from_the_given_replica_values() -> None:
    pool = PoolScaleConfig.model_validate(
        {"model": REAL, "gpus": ["h100"], "replica": {"h100": H100}}
    )
    (policy,) = AutoscaleConfig(enabled=True, time_scale=4.0, pools=(pool,)).policies()
    (option,) = policy.options
    assert policy.pool == REAL
    # as given: time_scale (the emulated engines' slow-down) does not scale them
    assert (option.gpu, option.tokens_per_s, option.cold_start_s) == ("h100", 9000.0, 180.0)
    assert option.price_per_hour_usd == 3.6


def test_given_fields_override_the_profile_and_the_rest_come_from_it() -> None:
    pool = PoolScaleConfig(
        model="llama-3-8b",
        gpus=("h100", "a100"),
        replica={"h100": GpuReplicaConfig(price_per_hour_usd=2.0)},
    )
    h100, a100 = AutoscaleConfig(pools=(pool,)).policies()[0].options
    modelled = gpu_option("llama-3-8b", "h100")
    assert h100.price_per_hour_usd == 2.0 != modelled.price_per_hour_usd
    assert (h100.tokens_per_s, h100.cold_start_s) == (
        modelled.tokens_per_s,
        modelled.cold_start_s,
    )
    assert a100 == gpu_option("llama-3-8b", "a100")


@pytest.mark.parametrize(
    ("replica", "message"),
    [
        ({}, "no emulated profile"),  # nothing given, no profile
        ({"h100": {"tokens_per_s": 9000.0, "cold_start_s": 180.0}}, "price_per_hour_usd"),
        ({"h100": H100, "h200": H100}, "not in gpus"),
        ({"h100": {**H100, "tokens_per_s": 0}}, "greater than 0"),
    ],
)
def test_incomplete_or_stray_replica_values_are_refused(
    replica: dict[str, dict[str, float]], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        PoolScaleConfig.model_validate({"model": REAL, "gpus": ["h100"], "replica": replica})


def _fleet(pool_model: str) -> dict[str, object]:
    return {
        "endpoints": [
            {
                "name": "e0",
                "url": "http://e0:8000",
                "models": [REAL],
                "gpu": "h100",
                "price_per_hour_usd": 3.6,
            }
        ],
        "autoscale": {
            "enabled": True,
            "pools": [{"model": pool_model, "gpus": ["h100"], "replica": {"h100": H100}}],
        },
    }


def test_a_pool_must_be_a_model_some_endpoint_serves() -> None:
    cfg = parse_config(_fleet(REAL))
    assert [p.pool for p in cfg.autoscale.policies()] == [REAL]
    with pytest.raises(ConfigError, match="no endpoint serves"):
        parse_config(_fleet("llama-8b"))
