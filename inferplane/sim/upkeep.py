"""The simulation's upkeep: faults that change the fleet, and periodic samples of it.

Split out of :mod:`inferplane.sim.runner` (a mixin of its ``Simulation``): a fault crashes,
slows, restarts or adds engines; a sample records queues, KV use and spend, and lets the
admission queue look at a fresh scrape. Leaping engines are brought up to ``now`` first.
"""

from __future__ import annotations

from inferplane.core.types import EndpointState
from inferplane.engine.types import EngineEvent, EngineState
from inferplane.sim.events import EventKind, EventQueue
from inferplane.sim.faults import ActionKind, FaultAction
from inferplane.sim.fleet import Fleet, SimEndpoint
from inferplane.sim.ledger import Call, Ledger
from inferplane.sim.records import Sample
from inferplane.sim.scenario import Scenario


class Upkeep:
    """Fault and sample handlers; the attributes are the ``Simulation``'s."""

    q: EventQueue
    fleet: Fleet
    ledger: Ledger
    scenario: Scenario
    _samples: list[Sample]
    _by_engine_id: dict[str, Call]
    _base_endpoints: int
    end_s: float

    def _handle(self, ep: SimEndpoint, events: list[EngineEvent]) -> list[EngineEvent]:
        raise NotImplementedError

    def _wake(self, ep: SimEndpoint, now: float) -> None:
        raise NotImplementedError

    def _schedule_poll(self, at_s: float | None) -> None:
        raise NotImplementedError

    def _advance(self, ep: SimEndpoint, now: float) -> None:
        raise NotImplementedError

    def _leaping(self) -> bool:
        raise NotImplementedError

    def _on_fault(self, action: FaultAction) -> None:
        now = self.q.now_s
        if action.kind is ActionKind.SCALE_OUT:
            for template in action.endpoints:
                ep = self.fleet.add_replica(template, now)
                self._handle(ep, ep.engine.start_loading(now))
                self._wake(ep, now)
            return
        for name in action.endpoints:
            ep = self.fleet.by_name[name]
            if action.kind is ActionKind.SLOW:  # steps up to now keep the old speed
                self._advance(ep, now)
                ep.engine.slowdown = action.factor
            elif action.kind is ActionKind.CRASH:
                self._handle(ep, ep.engine.reset(now, cold=True))
                self.ledger.accountant.on_endpoint_state(ep.name, EndpointState.COLD, now)
            elif ep.engine.state is EngineState.COLD:  # RESTART
                self._handle(ep, ep.engine.start_loading(now))
            self._wake(ep, now)

    def _on_sample(self, _: object = None) -> None:
        now = self.q.now_s
        waiting = running = 0
        kv: list[float] = []
        for ep in self.fleet.endpoints:
            if self._leaping():
                self._advance(ep, now)
            stats = ep.engine.stats()
            waiting += stats.num_waiting
            running += stats.num_running
            kv.append(stats.kv_usage)
        self._schedule_poll(now)  # a fresh scrape may show capacity the queue waits for
        spend = self.ledger.accountant.snapshot(now).fleet_spend_usd + self._extra_spend(now)
        self._samples.append(
            Sample(
                now,
                waiting,
                running,
                len(self._by_engine_id),
                tuple(kv),
                spend,
                self.ledger.tasks["success"],
            )
        )
        nxt = now + self.scenario.sample_every_s()
        if nxt <= self.end_s:
            self.q.push(nxt, EventKind.SAMPLE)

    def _extra_spend(self, now: float) -> float:
        """Spend outside the accountant's fixed fleet: scale-out replicas from start to stop,
        less the time configured replicas spent stopped after a scale-down drained them."""
        total = 0.0
        for ep in self.fleet.endpoints:
            if ep.index >= self._base_endpoints:
                total += ep.info.price_per_hour_usd * ep.cost_s(now) / 3600
            elif ep.stopped_s is not None and now > ep.stopped_s:
                total -= ep.info.price_per_hour_usd * (now - ep.stopped_s) / 3600
        return total
