"""The autoscaler: a level-triggered control loop that sizes each pool (sense, detect, adapt).

Every tick a body hands the loop one :class:`PoolSignal` per pool (what it observed over the
last window: tokens and requests that arrived, the backlog, SLO attainment and the replicas it
has, by GPU type and state) and gets back a :class:`ScaleDecision` per pool: how many replicas
of each GPU type the pool should have, and why. The loop compares desired with actual state
on every tick (level-triggered, like a Kubernetes controller), so a lost tick or a failed
start is corrected by the next one; nothing depends on seeing an edge.

How the desired size is found:

* **sense**: the observed demand is tokens per second over the window; a Holt forecaster
  (level plus trend, exponentially smoothed) learns its course. A body that knows more (a
  schedule, a diurnal profile) passes a :class:`Forecast` instead.
* **surge**: a window whose calls exceed the forecast by more than ``surge_z`` Poisson
  standard deviations is a burst: the rise of the last windows is extrapolated over the
  cold-start horizon (:mod:`inferplane.core.autoscale_surge`); the scale-down window then
  holds what was bought while the surge plays out. :meth:`Autoscaler.surging` lets a body
  check a window before its tick is due (at ``early_surge_z``) and tick at once.
* **burst reserve**: spare warm capacity at ``reserve_utilisation`` for the larger of
  ``burst_prior x quiet demand`` (the day's trough: a fixed amount, at most
  ``reserve_max_replicas`` over need) and ``demand x learned burst factor`` (held, decaying
  with ``burst_memory_s``, capped by the highest rate seen)
  (:mod:`inferplane.core.autoscale_reserve`): it covers a burst's first cold start.
* **learned utilisation**: the fraction of each replica's modelled throughput planned for
  starts at ``target_utilisation`` and rises while the SLO holds at load, up to
  ``max_utilisation``; an SLO miss resets it and lowers its ceiling
  (:mod:`inferplane.core.autoscale_learn`): the model may understate what a workload needs.
* **ahead of need**: a new replica takes its cold-start time before it serves, so capacity is
  sized for the peak forecast over ``[now, now + cold start + tick]``, not for now.
* **detect**: a backlog adds the replicas that drain it within ``backlog_drain_s``; SLO
  attainment under target while the pool runs hot adds one replica per tick.
* **adapt, cost-aware**: capacity in tokens/s is bought with the GPU option of least cost for
  the gap (whole replicas at their hourly price), and shed from the replicas of highest cost
  per token first; draining replicas finish their work and count for nothing.
* **no flapping**: scale-up is immediate; scale-down only follows the *largest* need seen over
  ``scale_down_window_s`` (Kubernetes' stabilisation window), only when that need is below the
  current capacity by more than ``down_tolerance``, and not within ``scale_down_cooldown_s``
  of the last scale-up. ``min_replicas`` and ``max_replicas`` bound the total.

Pure: no clock, no I/O; ``now_s`` comes in the signal and the state is a value passed back in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferplane.core.autoscale_learn import Learned, learned_utilisation
from inferplane.core.autoscale_plan import ScaleAction, plan
from inferplane.core.autoscale_plan import capacity as _capacity
from inferplane.core.autoscale_plan import cheapest_for as _cheapest_for
from inferplane.core.autoscale_reserve import BurstReserve, slow_baseline
from inferplane.core.autoscale_surge import surge_rate
from inferplane.core.forecast import Forecast, HoltForecast, ScheduleForecast

__all__ = [
    "Autoscaler",
    "AutoscalerState",
    "Forecast",
    "GpuOption",
    "HoltForecast",
    "PoolPolicy",
    "PoolSignal",
    "ScaleAction",
    "ScaleDecision",
    "ScheduleForecast",
]


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
    # Learned: windows within SLO at load raise the fraction planned for by utilisation_step
    # up to this (None: no learning), an SLO miss resets it (core/autoscale_learn.py).
    max_utilisation: float | None = 0.9
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

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"pool {self.pool!r}: at least one GPU option")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"pool {self.pool!r}: need 0 <= min_replicas <= max_replicas")
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"pool {self.pool!r}: target_utilisation in (0, 1]")
        most = self.max_utilisation
        if (most is not None and not 0 < most <= 1) or self.utilisation_step <= 0:
            raise ValueError(f"pool {self.pool!r}: max_utilisation in (0, 1], step > 0")
        if any(o.tokens_per_s <= 0 or o.price_per_hour_usd < 0 for o in self.options):
            raise ValueError(f"pool {self.pool!r}: options need tokens_per_s > 0, price >= 0")
        if min(self.surge_z, self.early_surge_z) <= 0 or self.surge_max_factor < 1:
            raise ValueError(f"pool {self.pool!r}: need surge z > 0, surge_max_factor >= 1")
        if self.surge_windows < 2:
            raise ValueError(f"pool {self.pool!r}: surge_windows >= 2")
        if not 1 <= self.burst_prior <= self.burst_max_factor or self.memory_s < 0:
            raise ValueError(f"pool {self.pool!r}: need 1 <= burst_prior <= burst_max_factor")
        low = min(self.burst_z, self.quiet_s, self.reserve_max_replicas)
        if not 0 < self.reserve_utilisation <= 1 or low < 0 or self.reserve_baseline_s <= 0:
            raise ValueError(
                f"pool {self.pool!r}: reserve_utilisation in (0, 1], reserve knobs >= 0"
            )

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

    def option(self, gpu: str) -> GpuOption | None:
        return next((o for o in self.options if o.gpu == gpu), None)


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
class _PoolMemory:
    forecast: HoltForecast = field(default_factory=HoltForecast)
    needs: tuple[tuple[float, float], ...] = ()  # (at_s, capacity tokens/s) in the window
    last_up_s: float | None = None
    rates: tuple[tuple[float, float], ...] = ()  # (at_s, tokens/s) of the last windows
    reserve: BurstReserve = field(default_factory=BurstReserve)
    slow: HoltForecast = field(default_factory=HoltForecast)  # the reserve's baseline demand
    learned: Learned = field(default_factory=Learned)  # utilisation planned for, from the SLO


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    """What the loop remembers between ticks, per pool."""

    pools: Mapping[str, _PoolMemory] = field(default_factory=dict)


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


class Autoscaler:
    """Sizes pools; ``decide`` is pure: it returns the decisions and the next state."""

    def __init__(self, policies: Sequence[PoolPolicy]) -> None:
        self.policies = {p.pool: p for p in policies}

    def decide(
        self,
        signals: Sequence[PoolSignal],
        state: AutoscalerState,
        forecasts: Mapping[str, Forecast] | None = None,
    ) -> tuple[list[ScaleDecision], AutoscalerState]:
        pools = dict(state.pools)
        decisions: list[ScaleDecision] = []
        for signal in signals:
            policy = self.policies.get(signal.pool)
            if policy is None:
                continue
            memory = pools.get(signal.pool, _PoolMemory())
            given = None if forecasts is None else forecasts.get(signal.pool)
            decision, pools[signal.pool] = _decide_pool(policy, signal, memory, given)
            decisions.append(decision)
        return decisions, AutoscalerState(pools)

    def surging(self, signal: PoolSignal, state: AutoscalerState) -> bool:
        """Whether ``signal``, a window not yet due (the calls since the last tick), is
        already a surge at the policy's ``early_surge_z``: the body may decide now."""
        policy = self.policies.get(signal.pool)
        memory = state.pools.get(signal.pool)
        if policy is None or memory is None:
            return False
        z = policy.early_surge_z
        return _surge_demand(policy, signal, memory, _horizon_s(policy), z) > 0


def _horizon_s(policy: PoolPolicy) -> float:
    return max(o.cold_start_s for o in policy.options) + policy.tick_s


def _decide_pool(
    policy: PoolPolicy, signal: PoolSignal, memory: _PoolMemory, given: Forecast | None
) -> tuple[ScaleDecision, _PoolMemory]:
    now = signal.now_s
    holt = memory.forecast.update(signal.tokens_per_s, now)
    forecast: Forecast = holt if given is None else given
    current = signal.replicas()
    horizon_s = _horizon_s(policy)
    surge = _surge_demand(policy, signal, memory, horizon_s, policy.surge_z)
    demand = max(signal.tokens_per_s, forecast.peak_tokens_per_s(now, now + horizon_s), surge)
    capacity = _capacity(policy, current)
    learned = learned_utilisation(policy, signal, memory.learned)
    utilisation = learned.utilisation
    need = demand / utilisation + signal.backlog_tokens / policy.backlog_drain_s
    reasons = [f"demand {demand:.0f} tok/s (horizon {horizon_s:.0f} s, at {utilisation:.2f})"]
    reserve, slow, spare = _reserve(policy, signal, memory, forecast, horizon_s, demand, need)
    if spare / policy.reserve_utilisation > need:
        need = spare / policy.reserve_utilisation
        reasons.append(f"burst reserve {spare:.0f} tok/s (x{spare / max(demand, 1e-9):.1f} demand)")
    if surge > 0:
        reasons.append(f"surge: {signal.tokens_per_s:.0f} tok/s rising, {surge:.0f} ahead")
    if signal.backlog_tokens > 0:
        reasons.append(f"backlog {signal.backlog_tokens:.0f} tok")
    hot = capacity > 0 and signal.tokens_per_s > policy.hot_utilisation * capacity
    slo = signal.slo_attainment
    slo_add = slo is not None and slo < policy.slo_target and hot
    if slo_add:
        need = max(need, capacity + _cheapest_for(policy, 1.0).tokens_per_s)
        reasons.append(f"SLO attainment {slo:.3f} < {policy.slo_target}")
    needs = (
        *((t, n) for t, n in memory.needs if t > now - policy.scale_down_window_s),
        (now, need),
    )
    window_need = max(n for _, n in needs)
    desired, action, why = plan(policy, current, need, window_need, memory.last_up_s, now)
    reasons.append(why)
    last_up = now if action is ScaleAction.UP else memory.last_up_s
    decision = ScaleDecision(
        pool=policy.pool,
        action=action,
        desired=desired,
        current=current,
        demand_tokens_per_s=demand,
        need_tokens_per_s=need,
        reason="; ".join(reasons),
    )
    rates = (*memory.rates, (now, signal.tokens_per_s))[-policy.surge_windows :]
    return decision, _PoolMemory(holt, needs[-256:], last_up, rates, reserve, slow, learned)


def _reserve(
    policy: PoolPolicy,
    signal: PoolSignal,
    memory: _PoolMemory,
    forecast: Forecast,
    horizon_s: float,
    demand: float,
    need: float,
) -> tuple[BurstReserve, HoltForecast, float]:
    """The reserve after this window, its slow baseline and the spare demand (tokens/s) it
    should carry: the learned part scales the slow baseline (never above the forecast), the
    prior's the quiet demand (at most ``reserve_max_replicas`` replicas over ``need``)."""
    now = signal.now_s
    reserve = _observe_reserve(policy, signal, memory)
    slow = slow_baseline(
        memory.slow, tokens=signal.tokens, requests=signal.requests, window_s=signal.window_s,
        now_s=now, time_constant_s=policy.reserve_baseline_s,
    )  # fmt: skip
    ahead = now + horizon_s
    base = min(slow.peak_tokens_per_s(now, ahead), forecast.peak_tokens_per_s(now, ahead))
    cap = need + policy.reserve_max_replicas * _cheapest_for(policy, 1.0).tokens_per_s
    spare = reserve.reserve_tokens_per_s(
        base, now, prior=policy.burst_prior, memory_s=policy.memory_s,
        prior_cap_tokens_per_s=cap, now_tokens_per_s=demand,
    )  # fmt: skip
    return reserve, slow, spare


def _observe_reserve(policy: PoolPolicy, signal: PoolSignal, memory: _PoolMemory) -> BurstReserve:
    """The burst reserve after this window, against the slow baseline's rate (a burst is
    measured from the demand it rose from; a noisy fast forecast would make noise a burst)."""
    holt = memory.slow if memory.slow.at_s is not None else memory.forecast
    return memory.reserve.observe(
        requests=signal.requests,
        tokens=signal.tokens,
        window_s=signal.window_s,
        now_s=signal.now_s,
        baseline_tokens_per_s=max(holt.level, holt.predict(signal.now_s)),
        memory_s=policy.memory_s,
        z=policy.burst_z,
        max_factor=policy.burst_max_factor,
        quiet_window_s=policy.quiet_s,
        level_time_constant_s=policy.reserve_baseline_s,
    )


def _surge_demand(
    policy: PoolPolicy, signal: PoolSignal, memory: _PoolMemory, horizon_s: float, z: float
) -> float:
    """Demand over the horizon when this window is a surge at ``z``, else 0.

    Expected: the forecast's rate over the window (never under its level: a falling trend
    must not make the expectation undershoot); the fit takes the last ``surge_windows``."""
    holt = memory.forecast
    return surge_rate(
        requests=signal.requests,
        tokens=signal.tokens,
        window_s=signal.window_s,
        now_s=signal.now_s,
        expected_tokens_per_s=max(holt.level, holt.predict(signal.now_s)),
        recent=memory.rates[-(policy.surge_windows - 1) :],
        horizon_s=horizon_s,
        z=z,
        max_factor=policy.surge_max_factor,
    )
