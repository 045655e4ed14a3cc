"""Latency outliers: an endpoint's recent latencies against predictions, judged by its pool.

The breaker (:mod:`inferplane.core.breaker`) ejects an endpoint whose latency is an
outlier among its peers for the same work. "The same work" is the prediction made at
dispatch (the predictor's uncalibrated TTFT or time between tokens), and each sample is
summarised two ways:

* ratio = observed / predicted (a GPU running 5x slow doubles both short and long calls);
* excess = observed - predicted, in seconds (a delay added to every call alike).

An endpoint is an outlier when, over its ``recent`` latest samples in the window, *both*
its median ratio is at least ``latency_ratio`` x the pool's median ratio (and at least
``min_ratio``) *and* its median excess is at least ``latency_ratio`` x the pool's median
excess (when that is positive). Either test alone ejects healthy engines of a uniformly
slow fleet, where every sample is ``k x predicted + d`` (k >= 1, d >= 0: a starved CPU, a
slow network, a time-scaled emulation): the ratio ``k + d / p`` flags whoever serves cheap
calls (a cached prompt predicted at 10 ms that took 10 ms + d), the excess
``(k - 1) p + d`` whoever serves long ones. Together they cannot both hold there: the pool's
medians are at least k and d, so ratio needs ``d / p >= 2k`` and excess ``(k - 1) p >= 2d``,
which multiply to ``k - 1 >= 4k``. Medians are ``median_low`` (an actual sample, the same
one for both summaries when the count is odd; for an even count the two picks still keep
that product below 1), so the argument holds sample for sample.

The pool's ratio counts as at least 1 (the prediction itself): where predictions run high
for most calls (the breaker's allowance for a KV-bound engine's queue is generous) the
pool's median ratio falls below 1 and its median excess to 0, and a queued call that took
2.2x its prediction was ejected against a pool at 0.69x (live agentic TP2 run at fea170e);
an endpoint now has to be ``latency_ratio`` x its own prediction at least, which a
5x-slow GPU still is. Pure, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

TTFT, TBT = 0, 1
METRICS = ("TTFT", "TBT")


@dataclass(frozen=True, slots=True, init=False)
class LatencyStat:
    """One latency summarised against its prediction (or medians of such)."""

    ratio: float  # observed / predicted
    excess_s: float  # observed - predicted

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, ratio: float, excess_s: float) -> None:
        object.__setattr__(self, "ratio", ratio)
        object.__setattr__(self, "excess_s", excess_s)

    @classmethod
    def of(cls, observed_s: float | None, predicted_s: float | None) -> LatencyStat | None:
        """The sample, or None when either figure is missing or unusable."""
        if observed_s is None or predicted_s is None or predicted_s <= 0 or observed_s < 0:
            return None
        ratio = observed_s / predicted_s
        if not math.isfinite(ratio):
            return None
        return cls(ratio, observed_s - predicted_s)


#: What an endpoint is judged against when its pool has no fresh peers: its prediction.
AS_PREDICTED = LatencyStat(1.0, 0.0)


def reference(stats: Iterable[LatencyStat]) -> LatencyStat:
    """The pool's reference: median ratio and median excess over its endpoints."""
    items = list(stats)
    return LatencyStat(
        statistics.median_low(s.ratio for s in items),
        statistics.median_low(s.excess_s for s in items),
    )


def ratio_limit(pool: LatencyStat, latency_ratio: float, min_ratio: float) -> float:
    """``latency_ratio`` x the pool's ratio, that ratio taken as at least 1 (module docstring)."""
    return max(min_ratio, latency_ratio * max(1.0, pool.ratio))


def is_outlier(
    stat: LatencyStat, pool: LatencyStat, latency_ratio: float, min_ratio: float
) -> bool:
    """Both the ratio and the excess are ``latency_ratio`` x the pool's (module docstring)."""
    if stat.ratio < ratio_limit(pool, latency_ratio, min_ratio):
        return False
    return stat.excess_s > 0 and stat.excess_s >= latency_ratio * max(0.0, pool.excess_s)


def describe(metric: int, stat: LatencyStat, pool: LatencyStat) -> str:
    return (
        f"{METRICS[metric]} {stat.ratio:.2f}x predicted (+{stat.excess_s:.3f}s) vs pool "
        f"{pool.ratio:.2f}x (+{max(0.0, pool.excess_s):.3f}s)"
    )


class LatencySamples:
    """One endpoint's latest samples per metric: (time, stat), bounded."""

    __slots__ = ("_samples",)

    def __init__(self, max_samples: int) -> None:
        self._samples: tuple[deque[tuple[float, LatencyStat]], ...] = (
            deque(maxlen=max_samples),
            deque(maxlen=max_samples),
        )

    def add(self, metric: int, now: float, stat: LatencyStat) -> None:
        self._samples[metric].append((now, stat))

    def clear(self) -> None:
        for samples in self._samples:
            samples.clear()

    def stat(
        self, metric: int, now: float, window_s: float, min_samples: int, recent: int
    ) -> LatencyStat | None:
        """Medians of the ``recent`` latest samples, if ``min_samples`` are in the window."""
        samples = self._samples[metric]
        while samples and samples[0][0] < now - window_s:
            samples.popleft()
        if len(samples) < min_samples:
            return None
        return reference(s for _, s in islice(reversed(samples), recent))
