"""The upstream half of a call: send it to an engine, pass the answer back, measure it.

Non-streaming answers are read whole, parsed once for ``usage`` and forwarded as the same
bytes. Streams are forwarded event by event as they arrive (``sse_filter``): usage is always
asked of the engine (``include_usage``) and the usage event is dropped again when the client
did not ask for it. A stream's cost cannot travel in a header (headers are gone before the
cost is known), so it is sent as an SSE comment line (``: inferplane cost_usd=...``) just
before ``data: [DONE]``; SSE clients ignore comments.

Reliability (``reliability``): every attempt's outcome feeds the endpoint's breaker, and
candidates whose breaker is open are skipped. A failure before the first byte reaches the
client (connect error, reset, 5xx, stall) is *replayed* on the next ranked endpoint not yet
tried, when the retry budget, the workflow's allowance and the attempt limit allow, after a
jittered back-off. A stream that breaks after some tokens (reset, an engine error event, no
event for the stall timeout) is *resumed*: the next endpoint continues the partial answer and
the stitcher makes the two segments one stream (no token lost or repeated, one usage). What
cannot be retried becomes an OpenAI error (JSON, or an SSE error event once a stream has
begun). A client that goes away cancels the handler, which closes the upstream connection,
which makes the engine abort the request. Calls of a hedged class may race a second attempt
on another endpoint before their first token (``hedge``); the winner is the attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

import aiohttp
import orjson
from aiohttp import web

from inferplane.config import TimeoutsConfig
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.resumption import (
    ResumeAction,
    ResumptionPlan,
    StreamKind,
    plan_resumption,
)
from inferplane.core.retry import Failure, FailureKind, failure_of_status
from inferplane.gateway.context import ApiKind, RequestContext
from inferplane.gateway.errors import ApiError
from inferplane.gateway.exchange import Candidate, Exchange, Finisher
from inferplane.gateway.hedge import Hedging
from inferplane.gateway.relay import (
    JSON_HEADERS,
    AttemptFailed,
    CallState,
    Responder,
    drain,
    err,
    timed_out,
)
from inferplane.gateway.reliability import AttemptTiming, Reliability
from inferplane.gateway.reliability_config import ReliabilityConfig
from inferplane.gateway.sse_filter import read_usage
from inferplane.gateway.tracing import TRACER_KEY, GatewayTracer
from inferplane.gateway.tracker import EndpointTracker
from inferplane.gateway.upstream import UpstreamClient

__all__ = ["Candidate", "Exchange", "Finisher", "Proxy", "read_usage"]


class Proxy:
    """Sends calls upstream over one shared client session."""

    def __init__(
        self,
        session: UpstreamClient | aiohttp.ClientSession,
        tracker: EndpointTracker,
        timeouts: TimeoutsConfig,
        retries: int,
        clock: Callable[[], float],
        reliability: ReliabilityConfig | None = None,
        predictor: LatencyPredictor | None = None,
    ) -> None:
        self._session = session
        self._tracker = tracker
        self._timeouts = timeouts
        self._retries = retries
        self._clock = clock
        # By (id of the class, stream): an enum member hashes by an interpreted __hash__.
        self._timeout_of: dict[tuple[int, bool], aiohttp.ClientTimeout] = {}
        self._tracer_of: tuple[object, GatewayTracer | None] | None = None  # (app, tracer)
        self._out = Responder(clock)
        self.reliability = Reliability(
            reliability or ReliabilityConfig(), tracker, clock, predictor
        )
        # The lean client answers the part of aiohttp's session API hedging uses (``post``).
        self.hedging = Hedging(
            self.reliability, cast(aiohttp.ClientSession, session), tracker, clock
        )
        cfg = self.reliability.config
        self._stall_s = cfg.resumption.stall_timeout_s or timeouts.inter_token_s

    def _timeout(self, ctx: RequestContext, again: bool) -> aiohttp.ClientTimeout | None:
        """An attempt's limits: the class's timeout, counted from the call's arrival for a
        retry or resumption (``again``: the call's attempts together stay within it), and
        never past the client's deadline; None when nothing is left for another attempt."""
        if ctx.deadline_s is None and not again:  # the common case: one value per class, mode
            key = (id(ctx.priority), ctx.stream)
            found = self._timeout_of.get(key)
            if found is None:
                built = self._build_timeout(ctx, False)
                assert built is not None  # a first attempt always gets one
                found = self._timeout_of[key] = built
            return found
        return self._build_timeout(ctx, again)

    def _build_timeout(self, ctx: RequestContext, again: bool) -> aiohttp.ClientTimeout | None:
        total, now = self._timeouts.for_class(ctx.priority), self._clock()
        if again:
            total -= now - ctx.arrival_s
        if ctx.deadline_s is not None:
            total = min(total, ctx.deadline_s - now)
        if total <= 0:
            if again:
                return None
            total = 0.001  # a first attempt is made, and times out at once: the client's 504
        return aiohttp.ClientTimeout(
            total=total,
            sock_connect=self._timeouts.connect_s,
            sock_read=self._stall_s if ctx.stream else None,
        )

    async def forward(
        self,
        request: web.Request,
        ctx: RequestContext,
        candidates: Sequence[Candidate],
        ex: Exchange,
        finish: Finisher,
        on_attempt: Callable[[str, str | None], None],
    ) -> web.StreamResponse:
        """Try candidates in order (retries and resumptions as the module says); answer the
        client from the first that responds.

        ``on_attempt(endpoint, retry_reason)`` is called before each attempt (the reason is
        None for the first one).
        """
        rel = self.reliability
        rel.begin_call(ctx, self._clock())
        call = CallState(request, ctx, ex, finish, self._tracer(request.app))
        self.hedging.begin(call, candidates, on_attempt)
        try:
            return await self._run(call, candidates, on_attempt)
        finally:
            if call.tracer is not None:  # a streamed answer is over: its ``stream`` span ends
                call.tracer.stream_close(ex, ctx.arrival_s)
            self.hedging.end(call)
            rel.end_call(ctx)

    def _tracer(self, app: web.Application) -> GatewayTracer | None:
        """The app's tracer when tracing is on (looked up once per app, not per call)."""
        found = self._tracer_of
        if found is None or found[0] is not app:
            found = self._tracer_of = (app, app.get(TRACER_KEY))
        tracer = found[1]
        return tracer if tracer is not None and tracer.enabled else None

    async def _run(
        self,
        call: CallState,
        candidates: Sequence[Candidate],
        on_attempt: Callable[[str, str | None], None],
    ) -> web.StreamResponse:
        rel, ctx = self.reliability, call.ctx
        error: ApiError | None = None  # built only when no attempt was made
        retry_reason: str | None = None
        holding = False
        try:
            while (cand := self._next(candidates, call.tried)) is not None:
                try:
                    return await self._one(call, cand, on_attempt, retry_reason)
                except AttemptFailed as failed:
                    error = failed.error
                    if holding:
                        rel.release(ctx)
                        holding = False
                    wait_s = await self._after_failure(call, cand, failed)
                    if wait_s is None:
                        break
                    holding = rel.config.retry.enabled
                    retry_reason = "resume" if failed.sent else (error.code or "error")
                    if wait_s > 0:
                        await asyncio.sleep(wait_s)
        finally:
            if holding:
                rel.release(ctx)
        if error is None:
            error = ApiError(
                503, f"no endpoint available for model '{ctx.model}'", code="no_endpoint",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        return await self._out.give_up(call, error)

    def _next(self, candidates: Sequence[Candidate], tried: list[str]) -> Candidate | None:
        """The best-ranked candidate not tried yet whose breaker admits an attempt."""
        if not self.reliability.config.retry.enabled and len(tried) > self._retries:
            return None
        for cand in candidates:
            if cand.endpoint not in tried and self.reliability.admits(cand.endpoint):
                return cand
        return None

    async def _after_failure(
        self, call: CallState, cand: Candidate, failed: AttemptFailed
    ) -> float | None:
        """Whether to try again (the back-off to sleep first) or give up (None)."""
        rel, ex = self.reliability, call.ex
        plan: ResumptionPlan | None = None
        if failed.sent:
            plan = self._plan(call, cand, failed.kind)
            if plan.action is ResumeAction.FINISH:
                await self._out.close(call, plan)
                return None
        resumable = plan is not None and plan.action is ResumeAction.CONTINUE
        failure = Failure(cand.endpoint, failed.kind, failed.sent, resumable)
        if rel.config.retry.enabled:
            now = self._clock()
            decision = rel.may_retry(call.ctx, failure, len(call.tried), call.tried, now)
            if not decision.allowed:
                return None
            wait_s = decision.backoff_s
        else:  # plain retries: the next endpoint, at once, while attempts are left
            if not failed.kind.retryable or (failed.sent and not resumable):
                return None
            wait_s = 0.0
        if plan is not None and plan.body is not None and call.events is not None:
            call.continuation = dict(plan.body)
            stitcher = call.events.stitcher
            assert stitcher is not None
            stitcher.start_continuation()
            ex.resumptions += 1
            rel.counts["resumptions"] += 1
            if call.tracer is not None:
                call.tracer.resumption(cand.endpoint, plan.num_tokens_sent, failed.kind.value)
        return wait_s

    def _plan(self, call: CallState, cand: Candidate, kind: FailureKind) -> ResumptionPlan:
        events = call.events
        if not self.reliability.config.resumption.enabled or events is None:
            return ResumptionPlan(ResumeAction.GIVE_UP, "resumption is off")
        assert events.stitcher is not None
        try:
            original = orjson.loads(cand.body)  # the original request, not a continuation
        except orjson.JSONDecodeError:
            return ResumptionPlan(ResumeAction.GIVE_UP, "body is not JSON")
        cfg = self.reliability.config.resumption
        kind_of = StreamKind.CHAT if call.ctx.path == ApiKind.CHAT else StreamKind.COMPLETION
        return plan_resumption(
            kind_of, original, events.stitcher.progress(), kind,
            resumptions_made=call.ex.resumptions, max_resumptions=cfg.max_resumptions,
            prompt_tokens=call.ctx.num_prompt_tokens or None,
        )  # fmt: skip

    async def _one(
        self,
        call: CallState,
        cand: Candidate,
        on_attempt: Callable[[str, str | None], None],
        retry_reason: str | None,
    ) -> web.StreamResponse:
        """One attempt on ``cand``: its outcome feeds the endpoint's breaker."""
        rel, ex, name = self.reliability, call.ex, cand.endpoint
        on_attempt(name, retry_reason)
        ex.attempts += 1
        ex.endpoint = name
        call.tried.append(name)
        self._tracker.acquire(name)
        rel.dispatch(name)
        started_s = call.attempt_started_s = self._clock()
        estimate, ex.dispatch_estimate = ex.dispatch_estimate, None
        predicted = rel.predict(name, call.ctx, started_s, estimate, attempt=id(call))
        if call.events is not None:
            call.events.new_segment(started_s)
        failure: FailureKind | None = FailureKind.CANCELLED
        try:
            if call.tracer is None:  # no span: one coroutine less per call
                result = await self._attempt(call, cand, _NO_TRACE_HEADERS)
            else:
                result = await self._traced(call, cand, ex.attempts, retry_reason)
            failure = failure_of_status(ex.status) if ex.status != 499 else FailureKind.CANCELLED
            if failure is None:
                rel.accepted(call.ctx, self._clock())
            return result
        except AttemptFailed as failed:
            failure = failed.kind
            raise
        except ApiError as refused:
            failure = failure_of_status(refused.status)
            raise
        finally:
            moved = self.hedging.settle(call)  # a hedge won: the attempt is the hedge's
            if moved is not None:
                name, started_s, predicted = moved.endpoint, moved.started_s, moved.predicted
            self._tracker.release(name)
            timing = self._timing(call, started_s, predicted)
            rel.record(name, failure, timing, self._clock(), attempt=id(call))

    def _timing(
        self, call: CallState, started_s: float, predicted: tuple[float | None, float | None]
    ) -> AttemptTiming:
        events, (ttft, tpot) = call.events, predicted
        if events is None:  # a whole answer: judge its total time against the prediction
            done = call.ex.last_chunk_s
            if done is None or not call.ex.completed:
                return AttemptTiming()
            self._tracker.record_ttft(call.ex.endpoint or "", done - started_s)
            if ttft is None or tpot is None:
                return AttemptTiming()
            total = ttft + tpot * max(0, call.ex.completion_tokens - 1)
            return AttemptTiming(done - started_s, total)
        first = events.seg_first_s
        if first is not None:
            self._tracker.record_ttft(call.ex.endpoint or "", first - started_s)
            return AttemptTiming(first - started_s, ttft, events.seg_tbt_s(), tpot)
        return AttemptTiming()

    async def _traced(
        self, call: CallState, cand: Candidate, n: int, retry_reason: str | None
    ) -> web.StreamResponse:
        if call.tracer is None:
            return await self._attempt(call, cand, _NO_TRACE_HEADERS)
        with call.tracer.attempt(cand.endpoint, n, retry_reason) as trace_headers:
            try:
                return await self._attempt(call, cand, trace_headers)
            except (AttemptFailed, ApiError) as exc:
                err = exc.error if isinstance(exc, AttemptFailed) else exc
                call.tracer.fail_current(err.code or err.error_type, err.status)
                raise

    async def _attempt(
        self, call: CallState, cand: Candidate, trace_headers: dict[str, str]
    ) -> web.StreamResponse:
        ctx, sent = call.ctx, call.out is not None
        body = cand.body
        if call.continuation is not None:
            body = orjson.dumps({**call.continuation, "model": _model_of(cand.body)})
        headers = {**JSON_HEADERS, **trace_headers} if trace_headers else JSON_HEADERS
        timeout = self._timeout(ctx, call.ex.attempts > 1)
        if timeout is None:  # the class's time is spent: no engine is asked again
            error = err(504, "the call's time ran out before another attempt", "upstream_timeout")
            raise AttemptFailed(FailureKind.EXPIRED, error, sent=sent)
        try:
            resp = await self.hedging.post(call, cand, body, headers, timeout)
        except aiohttp.ClientConnectorError:
            self._tracker.report_connect_error(cand.endpoint)
            error = err(502, "cannot connect to the engine", "connect_error")
            raise AttemptFailed(FailureKind.CONNECT, error, sent=sent) from None
        except TimeoutError:
            error = err(504, "engine did not answer in time", "upstream_timeout")
            raise timed_out(ctx, self._clock(), error, sent) from None
        except (aiohttp.ClientError, OSError):
            error = err(502, "engine closed the connection", "upstream_disconnect")
            raise AttemptFailed(FailureKind.RESET, error, sent=sent) from None
        async with resp:
            if resp.status >= 500:
                await drain(resp)
                if resp.status == 503:  # unavailable (loading, restarting): out until healthy
                    self._tracker.report_connect_error(cand.endpoint, "engine unavailable (503)")
                error = err(502, f"engine failed with HTTP {resp.status}", "upstream_error")
                raise AttemptFailed(FailureKind.SERVER_ERROR, error, sent=sent)
            if resp.status != 200:
                if sent:  # a continuation refused: the stream cannot go on there
                    await drain(resp)
                    kind = failure_of_status(resp.status) or FailureKind.SERVER_ERROR
                    error = err(502, f"engine refused to continue ({resp.status})", "upstream")
                    raise AttemptFailed(kind, error, sent=True)
                return await self._out.relay_error(resp, call.ex)
            if ctx.stream:
                return await self._out.stream(call, resp)
            return await self._out.whole(call, resp)


#: An untraced attempt's extra headers (none; never written to).
_NO_TRACE_HEADERS: dict[str, str] = {}


def _model_of(body: bytes) -> Any:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj.get("model") if isinstance(obj, dict) else None
