"""Client-side adaptive throttling and hedging: saying no early, and asking twice on time.

When the engines behind a pool start refusing or failing work, sending them more only
deepens their queues and the timeouts that follow. Google SRE's client-side adaptive
throttling rejects locally instead, with probability

    max(0, (requests - K * accepts) / (requests + 1))

over a sliding window (K = 2, about two minutes, REFERENCE §4): while the backends accept
at least half of what is sent nothing is rejected; as acceptance falls the gateway sheds a
growing share at once, with ``Retry-After``, instead of letting the calls time out.
``requests`` counts every call that consulted the throttle, including those it rejected,
so the probability decays as soon as the backends recover.

Hedging: a critical call that has not produced its first token by the predicted p95 TTFT
gets a second attempt elsewhere; the first token wins and the loser is cancelled. The TTFT
it starts from (``hedge_ttft_s``) is the uncalibrated prediction on the attempt's endpoint
scaled by the pool's median calibration factor: a fleet slower than its profile everywhere
waits longer, one degraded engine (whose own factor absorbs its slowness) does not.

Pure: ``now`` and a seeded ``random.Random`` are passed in; counts live in fixed-width time
buckets, so memory is bounded by the window, not by the traffic.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from inferplane.core.types import PriorityClass

__all__ = [
    "AdaptiveThrottle",
    "HedgeConfig",
    "HedgeDecision",
    "SlidingCounter",
    "ThrottleConfig",
    "ThrottleDecision",
    "hedge_after_s",
    "hedge_ttft_s",
    "should_hedge",
]


class SlidingCounter:
    """Sums of a few named counts over the last ``window_s`` seconds, in time buckets.

    Buckets are ``window_s / num_buckets`` wide, so a count leaves the window up to one
    bucket late; time that goes backwards is treated as the newest bucket.
    """

    __slots__ = ("_bucket_s", "_buckets", "_num_fields", "_window_s")

    def __init__(self, window_s: float, num_fields: int, num_buckets: int = 20) -> None:
        if window_s <= 0 or num_buckets < 1 or num_fields < 1:
            raise ValueError("window_s must be > 0, num_buckets and num_fields >= 1")
        self._window_s = window_s
        self._bucket_s = window_s / num_buckets
        self._num_fields = num_fields
        self._buckets: deque[tuple[int, list[float]]] = deque()

    def add(self, now: float, field_index: int, amount: float = 1.0) -> None:
        key = math.floor(now / self._bucket_s)
        if not self._buckets or key > self._buckets[-1][0]:
            self._buckets.append((key, [0.0] * self._num_fields))
        self._buckets[-1][1][field_index] += amount
        self._expire(now)

    def totals(self, now: float) -> tuple[float, ...]:
        """Each field's sum over the window ending at ``now``."""
        self._expire(now)
        sums = [0.0] * self._num_fields
        for _, counts in self._buckets:
            for i, value in enumerate(counts):
                sums[i] += value
        return tuple(sums)

    def clear(self) -> None:
        self._buckets.clear()

    def _expire(self, now: float) -> None:
        oldest = math.floor((now - self._window_s) / self._bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()


@dataclass(frozen=True, slots=True)
class ThrottleConfig:
    """SRE adaptive throttling (REFERENCE §4)."""

    k: float = 2.0  # accepts are multiplied by this: 2 tolerates 50% refusals before shedding
    window_s: float = 120.0
    min_retry_after_s: float = 1.0  # Retry-After when barely throttling
    max_retry_after_s: float = 10.0  # Retry-After when rejecting almost everything

    def __post_init__(self) -> None:
        if self.k < 1 or self.window_s <= 0:
            raise ValueError("throttle k must be >= 1 and window_s > 0")
        if not 0 < self.min_retry_after_s <= self.max_retry_after_s:
            raise ValueError("need 0 < min_retry_after_s <= max_retry_after_s")


@dataclass(frozen=True, slots=True)
class ThrottleDecision:
    """Whether to reject locally, with what probability it was drawn, and why."""

    reject: bool
    probability: float
    retry_after_s: float | None
    reason: str


_REQUESTS, _ACCEPTS = 0, 1


class AdaptiveThrottle:
    """One throttle per protected backend set (e.g. per pool).

    ``admit(now, rng)`` before sending (it counts the request), ``record_accept(now)`` when
    the backend accepted it (answered, even with an error caused by the request; not when it
    refused for overload, failed or timed out).
    """

    __slots__ = ("_cfg", "_counts")

    def __init__(self, config: ThrottleConfig | None = None) -> None:
        self._cfg = config or ThrottleConfig()
        self._counts = SlidingCounter(self._cfg.window_s, 2)

    def probability(self, now: float) -> float:
        """The current local-rejection probability, in [0, 1)."""
        requests, accepts = self._counts.totals(now)
        return max(0.0, (requests - self._cfg.k * accepts) / (requests + 1.0))

    def admit(self, now: float, rng: random.Random) -> ThrottleDecision:
        """Draw whether this request is sent or rejected locally; counts it either way."""
        p = self.probability(now)
        self._counts.add(now, _REQUESTS)
        if p <= 0.0:
            return ThrottleDecision(False, 0.0, None, "backends accept enough")
        if rng.random() >= p:
            return ThrottleDecision(False, p, None, f"sent despite throttling p={p:.2f}")
        cfg = self._cfg
        retry_after = cfg.min_retry_after_s + p * (cfg.max_retry_after_s - cfg.min_retry_after_s)
        return ThrottleDecision(True, p, retry_after, f"backends overloaded: rejected p={p:.2f}")

    def record_accept(self, now: float) -> None:
        self._counts.add(now, _ACCEPTS)

    def totals(self, now: float) -> tuple[int, int]:
        """(requests, accepts) in the window."""
        requests, accepts = self._counts.totals(now)
        return int(requests), int(accepts)


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    """Hedging for latency-critical classes (at most ``max_hedges`` extra attempts)."""

    classes: Collection[PriorityClass] = (PriorityClass.CRITICAL,)
    max_hedges: int = 1
    min_delay_s: float = 0.05  # never hedge sooner: a tiny prediction is not a signal
    default_delay_s: float = 1.0  # when there is no prediction
    p95_over_mean: float = 1.0  # multiply a mean TTFT prediction by this to get a p95

    def __post_init__(self) -> None:
        if self.max_hedges < 0 or self.min_delay_s < 0 or self.p95_over_mean <= 0:
            raise ValueError("hedge limits must be non-negative and p95_over_mean > 0")
        if self.default_delay_s < self.min_delay_s:
            raise ValueError("default_delay_s must be >= min_delay_s")


@dataclass(frozen=True, slots=True)
class HedgeDecision:
    hedge: bool
    reason: str


def hedge_ttft_s(raw_ttft_s: float | None, pool_factors: Collection[float]) -> float | None:
    """The typical TTFT to hedge against: ``raw_ttft_s`` (the predictor's uncalibrated TTFT
    on the attempt's endpoint) times the median of the pool's TTFT calibration factors."""
    if raw_ttft_s is None:
        return None
    factors = sorted(pool_factors)
    return raw_ttft_s * (factors[len(factors) // 2] if factors else 1.0)


def hedge_after_s(
    priority: PriorityClass, predicted_ttft_s: float | None, config: HedgeConfig
) -> float | None:
    """Seconds after the first attempt starts at which to hedge; None: never hedge this call."""
    if priority not in config.classes or config.max_hedges == 0:
        return None
    if predicted_ttft_s is None or not math.isfinite(predicted_ttft_s):
        return config.default_delay_s
    return max(config.min_delay_s, predicted_ttft_s * config.p95_over_mean)


def should_hedge(
    priority: PriorityClass,
    started_s: float,
    now: float,
    predicted_ttft_s: float | None,
    *,
    first_token_seen: bool,
    hedges_sent: int,
    config: HedgeConfig,
) -> HedgeDecision:
    """Send a second attempt now? Only a hedged class, before its first token, past the
    predicted p95 TTFT, within ``max_hedges``. (The retry budget is checked by the caller.)
    """
    delay = hedge_after_s(priority, predicted_ttft_s, config)
    if delay is None:
        return HedgeDecision(False, f"class {priority.value} is not hedged")
    if first_token_seen:
        return HedgeDecision(False, "first token already arrived")
    if hedges_sent >= config.max_hedges:
        return HedgeDecision(False, f"already hedged {hedges_sent} time(s)")
    waited = now - started_s
    if waited < delay:
        return HedgeDecision(False, f"waited {waited:.3f}s of {delay:.3f}s")
    return HedgeDecision(True, f"no first token after {waited:.3f}s (p95 TTFT {delay:.3f}s)")
