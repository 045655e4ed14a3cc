"""The autoscaler's values: what a body observed of a pool (:class:`PoolSignal`), what the loop
remembers between ticks (:class:`AutoscalerState`) and what it decided (:class:`ScaleDecision`).

Kept apart from :mod:`inferplane.core.autoscaler`, the loop that turns the first two into the
third, so that modules which only read or carry them (the learned values kept across restarts,
:mod:`inferplane.core.autoscale_knowledge`) need not import the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferplane.core.autoscale_absorb import Carried
from inferplane.core.autoscale_burst import BurstEpisode
from inferplane.core.autoscale_learn import Learned
from inferplane.core.autoscale_plan import ScaleAction
from inferplane.core.autoscale_reserve import BurstReserve
from inferplane.core.forecast import HoltForecast

__all__ = ["AutoscalerState", "PoolMemory", "PoolSignal", "ScaleDecision"]


@dataclass(frozen=True, slots=True)
class PoolSignal:
    """What a body observed of one pool over the last window ending at ``now_s``."""

    pool: str
    now_s: float
    window_s: float
    tokens: float  # prompt + output tokens of calls that arrived in the window
    requests: int = 0
    backlog_tokens: float = 0.0  # tokens queued and not yet started
    slo_attainment: float | None = None  # fraction of calls in the window within SLO
    serving: Mapping[str, int] = field(default_factory=dict)  # gpu -> ready replicas
    starting: Mapping[str, int] = field(default_factory=dict)  # gpu -> cold/warming replicas

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window_s if self.window_s > 0 else 0.0

    def replicas(self) -> dict[str, int]:
        """Replicas that are or will be serving (draining ones excluded), by GPU type."""
        out = dict(self.serving)
        for gpu, n in self.starting.items():
            out[gpu] = out.get(gpu, 0) + n
        return {g: n for g, n in out.items() if n > 0}


@dataclass(frozen=True, slots=True)
class PoolMemory:
    forecast: HoltForecast = field(default_factory=HoltForecast)
    needs: tuple[tuple[float, float], ...] = ()  # (at_s, capacity tokens/s) in the window
    last_up_s: float | None = None
    rates: tuple[tuple[float, float], ...] = ()  # (at_s, tokens/s) of the last cold start
    reserve: BurstReserve = field(default_factory=BurstReserve)
    slow: HoltForecast = field(default_factory=HoltForecast)  # the reserve's baseline demand
    learned: Learned = field(default_factory=Learned)  # utilisation planned for, from the SLO
    episode: BurstEpisode = field(default_factory=BurstEpisode)  # the burst on now, lengths
    carried: Carried = field(default_factory=Carried)  # carried within the SLO over the model


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    """What the loop remembers between ticks, per pool."""

    pools: Mapping[str, PoolMemory] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """One pool's desired replicas by GPU type, with the numbers behind it."""

    pool: str
    action: ScaleAction
    desired: Mapping[str, int]  # gpu -> replicas
    current: Mapping[str, int]
    demand_tokens_per_s: float  # the demand sized for (forecast peak over the horizon)
    need_tokens_per_s: float  # capacity wanted (demand, backlog and SLO, before bounds)
    reason: str

    @property
    def desired_total(self) -> int:
        return sum(self.desired.values())

    @property
    def current_total(self) -> int:
        return sum(self.current.values())
