"""Configuration of the gateway's reliability layer: breakers, retries, resumption, throttling.

Frozen pydantic models with defaults that are on, so a fleet config without a
``reliability`` section gets outlier ejection, a retry budget and stream resumption. Each
section turns into the pure core's own config value (``to_core``); ``enabled: false`` on a
section gives the plain behaviour of a gateway without it (every failure before the first
byte retried on the next ranked endpoint, no ejection, no resumption, no hedging).
Hedging is on for critical calls only; other classes are added in ``hedge.classes``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplane.core.breaker import BreakerConfig
from inferplane.core.retry import RetryConfig
from inferplane.core.throttle import HedgeConfig, ThrottleConfig
from inferplane.core.types import PriorityClass

__all__ = [
    "BreakerSection",
    "HedgeSection",
    "ReliabilityConfig",
    "ResumptionSection",
    "RetrySection",
    "ThrottleSection",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BreakerSection(_Frozen):
    """Outlier detection (see ``inferplane.core.breaker``)."""

    enabled: bool = True
    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    failure_window_s: float = Field(default=30.0, gt=0)
    min_requests: int = Field(default=10, ge=1)
    latency_ratio: float = Field(default=3.0, gt=1)
    latency_min_ratio: float = Field(default=1.5, gt=0)
    latency_min_samples: int = Field(default=3, ge=1)
    latency_recent_samples: int = Field(default=3, ge=1)
    latency_window_s: float = Field(default=30.0, gt=0)
    base_ejection_s: float = Field(default=30.0, gt=0)
    max_ejection_s: float = Field(default=300.0, gt=0)
    #: Envoy's max_ejection_percent (10%, at least one endpoint): 1 of an 8-engine pool.
    max_ejected_share: float = Field(default=0.1, ge=0, le=1)
    probe_successes: int = Field(default=3, ge=1)
    forgive_after_s: float = Field(default=300.0, gt=0)
    sweep_interval_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> BreakerSection:
        self.to_core()  # the core checks the fields against each other (ValueError)
        return self

    def to_core(self) -> BreakerConfig:
        fields = self.model_dump(exclude={"enabled", "sweep_interval_s"})
        return BreakerConfig(**fields)


class RetrySection(_Frozen):
    """The retry budget (Envoy semantics) and each workflow's allowance."""

    enabled: bool = True
    budget_ratio: float = Field(default=0.2, ge=0)
    min_concurrent_retries: int = Field(default=3, ge=0)
    max_attempts: int = Field(default=3, ge=1)
    workflow_ratio: float = Field(default=0.2, ge=0)
    workflow_min_retries: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.025, ge=0)
    backoff_cap_s: float = Field(default=0.25, ge=0)

    def to_core(self) -> RetryConfig:
        return RetryConfig(**self.model_dump(exclude={"enabled"}))


class ResumptionSection(_Frozen):
    """Stream resumption on another endpoint after a break."""

    enabled: bool = True
    max_resumptions: int = Field(default=2, ge=0)
    #: A stream with no event for this long is broken (None: ``timeouts.inter_token_s``).
    stall_timeout_s: float | None = Field(default=None, gt=0)


class ThrottleSection(_Frozen):
    """Client-side adaptive throttling per pool (off by default: admission sheds load)."""

    enabled: bool = False
    k: float = Field(default=2.0, ge=1)
    window_s: float = Field(default=120.0, gt=0)

    def to_core(self) -> ThrottleConfig:
        return ThrottleConfig(k=self.k, window_s=self.window_s)


class HedgeSection(_Frozen):
    """Hedging: a second attempt elsewhere when the first has no token by its p95 TTFT.

    In ``bench/cascade.py`` it fired rarely (0 to 40 hedges in ~570 critical calls) and
    never paid off: the TTFT tail there is queueing on every engine (a hedge queues too)
    or the slowed engine, which outlier ejection removes. So it is off by default: turn it
    on (``reliability: {hedge: {enabled: true}}``) where the TTFT tail comes from single
    slow replicas rather than fleet-wide queueing.
    """

    enabled: bool = False
    classes: tuple[PriorityClass, ...] = (PriorityClass.CRITICAL,)
    max_hedges: int = Field(default=1, ge=0, le=3)
    min_delay_s: float = Field(default=0.05, ge=0)
    #: The delay when no prediction is available (no predictor).
    default_delay_s: float = Field(default=1.0, ge=0)
    #: The predictor gives a typical TTFT; this factor turns it into a p95 (queueing
    #: delays are skewed: the 95th percentile of an exponential wait is 3x its mean).
    p95_over_mean: float = Field(default=3.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> HedgeSection:
        self.to_core()
        return self

    def to_core(self) -> HedgeConfig:
        return HedgeConfig(
            classes=frozenset(self.classes), max_hedges=self.max_hedges,
            min_delay_s=self.min_delay_s, default_delay_s=self.default_delay_s,
            p95_over_mean=self.p95_over_mean,
        )  # fmt: skip


class ReliabilityConfig(_Frozen):
    """The ``reliability`` section of a fleet config."""

    breaker: BreakerSection = BreakerSection()
    retry: RetrySection = RetrySection()
    resumption: ResumptionSection = ResumptionSection()
    throttle: ThrottleSection = ThrottleSection()
    hedge: HedgeSection = HedgeSection()
    seed: int = 0
