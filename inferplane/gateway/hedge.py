"""Hedged attempts: asking a second endpoint when the first is late with its first token.

A critical call (the classes in ``reliability.hedge``) whose attempt has produced no token by
the predicted p95 TTFT of the endpoint it went to gets a second attempt on the next ranked
endpoint not tried yet whose breaker admits it, when the pool's retry budget has a slot for
it (held until the race is over). The attempts race to their *first token* (a stream's
first event carrying text; a whole answer's first byte, since an engine sends nothing
before it is done): the first one wins, the others are cancelled at their engines (their
connections are closed, which makes the engine abort the request and free its slot), and
the client sees one clean answer from the winner. An attempt that fails during the race
drops out and the others go on; when the last one fails, its failure goes to the proxy,
which retries or gives up as for any attempt.

The predicted p95 TTFT (the core's ``hedge_after_s``) is the predictor's *uncalibrated* TTFT
of the call on that endpoint (its queue and prefill as a healthy engine would serve them;
the breaker's figure, ``Reliability.expected``, adds the wait behind a KV-bound engine's
queue, the hedge delay does not) times the pool's *median* calibration factor (so a fleet
that is slower than its profile everywhere raises the delay, while one degraded engine,
whose own factor absorbs its slowness, does not) times ``p95_over_mean``.

The proxy calls ``post`` where it would call ``session.post``; it returns the winner's
response with the bytes read during the race put back in front (``hedge_io.Primed``). When a hedge
took the attempt over, ``settle`` tells the proxy which endpoint, start time and prediction
to account the attempt to; every other attempt of the race is accounted here (the tracker's
in-flight count, the breaker: a cancelled loser counts as cancelled, with no latency).
A losing attempt's work counts as wasted: its prompt tokens in ``wasted_prefill_tokens``
and its engine time in ``counts['hedge_wasted_ms']``; when the hedge wins, the app's attempt
hook moves the call's spend meter over to it, so the first attempt's share is retry spend.
Hedges show as ``inferplane_retries_total{reason="hedge"}`` (hedges that took over), the
``hedge*`` counts in ``/v1/stats``, and in a trace each racer has its own ``upstream`` span
(``inferplane.hedge.role`` ``primary`` or ``hedge``, ``inferplane.hedge.outcome`` ``won``,
``lost`` or ``failed``; the first racer's also names the hedge's endpoint and the winner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

import aiohttp
from opentelemetry import trace
from opentelemetry.trace import Span

from inferplane.core.retry import FailureKind
from inferplane.core.throttle import HedgeConfig, hedge_after_s, hedge_ttft_s, should_hedge
from inferplane.gateway.exchange import Candidate
from inferplane.gateway.hedge_io import Primed, failure_of, open_attempt, race_failure, stop
from inferplane.gateway.relay import CallState
from inferplane.gateway.reliability import AttemptTiming, Reliability
from inferplane.gateway.tracing_state import AttemptTrace
from inferplane.gateway.tracker import EndpointTracker

__all__ = ["HedgeMove", "Hedging"]

Predicted = tuple[float | None, float | None]
OnAttempt = Callable[[str, str | None], None]


@dataclass(frozen=True, slots=True)
class HedgeMove:
    """The attempt the proxy started now lives on another endpoint (a hedge took it over)."""

    endpoint: str
    started_s: float
    predicted: Predicted


@dataclass(slots=True)
class _Call:
    """A hedged call's candidates, hedges sent, budget slots held and pending move."""

    candidates: Sequence[Candidate]
    on_attempt: OnAttempt
    hedges_sent: int = 0
    slots: int = 0
    moved: HedgeMove | None = None


@dataclass(slots=True)
class _Racer:
    endpoint: str
    started_s: float
    predicted: Predicted
    task: asyncio.Task[tuple[aiohttp.ClientResponse, bytes]]
    retired: bool = False
    raw_ttft_s: float | None = None  # the hedge delay's base (``predicted`` adds the queue)
    span: Span = trace.INVALID_SPAN  # its ``upstream`` span (tracing on)


class Hedging:
    """Hedged attempts for one proxy (see the module docstring)."""

    def __init__(
        self,
        reliability: Reliability,
        session: aiohttp.ClientSession,
        tracker: EndpointTracker,
        clock: Callable[[], float],
    ) -> None:
        section = reliability.config.hedge
        self.config: HedgeConfig = section.to_core()
        self._on = section.enabled and self.config.max_hedges > 0 and bool(self.config.classes)
        self._rel = reliability
        self._session = session
        self._tracker = tracker
        self._clock = clock
        self._calls: dict[int, _Call] = {}

    # ---- the proxy's hooks -----------------------------------------------------------------

    def begin(
        self, call: CallState, candidates: Sequence[Candidate], on_attempt: OnAttempt
    ) -> None:
        """A call enters the proxy: remember its candidates when its class is hedged."""
        if self._on and call.ctx.priority in self.config.classes and len(candidates) > 1:
            self._calls[id(call)] = _Call(candidates, on_attempt)

    def end(self, call: CallState) -> None:
        """The call is over."""
        self._calls.pop(id(call), None)

    def _release_slots(self, call: CallState, state: _Call) -> None:
        """The race is over: one attempt is left, so its hedges no longer count as extra
        attempts against the retry budget (held for the whole call, they starved the
        retries and resumptions of other calls in the cascade benchmark)."""
        for _ in range(state.slots):
            self._rel.release(call.ctx)
        state.slots = 0

    def settle(self, call: CallState) -> HedgeMove | None:
        """The attempt the proxy started is over: where it ended up, if a hedge moved it."""
        state = self._calls.get(id(call))
        if state is None or state.moved is None:
            return None
        moved, state.moved = state.moved, None
        return moved

    def post(
        self,
        call: CallState,
        cand: Candidate,
        body: bytes,
        headers: dict[str, str],
        client_timeout: aiohttp.ClientTimeout,
    ) -> Awaitable[aiohttp.ClientResponse]:
        """``session.post``, hedged when the call's class is and nothing was sent yet (the
        session's or the race's awaitable itself: no coroutine of its own per call)."""
        state = self._calls.get(id(call))
        if state is None or call.out is not None or state.hedges_sent >= self.config.max_hedges:
            return self._session.post(cand.url, data=body, headers=headers, timeout=client_timeout)
        first = self._racer(call, cand, body, headers, client_timeout, call.attempt_started_s)
        return _Race(self, call, state, first, headers, client_timeout).run()

    # ---- helpers for the race --------------------------------------------------------------

    def _racer(
        self,
        call: CallState,
        cand: Candidate,
        body: bytes,
        headers: dict[str, str],
        client_timeout: aiohttp.ClientTimeout,
        started_s: float,
    ) -> _Racer:
        predicted, raw_ttft_s = self._predict(cand.endpoint, call, started_s)
        coro = open_attempt(
            self._session, cand.url, body, headers, client_timeout, stream=call.ctx.stream
        )
        task = asyncio.create_task(coro)
        return _Racer(cand.endpoint, started_s, predicted, task, raw_ttft_s=raw_ttft_s)

    def _predict(
        self, endpoint: str, call: CallState, now: float
    ) -> tuple[Predicted, float | None]:
        """What the breaker judges the attempt against, and the bare uncalibrated TTFT."""
        predictor = self._rel.predictor
        if predictor is None:
            return (None, None), None
        ctx = call.ctx
        view = self._tracker.view(endpoint, now)
        est = predictor.predict(view, ctx.model, ctx.num_prompt_tokens, now)
        expected = self._rel.expected(endpoint, ctx.model, ctx.num_prompt_tokens, now, est)
        return expected, est.raw_ttft_s

    def _pool_factors(self, call: CallState) -> list[float]:
        """The TTFT calibration factors of the endpoints serving the call's model."""
        predictor, now, model = self._rel.predictor, self._clock(), call.ctx.model
        if predictor is None:
            return []
        tracker = self._tracker
        return [
            predictor.ttft_factor(name, now)
            for name in tracker.names()
            if model in tracker.info(name).models
        ]

    def _next_candidate(self, call: CallState, state: _Call) -> Candidate | None:
        for cand in state.candidates:
            if cand.endpoint not in call.tried and self._rel.admits(cand.endpoint):
                return cand
        return None

    def _take_slot(self, call: CallState) -> bool:
        """A retry-budget slot for a hedge (the same budget retries draw from)."""
        rel, model = self._rel, call.ctx.model
        return rel._budget(model).try_acquire(rel._active[model])

    def _retire(self, call: CallState, racer: _Racer, failure: FailureKind, *, lost: bool) -> None:
        """Account for an attempt that is out of the race (``lost``: cancelled by a win)."""
        racer.retired = True
        now = self._clock()
        if lost:
            stop(racer.task)
            waited_s = now - racer.started_s
            counts = self._rel.counts
            counts["hedge_cancelled"] += 1
            counts["hedge_wasted_ms"] += round(1e3 * waited_s)
            call.ex.wasted_prefill_tokens += call.ctx.num_prompt_tokens
            # No latency sample: its wait is only a lower bound, and a biased one (the race
            # is lost by whoever was slower this time), so it is no evidence of an outlier.
        elif failure is FailureKind.CONNECT:
            self._tracker.report_connect_error(racer.endpoint)
        self._tracker.release(racer.endpoint)
        self._rel.record(racer.endpoint, failure, AttemptTiming(), now, attempt=id(call))


class _Race:
    """One race between an attempt and its hedges (lives for one ``Hedging.post``)."""

    def __init__(
        self,
        hedging: Hedging,
        call: CallState,
        state: _Call,
        first: _Racer,
        headers: dict[str, str],
        client_timeout: aiohttp.ClientTimeout,
    ) -> None:
        self.h, self.call, self.state = hedging, call, state
        self.first = self.current = first
        # The attempt's trace (tracing on): each racer gets a span in it.
        self.trace: AttemptTrace | None = call.tracer.race() if call.tracer is not None else None
        if self.trace is not None:
            first.span = self.trace.spans[0]
        self.racers = [first]
        self.headers, self.client_timeout = headers, client_timeout
        self.ttft_s = hedge_ttft_s(first.raw_ttft_s, hedging._pool_factors(call))
        self.delay_s = hedge_after_s(call.ctx.priority, self.ttft_s, hedging.config)
        self.last_launch_s = first.started_s
        self.hedging_done = self.delay_s is None

    async def run(self) -> aiohttp.ClientResponse:
        try:
            while True:
                live = {r.task: r for r in self.racers if not r.retired}
                wait_s = self._until_hedge()
                done, _ = await asyncio.wait(
                    live, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    self._hedge()
                    continue
                for task in done:
                    answer = self._judge(live[task])
                    if answer is not None:
                        return answer
        finally:
            self._finish()

    def _until_hedge(self) -> float | None:
        if self.hedging_done or self.delay_s is None:
            return None
        return max(0.0, self.last_launch_s + self.delay_s - self.h._clock())

    def _hedge(self) -> None:
        """The hedge delay passed without a token: send the next attempt, if allowed."""
        h, call, state = self.h, self.call, self.state
        now = h._clock()
        decision = should_hedge(
            call.ctx.priority, self.last_launch_s, now, self.ttft_s,
            first_token_seen=False, hedges_sent=state.hedges_sent, config=h.config,
        )  # fmt: skip
        if not decision.hedge:
            self.hedging_done = state.hedges_sent >= h.config.max_hedges
            return
        cand = h._next_candidate(call, state)
        if cand is None:
            h._rel.counts["hedge_no_candidate"] += 1
            self.hedging_done = True
            return
        if not h._take_slot(call):
            h._rel.counts["hedge_denied_budget"] += 1
            self.hedging_done = True
            return
        state.slots += 1
        state.hedges_sent += 1
        h._rel.counts["hedges"] += 1
        call.tried.append(cand.endpoint)
        call.ex.attempts += 1
        h._tracker.acquire(cand.endpoint)
        h._rel.dispatch(cand.endpoint)
        headers = self.headers
        span: Span = trace.INVALID_SPAN
        if self.trace is not None and call.tracer is not None:
            after_s = round(now - self.first.started_s, 6)
            span, own = call.tracer.hedge(self.trace, cand.endpoint, call.ex.attempts, after_s)
            headers = {**headers, **own}  # the hedge's engine works under the hedge's span
        racer = h._racer(call, cand, cand.body, headers, self.client_timeout, now)
        racer.span = span
        self.racers.append(racer)
        self.last_launch_s = now

    def _judge(self, racer: _Racer) -> aiohttp.ClientResponse | None:
        """The answer when ``racer`` won (or failed last); None: the race goes on."""
        others = sum(1 for r in self.racers if not r.retired and r is not racer)
        try:
            resp, head = racer.task.result()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if not others:
                raise
            self._drop(racer, failure_of(exc))
            return None
        failure = race_failure(resp.status, head)
        if failure is not None and others:
            resp.close()
            self._drop(racer, failure)
            return None
        self._win(racer, won=failure is None)
        return cast(aiohttp.ClientResponse, Primed(resp, head))

    def _drop(self, racer: _Racer, failure: FailureKind) -> None:
        """A racer failed while others run: account it; the proxy follows another."""
        if racer is self.current:
            self.current = next(r for r in self.racers if not r.retired and r is not racer)
            if self.trace is not None:
                self.trace.lead(self.current.span, self.current.endpoint, won=False)
        self.h._rel.counts["hedge_race_failures"] += 1
        self._retire(racer, failure, lost=False)

    def _retire(self, racer: _Racer, failure: FailureKind, *, lost: bool) -> None:
        """``Hedging._retire``, and the racer's span ends (tracing on)."""
        self.h._retire(self.call, racer, failure, lost=lost)
        if self.trace is not None:
            reason = None if lost else failure.value
            self.trace.out(racer.span, "lost" if lost else "failed", reason)

    def _win(self, racer: _Racer, *, won: bool) -> None:
        racer.retired = True
        if self.trace is not None:  # before the losers' spans end (the first names the winner)
            self.trace.lead(racer.span, racer.endpoint, won=won)
        for other in self.racers:
            if not other.retired and other is not self.current:
                self._retire(other, FailureKind.CANCELLED, lost=True)
        if racer is not self.current:  # the proxy's attempt loses: its accounting is ours
            self._retire(self.current, FailureKind.CANCELLED, lost=True)
            self.current = racer
        if won and racer is not self.first:
            self.h._rel.counts["hedge_wins"] += 1

    def _finish(self) -> None:
        """Leaving the race (won, failed or cancelled): no racer keeps running."""
        call, current = self.call, self.current
        for racer in self.racers:
            if not racer.retired and racer is not current:
                self._retire(racer, FailureKind.CANCELLED, lost=True)
        if not current.task.done():  # the handler was cancelled (the client left)
            stop(current.task)
        self.h._release_slots(call, self.state)
        if current is not self.first:
            call.ex.endpoint = current.endpoint
            call.attempt_started_s = current.started_s
            self.state.moved = HedgeMove(current.endpoint, current.started_s, current.predicted)
            self.state.on_attempt(current.endpoint, "hedge")
