"""The autoscaler's live body: sense the gateway, run the core loop, act on a fleet.

Every ``tick_s`` the controller builds one ``PoolSignal`` per pool from what the gateway
already knows (token and request counters in its Prometheus registry, endpoint states and
scraped queues from the tracker), asks the pure :class:`~inferplane.core.autoscaler.Autoscaler`
for decisions, and hands them to its actuators:

* :class:`DesiredReplicasGauge` (external): publishes ``inferplane_desired_replicas{pool}`` and
  ``inferplane_desired_replicas_by_gpu{pool,gpu}`` for KEDA or an HPA to act on;
* :class:`EmbeddedFleet`: starts and drains emulated engines in this process, with real cold
  starts (an engine started cold loads its weights before it answers ``/health``). Its engines
  are *slots*: endpoints of the gateway config with fixed ports, running or stopped; a drained
  slot is marked DRAINING in the tracker, left to finish its calls, then stopped.

Between ticks the loop watches: every ``WATCH_S`` it looks at the window so far, and when the
core sees a surge in it (:meth:`~inferplane.core.autoscaler.Autoscaler.surging`) it ticks at
once and restarts the period from there (once per period), as the simulator does.

Wiring: ``setup_autoscaling(app, gateway, config, fleet=None)`` adds the loop to the app's
start and cleanup and ``GET /v1/autoscale`` (the last decisions with their reasons, and what
the loop has learned). With ``learned_store`` (a file or Redis) the learned values outlive a
restart (:mod:`inferplane.gateway.autoscale_store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from inferplane.core.autoscale_knowledge import as_json, knowledge, resume
from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    PoolSignal,
    ScaleDecision,
)
from inferplane.core.types import EndpointState, EndpointView
from inferplane.gateway.autoscale_demand import (
    EXCHANGE_ERRORS,
    PoolCounts,
    SharedDemand,
    pool_views,
    registry_counts,
)
from inferplane.gateway.autoscale_store import FileLearnedStore, LearnedStore, RedisLearnedStore
from inferplane.gateway.embedded_fleet import EmbeddedFleet, Slot
from inferplane.gateway.metric_series import CounterChild, CounterSeries
from inferplane.gateway.observability_config import (
    AutoscaleConfig,
    LearnedStoreKind,
    PoolScaleConfig,
)
from inferplane.state.config import StateBackend, StateConfig

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

log = logging.getLogger("inferplane.gateway.autoscale")

#: Tokens a call waiting at an engine stands for in the backlog (prompt plus output of a
#: typical call; the gateway does not see the engines' queues call by call).
TOKENS_PER_WAITING_CALL = 1000.0

#: How often the loop looks at the window so far for a surge, in seconds.
WATCH_S = 1.0

#: Decisions the controller keeps with their times (``history``), the oldest dropped first.
HISTORY_LEN = 2000

#: A process that has not published its demand counters for this long is retired from the
#: fleet-wide sums (``autoscale_demand``): several watch periods, so a busy loop is not.
SHARED_TTL_S = 30.0

#: Where ``setup_autoscaling`` leaves its controller once the app has started.
CONTROLLER_KEY = web.AppKey("inferplane_autoscale", dict)

__all__ = [
    "AutoscaleConfig",
    "AutoscaleController",
    "DesiredReplicasGauge",
    "EmbeddedFleet",
    "LearnedStoreKind",
    "PoolScaleConfig",
    "Slot",
    "learned_store",
    "setup_autoscaling",
]


class DesiredReplicasGauge:
    """The external actuator: desired replicas as metrics (KEDA's prometheus scaler reads them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Gauge(
            "inferplane_desired_replicas", "Replicas the autoscaler wants per pool.", ("pool",),
            registry=registry,
        )  # fmt: skip
        self.by_gpu = Gauge(
            "inferplane_desired_replicas_by_gpu", "Desired replicas per pool and GPU type.",
            ("pool", "gpu"), registry=registry,
        )  # fmt: skip

    async def apply(self, decision: ScaleDecision) -> None:
        self.total.labels(decision.pool).set(decision.desired_total)
        for gpu in {*decision.desired, *decision.current}:
            self.by_gpu.labels(decision.pool, gpu).set(decision.desired.get(gpu, 0))


class AutoscaleController:
    """Sense, decide, act, every tick; keeps the last decisions for ``/v1/autoscale``."""

    def __init__(
        self,
        config: AutoscaleConfig,
        registry: CollectorRegistry,
        views: Callable[[float], list[EndpointView]],
        actuators: Sequence[Any],
        fleet: EmbeddedFleet | None = None,
        policy_overrides: Mapping[str, Any] | None = None,
        shared: SharedDemand | None = None,
        store: LearnedStore | None = None,
    ) -> None:
        self.config = config
        self.store = store  # where what was learned outlives a restart (None: nowhere)
        self.fleet = fleet
        self.shared = shared  # None: this process's own calls are the demand
        self.tick_errors = 0  # ticks (or watches) that raised, logged by the loop
        policies = config.policies()
        if policy_overrides:  # core knobs the config does not carry (burst reserve, surge)
            policies = [replace(p, **policy_overrides) for p in policies]
        self.autoscaler = Autoscaler(policies)
        self.state = AutoscalerState()
        self.decisions: list[ScaleDecision] = []
        self.history: list[dict[str, Any]] = []  # every decision, with its tick's time
        self._registry = registry
        self._views = views
        self._actuators = list(actuators)
        # pool -> (tokens, ok, all, in flight) at the window's start
        self._last: dict[str, PoolCounts] = {}
        self._last_s: float | None = None
        self._fleet_counts: dict[str, PoolCounts] | None = None  # the last shared sums

    async def restore(self) -> None:
        """Start from what an earlier run of the loop learned (kept in the store)."""
        if self.store is not None:
            learned = await self.store.load()
            self.state = resume(self.state, learned, self.autoscaler.policies)

    @property
    def demand_scope(self) -> str:
        """``fleet`` (every gateway process's calls, summed in Redis) or ``local``."""
        return "local" if self._fleet_counts is None else "fleet"

    def _local_counts(self, views: list[EndpointView]) -> dict[str, PoolCounts]:
        counts = registry_counts(self._registry)
        return {
            pool: PoolCounts(*counts.get(pool, (0.0, 0.0, 0.0)), pool_views(views, pool)[3])
            for pool in self.autoscaler.policies
        }

    async def refresh(self, now: float) -> None:
        """Exchange this process's counters for the fleet's (when shared); on failure the
        window falls back on this process's own calls. A change of source starts the
        window's counts afresh (the two are not comparable: that window reads as quiet)."""
        if self.shared is None:
            return
        fleet: dict[str, PoolCounts] | None
        try:
            fleet = await self.shared.exchange(self._local_counts(self._views(now)))
        except EXCHANGE_ERRORS as exc:
            if self._fleet_counts is not None:
                log.warning(
                    "autoscale: shared demand unavailable, sizing from local calls: %s", exc
                )
            fleet = None
        if (fleet is None) != (self._fleet_counts is None):
            self._last = {}
        self._fleet_counts = fleet

    def sense(self, now: float, *, restart: bool = True) -> list[PoolSignal]:
        """One signal per pool over the window since the last call (``restart`` False: a
        look at the window so far, which keeps counting).

        Demand is the calls that started in the window (those that ended, answered or
        refused, plus the growth of the calls in flight at the pool's endpoints) times the
        mean work of a served call so far (work: prompt tokens not served from cache plus
        completion tokens; an agentic call resends a mostly cached context), as the simulator
        senses arrivals: a saturated pool refuses what it cannot serve, so work served alone
        would hide the demand that needs more replicas, and calls counted as they end would
        show a burst a call's duration late. SLO attainment is the share of calls answered
        200 (a proxy: latency SLOs are not counted per call in the registry yet).
        The counts are the fleet's (every gateway process's, from the last :meth:`refresh`)
        when the demand is shared, else this process's own.
        """
        window_s = self.config.tick_s if self._last_s is None else max(1e-3, now - self._last_s)
        if restart:
            self._last_s = now
        views = self._views(now)
        out = []
        counts = self._fleet_counts or self._local_counts(views)
        for pool in self.autoscaler.policies:
            now_counts = counts.get(pool, PoolCounts(0.0, 0.0, 0.0, 0.0))
            tokens, ok, total, in_flight = now_counts
            serving, starting, waiting, _ = pool_views(views, pool)
            prev = self._last.get(pool, now_counts)
            if restart or pool not in self._last:
                self._last[pool] = now_counts
            done = total - prev[2]
            started = max(0.0, done + in_flight - prev[3])
            out.append(
                PoolSignal(
                    pool=pool,
                    now_s=now,
                    window_s=window_s,
                    tokens=started * (tokens / ok if ok > 0 else TOKENS_PER_WAITING_CALL),
                    requests=int(started),
                    backlog_tokens=TOKENS_PER_WAITING_CALL * waiting,
                    slo_attainment=None if done <= 0 else min(1.0, (ok - prev[1]) / done),
                    serving=serving,
                    starting=starting,
                )
            )
        return out

    def surging(self, now: float) -> bool:
        """Whether the window so far already shows a surge in some pool."""
        if self._last_s is None:
            return False
        signals = self.sense(now, restart=False)
        return any(self.autoscaler.surging(s, self.state) for s in signals)

    async def tick(self, now: float) -> None:
        signals = self.sense(now)
        starting = _starting(self.fleet, self._views(now))
        if starting:
            signals = [
                replace(s, starting={**s.starting, **starting.get(s.pool, {})}) for s in signals
            ]
        self.decisions, self.state = self.autoscaler.decide(signals, self.state)
        if self.store is not None:  # writes only what changed
            await self.store.save(knowledge(self.state, self.autoscaler.policies))
        self.history += [{"t": now, **_as_dict(d)} for d in self.decisions]
        del self.history[:-HISTORY_LEN]
        for decision in self.decisions:
            for actuator in self._actuators:
                await actuator.apply(decision)

    def snapshot(self) -> list[dict[str, Any]]:
        return [_as_dict(d) for d in self.decisions]


def _as_dict(d: ScaleDecision) -> dict[str, Any]:
    return {
        "pool": d.pool,
        "action": d.action.value,
        "desired": dict(d.desired),
        "current": dict(d.current),
        "demand_tokens_per_s": round(d.demand_tokens_per_s, 1),
        "need_tokens_per_s": round(d.need_tokens_per_s, 1),
        "reason": d.reason,
    }


def _starting(fleet: EmbeddedFleet | None, views: list[EndpointView]) -> dict[str, dict[str, int]]:
    """Engines the embedded fleet started that do not serve yet (cold or loading)."""
    out: dict[str, dict[str, int]] = {}
    if fleet is None:
        return out
    states = {v.name: v.state for v in views}
    for name in fleet.servers:
        slot = fleet.slots[name]
        if name not in fleet.draining and states.get(name) is not EndpointState.READY:
            pool = out.setdefault(slot.pool, {})
            pool[slot.gpu] = pool.get(slot.gpu, 0) + 1
    return out


def _shared_demand(gateway: Gateway) -> SharedDemand | None:
    """The fleet-wide demand exchange when the gateways share their state in Redis."""
    state = gateway.config.state
    if state.backend is not StateBackend.REDIS:
        return None
    return SharedDemand(
        state.redis_url,
        prefix=state.key_prefix,
        ttl_s=SHARED_TTL_S,
        op_timeout_s=_loop_timeout_s(state),
    )


def _loop_timeout_s(state: StateConfig) -> float:
    """The loop's Redis calls are off the request path: they may wait longer than a call's."""
    return max(0.25, state.op_timeout_s)


def learned_store(gateway: Gateway, config: AutoscaleConfig) -> LearnedStore | None:
    """The store ``autoscale.learned_store`` names (None: memory only)."""
    if config.learned_store is LearnedStoreKind.FILE and config.state_path is not None:
        return FileLearnedStore(config.state_path)
    if config.learned_store is LearnedStoreKind.REDIS:
        state = gateway.config.state
        return RedisLearnedStore(
            state.redis_url, prefix=state.key_prefix, op_timeout_s=_loop_timeout_s(state)
        )
    return None


def setup_autoscaling(
    app: web.Application,
    gateway: Gateway,
    config: AutoscaleConfig,
    fleet: EmbeddedFleet | None = None,
    policy_overrides: Mapping[str, Any] | None = None,
) -> None:
    """Run the loop with the gateway (when enabled) and serve ``GET /v1/autoscale``.

    ``policy_overrides``: :class:`~inferplane.core.autoscaler.PoolPolicy` fields set on every
    pool's policy (knobs the config section does not carry yet, e.g. ``burst_prior``).
    Once the app has started, ``app[CONTROLLER_KEY]["ctl"]`` is the controller.
    """
    if not config.enabled:
        return
    holder: dict[str, AutoscaleController] = {}
    app[CONTROLLER_KEY] = holder
    tasks: list[asyncio.Task[None]] = []
    error_count: list[CounterChild] = []

    async def loop() -> None:
        ctl, errors, due_s, early = holder["ctl"], error_count[0], gateway.clock(), False
        while True:
            now = gateway.clock()
            try:
                await ctl.refresh(now)
                if now >= due_s:
                    due_s, early = now + config.tick_s, False
                    await ctl.tick(now)
                elif not early and ctl.surging(now):
                    due_s, early = now + config.tick_s, True  # the period restarts here
                    await ctl.tick(now)
            except Exception:  # the loop goes on: the next tick is level-triggered anyway
                log.exception("autoscale tick failed")
                ctl.tick_errors += 1
                errors.inc()
            await asyncio.sleep(max(0.0, min(WATCH_S, due_s - gateway.clock())))

    async def on_startup(app: web.Application) -> None:
        registry = gateway.recorder.metrics.registry
        actuators: list[Any] = [DesiredReplicasGauge(registry)]
        if fleet is not None:
            actuators.append(fleet)
        # The gateway's own counter series (as every other counter): no ``_created`` sample.
        doc = "Autoscale ticks that raised (logged)."
        error_count[:] = [CounterSeries("inferplane_autoscale_errors", doc, (), registry).labels()]
        holder["ctl"] = AutoscaleController(
            config, registry, lambda now: gateway.tracker.views(now), actuators, fleet,
            policy_overrides, _shared_demand(gateway), learned_store(gateway, config),
        )  # fmt: skip
        await holder["ctl"].restore()
        tasks.append(asyncio.create_task(loop()))

    async def on_cleanup(app: web.Application) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctl = holder.get("ctl")
        if ctl is not None and ctl.shared is not None:
            await ctl.shared.close()
        if ctl is not None and ctl.store is not None:
            await ctl.store.close()
        if fleet is not None:
            await fleet.stop()

    async def handler(request: web.Request) -> web.Response:
        ctl = holder.get("ctl")
        body: dict[str, Any] = {"decisions": []}
        if ctl is not None:
            body = {
                "decisions": ctl.snapshot(),
                "demand": ctl.demand_scope,
                "tick_errors": ctl.tick_errors,
                "learned": as_json(knowledge(ctl.state, ctl.autoscaler.policies)),
            }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/v1/autoscale", handler)
