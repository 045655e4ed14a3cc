"""Outlier detection and circuit breaking, per endpoint, with a cap per pool.

A GPU that dies is easy to notice; one that degrades keeps answering, slowly, and a
router that only counts errors keeps feeding it while its queue and the client timeouts
grow. So an endpoint is ejected (its breaker opens) on any of:

* ``consecutive_failures`` counted failures in a row (Envoy's consecutive 5xx);
* a failure rate of at least ``failure_rate`` over ``failure_window_s`` with at least
  ``min_requests`` outcomes;
* a latency outlier: the median observed/predicted TTFT (or time between tokens) of its
  ``latency_recent_samples`` most recent samples (at least ``latency_min_samples`` within
  ``latency_window_s``) is ``latency_ratio`` times the pool's median of the same ratio, and
  at least ``latency_min_ratio``. Only the recent samples count, so a GPU that degrades is
  not outvoted by its own healthy past (routing sends it little once the predictor learns,
  so fresh samples are few). Dividing by the prediction made at dispatch (the predictor's
  *uncalibrated* ``raw_ttft_s`` / ``raw_tpot_s``, which do not absorb the slowness) makes a
  busy endpoint's long TTFT expected, a degraded one's not. Latencies count whatever ended
  the attempt (a client that gave up on a slow stream measured it too), and ``observe``
  takes evidence from attempts still running (one overdue by a given ratio).

Only failures the endpoint caused count: a 4xx caused by the request (prompt too long, bad
JSON), a client that went away, or a 429 (load, which routing and throttling handle) never
do. An ejection lasts ``base_ejection_s`` x times ejected, capped at ``max_ejection_s``;
each ``forgive_after_s`` of good behaviour takes one off the count. At most
``max_ejected_share`` of a pool (at least one endpoint) is out at once: past that,
ejection is refused and said so. When the ejection expires the breaker is half-open:
``probe_concurrency`` requests at a time are let through; ``probe_successes`` good ones
close it, one bad one (an error, or still a latency outlier) opens it again for longer.

Time-driven transitions (ejection expiry, latency sweeps, forgiveness) happen in
``sweep(now)``, which the bodies call on a fixed interval (Envoy sweeps every 10 s); outcome
-driven ones in ``record``. Both return the transitions as events with reasons.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from inferplane.core.retry import FailureKind
from inferplane.core.throttle import SlidingCounter
from inferplane.core.types import EndpointState, EndpointView

__all__ = [
    "BreakerBoard",
    "BreakerConfig",
    "BreakerEvent",
    "BreakerState",
    "Outcome",
    "Trigger",
]


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


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished attempt on an endpoint: its failure (None: success) and latencies.

    ``predicted_*`` are the predictions made at dispatch (uncalibrated); without them the
    latencies are not used for outlier detection.
    """

    failure: FailureKind | None = None
    ttft_s: float | None = None
    predicted_ttft_s: float | None = None
    tbt_s: float | None = None  # mean time between tokens of the attempt
    predicted_tbt_s: float | None = None


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    endpoint: str
    before: BreakerState
    after: BreakerState
    trigger: Trigger
    reason: str
    until_s: float | None = None  # when the ejection ends (OPEN only)


_OK, _FAIL = 0, 1
_METRICS = ("TTFT", "TBT")


@dataclass(slots=True)
class _Breaker:
    """One endpoint's mutable breaker record (owned by the board)."""

    pool: str
    counts: SlidingCounter  # (ok, failed) over the failure window
    ratios: tuple[deque[tuple[float, float]], deque[tuple[float, float]]]  # (t, TTFT/TBT ratio)
    state: BreakerState = BreakerState.CLOSED
    since_s: float = 0.0
    until_s: float = 0.0
    consecutive: int = 0
    times_ejected: int = 0
    quiet_since_s: float = 0.0
    probes_in_flight: int = 0
    probe_ok: int = 0

    @classmethod
    def new(cls, pool: str, cfg: BreakerConfig) -> _Breaker:
        n = cfg.latency_max_samples
        return cls(
            pool, SlidingCounter(cfg.failure_window_s, 2), (deque(maxlen=n), deque(maxlen=n))
        )

    def reset_signals(self) -> None:
        self.consecutive = 0
        self.counts.clear()
        for samples in self.ratios:
            samples.clear()

    def median_ratio(self, metric: int, now: float, cfg: BreakerConfig) -> float | None:
        samples = self.ratios[metric]
        while samples and samples[0][0] < now - cfg.latency_window_s:
            samples.popleft()
        if len(samples) < cfg.latency_min_samples:
            return None
        return statistics.median(
            r for _, r in islice(reversed(samples), cfg.latency_recent_samples)
        )


def _ratio(observed_s: float | None, predicted_s: float | None) -> float | None:
    if observed_s is None or predicted_s is None or predicted_s <= 0:
        return None
    ratio = observed_s / predicted_s
    return ratio if math.isfinite(ratio) and ratio >= 0 else None


def _ratios(outcome: Outcome) -> tuple[float | None, float | None]:
    """Observed over predicted, for TTFT and TBT (None where either is missing)."""
    return (
        _ratio(outcome.ttft_s, outcome.predicted_ttft_s),
        _ratio(outcome.tbt_s, outcome.predicted_tbt_s),
    )


class BreakerBoard:
    """The breakers of every endpoint, grouped in pools for the ejection cap."""

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self._cfg = config or BreakerConfig()
        self._breakers: dict[str, _Breaker] = {}

    @property
    def config(self) -> BreakerConfig:
        return self._cfg

    def register(self, endpoint: str, pool: str = "") -> None:
        """Add an endpoint (idempotent; a changed pool is updated)."""
        self._get(endpoint, pool).pool = pool

    def remove(self, endpoint: str) -> None:
        self._breakers.pop(endpoint, None)

    def state(self, endpoint: str) -> BreakerState:
        b = self._breakers.get(endpoint)
        return BreakerState.CLOSED if b is None else b.state

    def times_ejected(self, endpoint: str) -> int:
        b = self._breakers.get(endpoint)
        return 0 if b is None else b.times_ejected

    def ejected(self, pool: str) -> tuple[int, int]:
        """(endpoints not closed, endpoints) in ``pool``."""
        members = [b for b in self._breakers.values() if b.pool == pool]
        return sum(b.state is not BreakerState.CLOSED for b in members), len(members)

    def max_ejected(self, pool: str) -> int:
        """How many endpoints of ``pool`` may be out at once (at least one)."""
        size = self.ejected(pool)[1]
        return max(1, math.floor(self._cfg.max_ejected_share * size + 1e-9))

    def overlay(self, views: Sequence[EndpointView]) -> list[EndpointView]:
        """The views routing should see: ejected endpoints, and half-open ones whose
        probe slots are taken, marked EJECTED (routing filters them out)."""
        out: list[EndpointView] = []
        for view in views:
            b = self._breakers.get(view.name)
            if b is not None and view.state.accepts_work and not self._admits(b):
                view = dataclasses.replace(
                    view, state=EndpointState.EJECTED, state_since_s=b.since_s
                )
            out.append(view)
        return out

    def _admits(self, b: _Breaker) -> bool:
        if b.state is BreakerState.OPEN:
            return False
        return b.state is BreakerState.CLOSED or b.probes_in_flight < self._cfg.probe_concurrency

    def on_dispatch(self, endpoint: str) -> None:
        """An attempt was sent to ``endpoint``: it takes a probe slot when half-open."""
        b = self._breakers.get(endpoint)
        if b is not None and b.state is BreakerState.HALF_OPEN:
            b.probes_in_flight += 1

    def record(self, endpoint: str, outcome: Outcome, now: float) -> list[BreakerEvent]:
        """Count one finished attempt; returns the transitions it caused."""
        b = self._get(endpoint)
        if b.state is BreakerState.HALF_OPEN:
            b.probes_in_flight = max(0, b.probes_in_flight - 1)
        if b.state is BreakerState.OPEN:
            return []  # late answers from before the ejection
        failure = outcome.failure
        counted = failure is None or failure.counts_against_endpoint
        if b.state is BreakerState.HALF_OPEN:
            return self._probe_result(endpoint, b, outcome, now, counted=counted)
        self._add_samples(b, outcome, now)  # latencies count however the attempt ended
        if not counted:
            return []  # the request's fault, the client's, or load: not the endpoint's
        if failure is None:
            b.consecutive = 0
            b.counts.add(now, _OK)
            return []
        b.consecutive += 1
        b.counts.add(now, _FAIL)
        return self._check_failures(endpoint, b, now)

    def observe_overdue(self, endpoint: str, ratio: float, now: float) -> list[BreakerEvent]:
        """An attempt still running on ``endpoint`` has taken ``ratio`` x its predicted
        duration already: a lower bound on its slowness, counted as one time-between-tokens
        sample (a probe that overdue fails at once). Call it once per attempt."""
        b = self._get(endpoint)
        outcome = Outcome(tbt_s=ratio, predicted_tbt_s=1.0)
        if b.state is BreakerState.HALF_OPEN:
            return self._probe_result(endpoint, b, outcome, now, counted=False)
        if b.state is BreakerState.CLOSED:
            self._add_samples(b, outcome, now)
        return []

    def latency_limit(self, endpoint: str, now: float) -> float:
        """The observed/predicted ratio above which an attempt on ``endpoint`` is slow now
        (against its pool's median time between tokens, or its prediction without peers)."""
        b = self._breakers.get(endpoint)
        pool = None if b is None else self._pool_median(b.pool, 1, now)
        return self._limit(1.0 if pool is None else pool)

    def _get(self, endpoint: str, pool: str = "") -> _Breaker:
        b = self._breakers.get(endpoint)
        if b is None:
            b = self._breakers[endpoint] = _Breaker.new(pool, self._cfg)
        return b

    def _add_samples(self, b: _Breaker, outcome: Outcome, now: float) -> None:
        for samples, ratio in zip(b.ratios, _ratios(outcome), strict=True):
            if ratio is not None:
                samples.append((now, ratio))

    def _check_failures(self, endpoint: str, b: _Breaker, now: float) -> list[BreakerEvent]:
        cfg = self._cfg
        if b.consecutive >= cfg.consecutive_failures:
            why = f"{b.consecutive} consecutive failures"
            return [self._eject(endpoint, b, now, Trigger.CONSECUTIVE_FAILURES, why)]
        ok, failed = b.counts.totals(now)
        total = ok + failed
        if total >= cfg.min_requests and failed / total >= cfg.failure_rate:
            why = f"{failed:.0f} of {total:.0f} failed in {cfg.failure_window_s:g}s"
            return [self._eject(endpoint, b, now, Trigger.FAILURE_RATE, why)]
        return []

    def _probe_result(
        self, endpoint: str, b: _Breaker, outcome: Outcome, now: float, *, counted: bool = True
    ) -> list[BreakerEvent]:
        """A probe's outcome; one not counted (cancelled, still running) fails only if slow."""
        slow = self._outlier_reason(b, outcome, now)
        failed = outcome.failure if counted else None
        if failed is not None or slow is not None:
            why = f"probe slow: {slow}" if slow else f"probe {failed.value if failed else ''}"
            return [self._open(endpoint, b, now, Trigger.PROBE_FAILED, why)]
        if not counted:
            return []
        b.probe_ok += 1
        if b.probe_ok < self._cfg.probe_successes:
            return []
        b.state, b.since_s, b.quiet_since_s = BreakerState.CLOSED, now, now
        b.reset_signals()
        why = f"{b.probe_ok} probes passed"
        return [BreakerEvent(endpoint, BreakerState.HALF_OPEN, b.state, Trigger.PROBES_PASSED, why)]

    def _outlier_reason(self, b: _Breaker, outcome: Outcome, now: float) -> str | None:
        """Why this single outcome is still a latency outlier against its pool, if it is."""
        for metric, ratio in enumerate(_ratios(outcome)):
            if ratio is None:
                continue
            pool = self._pool_median(b.pool, metric, now)
            pool = 1.0 if pool is None else pool  # no fresh peers: as predicted
            if ratio >= self._limit(pool):
                return f"{_METRICS[metric]} {ratio:.2f}x predicted vs pool {pool:.2f}x"
        return None

    def _limit(self, pool_median: float) -> float:
        return max(self._cfg.latency_min_ratio, self._cfg.latency_ratio * pool_median)

    def _pool_median(self, pool: str, metric: int, now: float) -> float | None:
        medians = self._medians(pool, metric, now)
        if len(medians) < self._cfg.latency_min_peers:
            return None
        return statistics.median(medians.values())

    def _medians(self, pool: str, metric: int, now: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, b in self._breakers.items():
            if b.pool == pool and b.state is BreakerState.CLOSED:
                m = b.median_ratio(metric, now, self._cfg)
                if m is not None:
                    out[name] = m
        return out

    def _eject(
        self, endpoint: str, b: _Breaker, now: float, trigger: Trigger, why: str
    ) -> BreakerEvent:
        """Open a closed breaker, unless the pool's cap is reached."""
        out, size = self.ejected(b.pool)
        cap = self.max_ejected(b.pool)
        if out >= cap:
            b.consecutive = 0  # wait for fresh evidence before asking again
            why = f"{why}; not ejected: {out} of {size} already out (cap {cap})"
            return BreakerEvent(endpoint, b.state, b.state, Trigger.CAP_REACHED, why)
        return self._open(endpoint, b, now, trigger, why)

    def _open(
        self, endpoint: str, b: _Breaker, now: float, trigger: Trigger, why: str
    ) -> BreakerEvent:
        cfg = self._cfg
        before = b.state
        b.times_ejected += 1
        duration = min(cfg.max_ejection_s, cfg.base_ejection_s * b.times_ejected)
        b.state, b.since_s, b.until_s = BreakerState.OPEN, now, now + duration
        b.probes_in_flight = b.probe_ok = 0
        b.reset_signals()
        why = f"{why}; ejected {duration:g}s (time {b.times_ejected})"
        return BreakerEvent(endpoint, before, b.state, trigger, why, b.until_s)

    def sweep(self, now: float) -> list[BreakerEvent]:
        """Time-driven transitions: expired ejections, forgiveness, latency outliers."""
        events: list[BreakerEvent] = []
        for name, b in self._breakers.items():
            if b.state is BreakerState.OPEN and now >= b.until_s:
                b.state, b.since_s = BreakerState.HALF_OPEN, now
                why = f"ejection of {self._duration(b):g}s over: probing"
                events.append(
                    BreakerEvent(name, BreakerState.OPEN, b.state, Trigger.EJECTION_EXPIRED, why)
                )
            elif b.state is BreakerState.CLOSED and b.times_ejected > 0:
                self._forgive(b, now)
        for pool in sorted({b.pool for b in self._breakers.values()}):
            events.extend(self._sweep_latency(pool, now))
        return events

    def _forgive(self, b: _Breaker, now: float) -> None:
        """Each quiet ``forgive_after_s`` takes one off the ejection count."""
        if now - b.quiet_since_s >= self._cfg.forgive_after_s:
            b.times_ejected -= 1
            b.quiet_since_s = now

    def _duration(self, b: _Breaker) -> float:
        return min(self._cfg.max_ejection_s, self._cfg.base_ejection_s * b.times_ejected)

    def _sweep_latency(self, pool: str, now: float) -> list[BreakerEvent]:
        worst: dict[str, tuple[float, str]] = {}
        for metric, label in enumerate(_METRICS):
            medians = self._medians(pool, metric, now)
            if len(medians) < self._cfg.latency_min_peers:
                continue
            pool_median = statistics.median(medians.values())
            for name, ratio in medians.items():
                excess = ratio / max(pool_median, 1e-12)
                if ratio >= self._limit(pool_median) and excess > worst.get(name, (0.0, ""))[0]:
                    why = f"{label} {ratio:.2f}x predicted vs pool median {pool_median:.2f}x"
                    worst[name] = (excess, why)
        events: list[BreakerEvent] = []
        for name in sorted(worst, key=lambda n: (-worst[n][0], n)):
            b = self._breakers[name]
            events.append(self._eject(name, b, now, Trigger.LATENCY_OUTLIER, worst[name][1]))
        return events
