"""Emulated endpoints state the profile knobs they run with, so the gateway's prior matches."""

from __future__ import annotations

from typing import Any

import pytest

from inferplane.config import ConfigError, EndpointConfig, parse_config
from inferplane.engine.fleet import EngineHandle, EngineSpec, engine_configs
from inferplane.engine.server import EngineServer
from inferplane.gateway.priors import prior_for_endpoint


def _endpoint(emulated: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "e0",
        "url": "http://127.0.0.1:9000",
        "gpu": "h100",
        "price_per_hour_usd": 2.5,
        "models": ["llama-3-8b"],
        "emulated": emulated,
    }


def _config(emulated: dict[str, Any]) -> EndpointConfig:
    return parse_config({"endpoints": [_endpoint(emulated)]}).endpoints[0]


def test_the_prior_follows_the_overridden_slots() -> None:
    default = prior_for_endpoint(_config({"time_scale": 10}))
    small = prior_for_endpoint(_config({"time_scale": 10, "overrides": {"max_num_seqs": 16}}))
    assert default is not None and small is not None
    assert small.max_num_seqs == 16 and default.max_num_seqs > 16
    assert small.throughput_tokens_per_s < default.throughput_tokens_per_s


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [({"max_num_sequences": 16}, "unknown engine knob"), ({"max_num_seqs": 0}, "must be > 0")],
)
def test_bad_overrides_fail_at_load_with_the_field_path(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"endpoints": [_endpoint({"overrides": overrides})]})
    assert "endpoints.0.emulated.overrides" in str(err.value) and needle in str(err.value)


def test_an_engine_started_with_overrides_says_so_in_its_endpoint_config() -> None:
    spec = EngineSpec(model="llama-3-8b", gpu="h100", profile_overrides=(("max_num_seqs", 16),))
    [(name, _, config)] = engine_configs([spec])
    server = EngineServer(config)
    assert server.model.profile.max_num_seqs == 16
    entry = EngineHandle(name, spec, server).endpoint_config()
    assert entry["emulated"]["overrides"] == {"max_num_seqs": 16}
    prior = prior_for_endpoint(parse_config({"endpoints": [entry]}).endpoints[0])
    assert prior is not None and prior.max_num_seqs == 16
