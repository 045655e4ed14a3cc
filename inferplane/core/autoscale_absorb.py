"""Does a burst break the SLO before a replica bought for it serves? The reserve's sizing.

The burst reserve (:mod:`inferplane.core.autoscale_reserve`) keeps warm capacity for a burst
of ``B`` tokens/s that no reactive step can serve in time. Sized by whether ``B`` exceeds the
capacity kept, it rounds a burst a few percent over one replica up to a second replica, held
all day (on the emulated fleet the quiet prior, ``8 x ~973`` tok/s, was 1% over one replica's
7,697, and the spare ran from 13 s to the end). What a burst breaks is the SLO, and the SLO
has room: calls may wait ``wait_s`` (the TTFT budget) before they miss it. So the reserve is
the least capacity under which a burst's queue keeps its wait within ``wait_s`` until a
replica bought when the burst is seen serves (:func:`slo_capacity`):

* a fluid queue: at capacity ``C`` against a burst of rate ``B`` on a backlog ``Q0``, the
  queue after ``t`` s is ``Q0 + (B - C) t`` and a call arriving then waits ``queue / C``;
  the wait stays within ``w`` for ``t <= T`` iff ``C >= (B T + Q0) / (T + w)`` (for
  ``Q0 <= B w``; a backlog already over that needs the whole burst, as before);
* ``T`` (:func:`queue_horizon_s`) is how long the queue builds: the cold start plus a tick
  (the burst is seen, a replica bought serves), or the whole burst when the loop will not
  buy during it (a burst expected to end before a replica bought then serves
  ``min_serve_s`` of it: :func:`inferplane.core.autoscale_burst.late_for_burst`);
* the capacity a replica has is the model's (``GpuOption.tokens_per_s``) unless the fleet
  has *shown* more (:class:`Carried`): the highest ratio of the demand over a span of
  windows (a cold start and a tick, their calls read at their Poisson lower bound) to the
  modelled capacity of the replicas that served it, among spans of windows that all met the
  SLO target with a backlog their rate drains within ``wait_s``, held over a day (what a
  replica carries is a property of the replicas and the workload's mix, not of the hour).
  On the emulated fleet two engines carried a burst whose best 10 s was 24,759 tok/s
  (their model: 15,394) with every call in its SLO. One window's few dozen calls, read at
  their lower bound, read a quarter low: no single window showed more than the model.
  The ratio only scales the reserve; the demand's own need keeps the model's margin (the
  learned utilisation, :mod:`inferplane.core.autoscale_learn`, moves that one).

Measured (docs/autoscaler.md): the room is ~5% of a burst at a 3 s SLO over 51-60 s, less
than the 10% scale-down band, and the span's ratio stayed near 1 on the emulated fleet, so
neither let the second engine go there (``hs-8001710``, ``hs-26274f2``).

Pure: numbers in, values out; ``now_s`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.core.autoscale_policy import PoolPolicy

__all__ = ["Carried", "queue_horizon_s", "slo_capacity", "slo_reserve"]


def slo_capacity(
    burst_tokens_per_s: float, *, wait_s: float, within_s: float, backlog_tokens: float = 0.0
) -> float:
    """The least capacity (tokens/s) that carries a burst of ``burst_tokens_per_s`` for
    ``within_s`` seconds on a backlog of ``backlog_tokens`` with every call's queue wait
    within ``wait_s``: ``(B T + Q0) / (T + w)``, never above the burst itself (a burst no
    larger than the capacity queues nothing; a backlog already over ``B w`` gets the whole
    burst, as if the SLO had no room)."""
    burst = max(0.0, burst_tokens_per_s)
    if wait_s <= 0 or within_s <= 0 or burst <= 0:
        return burst
    within = within_s if math.isfinite(within_s) else 1e12
    return min(burst, (burst * within + max(0.0, backlog_tokens)) / (within + wait_s))


def queue_horizon_s(
    *, cold_start_s: float, tick_s: float, burst_length_s: float | None, min_serve_s: float
) -> float:
    """How long a burst's queue builds before more capacity serves: a tick (the burst is
    seen) and a cold start, or the whole burst when it is expected to end before a replica
    bought then serves ``min_serve_s`` of it (the loop buys nothing for such a burst)."""
    bought = cold_start_s + tick_s
    if burst_length_s is not None and burst_length_s < cold_start_s + min_serve_s:
        return burst_length_s
    return bought


@dataclass(frozen=True, slots=True)
class Carried:
    """The most the fleet has carried within its SLO, as a ratio to its modelled capacity
    (1: no evidence over the model), when it was seen, and the run of windows within the SLO
    it is read over."""

    ratio: float = 1.0
    at_s: float | None = None
    run: tuple[tuple[float, int, float, float], ...] = ()  # (end s, calls, tokens, capacity)

    def ratio_at(self, now_s: float, window_s: float) -> float:
        """The ratio at ``now_s``: the one seen within ``window_s``, else 1."""
        if self.at_s is None or now_s - self.at_s > window_s:
            return 1.0
        return self.ratio

    def observe(
        self,
        *,
        requests: int,
        tokens: float,
        window_s: float,
        now_s: float,
        modelled_tokens_per_s: float,
        backlog_tokens: float,
        slo_attainment: float | None,
        slo_target: float,
        wait_s: float,
        z: float,
        span_s: float,
        memory_s: float,
    ) -> Carried:
        """After one window. A window that met ``slo_target`` with a backlog its rate drains
        within ``wait_s`` joins the run (any other ends it); the run's last ``span_s`` show
        their calls (at their Poisson lower bound, ``z`` sigmas down: over a span, not one
        window, whose few dozen calls would read a quarter low) carried by the modelled
        capacity of the replicas that served them. The higher ratio within ``memory_s`` is
        kept."""
        kept = self.ratio_at(now_s, memory_s)
        best = (self.ratio, self.at_s) if kept > 1.0 else (1.0, None)
        rate = tokens / window_s if window_s > 0 else 0.0
        met = slo_attainment is not None and slo_attainment >= slo_target
        if not met or window_s <= 0 or modelled_tokens_per_s <= 0 or backlog_tokens > wait_s * rate:
            return Carried(*best)
        window = (now_s, requests, tokens, modelled_tokens_per_s * window_s)
        run = (*(w for w in self.run if w[0] > now_s - span_s), window)
        calls = sum(w[1] for w in run)
        if calls <= 0:
            return Carried(*best, run)
        low = max(0.0, math.sqrt(calls) - z / 2.0) ** 2
        ratio = low * sum(w[2] for w in run) / calls / sum(w[3] for w in run)
        return Carried(ratio, now_s, run) if ratio > kept else Carried(*best, run)


def slo_reserve(
    policy: PoolPolicy,
    burst_tokens_per_s: float,
    *,
    backlog_tokens: float,
    burst_length_s: float | None,
    carried_ratio: float,
) -> float:
    """The reserve (modelled tokens/s) for a burst of ``burst_tokens_per_s`` under the
    policy's ``burst_slo_wait_s`` (None: the burst itself): :func:`slo_capacity` over
    :func:`queue_horizon_s`, the burst's length the one learned or ``burst_length_s``, in
    the model's tokens at the ratio the fleet has carried (at least 1)."""
    wait_s = policy.burst_slo_wait_s
    if wait_s is None:
        return burst_tokens_per_s
    cold_s = policy.fastest_cold_start_s
    serve_s = cold_s if policy.burst_min_serve_s is None else policy.burst_min_serve_s
    length_s = policy.burst_length_s if burst_length_s is None else burst_length_s
    within_s = queue_horizon_s(
        cold_start_s=cold_s, tick_s=policy.tick_s, burst_length_s=length_s, min_serve_s=serve_s
    )
    need = slo_capacity(
        burst_tokens_per_s, wait_s=wait_s, within_s=within_s, backlog_tokens=backlog_tokens
    )
    return need / max(1.0, carried_ratio)
