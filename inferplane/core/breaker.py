"""Outlier detection and circuit breaking, per endpoint, with a cap per pool.

A GPU that dies is easy to notice; one that degrades keeps answering, slowly, and a
router that only counts errors keeps feeding it while its queue and the client timeouts
grow. So an endpoint is ejected (its breaker opens) on any of:

* ``consecutive_failures`` counted failures in a row (Envoy's consecutive 5xx);
* a failure rate of at least ``failure_rate`` over ``failure_window_s`` with at least
  ``min_requests`` outcomes;
* a latency outlier (:mod:`inferplane.core.latency_outliers`): over its
  ``latency_recent_samples`` most recent samples (at least ``latency_min_samples`` within
  ``latency_window_s``), TTFT (or time between tokens) against the prediction made at
  dispatch is ``latency_ratio`` times the pool's median both as a ratio (and at least
  ``latency_min_ratio``) and as an excess in seconds, so a uniformly slow fleet ejects
  nobody. Only the recent samples count, so a GPU that degrades is not outvoted by its own
  healthy past (routing sends it little once the predictor learns, so fresh samples are
  few). The prediction is the predictor's *uncalibrated* ``raw_ttft_s`` / ``raw_tpot_s``
  (which do not absorb the slowness), so a busy endpoint's long TTFT is expected, a
  degraded one's not. Latencies count whatever ended the attempt (a client that gave up on
  a slow stream measured it too), and ``overdue_stat`` / ``observe_overdue`` take evidence
  from attempts still running.

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
import math
from collections.abc import Sequence
from dataclasses import dataclass

from inferplane.core.breaker_types import (
    BreakerConfig,
    BreakerEvent,
    BreakerState,
    Outcome,
    Trigger,
)
from inferplane.core.latency_outliers import (
    AS_PREDICTED,
    TBT,
    TTFT,
    LatencySamples,
    LatencyStat,
    describe,
    is_outlier,
    reference,
)
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

_OK, _FAIL = 0, 1


@dataclass(slots=True)
class _Breaker:
    """One endpoint's mutable breaker record (owned by the board)."""

    pool: str
    counts: SlidingCounter  # (ok, failed) over the failure window
    samples: LatencySamples  # TTFT and TBT against their predictions
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
        counts = SlidingCounter(cfg.failure_window_s, 2)
        return cls(pool, counts, LatencySamples(cfg.latency_max_samples))

    def reset_signals(self) -> None:
        self.consecutive = 0
        self.counts.clear()
        self.samples.clear()

    def latency(self, metric: int, now: float, cfg: BreakerConfig) -> LatencyStat | None:
        return self.samples.stat(
            metric, now, cfg.latency_window_s, cfg.latency_min_samples, cfg.latency_recent_samples
        )


def _stats(outcome: Outcome) -> tuple[LatencyStat | None, LatencyStat | None]:
    """TTFT and TBT against their predictions (None where either is missing)."""
    return (
        LatencyStat.of(outcome.ttft_s, outcome.predicted_ttft_s),
        LatencyStat.of(outcome.tbt_s, outcome.predicted_tbt_s),
    )


class BreakerBoard:
    """The breakers of every endpoint, grouped in pools for the ejection cap."""

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self._cfg = config or BreakerConfig()
        self._breakers: dict[str, _Breaker] = {}
        # Pool references, memoised while neither time, samples nor states change (the
        # gateway checks every running attempt against its pool once per sweep).
        self._version = 0
        self._memo_at: tuple[float, int] = (math.nan, -1)
        self._memo: dict[tuple[str, int], LatencyStat | None] = {}

    @property
    def config(self) -> BreakerConfig:
        return self._cfg

    def register(self, endpoint: str, pool: str = "") -> None:
        """Add an endpoint (idempotent; a changed pool is updated)."""
        self._get(endpoint, pool).pool = pool
        self._version += 1

    def remove(self, endpoint: str) -> None:
        self._breakers.pop(endpoint, None)
        self._version += 1

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

    def blocks(self, endpoint: str) -> bool:
        """Whether ``overlay`` would mark ``endpoint`` EJECTED when its view takes work."""
        b = self._breakers.get(endpoint)
        return b is not None and not self._admits(b)

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

    def overdue_stat(
        self, endpoint: str, elapsed_s: float, predicted_s: float, num_tokens: int, now: float
    ) -> LatencyStat | None:
        """Whether an attempt still running on ``endpoint`` for ``elapsed_s``, predicted to
        take ``predicted_s`` for ``num_tokens`` output tokens, is already a latency outlier
        against its pool (ratio over the pool's time-between-tokens ratio; excess over the
        pool's TTFT excess plus its per-token excess for every token): then the evidence
        to pass to ``observe_overdue``, as a time-between-tokens sample, else None."""
        whole = LatencyStat.of(elapsed_s, predicted_s)
        b = self._breakers.get(endpoint)
        if whole is None or b is None:
            return None
        ttft = self._pool_reference(b.pool, TTFT, now) or AS_PREDICTED
        tbt = self._pool_reference(b.pool, TBT, now) or AS_PREDICTED
        steps = max(0, num_tokens - 1)
        expected_excess_s = max(0.0, ttft.excess_s) + steps * max(0.0, tbt.excess_s)
        pool = LatencyStat(tbt.ratio, expected_excess_s)
        cfg = self._cfg
        if not is_outlier(whole, pool, cfg.latency_ratio, cfg.latency_min_ratio):
            return None
        per_token_s = max(0.0, whole.excess_s - max(0.0, ttft.excess_s)) / max(1, steps)
        return LatencyStat(whole.ratio, per_token_s)

    def observe_overdue(self, endpoint: str, stat: LatencyStat, now: float) -> list[BreakerEvent]:
        """Count ``overdue_stat``'s evidence once per attempt: a time-between-tokens sample
        (a lower bound on its slowness); a probe that overdue fails at once."""
        b = self._get(endpoint)
        if b.state is BreakerState.HALF_OPEN:
            why = f"probe overdue: {stat.ratio:.2f}x its predicted duration"
            return [self._open(endpoint, b, now, Trigger.PROBE_FAILED, why)]
        if b.state is BreakerState.CLOSED:
            b.samples.add(TBT, now, stat)
            self._version += 1
        return []

    def _get(self, endpoint: str, pool: str = "") -> _Breaker:
        b = self._breakers.get(endpoint)
        if b is None:
            b = self._breakers[endpoint] = _Breaker.new(pool, self._cfg)
        return b

    def _add_samples(self, b: _Breaker, outcome: Outcome, now: float) -> None:
        for metric, stat in enumerate(_stats(outcome)):
            if stat is not None:
                b.samples.add(metric, now, stat)
                self._version += 1

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
        """A probe's outcome; one not counted (cancelled) fails only if slow."""
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
        self._version += 1
        b.reset_signals()
        why = f"{b.probe_ok} probes passed"
        return [BreakerEvent(endpoint, BreakerState.HALF_OPEN, b.state, Trigger.PROBES_PASSED, why)]

    def _outlier_reason(self, b: _Breaker, outcome: Outcome, now: float) -> str | None:
        """Why this single outcome is still a latency outlier against its pool, if it is."""
        cfg = self._cfg
        for metric, stat in enumerate(_stats(outcome)):
            if stat is None:
                continue
            pool = self._pool_reference(b.pool, metric, now) or AS_PREDICTED  # no fresh peers
            if is_outlier(stat, pool, cfg.latency_ratio, cfg.latency_min_ratio):
                return describe(metric, stat, pool)
        return None

    def _pool_reference(self, pool: str, metric: int, now: float) -> LatencyStat | None:
        if self._memo_at != (now, self._version):
            self._memo.clear()
            self._memo_at = (now, self._version)
        key = (pool, metric)
        if key not in self._memo:
            stats = self._latencies(pool, metric, now)
            enough = len(stats) >= self._cfg.latency_min_peers
            self._memo[key] = reference(stats.values()) if enough else None
        return self._memo[key]

    def _latencies(self, pool: str, metric: int, now: float) -> dict[str, LatencyStat]:
        out: dict[str, LatencyStat] = {}
        for name, b in self._breakers.items():
            if b.pool == pool and b.state is BreakerState.CLOSED:
                stat = b.latency(metric, now, self._cfg)
                if stat is not None:
                    out[name] = stat
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
        self._version += 1
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
                self._version += 1
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
        cfg = self._cfg
        worst: dict[str, tuple[float, str]] = {}
        for metric in (TTFT, TBT):
            stats = self._latencies(pool, metric, now)
            if len(stats) < cfg.latency_min_peers:
                continue
            ref = reference(stats.values())
            for name, stat in stats.items():
                slower = stat.ratio / max(ref.ratio, 1e-12)
                if not is_outlier(stat, ref, cfg.latency_ratio, cfg.latency_min_ratio):
                    continue
                if slower > worst.get(name, (0.0, ""))[0]:
                    worst[name] = (slower, describe(metric, stat, ref))
        events: list[BreakerEvent] = []
        for name in sorted(worst, key=lambda n: (-worst[n][0], n)):
            b = self._breakers[name]
            events.append(self._eject(name, b, now, Trigger.LATENCY_OUTLIER, worst[name][1]))
        return events
