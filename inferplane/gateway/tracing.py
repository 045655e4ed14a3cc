"""Tracing: one OpenTelemetry trace per call, a span per hop, W3C ``traceparent`` in and out.

A call is a distributed transaction; its trace shows each decision where it was taken:

    inferplane.call                      (server span; parent: the client's traceparent)
      authenticate                        (the API key's tenant; a 401 names its reason)
      context                             (model, priority, stream, workflow)
      cache                               (hit or miss)
      admit                               (the decision only; a refusal names its reason)
      queue                               (only a call that waited: reason, exit, waited_s)
      route                               (ranked endpoints, per-axis scores as attributes)
      upstream                            (one per attempt; its traceparent goes to the engine)
      upstream                            (a hedge racing it: hedge.role, hedge.outcome)
      stream                              (a streamed answer, open while the client's SSE is)
      resumption                          (a broken stream continued elsewhere)
      upstream                            (retry.reason: resume, or the failed attempt's code)
      account                             (tokens, attempts, cost)

Every span of a call is a child of ``inferplane.call``, wherever it is opened: ``account`` is
opened by the proxy inside the last attempt, ``queue`` inside ``admit``, which ends as its
``queue`` opens (``admit`` times the decision, ``queue`` the wait). A hedge is an attempt of
its own: the race's racers each have an ``upstream`` span, and the one that took over stands
for the attempt from then on. A hop that raises an ``ApiError`` ends with an error status,
its HTTP status and ``inferplane.reject.reason``.

The gateway calls a few context managers, one line per hop::

    with tracer.call(request.headers, request_id, path) as call:
        ctx, raw, body = await tracer.read_context(request, ...)   # authenticate, context
        with tracer.hop("admit"): ...
        tracer.route(decision)
        with tracer.attempt(endpoint, n) as headers:   # add ``headers`` to the upstream call
            ...
        call.reject(429, "queue_full")                  # or call.finish(status)

Each ``GatewayTracer`` owns its own ``TracerProvider`` (tests run many gateways in one
process); nothing is global. Tracing is off by default (``TracingConfig.enabled``): the helpers
then cost a branch, and the gateway guards what only feeds spans (attributes, the split
authenticate hop) with ``tracer.enabled``. OTLP export needs the optional
``opentelemetry-exporter-otlp-proto-http`` package and an endpoint; tests use the in-memory
exporter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from inferplane.core.types import RouteDecision, client_workflow_id
from inferplane.gateway.context import Authenticator, RequestContext, read_context
from inferplane.gateway.errors import ApiError
from inferplane.gateway.exchange import Exchange
from inferplane.gateway.observability_config import TracingConfig
from inferplane.gateway.tracing_state import (
    ATTEMPT,
    CALL,
    AttemptTrace,
    CallSpan,
    CallTrace,
    call_context,
    end_admit,
    failed,
    note,
    otlp_exporter,
    traceparent,
)

__all__ = ["TRACER_KEY", "CallSpan", "GatewayTracer", "TracingConfig", "setup_tracing"]

_PROPAGATOR = TraceContextTextMapPropagator()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_RANKED = 8  # endpoints whose scores go on the route span (bounded attributes)
_TRACED_PREFIX = "/v1/"
_HOPS = frozenset({"authenticate", "context", "cache", "admit", "queue", "account"})


class GatewayTracer:
    """Spans for the gateway's hops, from one private provider."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.enabled = config.enabled
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        resource = Resource.create({"service.name": config.service_name})
        self.provider = TracerProvider(sampler=sampler, resource=resource)
        if exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        elif config.enabled and config.otlp_endpoint:
            self.provider.add_span_processor(
                BatchSpanProcessor(otlp_exporter(config.otlp_endpoint))
            )
        self._tracer = self.provider.get_tracer("inferplane.gateway")

    @classmethod
    def in_memory(cls, sample_ratio: float = 1.0) -> tuple[GatewayTracer, InMemorySpanExporter]:
        exporter = InMemorySpanExporter()
        config = TracingConfig(enabled=True, sample_ratio=sample_ratio)
        return cls(config, exporter), exporter

    def shutdown(self) -> None:
        self.provider.shutdown()

    @contextlib.contextmanager
    def call(self, headers: Mapping[str, str], request_id: str, path: str) -> Iterator[CallSpan]:
        """The call's root span, child of the client's ``traceparent`` when it sent one."""
        if not self.enabled:
            yield CallSpan(NonRecordingSpan(trace.INVALID_SPAN_CONTEXT))
            return
        parent = _PROPAGATOR.extract({k.lower(): v for k, v in headers.items()})
        with self._tracer.start_as_current_span(
            "inferplane.call",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"inferplane.request_id": request_id, "url.path": path},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            current = CallTrace(span)
            token = CALL.set(current)
            try:
                yield CallSpan(span)
            finally:
                CALL.reset(token)
                if current.stream is not None:  # the handler left before closing it
                    current.stream.end()

    def hop(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span]:
        """One hop of the call (``authenticate``, ``context``, ``admit``...).

        With tracing off this is one shared no-op context (no generator per hop).
        """
        if name not in _HOPS:
            raise ValueError(f"unknown hop {name!r}")
        if not self.enabled:
            return _NO_HOP
        if name == "admit":
            return self._admit(attributes)
        if name == "queue":
            end_admit("queued")
        return self._child(name, attributes)

    async def read_context(
        self,
        request: web.Request,
        path: str,
        auth: Authenticator,
        now: float,
        max_body_bytes: int,
    ) -> tuple[RequestContext, bytes, dict[str, Any]]:
        """``context.read_context`` as two hops: ``authenticate`` (the key's tenant), then
        ``context``. The gateway calls it only with tracing on; off, it calls
        ``context.read_context``, which authenticates inline (no hop, one key lookup)."""
        with self.hop("authenticate") as span:
            caller = auth.caller(request.headers)
            self.note(span, tenant=caller.tenant, api_key_name=caller.key_name)
        with self.hop("context") as span:
            ctx, raw, body = await read_context(request, path, auth, now, max_body_bytes, caller)
            workflow = ctx.workflow_id  # as the client sent it (the tenant is on authenticate)
            self.note(
                span, model=ctx.model, priority=ctx.priority.value, stream=ctx.stream,
                workflow_id=workflow and client_workflow_id(ctx.tenant, workflow),
                workflow_step=ctx.workflow_step, prompt_tokens=ctx.num_prompt_tokens,
            )  # fmt: skip
        return ctx, raw, body

    def note_account(self, span: Span, done: Exchange, cost_usd: float) -> None:
        """The ``account`` hop's attributes: what the call used and cost, over its attempts."""
        self.note(
            span, cost_usd=cost_usd, prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens, attempts=done.attempts,
            resumptions=done.resumptions, status=done.status,
        )  # fmt: skip

    def route(self, decision: RouteDecision, target: str | None = None) -> None:
        """The routing decision: ranked endpoints, predicted TTFT and per-axis scores."""
        if not self.enabled:
            return
        attrs: dict[str, AttributeValue] = {
            "inferplane.route.reason": decision.reason[:512],
            "inferplane.route.ranked": list(decision.names()[:_MAX_RANKED]),
        }
        if target is not None:
            attrs["inferplane.route.model"] = target
        for ranked in decision.ranked[:_MAX_RANKED]:
            prefix = f"inferplane.score.{ranked.name}"
            attrs[prefix] = ranked.score
            if ranked.predicted_ttft_s is not None:
                attrs[f"inferplane.predicted_ttft_s.{ranked.name}"] = ranked.predicted_ttft_s
            for axis in ranked.axes:
                attrs[f"{prefix}.{axis.axis}"] = axis.score
        self._tracer.start_span("route", context=call_context(), attributes=attrs).end()

    @contextlib.contextmanager
    def attempt(
        self, endpoint: str, attempt: int, retry_reason: str | None = None
    ) -> Iterator[dict[str, str]]:
        """One upstream attempt; yields the headers (``traceparent``) to send to the engine.

        The span ends with an error status when the body raises; ``fail_current`` marks an
        attempt that returned an error without raising. A hedging race adds its racers'
        spans (``race``, ``hedge``); all end with the attempt, if not before.
        """
        if not self.enabled:
            yield {}
            return
        attrs = {"endpoint": endpoint, "attempt": attempt, "retry.reason": retry_reason}
        span = self._start("upstream", attrs, SpanKind.CLIENT)
        current = AttemptTrace(span)
        token = ATTEMPT.set(current)
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                yield traceparent(span)
        except Exception as exc:
            failed(current.span, exc)
            raise
        finally:
            ATTEMPT.reset(token)
            for racer in current.spans:
                if racer.is_recording():
                    racer.end()

    def fail_current(self, reason: str, status: int | None = None) -> None:
        """Mark the current attempt (the racer standing for it) or hop failed with ``reason``."""
        current = ATTEMPT.get()
        span = current.span if current is not None else trace.get_current_span()
        if span.is_recording():
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            span.set_status(Status(StatusCode.ERROR, reason))

    # ---- a hedging race: each racer has its own ``upstream`` span ---------------------------

    def race(self) -> AttemptTrace | None:
        """The attempt open in this context, for a hedging race to trace its racers in."""
        return ATTEMPT.get() if self.enabled else None

    def hedge(
        self, race: AttemptTrace, endpoint: str, attempt: int, after_s: float
    ) -> tuple[Span, dict[str, str]]:
        """A hedge joins ``race``: its ``upstream`` span (``inferplane.hedge.role`` ``hedge``;
        the first racer's becomes ``primary``) and the ``traceparent`` to send its engine."""
        first = race.spans[0]
        if first.is_recording():
            note(first, {"hedge.role": "primary", "hedge.endpoint": endpoint,
                         "hedge.after_s": after_s})  # fmt: skip
        attrs = {"endpoint": endpoint, "attempt": attempt, "hedge.role": "hedge",
                 "hedge.after_s": after_s}  # fmt: skip
        span = self._start("upstream", attrs, SpanKind.CLIENT)
        race.spans.append(span)
        return span, traceparent(span)

    # ---- the client's stream ---------------------------------------------------------------

    def stream_open(self) -> None:
        """The client's SSE stream is prepared: the call's ``stream`` span opens."""
        call = CALL.get()
        if self.enabled and call is not None and call.stream is None:
            call.stream = self._start("stream", {})

    def stream_close(self, done: Exchange, arrival_s: float) -> None:
        """The client's stream is over: what it carried, and how it ended."""
        call = CALL.get()
        span = call.stream if call is not None else None
        if span is None or call is None:
            return
        call.stream = None
        first = done.first_token_s
        note(span, {
            "ttft_s": None if first is None else round(first - arrival_s, 6),
            "tpot_s": done.tpot_s(), "completion_tokens": done.completion_tokens,
            "chunks": done.chunks, "segments": 1 + done.resumptions, "status": done.status,
            "reason": done.reason or None,
        })  # fmt: skip
        if not done.completed and done.status != 499:
            span.set_status(Status(StatusCode.ERROR, done.reason or "stream ended early"))
        span.end()

    def resumption(self, from_endpoint: str, num_tokens: int, reason: str) -> None:
        """A stream broke after ``num_tokens`` and will continue on another endpoint."""
        if not self.enabled:
            return
        attrs: dict[str, AttributeValue] = {
            "inferplane.resume.from": from_endpoint,
            "inferplane.resume.tokens": num_tokens,
            "inferplane.resume.reason": reason,
        }
        self._tracer.start_span("resumption", context=call_context(), attributes=attrs).end()

    def note(self, span: Span, **attributes: Any) -> None:
        """Set ``inferplane.<name>`` attributes (None values skipped) on a hop's span.

        The caller guards the call with ``tracer.enabled`` (off: not even the keywords)."""
        note(span, attributes)

    @contextlib.contextmanager
    def _child(
        self, name: str, attributes: Mapping[str, Any], kind: SpanKind = SpanKind.INTERNAL
    ) -> Iterator[Span]:
        if not self.enabled:
            yield trace.INVALID_SPAN
            return
        span = self._start(name, attributes, kind)
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            try:
                yield span
            except Exception as exc:
                failed(span, exc)
                raise
            finally:
                if span.is_recording():  # ``admit`` may have ended as its ``queue`` began
                    span.end()

    @contextlib.contextmanager
    def _admit(self, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """The ``admit`` hop: the decision alone (``inferplane.admit.decision``); a call that
        queues ends it as its ``queue`` hop opens."""
        call = CALL.get()
        decision = "rejected"
        with self._child("admit", attributes) as span:
            if call is not None:
                call.admit = span
            try:
                yield span
                decision = "admitted"
            finally:
                if call is not None:
                    call.admit = None
                if span.is_recording():  # not ended by a queue wait
                    span.set_attribute("inferplane.admit.decision", decision)

    def _start(
        self, name: str, attributes: Mapping[str, Any], kind: SpanKind = SpanKind.INTERNAL
    ) -> Span:
        """A span of the call, child of its root (ended by the caller)."""
        attrs = {k if k.startswith(("inferplane.", "http.")) else f"inferplane.{k}": v
                 for k, v in attributes.items() if v is not None}  # fmt: skip
        return self._tracer.start_span(name, context=call_context(), kind=kind, attributes=attrs)


class _NoHop:
    """The context of a hop when tracing is off: yields the invalid (no-op) span."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_HOP = _NoHop()

#: The app's tracer, for the handlers and the proxy: ``request.app[TRACER_KEY]``.
TRACER_KEY = web.AppKey("inferplane_tracer", GatewayTracer)


def setup_tracing(app: web.Application, config: TracingConfig) -> GatewayTracer:
    """Open the root span of every ``/v1/`` call in a middleware; returns the tracer.

    The middleware sits inside the error middleware, so it sees the handler's ``ApiError``
    (recorded as a rejection with its code) before it becomes an error response. Hops inside
    the call use ``request.app[TRACER_KEY]``. The provider is shut down with the app.
    """
    tracer = GatewayTracer(config)
    app[TRACER_KEY] = tracer

    @web.middleware
    async def trace_calls(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not tracer.enabled or not request.path.startswith(_TRACED_PREFIX):
            return await handler(request)
        request_id = request.headers.get("X-Request-Id", "")
        with tracer.call(request.headers, request_id, request.path) as call:
            try:
                response = await handler(request)
            except ApiError as err:
                call.reject(err.status, err.code or err.error_type)
                raise
            call.set(endpoint=response.headers.get("X-Inferplane-Endpoint"))
            call.finish(response.status)
            return response

    async def shutdown(app: web.Application) -> None:
        tracer.shutdown()

    if tracer.enabled:  # off: no middleware at all on the hot path
        app.middlewares.append(trace_calls)
    app.on_cleanup.append(shutdown)
    return tracer
