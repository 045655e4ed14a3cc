"""Burst episodes for the autoscaler: is a burst on, since when, and how long do bursts last?

A replica bought during a burst serves a cold start later. When the burst is over by then,
the replica serves only the burst's tail and the quiet hours after it, which the replicas
already there carry: it is paid for (cold start, service, drain) and helps no one. On the
emulated fleet a cold start takes 46 s against a 60 s burst, and most replicas bought during
it came ready after it had ended. :class:`BurstEpisode` tracks the burst that is on (when it
began, the demand it rose from) and learns how long bursts last, so the loop can tell whether
a replica bought now would still find the burst on (:func:`late_for_burst`):

* a burst **begins** with a window that is a surge (the loop's test: sudden, rising), or
  whose calls are ``on_ratio`` x the lowest window of the last cold start (:func:`rise_ratio`:
  a rise too fast for a reactive step, spread over windows none of which is a surge), and
  whose calls, read at their Poisson lower bound (``z`` sigmas down, as the reserve reads
  them), are at least ``on_ratio`` x what the slow baseline expected, once that baseline has
  settled (a ramp is no burst); the baseline then is the demand it rose from;
* it **ends** with the first window whose rate is under ``off_ratio`` x that demand, or x the
  slow baseline now if higher (the baseline follows a lasting rise slowly, so a step that
  stays becomes the new demand after a few minutes instead of a burst without end); a burst
  of at least two windows teaches its length (the longest seen is kept: a burst must not look
  shorter than one already seen; a single noisy window teaches nothing);
* its **expected end**: its start plus the learned length (or the operator's prior; none:
  unknown, and the loop buys as before). One that has outlasted that length lasts as long
  again as it has lasted so far (a Lindy estimate), unless its rate is already falling: then
  it is in its tail, and so is one that ended less than a cold start and a minimum service
  ago while its rate keeps falling.

Pure: numbers in, a new value out; ``now_s`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from inferplane.core.autoscale_policy import PoolPolicy
from inferplane.core.autoscale_reserve import burst_ratio
from inferplane.core.autoscale_surge import fitted_line

__all__ = ["BurstEpisode", "late_cap", "late_for_burst", "rise_ratio"]


@dataclass(frozen=True, slots=True)
class BurstEpisode:
    """The burst on now (if any) and the longest burst seen."""

    start_s: float | None = None  # when the burst on now began (None: none is on)
    base_tokens_per_s: float = 0.0  # the demand it rose from
    windows: int = 0  # windows of the burst on now
    length_s: float | None = None  # the longest burst seen (None: none yet)
    ended_s: float | None = None  # when the last burst ended

    @property
    def on(self) -> bool:
        return self.start_s is not None

    def observe(
        self,
        *,
        requests: int,
        tokens: float,
        window_s: float,
        now_s: float,
        baseline_tokens_per_s: float,
        z: float,
        on_ratio: float,
        off_ratio: float,
        surging: bool = True,
    ) -> BurstEpisode:
        """The episode after one window ending at ``now_s`` (``baseline``: the demand the
        window was expected at, before it; ``surging``: whether it may start a burst, the
        window a surge over a settled baseline)."""
        if window_s <= 0:
            return self
        if self.start_s is None:
            if requests <= 0 or baseline_tokens_per_s <= 0 or not surging:
                return self
            expected = baseline_tokens_per_s * window_s / (tokens / requests)
            if burst_ratio(requests, expected, z) < on_ratio:
                return self
            return replace(
                self, start_s=now_s - window_s, base_tokens_per_s=baseline_tokens_per_s, windows=1
            )
        if tokens / window_s >= off_ratio * max(self.base_tokens_per_s, baseline_tokens_per_s):
            return replace(self, windows=self.windows + 1)
        length = self.length_s
        if self.windows >= 2:
            length = max(length or 0.0, now_s - window_s - self.start_s)
        return BurstEpisode(length_s=length, ended_s=now_s)

    def remaining_s(self, now_s: float, *, prior_length_s: float | None, falling: bool) -> float:
        """Seconds the burst on now is expected to last (0: none on, inf: unknown)."""
        if self.start_s is None:
            return 0.0
        elapsed = max(0.0, now_s - self.start_s)
        length = self.length_s if self.length_s is not None else prior_length_s
        if length is None:
            return math.inf
        if elapsed < length:
            return length - elapsed
        return 0.0 if falling else elapsed


def rise_ratio(
    *,
    requests: int,
    tokens: float,
    window_s: float,
    now_s: float,
    rates: Sequence[tuple[float, float]],
    within_s: float,
    z: float,
) -> float:
    """How many times the lowest rate of the windows ``rates`` (``(at_s, tokens/s)``, before
    this one) that ended within ``within_s`` the window's calls are, at least (their Poisson
    lower bound ``z`` sigmas down; 0 without such a window). A rise to ``on_ratio`` within a
    cold start is a burst even when no single window is a surge: the fast forecast's trend
    follows a rise spread over a few windows (agentic calls ramp up as their tasks start), so
    no window is ``surge_z`` over it, while no reactive step can catch up with it."""
    lows = [r for t, r in rates if now_s - t <= within_s]
    if not lows or requests <= 0 or window_s <= 0 or min(lows) <= 0:
        return 0.0
    return burst_ratio(requests, min(lows) * window_s / (tokens / requests), z)


def late_for_burst(
    episode: BurstEpisode,
    now_s: float,
    *,
    rates: Sequence[tuple[float, float]],
    prior_length_s: float | None,
    cold_start_s: float,
    min_serve_s: float,
) -> float | None:
    """The burst's expected remaining seconds when a replica bought now would serve less than
    ``min_serve_s`` of it (it comes ready ``cold_start_s`` from now), else None.

    ``rates``: ``(at_s, tokens/s)`` of the last windows, this one included (their fitted
    slope tells a burst in its tail). A burst that ended less than a cold start and
    ``min_serve_s`` ago is still late while its rate falls: its tail outlasts the episode."""
    falling = len(rates) >= 2 and fitted_line(rates, now_s)[1] < 0
    if not episode.on:
        ended_s = episode.ended_s
        recent = ended_s is not None and now_s - ended_s < cold_start_s + min_serve_s
        return 0.0 if recent and falling else None
    left_s = episode.remaining_s(now_s, prior_length_s=prior_length_s, falling=falling)
    return left_s if left_s < cold_start_s + min_serve_s else None


def late_cap(
    policy: PoolPolicy,
    episode: BurstEpisode,
    now_s: float,
    rates: tuple[tuple[float, float], ...],
    capacity: float,
    need: float,
) -> tuple[float, str]:
    """The need: while a burst is on that will be over before a replica bought now serves
    ``burst_min_serve_s`` of it, no more than the capacity there is (and why, else "")."""
    cold_s = policy.fastest_cold_start_s
    serve_s = cold_s if policy.burst_min_serve_s is None else policy.burst_min_serve_s
    left_s = late_for_burst(
        episode, now_s, rates=rates, prior_length_s=policy.burst_length_s,
        cold_start_s=cold_s, min_serve_s=serve_s,
    )  # fmt: skip
    if left_s is None or need <= capacity:
        return need, ""
    return (
        capacity,
        f"burst over in ~{left_s:.0f} s, before a replica bought now serves {serve_s:.0f} s",
    )
