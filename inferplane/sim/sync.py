"""The simulation's engines and what the router sees of them: wakes, syncs, views, routing.

Split out of :mod:`inferplane.sim.runner` (a mixin of its ``Simulation``). Engines leap: each
is woken only when it next finishes a request (``next_wake_time``) and is otherwise brought
up to date only when something reads it. What reads them all is a *sync* (the scenario's
``speed.sync_s``, by default the scrape interval; 0: before every call): every engine catches
up with the clock, its KV events reach the prefix index, and the :class:`ViewBook` rebuilds
every view (with a scrape when one is due); an engine that would only decode quietly is read
in closed form instead (``QUIET_SYNC``). Between syncs the views of changed endpoints are
patched (:mod:`inferplane.sim.views`) and the engine a call goes to is caught up before it
takes the call. The core's router ranks a candidate set of the pool when
``speed.route_candidates`` is set (:func:`inferplane.core.candidates.candidates`).
"""

from __future__ import annotations

import random

from inferplane.core.candidates import candidates
from inferplane.core.types import CallContext, EndpointState, EndpointView
from inferplane.engine.types import (
    EngineEvent,
    EngineState,
    RequestFinished,
    RequestScheduled,
    StateChanged,
    TokensGenerated,
)
from inferplane.sim.baselines import Inferplane, Policy
from inferplane.sim.events import EventKind, EventQueue
from inferplane.sim.fleet import Fleet, SimEndpoint
from inferplane.sim.kvfeed import KVFeed, split
from inferplane.sim.ledger import Call, Ledger
from inferplane.sim.views import ViewBook

EMIT_TOKENS = False
#: Wake an engine only when it next finishes a request (``next_wake_time``), not every step;
#: engines are brought up to date before anything reads them (sync, dispatch, sample).
FAST_FORWARD = True
#: At a sync, leave an engine that is only decoding quietly where it is (``load_at``: no
#: finish, no eviction): its scrape reads the load it would have, and the ``BlockStored``
#: of its decoded blocks reach the prefix index at its next advance (a wake, a dispatch to
#: it, a sample). Nothing routes on those blocks before then: they extend prompts of calls
#: still running, which only a later call of the same task repeats, after this one ended.
QUIET_SYNC = True
_ENGINE_TO_VIEW = {
    EngineState.READY: EndpointState.READY,
    EngineState.LOADING: EndpointState.WARMING,
    EngineState.COLD: EndpointState.COLD,
}


class EngineSync:
    """Engine wakes, syncs, views and routing; the attributes are the ``Simulation``'s."""

    q: EventQueue
    fleet: Fleet
    ledger: Ledger
    kv: KVFeed | None
    policy: Policy
    book: ViewBook
    counters: dict[str, int]
    sync_s: float
    route_candidates: int
    _synced_s: float
    _route_rng: random.Random
    _candidate_rng: random.Random
    _by_engine_id: dict[str, Call]

    def _on_finished(self, ep: SimEndpoint, ev: RequestFinished) -> None:
        raise NotImplementedError

    def _on_engine(self, index: int) -> None:
        ep, now = self.fleet.endpoints[index], self.q.now_s
        if ep.wake_at_s != now:
            return  # superseded by a later reschedule
        ep.wake_at_s = None
        self.counters["engine_wakes"] += 1
        self._handle(ep, ep.engine.advance(now, emit_tokens=EMIT_TOKENS))
        self._wake(ep, now)

    def _advance(self, ep: SimEndpoint, now: float) -> None:
        self._handle(ep, ep.engine.advance(now, emit_tokens=EMIT_TOKENS))

    def _leaping(self) -> bool:
        return FAST_FORWARD

    def _views(self, now: float) -> list[EndpointView]:
        """The router's snapshots: a sync when one is due, else the patched views."""
        fleet = self.fleet
        due = fleet.scrape_due(now)
        if self.sync_s <= 0 or due or now - self._synced_s >= self.sync_s:
            self._synced_s = now
            if FAST_FORWARD and (self.kv is not None or due):
                for ep in fleet.endpoints:
                    if not QUIET_SYNC or ep.engine.load_at(now) is None:
                        self._handle(ep, ep.engine.advance(now, emit_tokens=EMIT_TOKENS))
            self.book.rebuild(now)
            self.counters["syncs"] += 1
            return self.book.views
        return self.book.current(now)

    def _route(self, ctx: CallContext, views: list[EndpointView], now: float) -> tuple[str, ...]:
        """The policy's ranking of ``ctx`` (over a candidate set of its pool when set)."""
        pool = self.book.pool(ctx.model)
        d, policy = self.route_candidates, self.policy
        if 0 < d < len(pool) and isinstance(policy, Inferplane):
            picked = candidates(
                pool, d, self._candidate_rng,
                keys=ctx.prompt_block_keys,
                index=None if self.kv is None else self.kv.index,
                affinity_endpoint=policy.affinity_for(ctx.workflow_id, now),
                positions=self.book.positions[ctx.model],
            )  # fmt: skip
            ranked = policy.route(ctx, picked, now, self._route_rng).names()
            if ranked:
                return ranked
        return policy.route(ctx, views, now, self._route_rng).names()

    def _record_route(self, ep: SimEndpoint, ctx: CallContext, now: float) -> None:
        """The call was submitted to ``ep``: its prompt becomes a guess in the prefix index."""
        if self.kv is not None:
            self.kv.routed(ep.name, ctx.prompt_block_keys, now)

    def _wake(self, ep: SimEndpoint, now: float) -> None:
        engine = ep.engine
        t = engine.next_wake_time() if FAST_FORWARD else engine.next_event_time()
        if t is None:
            return
        t = max(t, now)
        if t != ep.wake_at_s:
            ep.wake_at_s = t
            self.q.push(t, EventKind.ENGINE, ep.index)

    def _handle(self, ep: SimEndpoint, events: list[EngineEvent]) -> list[EngineEvent]:
        """Act on an engine's events (its KV events go to the prefix index last, in one
        batch); the events other than KV events, in order."""
        by_id = self._by_engine_id
        kv, others = split(events)
        for ev in others:
            kind = type(ev)
            if kind is RequestScheduled:
                call = by_id.get(ev.request_id)  # type: ignore[union-attr]
                if call is not None:  # engine queue time joins the gateway's
                    call.queue_s += ev.time_s - call.dispatch_s
            elif kind is TokensGenerated:
                call = by_id.get(ev.request_id)  # type: ignore[union-attr]
                if call is not None and call.first_token_s is None:
                    call.first_token_s = ev.time_s
                    self.fleet.changed.add(ep.index)  # the predictor learns of it
            elif kind is RequestFinished:
                assert isinstance(ev, RequestFinished)
                self._on_finished(ep, ev)
            elif kind is StateChanged:
                assert isinstance(ev, StateChanged)
                self.fleet.changed.add(ep.index)
                self.ledger.accountant.on_endpoint_state(
                    ep.name, _ENGINE_TO_VIEW[ev.state], ev.time_s
                )
        if kv and self.kv is not None:
            self.kv.apply(ep.name, kv, self.q.now_s)
        return others
