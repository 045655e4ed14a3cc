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
now. The quiet demand is the lowest *level* (the window rates smoothed with the slow
baseline's time constant, unclipped: a burst only raises it) over ``quiet_window_s``, a day by
default, so it sits at the day's trough; until the level has settled it is the level now.
The prior's reserve is therefore a fixed amount of warm capacity, ``prior x quiet`` (the
autoscaler holds at most ``reserve_max_replicas`` of it over the demand's need): it binds in
the quiet hours, when a burst from a trough needs more than the demand asks for, and costs
nothing at mid-day, when the demand's own need is larger (a prior that multiplied the demand
*now* cost 1.26x the peak-sized fleet's GPU-hours in the simulator's day at prior 8). A
learned factor multiplies the demand now, capped by the highest rate seen: it only helps the
bursts after the first. The factor is capped at ``max_factor``.

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
    noise, 2 sigmas up: a baseline near 0 must still be able to grow).

    It starts at the first window with calls: windows before any call (a loop started
    before its traffic) leave it unset. Started at 0, the clip let it grow only ~4% a
    window, so on the emulated fleet it read ~1,700 tok/s against 3,000 when the burst came
    and ``burst_prior_now`` sized the reserve from half the demand now."""
    if old.at_s is None and requests <= 0:
        return old
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
    quiet: tuple[tuple[float, float], ...] = ()  # (bucket start, lowest level) in window
    since_s: float | None = None  # the first window seen
    level_tokens_per_s: float | None = None  # the window rates, exponentially smoothed

    @property
    def quiet_tokens_per_s(self) -> float | None:
        """The lowest level over the quiet window (the level now until it has settled; None
        before any window)."""
        return min((v for _, v in self.quiet), default=self.level_tokens_per_s)

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
        level_time_constant_s: float = 60.0,
    ) -> BurstReserve:
        """The reserve after one window (``baseline``: the rate the window was expected at).

        The level smooths the window rates (unclipped: a burst only raises it, and the quiet
        demand is its *lowest* value) with ``level_time_constant_s``; once it has settled
        (one time constant after the first window) it enters the quiet window."""
        factor, peak = self.factor_at(now_s, memory_s), self.peak_at(now_s, memory_s)
        rate = tokens / window_s if window_s > 0 else 0.0
        level = self.level_tokens_per_s
        alpha = 1.0 - math.exp(-window_s / level_time_constant_s)
        level = rate if level is None else level + alpha * (rate - level)
        since = now_s if self.since_s is None else self.since_s
        quiet = self.quiet
        if now_s - since >= level_time_constant_s:
            quiet = _lowest(quiet, level, now_s, quiet_window_s)
        if requests > 0 and window_s > 0:
            expected = baseline_tokens_per_s * window_s / (tokens / requests)
            ratio = min(max_factor, burst_ratio(requests, expected, z))
            factor = max(factor, ratio)
            peak = max(peak, rate)
        at_s = now_s if self.at_s is None else max(self.at_s, now_s)
        return BurstReserve(factor, peak, at_s, quiet, since, level)

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
        now_tokens_per_s: float | None = None,
    ) -> float:
        """The demand the reserve should carry: the larger of ``prior x quiet demand`` (the
        quiet demand at most the demand now, ``now_tokens_per_s``, by default the ``demand``;
        the whole at most ``prior_cap_tokens_per_s``) and ``demand x learned factor`` (at most
        the decayed highest rate seen)."""
        learned, prior_part = self.reserve_parts(
            demand_tokens_per_s, now_s, prior=prior, memory_s=memory_s,
            prior_cap_tokens_per_s=prior_cap_tokens_per_s, now_tokens_per_s=now_tokens_per_s,
        )  # fmt: skip
        return max(learned, prior_part)

    def reserve_parts(
        self,
        demand_tokens_per_s: float,
        now_s: float,
        *,
        prior: float,
        memory_s: float,
        prior_cap_tokens_per_s: float = math.inf,
        now_tokens_per_s: float | None = None,
    ) -> tuple[float, float]:
        """The reserve's two parts, tokens/s: the learned one (``demand x learned factor``,
        at most the decayed highest rate seen) and the prior's (``prior x quiet demand``, at
        most ``prior_cap_tokens_per_s``), as :meth:`reserve_tokens_per_s` takes them."""
        learned = self.factor_at(now_s, memory_s)
        seen = min(demand_tokens_per_s * learned, self.peak_at(now_s, memory_s))
        now = demand_tokens_per_s if now_tokens_per_s is None else now_tokens_per_s
        quiet = self.quiet_tokens_per_s
        quiet = now if quiet is None else min(now, quiet)
        return max(0.0, seen), max(0.0, min(prior * quiet, prior_cap_tokens_per_s))
