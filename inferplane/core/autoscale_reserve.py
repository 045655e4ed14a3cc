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

Before any burst was seen the factor is the policy's ``prior`` (1: no reserve). The factor
is capped at ``max_factor``. The reserve multiplies the demand *now*: a prior sized for a
burst that rises from a trough over-provisions at mid-day (in the simulator's day, a prior
of 8 costs 1.26x the peak-sized fleet's GPU-hours); a learned factor only helps the bursts
after the first.

Pure: numbers in, a new value out; ``now_s`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BurstReserve", "burst_ratio"]


def burst_ratio(requests: int, expected_requests: float, z: float) -> float:
    """How many times the expected count the window's count is, at least (its Poisson lower
    bound ``z`` sigmas down; 0 when nothing was expected)."""
    if expected_requests <= 0 or requests <= 0:
        return 0.0
    low = max(0.0, math.sqrt(requests) - z / 2.0) ** 2
    return low / expected_requests


def _decayed(value: float, floor: float, dt_s: float, half_life_s: float) -> float:
    """``value`` decayed towards ``floor`` over ``dt_s`` at the half-life."""
    if value <= floor or dt_s <= 0:
        return max(value, floor)
    if half_life_s <= 0:
        return floor
    return floor + (value - floor) * math.exp(-math.log(2.0) * dt_s / half_life_s)


@dataclass(frozen=True, slots=True)
class BurstReserve:
    """The learned burst factor and the highest rate seen, both held and decaying."""

    factor: float = 1.0  # learned burst factor at ``at_s`` (>= 1)
    peak_tokens_per_s: float = 0.0  # highest window rate seen, at ``at_s``
    at_s: float | None = None

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
    ) -> BurstReserve:
        """The reserve after one window (``baseline``: the rate the window was expected at)."""
        factor, peak = self.factor_at(now_s, memory_s), self.peak_at(now_s, memory_s)
        if requests > 0 and window_s > 0:
            rate = tokens / window_s
            expected = baseline_tokens_per_s * window_s / (tokens / requests)
            ratio = min(max_factor, burst_ratio(requests, expected, z))
            factor = max(factor, ratio)
            peak = max(peak, rate)
        at_s = now_s if self.at_s is None else max(self.at_s, now_s)
        return BurstReserve(factor=factor, peak_tokens_per_s=peak, at_s=at_s)

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
        self, demand_tokens_per_s: float, now_s: float, *, prior: float, memory_s: float
    ) -> float:
        """The demand the reserve should carry: ``demand x max(prior, learned factor)``,
        at most the larger of the (decayed) highest rate seen and ``demand x prior``."""
        learned = self.factor_at(now_s, memory_s)
        wanted = demand_tokens_per_s * max(prior, learned)
        cap = max(self.peak_at(now_s, memory_s), demand_tokens_per_s * prior)
        return max(0.0, min(wanted, cap))
