"""The fleet config validates once and names the bad field when it cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferplane.config import ConfigError, hash_api_key, load_config, parse_config
from inferplane.core.types import EngineKind, PriorityClass

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _endpoint(**over: Any) -> dict[str, Any]:
    base = {
        "name": "e0",
        "url": "http://127.0.0.1:9000",
        "gpu": "h100",
        "price_per_hour_usd": 2.5,
        "models": ["m"],
    }
    base.update(over)
    return base


def test_example_configs_load() -> None:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert paths
    for path in paths:
        cfg = load_config(path)
        assert cfg.endpoints


def test_example_key_is_the_documented_demo_key() -> None:
    cfg = load_config(EXAMPLES / "fleet.yaml")
    assert cfg.gateway.auth.keys[0].key_sha256 == hash_api_key("sk-demo-acme")


def test_minimal_config_defaults() -> None:
    cfg = parse_config({"endpoints": [_endpoint()]})
    ep = cfg.endpoints[0]
    assert ep.kind is EngineKind.VLLM
    assert cfg.gateway.auth.mode == "anonymous"
    assert cfg.targets_for("m") == ("m",)
    assert cfg.targets_for("unknown") == ()
    assert ep.info().url == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("data", "path_fragment"),
    [
        ({"endpoints": [_endpoint(price_per_hour_usd=-1)]}, "endpoints.0.price_per_hour_usd"),
        ({"endpoints": [_endpoint(), _endpoint(url="ftp://x")]}, "endpoints.1.url"),
        ({"endpoints": [_endpoint(kind="tgi")]}, "endpoints.0.kind"),
        ({"endpoints": [_endpoint(models=[])]}, "endpoints.0.models"),
        ({"endpoints": [_endpoint(gpus="h100")]}, "endpoints.0.gpus"),
        ({"endpoints": []}, "endpoints"),
        ({"gateway": {"port": 70000}, "endpoints": [_endpoint()]}, "gateway.port"),
        ({"endpoints": [_endpoint(metrics_path="metrics")]}, "endpoints.0"),
        (
            {"gateway": {"auth": {"mode": "api_keys"}}, "endpoints": [_endpoint()]},
            "gateway.auth",
        ),
        (
            {
                "gateway": {"auth": {"keys": [{"key_sha256": "abc", "tenant": "t"}]}},
                "endpoints": [_endpoint()],
            },
            "gateway.auth.keys.0",
        ),
    ],
)
def test_bad_field_is_named(data: dict[str, Any], path_fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "fleet.yaml")
    assert path_fragment in str(info.value)
    assert "fleet.yaml" in str(info.value)


@pytest.mark.parametrize(
    ("kind", "given", "want"),
    [
        ("vllm", None, "/metrics"),
        ("sglang", None, "/metrics"),
        ("openai", None, "/metrics"),
        ("trtllm", None, "/prometheus/metrics"),  # trtllm-serve's /metrics is JSON stats
        ("trtllm", "/custom", "/custom"),
    ],
)
def test_metrics_path_defaults_by_engine_kind(kind: str, given: str | None, want: str) -> None:
    over: dict[str, Any] = {"kind": kind}
    if given is not None:
        over["metrics_path"] = given
    assert parse_config({"endpoints": [_endpoint(**over)]}).endpoints[0].metrics_path == want


def test_duplicate_endpoint_names_rejected() -> None:
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"endpoints": [_endpoint(), _endpoint()]})


def test_route_must_target_served_models() -> None:
    with pytest.raises(ConfigError, match="no endpoint serves: other"):
        parse_config({"endpoints": [_endpoint()], "routes": [{"name": "r", "targets": ["other"]}]})
    cfg = parse_config({"endpoints": [_endpoint()], "routes": [{"name": "r", "targets": ["m"]}]})
    assert cfg.targets_for("r") == ("m",)
    assert cfg.model_names() == ("m", "r")


def test_timeouts_per_class() -> None:
    cfg = parse_config({"endpoints": [_endpoint()], "gateway": {"timeouts": {"sheddable_s": 7}}})
    assert cfg.gateway.timeouts.for_class(PriorityClass.SHEDDABLE) == 7
    assert cfg.gateway.timeouts.for_class(PriorityClass.CRITICAL) == 600


def test_config_is_frozen() -> None:
    cfg = parse_config({"endpoints": [_endpoint()]})
    with pytest.raises(Exception, match="frozen"):
        cfg.endpoints[0].name = "x"  # type: ignore[misc]


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(top)


def test_fleet_config_mounts_admission_cache_tracing_autoscale_state() -> None:
    cfg = parse_config(
        {
            "endpoints": [_endpoint()],
            "admission": {"quotas": {"keys": {"ci": {"requests_per_min": 5}}}},
            "tracing": {"enabled": True, "sample_ratio": 0.5},
            "state": {"backend": "redis", "redis_url": "redis://127.0.0.1:1/0"},
        }
    )
    assert cfg.admission.quotas.keys["ci"].requests_per_min == 5
    assert cfg.tracing.enabled and cfg.tracing.sample_ratio == 0.5
    assert cfg.state.backend.value == "redis"
    assert not cfg.autoscale.enabled and cfg.cache == type(cfg.cache)()
