"""The breaker's values: its states, what triggers a transition, its config, an attempt's
outcome and a transition event (split from :mod:`inferplane.core.breaker`, which
re-exports them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferplane.core.retry import FailureKind


class BreakerState(enum.Enum):
    CLOSED = "closed"  # takes traffic
    OPEN = "open"  # ejected until its ejection expires
    HALF_OPEN = "half_open"  # probing: a few requests at a time decide its return


class Trigger(enum.Enum):
    """What caused a breaker event."""

    CONSECUTIVE_FAILURES = "consecutive_failures"
    FAILURE_RATE = "failure_rate"
    LATENCY_OUTLIER = "latency_outlier"
    EJECTION_EXPIRED = "ejection_expired"
    PROBE_FAILED = "probe_failed"
    PROBES_PASSED = "probes_passed"
    CAP_REACHED = "cap_reached"  # an ejection was due but the pool's cap refused it


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    consecutive_failures: int = 5
    failure_rate: float = 0.5
    failure_window_s: float = 30.0
    min_requests: int = 10
    latency_ratio: float = 3.0  # x the pool's median observed/predicted ratio
    latency_min_ratio: float = 1.5  # and at least this far above its own prediction
    latency_min_samples: int = 3  # per endpoint, within the window
    latency_recent_samples: int = 3  # an endpoint's median is over its latest samples
    latency_min_peers: int = 3  # endpoints with enough samples to form a pool median
    latency_window_s: float = 30.0
    latency_max_samples: int = 64
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejected_share: float = 0.1
    probe_successes: int = 3
    probe_concurrency: int = 1
    forgive_after_s: float = 300.0

    def __post_init__(self) -> None:
        counts = (self.consecutive_failures, self.min_requests, self.latency_min_samples)
        if min(counts) < 1 or self.latency_min_peers < 2 or self.latency_max_samples < 1:
            raise ValueError("breaker counts must be >= 1 (latency_min_peers >= 2)")
        if not 0 < self.failure_rate <= 1 or not 0 <= self.max_ejected_share <= 1:
            raise ValueError("failure_rate must be in (0, 1], max_ejected_share in [0, 1]")
        if min(self.failure_window_s, self.latency_window_s, self.base_ejection_s) <= 0:
            raise ValueError("breaker windows and base_ejection_s must be > 0")
        if self.max_ejection_s < self.base_ejection_s or self.forgive_after_s <= 0:
            raise ValueError("max_ejection_s must be >= base_ejection_s, forgive_after_s > 0")
        if self.probe_successes < 1 or self.probe_concurrency < 1 or self.latency_ratio <= 1:
            raise ValueError("probe counts must be >= 1 and latency_ratio > 1")
        recent = self.latency_recent_samples
        if not self.latency_min_samples <= recent <= self.latency_max_samples:
            raise ValueError("need latency_min_samples <= recent_samples <= max_samples")


@dataclass(frozen=True, slots=True, init=False)
class Outcome:
    """One finished attempt on an endpoint: its failure (None: success) and latencies.

    ``predicted_*`` are the predictions made at dispatch (uncalibrated); without them the
    latencies are not used for outlier detection.
    """

    failure: FailureKind | None = None
    ttft_s: float | None = None
    predicted_ttft_s: float | None = None
    tbt_s: float | None = None  # time between tokens of the attempt (stalls trimmed)
    predicted_tbt_s: float | None = None

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        failure: FailureKind | None = None,
        ttft_s: float | None = None,
        predicted_ttft_s: float | None = None,
        tbt_s: float | None = None,
        predicted_tbt_s: float | None = None,
    ) -> None:
        object.__setattr__(self, "failure", failure)
        object.__setattr__(self, "ttft_s", ttft_s)
        object.__setattr__(self, "predicted_ttft_s", predicted_ttft_s)
        object.__setattr__(self, "tbt_s", tbt_s)
        object.__setattr__(self, "predicted_tbt_s", predicted_tbt_s)


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    endpoint: str
    before: BreakerState
    after: BreakerState
    trigger: Trigger
    reason: str
    until_s: float | None = None  # when the ejection ends (OPEN only)
