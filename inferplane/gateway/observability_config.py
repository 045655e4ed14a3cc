"""Configuration of the observability and control-loop features: tracing and autoscaling.

Frozen pydantic models with defaults (both features off), light enough for the config tree
to import: nothing here pulls in aiohttp, OpenTelemetry or the engine. The modules that use
them (``gateway.tracing``, ``gateway.autoscale``) re-export them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplane.core.autoscale_policy import MAX_UTILISATION

if TYPE_CHECKING:
    from inferplane.core.autoscaler import GpuOption, PoolPolicy

__all__ = [
    "AutoscaleConfig",
    "GpuReplicaConfig",
    "LearnedStoreKind",
    "PoolScaleConfig",
    "TracingConfig",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TracingConfig(_Frozen):
    """The ``tracing`` section."""

    enabled: bool = False
    service_name: str = "inferplane-gateway"
    sample_ratio: float = Field(default=1.0, ge=0, le=1)  # for calls with no sampled parent
    otlp_endpoint: str | None = None  # e.g. http://collector:4318/v1/traces; None: no export


class GpuReplicaConfig(_Frozen):
    """One replica of a pool's model on one GPU type, as deployed: what the autoscaler buys.

    A field left out comes from the emulated engine profile of the model on that GPU (scaled
    by ``time_scale``); a model with no profile (a real deployment's model) must give all
    three. Values given here are used as they are (``time_scale`` does not scale them).
    """

    tokens_per_s: float | None = Field(default=None, gt=0)  # sustained prompt + output tokens
    cold_start_s: float | None = Field(default=None, ge=0)  # from start to serving
    price_per_hour_usd: float | None = Field(default=None, ge=0)  # per replica (all its GPUs)

    @property
    def complete(self) -> bool:
        """Whether it needs no engine profile."""
        return None not in (self.tokens_per_s, self.cold_start_s, self.price_per_hour_usd)


class PoolScaleConfig(_Frozen):
    """One pool (a served model) and how it may be sized."""

    model: str = Field(min_length=1)
    gpus: tuple[str, ...] = Field(min_length=1)  # GPU types it may run on
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=8, ge=0)
    target_utilisation: float = Field(default=0.7, gt=0, le=1)
    scale_down_window_s: float = Field(default=300.0, ge=0)
    scale_down_cooldown_s: float = Field(default=120.0, ge=0)
    # Burst reserve (core/autoscale_reserve.py): the burst factor kept warm before one is
    # seen (1: none until a burst is seen), the learned factor's cap and its half-life
    # (None: twice scale_down_window_s); the window over which the quiet demand (the trough
    # the prior multiplies) is the lowest level seen (None: a day of scale-down windows), and
    # how many replicas over need the prior may hold.
    burst_prior: float = Field(default=1.0, ge=1)
    burst_max_factor: float = Field(default=8.0, ge=1)
    burst_memory_s: float | None = Field(default=None, ge=0)
    quiet_window_s: float | None = Field(default=None, gt=0)
    reserve_max_replicas: int = Field(default=1, ge=0)
    burst_prior_now: float = Field(default=1.0, ge=1)  # burst over the demand now (1: none)
    # Learned utilisation (core/autoscale_learn.py): the ceiling the planned fraction of
    # modelled capacity may rise to from target_utilisation (None: never rises), and its step.
    max_utilisation: float | None = Field(default=2.0, gt=0, le=MAX_UTILISATION)
    utilisation_step: float = Field(default=0.02, gt=0)
    # Burst episodes (core/autoscale_burst.py): the length a burst is expected to last before
    # one is seen (None: unknown, bought for as usual), and how long a replica bought during
    # one must serve it (None: its cold start).
    burst_length_s: float | None = Field(default=None, ge=0)
    burst_min_serve_s: float | None = Field(default=None, ge=0)
    # The queue wait a burst may build before the SLO breaks (the TTFT budget): the reserve
    # keeps only the capacity that holds it there until a replica bought for the burst
    # serves (core/autoscale_absorb.py; None: the whole burst).
    burst_slo_wait_s: float | None = Field(default=None, ge=0)
    # Per GPU type: one replica's throughput, cold start and price as deployed (GPU types
    # left out, and fields left out, come from the emulated profile, which must then exist).
    replica: Mapping[str, GpuReplicaConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> PoolScaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        if max(self.burst_prior, self.burst_prior_now) > self.burst_max_factor:
            raise ValueError("burst_prior and burst_prior_now must be <= burst_max_factor")
        unknown = sorted(set(self.replica) - set(self.gpus))
        if unknown:
            raise ValueError(f"replica: GPU types {unknown} are not in gpus {list(self.gpus)}")
        for gpu in self.gpus:
            spec = self.replica.get(gpu)
            if spec is None or not spec.complete:
                _require_profile(self.model, gpu)
        return self

    def option(self, gpu: str, time_scale: float) -> GpuOption:
        """One replica on ``gpu``: the given values, the rest from the engine profile."""
        from inferplane.core.autoscaler import GpuOption

        spec = self.replica.get(gpu, GpuReplicaConfig())
        tokens, cold, price = spec.tokens_per_s, spec.cold_start_s, spec.price_per_hour_usd
        if tokens is None or cold is None or price is None:
            from inferplane.engine.sizing import gpu_option

            modelled = gpu_option(self.model, gpu, time_scale=time_scale)
            tokens = modelled.tokens_per_s if tokens is None else tokens
            cold = modelled.cold_start_s if cold is None else cold
            price = modelled.price_per_hour_usd if price is None else price
        return GpuOption(gpu=gpu, price_per_hour_usd=price, tokens_per_s=tokens, cold_start_s=cold)


def _require_profile(model: str, gpu: str) -> None:
    """A clear error when the replica values must come from an emulated profile there is not."""
    from inferplane.engine.profiles import load_profile

    try:
        load_profile(model, gpu)
    except ValueError as exc:
        raise ValueError(
            f"no emulated profile for {model!r} on {gpu!r} ({exc}); give "
            f"replica.{gpu}: tokens_per_s, cold_start_s and price_per_hour_usd"
        ) from None


class LearnedStoreKind(StrEnum):
    """Where the autoscaler keeps what it learned across restarts."""

    MEMORY = "memory"
    FILE = "file"
    REDIS = "redis"


class AutoscaleConfig(_Frozen):
    """The ``autoscale`` section: off by default."""

    enabled: bool = False
    tick_s: float = Field(default=15.0, gt=0)
    time_scale: float = Field(default=1.0, gt=0)  # the emulated engines' (sizing): slow-down
    pools: tuple[PoolScaleConfig, ...] = ()
    # Where the loop keeps what it learned (learned utilisation, burst length) so that a
    # restart does not forget (gateway/autoscale_store.py): memory (forgotten), file (at
    # state_path) or redis (the state section's Redis, which must then be the backend).
    learned_store: LearnedStoreKind = LearnedStoreKind.MEMORY
    state_path: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _store(self) -> AutoscaleConfig:
        if (self.learned_store is LearnedStoreKind.FILE) != (self.state_path is not None):
            raise ValueError("learned_store: file needs state_path, and state_path needs it")
        return self

    def policies(self) -> list[PoolPolicy]:
        """The core's pool policies, GPU options from ``replica`` or the engine profiles."""
        from inferplane.core.autoscaler import PoolPolicy

        return [
            PoolPolicy(
                pool=p.model,
                options=tuple(p.option(g, self.time_scale) for g in p.gpus),
                min_replicas=p.min_replicas,
                max_replicas=p.max_replicas,
                target_utilisation=p.target_utilisation,
                scale_down_window_s=p.scale_down_window_s,
                scale_down_cooldown_s=p.scale_down_cooldown_s,
                tick_s=self.tick_s,
                burst_prior=p.burst_prior,
                burst_max_factor=p.burst_max_factor,
                burst_memory_s=p.burst_memory_s,
                quiet_window_s=p.quiet_window_s,
                reserve_max_replicas=p.reserve_max_replicas,
                max_utilisation=p.max_utilisation,
                utilisation_step=p.utilisation_step,
                burst_prior_now=p.burst_prior_now,
                burst_length_s=p.burst_length_s,
                burst_min_serve_s=p.burst_min_serve_s,
                burst_slo_wait_s=p.burst_slo_wait_s,
            )
            for p in self.pools
        ]
