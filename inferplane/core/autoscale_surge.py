"""Surge detection for the autoscaler: is a window's demand a burst, and where is it heading?

Holt's trend in :mod:`inferplane.core.autoscaler` is slow on purpose (noise must not read as
growth), so an unannounced burst would be chased one tick at a time, each step a cold start
late. A window is a *surge* when its calls exceed the calls the forecast expected by more than
``z`` Poisson standard deviations (:func:`surge_z`). A surge fits a line to the rates of the
last few windows (least squares, so one noisy window does not make the slope) and
extrapolates it over the cold-start horizon, capped at a multiple of the observed rate
(:func:`surge_rate`). On a steady Poisson load about 0.5% of windows read as a surge at
``z`` 3 (the forecast's own noise adds to the count's); a false one buys at most the cap for
one scale-down window.

A body may also check a window before its tick is due (:func:`surge_rate` with the partial
window and a stricter ``z``): a burst seen two seconds in need not wait out the tick.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["fitted_line", "rising_rate", "surge_rate", "surge_z"]


def surge_z(requests: int, expected_requests: float) -> float:
    """How far ``requests`` lies above ``expected_requests`` in standard deviations of a
    Poisson count: ``2 (sqrt(n) - sqrt(expected))``, Anscombe's variance-stabilised form,
    near normal from a few calls on (the plain ``(n - e) / sqrt(e)`` overstates small counts'
    upper tail)."""
    return 2.0 * (math.sqrt(max(0, requests)) - math.sqrt(max(0.0, expected_requests)))


def fitted_line(points: Sequence[tuple[float, float]], at_s: float) -> tuple[float, float]:
    """Least-squares line through ``(t, y)`` points: its value at ``at_s`` and its slope."""
    n = len(points)
    if n == 0:
        return 0.0, 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t <= 0:
        return mean_y, 0.0
    slope = sum((t - mean_t) * (y - mean_y) for t, y in points) / var_t
    return mean_y + slope * (at_s - mean_t), slope


def surge_rate(
    *,
    requests: int,
    tokens: float,
    window_s: float,
    now_s: float,
    expected_tokens_per_s: float,
    recent: Sequence[tuple[float, float]],
    horizon_s: float,
    z: float,
    max_factor: float,
) -> float:
    """Demand (tokens/s) over the horizon if this window is a surge, else 0.

    ``recent``: ``(at_s, tokens/s)`` of the windows before this one (the fit takes them and
    this window); ``expected_tokens_per_s``: what the forecast expected over this window.
    """
    if requests <= 0 or window_s <= 0 or not recent:
        return 0.0
    rate = tokens / window_s
    per_call = tokens / requests
    if surge_z(requests, expected_tokens_per_s * window_s / per_call) < z:
        return 0.0
    rising = rising_rate((*recent, (now_s, rate)), now_s, horizon_s, max_factor)
    return max(rate, rising) if rising > 0 else 0.0


def rising_rate(
    rates: Sequence[tuple[float, float]], now_s: float, horizon_s: float, max_factor: float
) -> float:
    """Where the line fitted to ``rates`` (``(at_s, tokens/s)``, the last one now's) is
    ``horizon_s`` from now when it rises, at most ``max_factor`` x the last rate; 0 when it
    is flat or falling. The surge's extrapolation, and the scale-down's guard: a replica
    released now takes a cold start to come back."""
    if len(rates) < 2:
        return 0.0
    level, slope = fitted_line(rates, now_s)
    if slope <= 0:
        return 0.0
    return min(rates[-1][1] * max_factor, level + slope * horizon_s)
