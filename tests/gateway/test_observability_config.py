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
    ],
)
def test_bad_pools_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PoolScaleConfig.model_validate(bad)


def test_sampling_ratio_is_bounded() -> None:
    with pytest.raises(ValidationError):
        TracingConfig(sample_ratio=1.5)
