"""Burst reserve for the autoscaler: spare warm capacity sized from the bursts seen.

A replica started when a burst is seen serves a cold start later; a burst shorter than a few
cold starts is over before a purely reactive loop has caught up with it (on the emulated
fleet a cold start takes 46 s against a 60 s burst). What covers the first cold start of a
burst is capacity that is already warm. :class:`BurstReserve` learns how large a burst gets
relative to the demand it rises from (the *burst factor*) and the loop keeps enough capacity
for ``baseline demand x factor`` at ``reserve_utilisation`` (running hot for one cold start is
acceptable; the reactive loop takes over when its replicas are ready).

How the factor is learned, per window:

* the window's calls are compared with the calls the baseline expected (the autoscaler's
  slow baseline before the window, a Holt forecast with a ``reserve_baseline_s`` time
  constant whose input is clipped: the demand a burst rises from), through the lower end of
  a Poisson confidence interval of the count (``z`` sigmas, Anscombe's form), so a steady
  load's noise does not read as a burst: ``ratio = (sqrt(calls) - z/2)^2 / expected``;
* the learned factor is a peak-hold of those ratios that decays back towards 1 with a
  half-life of ``memory_s``: the reserve shrinks when bursts stop;
* the highest rate seen (tokens/s), held and decayed the same way, caps the reserve: the
  reserve never asks for more than the bursts seen (or the prior) did.

The prior is an operator's expectation before any burst was seen, in absolute terms: a burst
may bring ``prior`` times the pool's *quiet* demand (tokens/s), not ``prior`` times the demand
now. The quiet demand is a low envelope of the slow baseline: it follows the baseline down at
once and up only with a half-life of ``quiet_memory_s`` (by default hours at the default
scale-down window), so it sits near the day's trough. The prior's reserve is therefore a
fixed amount of warm capacity, ``prior x quiet``: it binds in the quiet hours, when a burst
from a trough needs more than the demand asks for, and costs nothing at mid-day, when the
demand's own need is larger (a prior that multiplied the demand *now* cost 1.26x the
peak-sized fleet's GPU-hours in the simulator's day at prior 8). A learned factor multiplies
the demand now, capped by the highest rate seen: it only helps the bursts after the first.
The factor is capped at ``max_factor``.

Pure: numbers in, a new value out; ``now_s`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from inferplane.core.forecast import HoltForecast

__all__ = ["BASELINE_CLIP", "BurstReserve", "burst_ratio", "slow_baseline"]

#: The reserve's slow baseline takes a window's rate at most this many times its own
#: expectation: a burst must not inflate the demand the next burst is sized from. A lasting
#: rise still comes through, about 4% a 5 s window at the 60 s time constant (so a pool that
#: starts idle builds its baseline over minutes; its first window is taken as it is).
BASELINE_CLIP = 1.5


def slow_baseline(
    old: HoltForecast,
    *,
    tokens: float,
    requests: int,
    window_s: float,
    now_s: float,
    time_constant_s: float,
) -> HoltForecast:
    """The slow baseline demand after a window: a Holt forecast with ``time_constant_s``
    whose input is clipped at ``BASELINE_CLIP`` x the calls it expected (or their Poisson
    noise, 2 sigmas up: a baseline near 0 must still be able to grow)."""
    alpha = 1.0 - math.exp(-window_s / time_constant_s)
    rate = tokens / window_s if window_s > 0 else 0.0
    if old.at_s is not None and requests > 0 and window_s > 0:
        per_call_s = tokens / requests / window_s  # one call's tok/s
        expected = max(old.level, old.predict(now_s)) / per_call_s  # calls in the window
        most = max(BASELINE_CLIP * expected, (math.sqrt(expected) + 1.0) ** 2)
        rate = min(rate, most * per_call_s)
    return replace(old, alpha=alpha, beta=alpha / 4).update(rate, now_s)


def burst_ratio(requests: int, expected_requests: float, z: float) -> float:
    """How many times the expected count the window's count is, at least (its Poisson lower
    bound ``z`` sigmas down; 0 when nothing was expected)."""
    if expected_requests <= 0 or requests <= 0:
        return 0.0
    low = max(0.0, math.sqrt(requests) - z / 2.0) ** 2
    return low / expected_requests


#: The quiet demand's window is kept as this many buckets, each holding its lowest baseline.
QUIET_BUCKETS = 24


def _lowest(
    buckets: tuple[tuple[float, float], ...], value: float, now_s: float, window_s: float
) -> tuple[tuple[float, float], ...]:
    """``(bucket start, lowest value)`` over ``window_s`` after ``value`` seen at ``now_s``."""
    width = window_s / QUIET_BUCKETS
    kept = tuple((t, v) for t, v in buckets if t > now_s - window_s)
    if kept and now_s < kept[-1][0] + width:
        return (*kept[:-1], (kept[-1][0], min(kept[-1][1], value)))
    return (*kept, (now_s, value))


def _decayed(value: float, floor: float, dt_s: float, half_life_s: float) -> float:
    """``value`` decayed towards ``floor`` over ``dt_s`` at the half-life."""
    if value <= floor or dt_s <= 0:
        return max(value, floor)
    if half_life_s <= 0:
        return floor
    return floor + (value - floor) * math.exp(-math.log(2.0) * dt_s / half_life_s)


@dataclass(frozen=True, slots=True)
class BurstReserve:
    """The learned burst factor and the highest rate seen, both held and decaying, and the
    quiet demand (a low envelope of the baseline) the prior scales."""

    factor: float = 1.0  # learned burst factor at ``at_s`` (>= 1)
    peak_tokens_per_s: float = 0.0  # highest window rate seen, at ``at_s``
    at_s: float | None = None
    quiet: tuple[tuple[float, float], ...] = ()  # (bucket start, lowest baseline) in window
    since_s: float | None = None  # the first window seen

    @property
    def quiet_tokens_per_s(self) -> float | None:
        """The lowest baseline over the quiet window (None before any)."""
        return min((v for _, v in self.quiet), default=None)

    def observe(
        self,
        *,
        requests: int,
        tokens: float,
        window_s: float,
        now_s: float,
        baseline_tokens_per_s: float,
        memory_s: float,
        z: float,
        max_factor: float,
        quiet_window_s: float = math.inf,
        quiet_tokens_per_s: float | None = None,
    ) -> BurstReserve:
        """The reserve after one window (``baseline``: the rate the window was expected at;
        ``quiet_tokens_per_s``: the slow baseline now, whose lowest value over
        ``quiet_window_s`` is the quiet demand; None: nothing to add to the window)."""
        factor, peak = self.factor_at(now_s, memory_s), self.peak_at(now_s, memory_s)
        quiet = self.quiet
        if quiet_tokens_per_s is not None:
            quiet = _lowest(quiet, quiet_tokens_per_s, now_s, quiet_window_s)
        if requests > 0 and window_s > 0:
            rate = tokens / window_s
            expected = baseline_tokens_per_s * window_s / (tokens / requests)
            ratio = min(max_factor, burst_ratio(requests, expected, z))
            factor = max(factor, ratio)
            peak = max(peak, rate)
        at_s = now_s if self.at_s is None else max(self.at_s, now_s)
        since = now_s if self.since_s is None else self.since_s
        return BurstReserve(factor, peak, at_s, quiet, since)

    def factor_at(self, now_s: float, memory_s: float) -> float:
        """The learned factor at ``now_s`` (decayed towards 1 since the last window)."""
        if self.at_s is None:
            return 1.0
        return _decayed(self.factor, 1.0, now_s - self.at_s, memory_s)

    def peak_at(self, now_s: float, memory_s: float) -> float:
        """The highest rate seen, decayed towards 0 since the last window."""
        if self.at_s is None:
            return 0.0
        return _decayed(self.peak_tokens_per_s, 0.0, now_s - self.at_s, memory_s)

    def reserve_tokens_per_s(
        self,
        demand_tokens_per_s: float,
        now_s: float,
        *,
        prior: float,
        memory_s: float,
        prior_cap_tokens_per_s: float = math.inf,
    ) -> float:
        """The demand the reserve should carry: the larger of ``prior x quiet demand`` (at most
        ``prior_cap_tokens_per_s``) and ``demand x learned factor`` (at most the decayed
        highest rate seen); the quiet demand counts at most the demand now."""
        learned = self.factor_at(now_s, memory_s)
        seen = min(demand_tokens_per_s * learned, self.peak_at(now_s, memory_s))
        quiet = self.quiet_tokens_per_s
        quiet = demand_tokens_per_s if quiet is None else min(quiet, demand_tokens_per_s)
        return max(0.0, seen, min(prior * quiet, prior_cap_tokens_per_s))
