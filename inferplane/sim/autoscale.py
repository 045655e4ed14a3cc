"""The autoscaler in the simulator: the core's control loop on a periodic tick of virtual time.

The simulator drives the same loop as the gateway. Every ``tick_s`` of the fleet config's
``autoscale`` section (the section ``inferplane serve`` reads), a control tick:

* **senses** each pool the way the gateway does: demand as the calls that arrived in the
  window times the mean work per call served so far (work: prompt tokens not served from
  cache plus output tokens; agentic calls resend a mostly cached context, so tokens *sent*
  would overstate demand many times), the share of calls that ended within their SLO (a
  :class:`PoolSensor` the runner feeds), the backlog (calls queued at the admission gate plus
  the engines' scraped waiting counts, at the mean work per call) and the replicas by GPU
  type and state;
* **watches** between ticks: every ``WATCH_S`` the window so far is checked for a surge
  (:meth:`~inferplane.core.autoscaler.Autoscaler.surging`); one that shows one ticks at once
  and restarts the period (once per period), so a burst seen two seconds in does not wait
  out the tick;
* **decides** with the pure :class:`~inferplane.core.autoscaler.Autoscaler` (or, for
  comparison, :class:`QueueRule`: production-stack's KEDA rule on waiting calls, as an HPA
  evaluates it);
* **acts** on the simulated fleet: a new replica starts cold and loads for its profile's
  cold-start time before it takes work; a replica scaled down drains (no new work, in-flight
  calls finish) and then stops. Spend counts every replica from start to stop, warming and
  draining included.

Scale-down drains the youngest replicas first, so the fleet config's own endpoints (the
accountant's fixed fleet) are the last to go. :class:`Scaling` is a mixin of the runner's
``Simulation``; :class:`ScaleLoop` holds the loop's state and is free of the event machinery.
"""

from __future__ import annotations

from collections.abc import Mapping

from inferplane.core.types import EndpointView
from inferplane.engine.types import EngineEvent, EngineState, RequestFinished
from inferplane.sim.events import EventKind, EventQueue
from inferplane.sim.fleet import Fleet, SimEndpoint
from inferplane.sim.kvfeed import KVFeed
from inferplane.sim.ledger import Call
from inferplane.sim.records import Outcome
from inferplane.sim.scale_loop import (
    FleetPoint,
    PoolCounts,
    QueueRule,
    ScaleLoop,
    ScalePolicy,
    make_loop,
    within_slo,
)

__all__ = [
    "CONTROL_TICK",
    "FleetPoint",
    "QueueRule",
    "ScaleLoop",
    "ScalePolicy",
    "Scaling",
    "gpu_hours",
    "make_loop",
    "replica_spend_usd",
    "within_slo",
]

#: How often the loop looks at the window so far for a surge (inferplane's loop only).
WATCH_S = 1.0


class _Tick:
    """The payload of a control-tick event (a SAMPLE-priority event: the instant has settled)."""

    __slots__ = ()


CONTROL_TICK = _Tick()


class _Watch:
    """The payload of a surge-watch event."""

    __slots__ = ()


SURGE_WATCH = _Watch()


class Scaling:
    """Control-tick handling and actuation; the attributes are the ``Simulation``'s."""

    q: EventQueue
    fleet: Fleet
    kv: KVFeed | None
    scaler: ScaleLoop | None
    _queued: dict[str, Call]
    end_s: float
    _early: bool  # a surge ticked early since the last periodic tick
    _next_tick_s: float  # when the next control tick is due

    def _handle(self, ep: SimEndpoint, events: list[EngineEvent]) -> list[EngineEvent]:
        raise NotImplementedError

    def _wake(self, ep: SimEndpoint, now: float) -> None:
        raise NotImplementedError

    def _on_sample(self, _: object = None) -> None:
        raise NotImplementedError

    def _views(self, now: float) -> list[EndpointView]:
        raise NotImplementedError

    def _sense_arrival(self, call: Call) -> None:
        if self.scaler is not None and call.attempt == 0:
            self.scaler.on_arrival(call.info.targets[0])

    def _served(self, ep: SimEndpoint, call: Call, ev: RequestFinished) -> None:
        """An attempt ended at its engine: count its work, stop the replica if it drained."""
        if self.scaler is not None:
            work = ev.num_prompt_tokens - ev.num_cached_tokens + ev.num_completion_tokens
            self.scaler.on_served(call.info.targets[0], work)
        self._stop_if_drained(ep, ev.time_s)

    def _sense_end(self, call: Call, now: float, outcome: Outcome) -> None:
        if self.scaler is not None and outcome is not Outcome.UNFINISHED:
            self.scaler.on_finish(call.info.targets[0], within_slo(call, now, outcome))

    def _on_sample_or_tick(self, payload: object) -> None:
        if payload is CONTROL_TICK:
            self._on_control_tick()
        elif payload is SURGE_WATCH:
            self._on_watch()
        else:
            self._on_sample(payload)

    def _start_scaling(self) -> None:
        self._early, self._next_tick_s = False, 0.0
        if self.scaler is not None and self.scaler.policy is not ScalePolicy.OFF:
            self.q.push(self.q.now_s, EventKind.SAMPLE, CONTROL_TICK)
            if self.scaler.policy is ScalePolicy.INFERPLANE:
                self.q.push(self.q.now_s + WATCH_S, EventKind.SAMPLE, SURGE_WATCH)

    def _sense_counts(self, now: float) -> tuple[dict[str, PoolCounts], dict[str, int]]:
        assert self.scaler is not None
        self._views(now)  # engines caught up, and the scrape the gateway would have when due
        counts = {pool: self._pool_counts(pool) for pool in self.scaler.policies}
        queued: dict[str, int] = {}
        for call in self._queued.values():
            queued[call.info.targets[0]] = queued.get(call.info.targets[0], 0) + 1
        return counts, queued

    def _control(self, now: float) -> None:
        assert self.scaler is not None
        counts, queued = self._sense_counts(now)
        for pool, desired in self.scaler.decide(now, counts, queued).items():
            self._scale_to(pool, desired, now)

    def _on_control_tick(self) -> None:
        if self.q.now_s < self._next_tick_s:
            return  # an early tick moved the period on: this one is stale
        self._control(self.q.now_s)
        self._early = False
        self._schedule_tick(self.q.now_s)

    def _schedule_tick(self, now: float) -> None:
        assert self.scaler is not None
        self._next_tick_s = now + self.scaler.config.tick_s
        self.q.push(self._next_tick_s, EventKind.SAMPLE, CONTROL_TICK)

    def _on_watch(self) -> None:
        """Between ticks: a surge in the window so far ticks at once, and the period restarts
        from it (a short window after it would make a noisy rate and a steep slope); once per
        period."""
        scaler = self.scaler
        assert scaler is not None
        now = self.q.now_s
        if not self._early:
            counts, queued = self._sense_counts(now)
            if scaler.surging(now, counts, queued):
                self._early = True
                scaler.early_ticks.append(now)
                self._control(now)
                self._schedule_tick(now)  # windows stay a period long
        if now + WATCH_S < self.end_s:
            self.q.push(now + WATCH_S, EventKind.SAMPLE, SURGE_WATCH)

    def _live(self, pool: str) -> list[SimEndpoint]:
        return [
            ep for ep in self.fleet.endpoints if ep.stopped_s is None and pool in ep.info.models
        ]

    def _pool_counts(self, pool: str) -> PoolCounts:
        serving: dict[str, int] = {}
        starting: dict[str, int] = {}
        draining = waiting = 0
        for ep in self._live(pool):
            gpu = ep.info.gpu
            waiting += ep.load.num_waiting
            if ep.draining:
                draining += 1
            elif ep.engine.state is EngineState.READY:
                serving[gpu] = serving.get(gpu, 0) + 1
            else:
                starting[gpu] = starting.get(gpu, 0) + 1
        return PoolCounts(serving, starting, draining, waiting)

    def _scale_to(self, pool: str, desired: Mapping[str, int], now: float) -> None:
        live = [ep for ep in self._live(pool) if not ep.draining]
        gpus = {*desired, *(ep.info.gpu for ep in live)}
        for gpu in sorted(gpus):
            have = [ep for ep in live if ep.info.gpu == gpu]
            want = desired.get(gpu, 0)
            for _ in range(want - len(have)):
                self._add_replica(pool, gpu, now)
            for ep in sorted(have, key=lambda e: -e.index)[: max(0, len(have) - want)]:
                ep.draining = True
                self._stop_if_drained(ep, now)

    def _add_replica(self, pool: str, gpu: str, now: float) -> None:
        assert self.scaler is not None
        serving = [ep for ep in self.fleet.endpoints if pool in ep.info.models]
        same = [ep for ep in serving if ep.info.gpu == gpu]
        template = (same or serving)[0]
        option = self.scaler.policies[pool].option(gpu)
        price = None if same or option is None else option.price_per_hour_usd
        ep = self.fleet.add_replica(template.name, now, gpu=gpu, price_per_hour_usd=price)
        if self.kv is not None:
            self.kv.add_endpoint(ep.name)
        self._handle(ep, ep.engine.start_loading(now))
        self._wake(ep, now)

    def _stop_if_drained(self, ep: SimEndpoint, now: float) -> None:
        """A draining replica with nothing in flight stops (and stops costing)."""
        if ep.draining and ep.in_flight <= 0 and ep.stopped_s is None:
            ep.stopped_s = now


def gpu_hours(fleet: Fleet, now: float) -> float:
    """GPU-hours of every replica of the run, from its start to its stop (or ``now``)."""
    return sum(ep.info.tensor_parallel * ep.cost_s(now) for ep in fleet.endpoints) / 3600.0


def replica_spend_usd(fleet: Fleet, now: float) -> float:
    """Dollars of every replica of the run, from its start to its stop (or ``now``)."""
    return sum(ep.info.price_per_hour_usd * ep.cost_s(now) for ep in fleet.endpoints) / 3600.0
