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
* **burst episodes**: a burst that will be over before a replica bought now would serve
  ``burst_min_serve_s`` of it (its expected length: the longest seen, or ``burst_length_s``)
  buys nothing more; when it ends, its needs leave the scale-down window, so the replicas it
  brought drain at once (:mod:`inferplane.core.autoscale_burst`).
* **burst reserve**: spare warm capacity at ``reserve_utilisation`` for the larger of
  ``burst_prior x quiet demand`` (the day's trough: a fixed amount), ``burst_prior_now x
  the demand now`` (its forecast; the slow baseline during a burst episode), both at most
  ``reserve_max_replicas`` over need, and ``demand x learned burst factor`` (held, decaying
  with ``burst_memory_s``, capped by the highest rate seen)
  (:mod:`inferplane.core.autoscale_reserve`): it covers a burst's first cold start. The
  prior's part buys replicas; the learned part only keeps those a burst brought (it holds
  them in the scale-down window) and buys none once the burst is over. With
  ``burst_slo_wait_s`` each part is the least capacity whose queue keeps its wait within it
  until a replica bought when the burst is seen serves, at what the fleet has carried
  within its SLO (:mod:`inferplane.core.autoscale_absorb`).
* **learned utilisation**: the fraction of each replica's modelled throughput planned for
  starts at ``target_utilisation`` and rises while the SLO holds at load, up to
  ``max_utilisation``; an SLO miss resets it and lowers its ceiling
  (:mod:`inferplane.core.autoscale_learn`): the model may misprice a workload. The reserve
  does not run at it: it is the margin for a burst larger than any window seen (running it
  at the learned fraction cost 44 failed tasks on the emulated bench). What was learned
  survives a restart of the loop (:mod:`inferplane.core.autoscale_knowledge`).
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
  of the last scale-up, nor while the recent windows' fitted line rises to a need the
  smaller fleet could not carry within a cold start (released capacity takes that long to
  come back), nor while a burst episode is on (a burst can rise again within itself; its
  replicas drain at once when it ends). ``min_replicas`` and ``max_replicas`` bound the total.

Pure: no clock, no I/O; ``now_s`` comes in the signal and the state is a value passed back in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from inferplane.core.autoscale_absorb import Carried, slo_reserve
from inferplane.core.autoscale_burst import BurstEpisode, late_cap, rise_ratio
from inferplane.core.autoscale_learn import Learned, learned_utilisation
from inferplane.core.autoscale_plan import ScaleAction, plan
from inferplane.core.autoscale_plan import capacity as _capacity
from inferplane.core.autoscale_plan import cheapest_for as _cheapest_for
from inferplane.core.autoscale_policy import GpuOption, PoolPolicy
from inferplane.core.autoscale_reserve import BurstReserve, slow_baseline
from inferplane.core.autoscale_state import AutoscalerState, PoolMemory, PoolSignal, ScaleDecision
from inferplane.core.autoscale_surge import rising_rate, surge_rate
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
            memory = pools.get(signal.pool, PoolMemory())
            signal = _with_work(signal)
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
        return _surge_demand(policy, _with_work(signal), memory, _horizon_s(policy), z) > 0


def _with_work(signal: PoolSignal) -> PoolSignal:
    """The window as the rate tests read it: calls that carried no tokens (no work to size
    for) count as no calls, whose tokens per call would be undefined."""
    if signal.requests > 0 and signal.tokens <= 0:
        return replace(signal, requests=0)
    return signal


def _horizon_s(policy: PoolPolicy) -> float:
    return max(o.cold_start_s for o in policy.options) + policy.tick_s


def _decide_pool(
    policy: PoolPolicy, signal: PoolSignal, memory: PoolMemory, given: Forecast | None
) -> tuple[ScaleDecision, PoolMemory]:
    now = signal.now_s
    episode, rises = _episode(policy, signal, memory)
    ended = memory.episode.on and not episode.on
    # A burst that ended leaves the fast forecast: its level and trend are not the demand's.
    holt = (replace(memory.forecast, at_s=None) if ended else memory.forecast).update(
        signal.tokens_per_s, now
    )
    forecast: Forecast = holt if given is None else given
    current = signal.replicas()
    capacity = _capacity(policy, current)
    demand, need, learned, reasons = _demand_need(policy, signal, memory, forecast, capacity)
    reserve, slow, (kept, bought) = _reserve(
        policy, signal, memory, forecast, (demand, need), bursting=episode.on or rises
    )
    carried = _carried(policy, signal, memory.carried)
    burst = bought
    kept, bought = (
        slo_reserve(
            policy, part, backlog_tokens=signal.backlog_tokens, burst_length_s=episode.length_s,
            carried_ratio=carried.ratio_at(now, policy.quiet_s),
        )
        for part in (kept, bought)
    )  # fmt: skip
    if bought / policy.reserve_utilisation > need:
        need = bought / policy.reserve_utilisation
        reasons.append(
            f"burst reserve {bought:.0f} tok/s (x{bought / max(demand, 1e-9):.1f} demand"
            f"; for a burst of {burst:.0f}{', burst on' if episode.on else ''})"
        )
    seen = _recent_rates(policy, (*memory.rates, (now, signal.tokens_per_s)), now)
    rates = seen[-policy.surge_windows :]
    need, late = late_cap(policy, episode, now, rates, capacity, need)
    if late:
        reasons.append(late)
    held = max(need, kept / policy.reserve_utilisation)  # the learned reserve only holds
    since = memory.episode.start_s if ended else None
    needs = (
        *((t, n) for t, n in memory.needs
          if t > now - policy.scale_down_window_s and (since is None or t < since)),
        (now, held),
    )  # fmt: skip
    window_need = max(n for _, n in needs)
    rising = _rising_need(policy, rates, now, learned.utilisation)
    kept_in_burst = capacity if episode.on else 0.0  # nothing is released during a burst
    desired, action, why = plan(
        policy, current, need, max(window_need, rising, kept_in_burst), memory.last_up_s, now
    )
    if action is ScaleAction.HOLD and max(rising, kept_in_burst) > window_need:
        why = f"{why}; {_kept_why(rising, kept_in_burst)}"
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
    after = PoolMemory(holt, needs[-256:], last_up, seen, reserve, slow, learned, episode, carried)
    return decision, after


#: The most windows the loop keeps, whatever the cold start spans in ticks (its memory is
#: bounded).
MAX_RATES = 64


def _recent_rates(
    policy: PoolPolicy, rates: tuple[tuple[float, float], ...], now: float
) -> tuple[tuple[float, float], ...]:
    """The windows (``(at_s, tokens/s)``) kept after this one: those of the last cold start,
    which the rise test reads (a rise within a cold start is a burst), and at least the last
    ``surge_windows``, which the surge fit reads. Until 35fff4f only the latter were kept,
    so the rise test saw 15-20 s at the benches' 5 s tick: the emulated day's seed 1 rose
    3.2x in 25 s, never 2x within four windows, and began its burst only at 128 s."""
    within_s = policy.fastest_cold_start_s
    kept = tuple(r for r in rates if now - r[0] <= within_s)
    if len(kept) < policy.surge_windows:
        kept = rates[-policy.surge_windows :]
    return kept[-MAX_RATES:]


def _kept_why(rising: float, kept_in_burst: float) -> str:
    if kept_in_burst >= rising:
        return "burst on: nothing released until it ends"
    return f"rising to {rising:.0f} tok/s within a cold start"


def _rising_need(
    policy: PoolPolicy, rates: Sequence[tuple[float, float]], now: float, utilisation: float
) -> float:
    """The need where the recent windows' fitted line rises to within the horizon (0: flat
    or falling). A replica released now takes a cold start to come back, so the loop does not
    scale down below it; it buys nothing (the forecast and the surge test size scale-ups)."""
    rate = rising_rate(rates, now, _horizon_s(policy), policy.surge_max_factor)
    return rate / utilisation


def _demand_need(
    policy: PoolPolicy,
    signal: PoolSignal,
    memory: PoolMemory,
    forecast: Forecast,
    capacity: float,
) -> tuple[float, float, Learned, list[str]]:
    """The demand sized for (forecast peak over the horizon, surge), the capacity it needs
    with the backlog and SLO terms, the utilisation learned and the reasons."""
    now = signal.now_s
    horizon_s = _horizon_s(policy)
    surge = _surge_demand(policy, signal, memory, horizon_s, policy.surge_z)
    demand = max(signal.tokens_per_s, forecast.peak_tokens_per_s(now, now + horizon_s), surge)
    learned = learned_utilisation(policy, signal, memory.learned)
    utilisation = learned.utilisation
    need = demand / utilisation + signal.backlog_tokens / policy.backlog_drain_s
    reasons = [f"demand {demand:.0f} tok/s (horizon {horizon_s:.0f} s, at {utilisation:.2f})"]
    if surge > 0:
        reasons.append(f"surge: {signal.tokens_per_s:.0f} tok/s rising, {surge:.0f} ahead")
    if signal.backlog_tokens > 0:
        reasons.append(f"backlog {signal.backlog_tokens:.0f} tok")
    hot = capacity > 0 and signal.tokens_per_s > policy.hot_utilisation * capacity
    slo = signal.slo_attainment
    if slo is not None and slo < policy.slo_target and hot:
        need = max(need, capacity + _cheapest_for(policy, 1.0).tokens_per_s)
        reasons.append(f"SLO attainment {slo:.3f} < {policy.slo_target}")
    return demand, need, learned, reasons


def _episode(
    policy: PoolPolicy, signal: PoolSignal, memory: PoolMemory
) -> tuple[BurstEpisode, bool]:
    """The burst episode after this window, and whether the window rises like a burst: a
    surge, or a rise to ``burst_on_ratio`` within a cold start, once the slow baseline has
    settled. Such a window over the slow baseline begins an episode
    (:mod:`inferplane.core.autoscale_burst`); one under it (a rise from a dip, or a burst's
    first windows) still rises, and the reserve's prior on the demand now then scales the
    slow baseline, as it does in an episode: the demand of a burst under way is not the
    demand the burst it guards against would rise from."""
    holt = memory.slow if memory.slow.at_s is not None else memory.forecast
    since, horizon_s = memory.reserve.since_s, _horizon_s(policy)
    settled = since is not None and signal.now_s - since >= policy.reserve_baseline_s
    surging = settled and (
        rise_ratio(
            requests=signal.requests, tokens=signal.tokens, window_s=signal.window_s,
            now_s=signal.now_s, rates=memory.rates, z=policy.burst_z,
            within_s=policy.fastest_cold_start_s,
        ) >= policy.burst_on_ratio
        or _surge_demand(policy, signal, memory, horizon_s, policy.surge_z) > 0
    )  # fmt: skip
    episode = memory.episode.observe(
        requests=signal.requests, tokens=signal.tokens, window_s=signal.window_s,
        now_s=signal.now_s, baseline_tokens_per_s=max(holt.level, holt.predict(signal.now_s)),
        z=policy.burst_z, on_ratio=policy.burst_on_ratio, off_ratio=policy.burst_off_ratio,
        surging=surging,
    )  # fmt: skip
    return episode, surging


def _reserve(
    policy: PoolPolicy,
    signal: PoolSignal,
    memory: PoolMemory,
    forecast: Forecast,
    demand_need: tuple[float, float],
    *,
    bursting: bool,
) -> tuple[BurstReserve, HoltForecast, tuple[float, float]]:
    """The reserve after this window, its slow baseline and the spare demand (tokens/s) it
    should carry, in two parts: the learned one scales the slow baseline (never above the
    forecast), the prior's the larger of ``burst_prior x quiet demand`` and ``burst_prior_now
    x the forecast`` (the slow baseline instead while a burst episode is on, or the window
    rises like a burst: a burst is not the demand the next one rises from), at most
    ``reserve_max_replicas`` replicas over ``need``. The slow baseline alone lags a day's
    ramp by its time constant and more (its input is clipped): on the emulated fleet it read
    728 tok/s at 9 s and bought the spare at 99 s, 6 s before the burst, against a 46 s cold
    start."""
    demand, need = demand_need
    now = signal.now_s
    reserve = _observe_reserve(policy, signal, memory)
    slow = slow_baseline(
        memory.slow, tokens=signal.tokens, requests=signal.requests, window_s=signal.window_s,
        now_s=now, time_constant_s=policy.reserve_baseline_s,
    )  # fmt: skip
    ahead = now + _horizon_s(policy)
    base = min(slow.peak_tokens_per_s(now, ahead), forecast.peak_tokens_per_s(now, ahead))
    cap = need + policy.reserve_max_replicas * _cheapest_for(policy, 1.0).tokens_per_s
    learned, prior = reserve.reserve_parts(
        base, now, prior=policy.burst_prior, memory_s=policy.memory_s,
        prior_cap_tokens_per_s=cap, now_tokens_per_s=demand,
    )  # fmt: skip
    ahead_now = base if bursting else forecast.peak_tokens_per_s(now, ahead)
    return reserve, slow, (learned, max(prior, _prior_now(policy, reserve, ahead_now, cap)))


def _prior_now(policy: PoolPolicy, reserve: BurstReserve, demand: float, cap: float) -> float:
    """The prior on the demand now: the demand plus the burst it may bring, ``burst_prior_now
    - 1`` x the demand, the quiet demand at most (a burst adds to the day what it adds to its
    trough), the whole at most ``cap``. The demand's own need then covers the burst once the
    demand is high (mid-day, a burst's tail), and the spare is not paid on top of it. Until
    the quiet level has settled it is ``burst_prior_now`` x the demand (a loop started before
    its traffic: the level rises from 0 and would hold the spare back)."""
    low = min((demand, *(v for _, v in reserve.quiet)))
    return min(demand + (policy.burst_prior_now - 1.0) * low, cap)


def _carried(policy: PoolPolicy, signal: PoolSignal, carried: Carried) -> Carried:
    """What the serving replicas carried within the SLO over their modelled capacity
    (:class:`~inferplane.core.autoscale_absorb.Carried`; unchanged without a burst wait)."""
    if policy.burst_slo_wait_s is None:
        return carried
    return carried.observe(
        requests=signal.requests, tokens=signal.tokens, window_s=signal.window_s,
        now_s=signal.now_s, modelled_tokens_per_s=_capacity(policy, signal.serving),
        backlog_tokens=signal.backlog_tokens, slo_attainment=signal.slo_attainment,
        slo_target=policy.slo_target, wait_s=policy.burst_slo_wait_s, z=policy.burst_z,
        span_s=_horizon_s(policy), memory_s=policy.quiet_s,
    )  # fmt: skip


def _observe_reserve(policy: PoolPolicy, signal: PoolSignal, memory: PoolMemory) -> BurstReserve:
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
    policy: PoolPolicy, signal: PoolSignal, memory: PoolMemory, horizon_s: float, z: float
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
