"""The configuration tree: one YAML file describes a fleet; the gateway serves it, the
simulator replays it.

It is validated once, at start, into frozen pydantic models; a bad file fails with the dotted
path of every bad field and why (``endpoints.2.price_per_hour_usd: ...``), never later at
request time. Unknown keys are errors too, so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.cache_config import CacheConfig
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.types import EndpointInfo, EngineKind, PriorityClass
from inferplane.engine.profiles import KNOB_NAMES
from inferplane.gateway.observability_config import (
    AutoscaleConfig,
    LearnedStoreKind,
    TracingConfig,
)
from inferplane.gateway.reliability_config import ReliabilityConfig
from inferplane.state.config import StateBackend, StateConfig

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_M = TypeVar("_M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names every bad field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KVEventsConfig(_Frozen):
    """Where an endpoint publishes vLLM KV-cache events (ZMQ PUB) and its replay socket."""

    endpoint: str = Field(pattern=r"^tcp://")
    replay_endpoint: str | None = Field(default=None, pattern=r"^tcp://")
    topic: str = ""


class EmulatedConfig(_Frozen):
    """The endpoint is an inferplane emulated engine: its tokenizer (the built-in one) and
    its performance profile are known, so the gateway can hash prompts into the same KV
    blocks the engine caches and start its latency predictor from the engine's own model."""

    time_scale: float = Field(default=1.0, gt=0)
    engine_model: str | None = None  # the profile's model name, when served under another
    #: Profile knobs the engine was started with (e.g. ``max_num_seqs: 16``), so the
    #: gateway's latency prior matches the engine rather than the data file's defaults.
    overrides: dict[str, float] = Field(default_factory=dict)

    @field_validator("overrides")
    @classmethod
    def _known_knobs(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - KNOB_NAMES)
        if unknown:
            raise ValueError(f"unknown engine knob(s) {unknown}; known: {sorted(KNOB_NAMES)}")
        bad = sorted(k for k, v in value.items() if not v > 0)
        if bad:
            raise ValueError(f"engine knob(s) {bad} must be > 0")
        return value


class EndpointConfig(_Frozen):
    """One engine replica."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    url: str = Field(pattern=r"^https?://")
    kind: EngineKind = EngineKind.VLLM
    models: tuple[str, ...] = Field(min_length=1)
    gpu: str = Field(min_length=1)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    price_per_hour_usd: float = Field(ge=0)
    region: str = "local"
    max_model_len: int | None = Field(default=None, ge=1)
    #: Where the engine's Prometheus text is (default by kind: trtllm-serve serves it at
    #: ``/prometheus/metrics``, its ``/metrics`` being JSON iteration stats; others ``/metrics``).
    metrics_path: str = ""
    health_path: str = "/health"
    kv_events: KVEventsConfig | None = None
    emulated: EmulatedConfig | None = None

    @model_validator(mode="after")
    def _default_metrics_path(self) -> EndpointConfig:
        if not self.metrics_path:
            path = "/prometheus/metrics" if self.kind is EngineKind.TRTLLM else "/metrics"
            object.__setattr__(self, "metrics_path", path)
        elif not self.metrics_path.startswith("/"):
            raise ValueError("metrics_path must start with '/'")
        return self

    def info(self) -> EndpointInfo:
        """The endpoint's identity as the policy core sees it."""
        return EndpointInfo(
            name=self.name,
            url=self.url.rstrip("/"),
            kind=self.kind,
            models=self.models,
            gpu=self.gpu,
            price_per_hour_usd=self.price_per_hour_usd,
            region=self.region,
            max_model_len=self.max_model_len,
            tensor_parallel=self.tensor_parallel,
        )


class ApiKeyConfig(_Frozen):
    """An API key, stored as the SHA-256 hex of the key, never the key itself."""

    key_sha256: str
    tenant: str = Field(min_length=1)
    name: str | None = None
    default_priority: PriorityClass = PriorityClass.STANDARD
    max_priority: PriorityClass = PriorityClass.CRITICAL

    @model_validator(mode="after")
    def _check_hash(self) -> ApiKeyConfig:
        if not _SHA256_HEX.match(self.key_sha256):
            raise ValueError("key_sha256 must be 64 lowercase hex digits (sha256 of the key)")
        if self.default_priority.rank < self.max_priority.rank:
            raise ValueError("default_priority is above max_priority")
        return self


class AuthConfig(_Frozen):
    """How callers are identified: API keys, or an explicit anonymous mode for demos."""

    mode: Literal["api_keys", "anonymous"] = "api_keys"
    keys: tuple[ApiKeyConfig, ...] = ()
    anonymous_tenant: str = "anonymous"

    @model_validator(mode="after")
    def _check_keys(self) -> AuthConfig:
        if self.mode == "api_keys" and not self.keys:
            raise ValueError("mode api_keys needs at least one key (or mode: anonymous)")
        hashes = [k.key_sha256 for k in self.keys]
        if len(hashes) != len(set(hashes)):
            raise ValueError("the same key is listed twice")
        return self


class TimeoutsConfig(_Frozen):
    """Upstream timeouts per priority class, and the stall limit between tokens."""

    critical_s: float = Field(default=600.0, gt=0)
    standard_s: float = Field(default=300.0, gt=0)
    sheddable_s: float = Field(default=120.0, gt=0)
    connect_s: float = Field(default=5.0, gt=0)
    inter_token_s: float = Field(default=30.0, gt=0)

    def for_class(self, priority: PriorityClass) -> float:
        return {
            PriorityClass.CRITICAL: self.critical_s,
            PriorityClass.STANDARD: self.standard_s,
            PriorityClass.SHEDDABLE: self.sheddable_s,
        }[priority]


class GatewayConfig(_Frozen):
    """The gateway process itself."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    auth: AuthConfig = AuthConfig(mode="anonymous")
    timeouts: TimeoutsConfig = TimeoutsConfig()
    scrape_interval_s: float = Field(default=0.1, gt=0, le=10)
    stale_after_s: float = Field(default=0.5, gt=0)
    health_interval_s: float = Field(default=1.0, gt=0)
    health_timeout_s: float = Field(default=1.0, gt=0)
    unhealthy_after: int = Field(default=2, ge=1)  # failed checks before an endpoint is COLD
    warmup_s: float = Field(default=10.0, ge=0)  # WARMING time after an endpoint comes back
    max_connections: int = Field(default=1024, ge=1)  # upstream connection pool size
    retries_before_first_byte: int = Field(default=1, ge=0, le=5)
    workflow_idle_ttl_s: float = Field(default=300.0, gt=0)
    max_in_flight: int = Field(default=4096, ge=1)
    log_requests: bool = True  # one JSON log line per request
    seed: int = 0  # seeds the routing tie-breaker RNG


class ModelRouteConfig(_Frozen):
    """A model name clients ask for, mapped to served models in order of preference."""

    name: str = Field(min_length=1)
    targets: tuple[str, ...] = Field(min_length=1)
    allow_fallback: bool = True


Endpoints = Annotated[tuple[EndpointConfig, ...], Field(min_length=1)]


class FleetConfig(_Frozen):
    """The whole tree: a gateway, its endpoints and optional model routes."""

    gateway: GatewayConfig = GatewayConfig()
    endpoints: Endpoints
    routes: tuple[ModelRouteConfig, ...] = ()
    routing: RoutingConfig = RoutingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    cache: CacheConfig = CacheConfig()
    reliability: ReliabilityConfig = ReliabilityConfig()
    tracing: TracingConfig = TracingConfig()
    autoscale: AutoscaleConfig = AutoscaleConfig()
    state: StateConfig = StateConfig()

    @model_validator(mode="after")
    def _check_references(self) -> FleetConfig:
        names = [e.name for e in self.endpoints]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"endpoint names must be unique; repeated: {', '.join(dupes)}")
        served = self.served_models()
        for route in self.routes:
            missing = [t for t in route.targets if t not in served]
            if missing:
                raise ValueError(
                    f"route {route.name!r} targets models no endpoint serves: {', '.join(missing)}"
                )
        unserved = [p.model for p in self.autoscale.pools if p.model not in served]
        if unserved:  # a pool is sized on the calls for its model: none would come
            raise ValueError(f"autoscale pools name models no endpoint serves: {unserved}")
        redis = self.state.backend is StateBackend.REDIS
        if self.autoscale.learned_store is LearnedStoreKind.REDIS and not redis:
            raise ValueError("autoscale.learned_store: redis needs state.backend: redis")
        return self

    def served_models(self) -> tuple[str, ...]:
        """Every model some endpoint serves, in first-seen order."""
        seen: dict[str, None] = {}
        for endpoint in self.endpoints:
            for model in endpoint.models:
                seen.setdefault(model, None)
        return tuple(seen)

    def model_names(self) -> tuple[str, ...]:
        """What clients may ask for: served models plus route names."""
        names = dict.fromkeys(self.served_models())
        for route in self.routes:
            names.setdefault(route.name, None)
        return tuple(names)

    def targets_for(self, model: str) -> tuple[str, ...]:
        """Served models to try for a requested model name, in order; empty if unknown."""
        for route in self.routes:
            if route.name == model:
                return route.targets
        return (model,) if model in self.served_models() else ()


def hash_api_key(key: str) -> str:
    """The form keys are stored in: SHA-256 hex of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def validate_yaml_tree(
    data: Any, model: type[_M], error: type[ValueError], what: str, source: str
) -> _M:
    """Validate a parsed YAML tree into ``model``; ``error`` names every bad field's path."""
    if not isinstance(data, Mapping):
        raise error(f"invalid {what} in {source}: the top level must be a mapping")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"invalid {what} in {source}:"]
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {path}: {err['msg']}")
        raise error("\n".join(lines)) from None


def read_yaml_file(path: str | Path, error: type[ValueError], what: str) -> Any:
    """Read and parse a YAML file, turning I/O and syntax errors into ``error``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML in {p}: {exc}") from None


def parse_config(data: Any, source: str = "<config>") -> FleetConfig:
    """Validate an already-parsed mapping into a FleetConfig or raise ConfigError."""
    return validate_yaml_tree(data, FleetConfig, ConfigError, "configuration", source)


def load_config(path: str | Path) -> FleetConfig:
    """Read and validate a YAML fleet config file."""
    return parse_config(read_yaml_file(path, ConfigError, "configuration"), str(path))
