"""Demand forecasts for the autoscaler: what a pool will be asked for over the next horizon.

The autoscaler sizes a pool for the peak demand expected between now and when a replica it
starts now could serve (cold start plus a tick). :class:`HoltForecast` learns that course
from the observed windows (a level and a trend, exponentially smoothed); a body that knows
more (a schedule, a diurnal profile) passes a :class:`ScheduleForecast` or any
:class:`Forecast`. Pure values: no clock, ``now_s`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

__all__ = ["Forecast", "HoltForecast", "ScheduleForecast"]


class Forecast(Protocol):
    """Demand ahead, in tokens per second."""

    def peak_tokens_per_s(self, start_s: float, end_s: float) -> float: ...


@dataclass(frozen=True, slots=True)
class HoltForecast:
    """Holt's linear smoothing of a rate: a level and a trend per second, updated per window."""

    level: float = 0.0
    trend_per_s: float = 0.0
    at_s: float | None = None
    alpha: float = 0.5
    beta: float = 0.1  # a slow trend: noise must not read as growth

    def update(self, rate: float, now_s: float) -> HoltForecast:
        if self.at_s is None:
            return replace(self, level=rate, trend_per_s=0.0, at_s=now_s)
        dt = now_s - self.at_s
        if dt <= 0:
            return self
        predicted = self.level + self.trend_per_s * dt
        level = self.alpha * rate + (1 - self.alpha) * predicted
        trend = self.beta * (level - self.level) / dt + (1 - self.beta) * self.trend_per_s
        return replace(self, level=max(0.0, level), trend_per_s=trend, at_s=now_s)

    def predict(self, at_s: float) -> float:
        """The rate expected at ``at_s`` (0 before the first update)."""
        if self.at_s is None:
            return 0.0
        return max(0.0, self.level + self.trend_per_s * (at_s - self.at_s))

    def peak_tokens_per_s(self, start_s: float, end_s: float) -> float:
        if self.at_s is None:
            return 0.0
        ends = (self.level + self.trend_per_s * (t - self.at_s) for t in (start_s, end_s))
        return max(0.0, *ends)


@dataclass(frozen=True, slots=True)
class ScheduleForecast:
    """A known demand course: piecewise-constant ``(from_s, tokens_per_s)`` steps, sorted."""

    steps: tuple[tuple[float, float], ...]

    def peak_tokens_per_s(self, start_s: float, end_s: float) -> float:
        peak, current = 0.0, 0.0
        for at_s, rate in self.steps:
            if at_s <= start_s:
                current = rate
            elif at_s <= end_s:
                peak = max(peak, rate)
        return max(peak, current)
