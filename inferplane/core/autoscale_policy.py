"""The autoscaler's per-pool settings: the GPU options a pool may buy and its policy (bounds,
utilisation, scale-down hysteresis, surge, burst reserve and burst-episode knobs).

Kept apart from :mod:`inferplane.core.autoscaler` (which re-exports both) so the loop's
arithmetic stays short; the knobs are described where they are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_UTILISATION", "GpuOption", "PoolPolicy"]

#: The most of a replica's modelled throughput a pool may learn to plan for.
MAX_UTILISATION = 4.0


@dataclass(frozen=True, slots=True)
class GpuOption:
    """One way to serve a pool's model: a replica of this GPU type."""

    gpu: str
    price_per_hour_usd: float  # per replica (all its GPUs)
    tokens_per_s: float  # sustainable prompt + output tokens per second per replica
    cold_start_s: float  # from start to serving

    @property
    def usd_per_million_tokens(self) -> float:
        return 1e6 * self.price_per_hour_usd / (3600.0 * self.tokens_per_s)


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """How one pool may be sized."""

    pool: str
    options: tuple[GpuOption, ...]
    min_replicas: int = 1
    max_replicas: int = 8
    target_utilisation: float = 0.7  # plan for this fraction of each replica's throughput
    # Learned: windows within SLO at load raise the fraction planned for by utilisation_step,
    # or to the fraction they carried, up to this (None: no learning; above 1 where the
    # model underprices the work, as cached prompts), an SLO miss resets it
    # (core/autoscale_learn.py).
    max_utilisation: float | None = 2.0
    utilisation_step: float = 0.02
    backlog_drain_s: float = 30.0  # a backlog should drain within this
    slo_target: float = 0.95  # attainment below this while the pool runs hot adds a replica
    hot_utilisation: float = 0.5  # "runs hot": observed demand over this fraction of capacity
    scale_down_window_s: float = 300.0
    scale_down_cooldown_s: float = 120.0
    down_tolerance: float = 0.1
    tick_s: float = 15.0
    surge_z: float = 3.0  # calls this many Poisson sigmas above the forecast: a surge
    surge_max_factor: float = 2.0  # a surge extrapolates to at most this x the observed rate
    surge_windows: int = 4  # windows the surge's slope is fitted over (least squares)
    early_surge_z: float = 3.5  # a window not yet due this far over the forecast: tick now
    burst_prior: float = 1.0  # burst over the quiet demand the reserve covers (1: none)
    # Burst over the demand now (its slow baseline) the reserve covers, like burst_prior at
    # most reserve_max_replicas over need (1: none): a burst at mid-day is larger in absolute
    # terms than one from the trough, which the quiet demand's prior is sized for.
    burst_prior_now: float = 1.0
    # Half-life of the learned burst factor (None: twice scale_down_window_s, the time the
    # loop holds a peak's capacity; a day compressed for a bench compresses both alike).
    burst_memory_s: float | None = None
    burst_max_factor: float = 8.0  # the learned factor's cap
    # The quiet demand the prior scales is the lowest level of demand over this window
    # (None: 288 x scale_down_window_s, a day at the default window: the day's trough).
    quiet_window_s: float | None = None
    reserve_max_replicas: int = 1  # the prior's reserve: at most this many replicas over need
    burst_z: float = 2.0  # a window's count is read at its Poisson lower bound, z sigmas down
    reserve_utilisation: float = 1.0  # the reserve may run this hot until the loop catches up
    reserve_baseline_s: float = 60.0  # time constant of the slow demand the reserve scales
    # Burst episodes (core/autoscale_burst.py): a burst begins at burst_on_ratio x the slow
    # baseline (read as the reserve reads it), ends under burst_off_ratio x the demand it rose
    # from; burst_length_s: its expected length before one is seen (None: unknown, buy as
    # usual); a replica bought during one must serve burst_min_serve_s of it (None: its
    # cold start, so that at least half of what it is paid before the end serves the burst).
    burst_length_s: float | None = None
    burst_min_serve_s: float | None = None
    burst_on_ratio: float = 2.0
    burst_off_ratio: float = 1.5
    # The queue wait a burst may build before the SLO breaks (its TTFT budget): the reserve
    # is the least capacity that keeps the wait within it until a replica bought when the
    # burst is seen serves, scaled by what the fleet has carried within its SLO over the
    # model (core/autoscale_absorb.py). None: the reserve is the whole burst.
    burst_slo_wait_s: float | None = None

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"pool {self.pool!r}: at least one GPU option")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"pool {self.pool!r}: need 0 <= min_replicas <= max_replicas")
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"pool {self.pool!r}: target_utilisation in (0, 1]")
        most = self.max_utilisation
        if (most is not None and not 0 < most <= MAX_UTILISATION) or self.utilisation_step <= 0:
            raise ValueError(
                f"pool {self.pool!r}: max_utilisation in (0, {MAX_UTILISATION}], step > 0"
            )
        if any(o.tokens_per_s <= 0 or o.price_per_hour_usd < 0 for o in self.options):
            raise ValueError(f"pool {self.pool!r}: options need tokens_per_s > 0, price >= 0")
        if min(self.surge_z, self.early_surge_z) <= 0 or self.surge_max_factor < 1:
            raise ValueError(f"pool {self.pool!r}: need surge z > 0, surge_max_factor >= 1")
        if self.surge_windows < 2:
            raise ValueError(f"pool {self.pool!r}: surge_windows >= 2")
        priors = (self.burst_prior, self.burst_prior_now)
        if not 1 <= min(priors) <= max(priors) <= self.burst_max_factor or self.memory_s < 0:
            raise ValueError(f"pool {self.pool!r}: need 1 <= burst_prior <= burst_max_factor")
        low = min(self.burst_z, self.quiet_s, self.reserve_max_replicas)
        if not 0 < self.reserve_utilisation <= 1 or low < 0 or self.reserve_baseline_s <= 0:
            raise ValueError(
                f"pool {self.pool!r}: reserve_utilisation in (0, 1], reserve knobs >= 0"
            )
        lengths = (self.burst_length_s or 0.0, self.burst_min_serve_s or 0.0)
        if min(lengths) < 0 or not 1 < self.burst_off_ratio <= self.burst_on_ratio:
            raise ValueError(f"pool {self.pool!r}: burst lengths >= 0, 1 < off <= on ratio")
        if self.burst_slo_wait_s is not None and not 0 <= self.burst_slo_wait_s < math.inf:
            raise ValueError(f"pool {self.pool!r}: burst_slo_wait_s finite and >= 0")

    @property
    def memory_s(self) -> float:
        """The learned burst factor's half-life."""
        if self.burst_memory_s is None:
            return 2.0 * self.scale_down_window_s
        return self.burst_memory_s

    @property
    def quiet_s(self) -> float:
        """The window over which the quiet demand is the lowest level."""
        window_s = self.quiet_window_s
        return 288.0 * self.scale_down_window_s if window_s is None else window_s

    @property
    def fastest_cold_start_s(self) -> float:
        """The shortest cold start of the GPU types the pool may buy: the soonest a replica
        bought now serves, and the span within which a rise is a burst."""
        return min(o.cold_start_s for o in self.options)

    def option(self, gpu: str) -> GpuOption | None:
        return next((o for o in self.options if o.gpu == gpu), None)
