"""One simulated run: a scenario's workload through one routing policy, in virtual time.

The loop pops events in ``(time, priority, seq)`` order and leaps straight to the next one:
arrivals become ``CallContext`` values routed by the policy (the core's ``route`` for
``inferplane``) and submitted to that endpoint's ``EngineModel``; each engine is woken
only at its own ``next_event_time()``; client timeouts abort at the engine and may retry
with jittered exponential back-off; faults change the fleet. Spend and cost per
successful task come from the core's ``Accountant``, fed exactly as the gateway feeds it.

Admission (:mod:`inferplane.sim.gate`) sits before routing exactly where the gateway puts
it: ``admit`` on each attempt; a queued call is routed only when ``poll`` dispatches it (an
engine freed capacity, or a queued call's expiry came due); a client that gives up while
queued cancels; an admitted call's end is reported with ``on_finish``. A rejected client
waits the answer's Retry-After when it honours it. The engines' KV events feed the core's
prefix index (:mod:`inferplane.sim.kvfeed`) for the core-routed policies.

Time to first token is the engine's first ``TokensGenerated`` of each request: with
``emit_tokens=False`` the engine model reports only that one (``sync.EMIT_TOKENS`` turns
every token event back on, for comparison; the runner keeps only the first either way).
Engine wakes, syncs, the router's views and candidate sets live in :mod:`inferplane.sim.sync`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from inferplane.config import FleetConfig
from inferplane.core.admission import CapacityFn, Enqueue, Reject
from inferplane.core.autoscaler import Forecast
from inferplane.core.capacity import pool_capacity
from inferplane.core.queueing import ExitKind, QueueExit
from inferplane.core.types import CallContext, EndpointView
from inferplane.engine.types import (
    EngineRequest,
    FinishReason,
    RequestFinished,
)
from inferplane.sim.autoscale import Scaling, make_loop
from inferplane.sim.baselines import CORE_ROUTED, Inferplane, make_policy, needs_block_keys
from inferplane.sim.capacity import CapacityBook
from inferplane.sim.events import EventKind, EventQueue
from inferplane.sim.faults import expand
from inferplane.sim.fleet import Fleet, SimEndpoint
from inferplane.sim.gate import make_gate
from inferplane.sim.gc_tuning import rare_collections
from inferplane.sim.kvfeed import KVFeed
from inferplane.sim.ledger import Call, Ledger
from inferplane.sim.records import Outcome, RunResult, Sample
from inferplane.sim.scenario import Scenario
from inferplane.sim.sources import build_sources
from inferplane.sim.sync import EngineSync
from inferplane.sim.upkeep import Upkeep
from inferplane.sim.views import ViewBook
from inferplane.sim.workload import CallSpec

_PROGRESS_EVERY = 4096
_SUCCESS = (FinishReason.STOP, FinishReason.LENGTH)

ProgressFn = Callable[[float], None]


class Simulation(EngineSync, Upkeep, Scaling):
    """Runs one policy over one scenario; ``run()`` once, then read the ``RunResult``.

    ``autoscale`` (``off``, ``inferplane``, ``queue-hpa``; None: ``inferplane`` when the fleet
    config's ``autoscale`` section is enabled) sizes the pools (:mod:`inferplane.sim.autoscale`);
    ``forecasts`` (pool -> demand course) go to the core's autoscaler.
    """

    def __init__(
        self,
        scenario: Scenario,
        fleet_config: FleetConfig,
        base_dir: Path,
        policy: str,
        *,
        seed: int | None = None,
        progress: ProgressFn | None = None,
        autoscale: str | None = None,
        forecasts: Mapping[str, Forecast] | None = None,
    ) -> None:
        self.scenario, self.policy_name, self._progress = scenario, policy, progress
        self.seed = scenario.seed if seed is None else seed
        scrape = scenario.scrape_interval_s or fleet_config.gateway.scrape_interval_s
        self.fleet = Fleet(fleet_config, self.seed, scrape, kv_events=policy in CORE_ROUTED)
        self.kv: KVFeed | None = None
        if policy in CORE_ROUTED:
            # The index mirrors the engines' caches: room for every block the fleet holds
            # (x2: guesses, replicas added later), so only the engines' own LRU evicts.
            blocks = 2 * sum(ep.engine.num_gpu_blocks for ep in self.fleet.endpoints)
            block_size = self.fleet.endpoints[0].engine.profile.block_size
            self.kv = KVFeed(block_size, max(1_000_000, blocks), max(2_000_000, blocks))
            for ep in self.fleet.endpoints:
                self.kv.add_endpoint(ep.name)
        self.policy = make_policy(policy, None if self.kv is None else self.kv.index, fleet_config)
        speed = scenario.speed
        self.sync_s = scrape if speed.sync_s is None else speed.sync_s
        self.route_candidates = speed.route_candidates
        self._synced_s = -float("inf")
        self.book = ViewBook(self.fleet)
        predictor = (
            self.policy.predictor if isinstance(self.policy, Inferplane) else Inferplane().predictor
        )
        capacity: CapacityFn = pool_capacity
        if self.sync_s > 0:
            capacity = CapacityBook(
                self.book, predictor, scenario.admission, speed.admission_best_of
            )
        self.gate = make_gate(policy, scenario.admission, predictor, capacity)
        self._queued: dict[str, Call] = {}
        self._poll_at: float | None = None
        self._keys_needed = needs_block_keys(policy)
        self._route_rng = random.Random(f"{self.seed}/route")
        self._client_rng = random.Random(f"{self.seed}/clients")
        self._candidate_rng = random.Random(f"{self.seed}/candidates")
        self.sources = build_sources(scenario, base_dir, fleet_config, self.fleet, self.seed)
        self.ledger = Ledger(
            [ep.info for ep in self.fleet.endpoints], fleet_config.gateway.workflow_idle_ttl_s
        )
        self.q = EventQueue()
        self.duration_s = scenario.duration_s
        self.end_s = scenario.duration_s + scenario.drain_s
        self._open: dict[int, Call] = {}
        self._by_engine_id: dict[str, Call] = {}
        self._samples: list[Sample] = []
        self._next_call_id = 0
        self.counters = {"events": 0, "retries": 0, "engine_wakes": 0, "syncs": 0}
        self._base_endpoints = len(self.fleet.endpoints)
        self._faults = expand(
            scenario.faults, {e.name: e.info.region for e in self.fleet.endpoints}
        )
        self.scaler = make_loop(fleet_config.autoscale, autoscale or scenario.autoscale, forecasts)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        for action in self._faults:
            self.q.push(action.at_s, EventKind.FAULT, action)
        for i in range(len(self.sources)):
            self._pull(i)
        self.q.push(0.0, EventKind.SAMPLE)
        self._start_scaling()
        q, handlers = self.q, self._handlers()
        with rare_collections():
            while q:
                t = q.peek_time()
                assert t is not None
                if t > self.end_s or (t >= self.duration_s and not self._open):
                    break
                _, kind, payload = q.pop()
                handlers[kind](payload)
                self.counters["events"] += 1
                if self._progress is not None and self.counters["events"] % _PROGRESS_EVERY == 0:
                    self._progress(q.now_s)
        return self._finish()

    def _handlers(self) -> dict[EventKind, Callable[[object], None]]:
        return {
            EventKind.FAULT: self._on_fault,  # type: ignore[dict-item]
            EventKind.ENGINE: self._on_engine,  # type: ignore[dict-item]
            EventKind.POLL: self._on_poll,  # type: ignore[dict-item]
            EventKind.TIMEOUT: self._on_timeout,  # type: ignore[dict-item]
            EventKind.ARRIVAL: self._on_arrival,  # type: ignore[dict-item]
            EventKind.SAMPLE: self._on_sample_or_tick,
        }

    def _pull(self, source: int) -> None:
        """Schedule the next open-loop arrival of a source, if it comes before the end."""
        nxt = self.sources[source][0].next_arrival()
        if nxt is not None and nxt[0] <= self.duration_s:
            self._new_call(nxt[1], source, nxt[0], refill=True)

    def _new_call(self, spec: CallSpec, source: int, t: float, *, refill: bool) -> None:
        self._next_call_id += 1
        call = Call(self._next_call_id, spec, source, self.sources[source][1], t)
        self._open[call.call_id] = call
        self.q.push(t, EventKind.ARRIVAL, (call, source if refill else -1))

    # -- handlers ---------------------------------------------------------------------------

    def _on_arrival(self, payload: tuple[Call, int]) -> None:
        call, refill = payload
        if refill >= 0:
            self._pull(refill)
        self._sense_arrival(call)
        self._attempt(call, self.q.now_s)

    def _attempt(self, call: Call, now: float) -> None:
        """One try of the call: admission first, then routing now or at dispatch."""
        call.attempt += 1
        call.first_token_s = None
        call.engine_id = f"c{call.call_id}.{call.attempt}"
        ctx = call.ctx = self._context(call, call.info.targets[0], now)
        # By id, not the call: a closed call (and its prompt) is freed at once, not kept by
        # its pending timeout for up to ``timeout_s`` (300 s: ~900,000 calls at 1,000 GPUs).
        self.q.push(now + call.info.timeout_s, EventKind.TIMEOUT, (call.call_id, call.attempt))
        views = self._views(now)
        decision = self.gate.admit(ctx, self.book.pool(ctx.model), now)
        if isinstance(decision, Reject):
            self._attempt_failed(call, now, Outcome.REJECTED, decision.code, decision.retry_after_s)
        elif isinstance(decision, Enqueue):
            self._queued[ctx.request_id] = call
            self._exits(decision.evicted, now)
            self._schedule_poll(None)
        else:
            self._dispatch(call, now, views)

    def _dispatch(self, call: Call, now: float, views: list[EndpointView] | None) -> None:
        """Route an admitted call on current state and submit it to that engine."""
        ctx = call.ctx
        assert ctx is not None
        views = self._views(now) if views is None else views
        ranked: tuple[str, ...] = ()
        for target in call.info.targets:
            c = ctx if target == ctx.model else dataclasses.replace(ctx, model=target)
            ranked = self._route(c, views, now)
            if ranked:
                break
        if not ranked:
            self.gate.on_finish(ctx, now, 0, False)
            self._attempt_failed(call, now, Outcome.REJECTED, "no_endpoint")
            return
        ep = self.fleet.by_name[ranked[0]]
        self._advance(ep, now)
        spec = call.spec
        request = EngineRequest(
            call.engine_id,
            spec.prompt_token_ids,
            spec.max_tokens,
            call.info.priority.rank,
            ignore_eos=True,
            prompt_block_keys=ctx.prompt_block_keys or None,
        )
        try:
            ep.engine.submit(request, now)
        except ValueError:
            self.gate.on_finish(ctx, now, 0, False)
            self._attempt_failed(call, now, Outcome.REJECTED, "cannot_fit")
            return
        self._record_route(ep, ctx, now)
        ep.in_flight += 1
        call.dispatch_s = now
        call.endpoint = ep
        self._by_engine_id[call.engine_id] = call
        self.ledger.start(call, ep.name, now)
        self._wake(ep, now)

    # -- the admission queue ----------------------------------------------------------------

    def _schedule_poll(self, at_s: float | None) -> None:
        """Poll the gate at ``at_s`` (None: at the next queued call's expiry)."""
        if not self.gate.queued():
            return
        t = self.gate.next_expiry_s() if at_s is None else at_s
        if t is not None and (self._poll_at is None or t < self._poll_at):
            self._poll_at = t
            self.q.push(t, EventKind.POLL, t)

    def _on_poll(self, at_s: float) -> None:
        if self._poll_at != at_s:
            return  # superseded by an earlier poll, which rescheduled
        self._poll_at = None
        now = self.q.now_s
        self._views(now)
        self._exits(self.gate.poll(now, self.book.pool), now)
        self._schedule_poll(None)

    def _exits(self, exits: Sequence[QueueExit], now: float) -> None:
        """Calls that left the admission queue: dispatch them, or tell their clients no."""
        for out in exits:
            call = self._queued.pop(out.item.call.request_id, None)
            if call is None:
                continue
            call.queue_s += out.waited_s
            if out.kind is ExitKind.DISPATCHED:
                self._dispatch(call, now, None)
            else:
                self._attempt_failed(call, now, Outcome.REJECTED, f"queue_{out.kind.value}")

    def _context(self, call: Call, model: str, now: float) -> CallContext:
        spec, info = call.spec, call.info
        if self._keys_needed and call.keys is None:
            call.keys = spec.block_keys()
        e2e = info.slo.e2e_s
        return CallContext(
            request_id=call.engine_id,
            tenant=info.tenant,
            model=model,
            priority=info.priority,
            arrival_s=call.arrival_s,
            num_prompt_tokens=len(spec.prompt_token_ids),
            max_tokens=spec.max_tokens,
            deadline_s=None if e2e is None else call.arrival_s + e2e,
            ttft_budget_s=info.slo.ttft_s,
            workflow_id=call.workflow_id,
            workflow_step=spec.step + 1,
            workflow_steps=spec.steps,
            stream=True,
            prompt_block_keys=call.keys or (),
        )

    def _on_finished(self, ep: SimEndpoint, ev: RequestFinished) -> None:
        call = self._by_engine_id.pop(ev.request_id, None)
        if call is None:
            return  # an attempt the client already gave up on
        ep.in_flight -= 1
        self._served(ep, call, ev)
        call.cached, call.completion = ev.num_cached_tokens, ev.num_completion_tokens
        ok = ev.reason in _SUCCESS
        assert call.ctx is not None
        self.gate.on_finish(
            call.ctx, ev.time_s, ev.num_prompt_tokens + ev.num_completion_tokens, ok,
            ev.num_completion_tokens,
        )  # fmt: skip
        self._schedule_poll(ev.time_s)
        if ok:
            self._close(call, ev.time_s, Outcome.SUCCESS, "")
        else:
            self._attempt_failed(call, ev.time_s, Outcome.FAILED, f"engine_{ev.reason.value}")

    def _on_timeout(self, payload: tuple[int, int]) -> None:
        call_id, attempt = payload
        call = self._open.get(call_id)
        if call is None:
            return  # closed since
        now = self.q.now_s
        if call.attempt == attempt and self._queued.pop(call.engine_id, None) is not None:
            out = self.gate.cancel(call.engine_id, now)  # gave up while queued
            call.queue_s += out.waited_s if out is not None else 0.0
            self._attempt_failed(call, now, Outcome.TIMEOUT, "timeout")
            return
        if call.attempt != attempt or self._by_engine_id.pop(call.engine_id, None) is None:
            return  # that attempt already ended
        ep = call.endpoint
        assert ep is not None and call.ctx is not None
        ep.in_flight -= 1
        self._stop_if_drained(ep, now)
        self.gate.on_finish(call.ctx, now, 0, False)
        self._schedule_poll(now)
        self._handle(ep, ep.engine.abort(call.engine_id, now))
        self._wake(ep, now)
        self._attempt_failed(call, now, Outcome.TIMEOUT, "timeout")

    def _attempt_failed(
        self, call: Call, now: float, outcome: Outcome, reason: str, retry_after_s: int = 0
    ) -> None:
        if outcome is Outcome.REJECTED:
            self.ledger.reject(reason)
        clients = self.scenario.clients
        retry = outcome is not Outcome.REJECTED or clients.retry_on_reject
        if retry and call.attempt <= clients.max_retries:
            if retry_after_s > 0 and clients.honour_retry_after:
                backoff = retry_after_s * (1.0 + 0.25 * self._client_rng.random())
            else:
                backoff = clients.backoff_s * 2 ** (call.attempt - 1)
                backoff *= 0.5 + self._client_rng.random()
            if now + backoff <= self.end_s:
                self.counters["retries"] += 1
                self.q.push(now + backoff, EventKind.ARRIVAL, (call, -1))
                return
        self._close(call, now, outcome, reason)

    # -- endings ----------------------------------------------------------------------------

    def _close(self, call: Call, now: float, outcome: Outcome, reason: str) -> None:
        """The call's last word: record it, then start its task's next call (if any)."""
        del self._open[call.call_id]
        self.ledger.close(call, now, outcome, reason)
        self._sense_end(call, now, outcome)
        if call.endpoint is not None:
            ok = outcome is Outcome.SUCCESS
            self.policy.on_done(call.workflow_id, call.endpoint.name, ok, now)
        if outcome is Outcome.UNFINISHED:
            return
        spec = call.spec
        nxt = self.sources[call.source][0].follow_up(spec, outcome is Outcome.SUCCESS)
        if nxt is None:
            self.ledger.task_ended(call, now, cut=False)
        elif now + nxt[0] <= self.duration_s:
            self._new_call(nxt[1], call.source, now + nxt[0], refill=False)
        else:
            self.ledger.task_ended(call, now, cut=True)  # its next call would start too late

    def _finish(self) -> RunResult:
        end = min(max(self.q.now_s, self.duration_s), self.end_s)
        self.q.now_s = end
        for call_id in sorted(self._open):
            self._close(self._open[call_id], end, Outcome.UNFINISHED, "run ended")
        self._on_sample()
        return RunResult(
            policy=self.policy_name,
            end_s=end,
            endpoints=tuple(ep.name for ep in self.fleet.endpoints),
            records=tuple(sorted(self.ledger.records, key=lambda r: r.call_id)),
            samples=tuple(self._samples),
            accounting=self.ledger.accountant.snapshot(end),
            extra_spend_usd=self._extra_spend(end),
            rejections=dict(sorted(self.ledger.rejections.items())),
            tasks=dict(self.ledger.tasks),
            counters=dict(self.counters),
        )
