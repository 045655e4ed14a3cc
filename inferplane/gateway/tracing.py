"""Tracing: one OpenTelemetry trace per call, a span per hop, W3C ``traceparent`` in and out.

A call is a distributed transaction; its trace shows each decision where it was taken:

    inferplane.call                      (server span; parent: the client's traceparent)
      authenticate                        (the API key's tenant; a 401 names its reason)
      context                             (model, priority, stream, workflow)
      cache                               (hit or miss)
      admit                               (queued_s; a refusal names its reason)
      queue                               (only a call that waited: reason, exit, waited_s)
      route                               (ranked endpoints, per-axis scores as attributes)
      upstream                            (one per attempt; its traceparent goes to the engine)
      resumption                          (a broken stream continued elsewhere)
      upstream                            (retry.reason: resume, or the failed attempt's code)
      account                             (tokens, attempts, cost)

Every span of a call is a child of ``inferplane.call``, wherever it is opened: ``account`` is
opened by the proxy inside the last attempt, ``queue`` inside ``admit`` (so ``admit``'s time
includes the wait and ``queue`` shows the wait alone). A hop that raises an ``ApiError`` ends
with an error status, its HTTP status and ``inferplane.reject.reason``.

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
import contextvars
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
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

__all__ = ["TRACER_KEY", "CallSpan", "GatewayTracer", "TracingConfig", "setup_tracing"]

_PROPAGATOR = TraceContextTextMapPropagator()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_RANKED = 8  # endpoints whose scores go on the route span (bounded attributes)
_TRACED_PREFIX = "/v1/"
_HOPS = frozenset({"authenticate", "context", "cache", "admit", "queue", "account", "stream"})
#: The root span of the call being served in this context (None outside a call): every span
#: of the call is opened as its child, wherever the gateway opens it.
_CALL_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "inferplane_call_span", default=None
)


class CallSpan:
    """The root span of one call; ends with a status (or a rejection with its reason)."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def set(self, **attributes: Any) -> None:
        _note(self.span, attributes)

    def reject(self, status: int, reason: str) -> None:
        _refused(self.span, status, reason)

    def finish(self, status: int, reason: str | None = None) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400 or reason:
            self.span.set_status(Status(StatusCode.ERROR, reason or str(status)))


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
            self.provider.add_span_processor(BatchSpanProcessor(_otlp(config.otlp_endpoint)))
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
            token = _CALL_SPAN.set(span)
            try:
                yield CallSpan(span)
            finally:
                _CALL_SPAN.reset(token)

    def hop(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span]:
        """One hop of the call (``authenticate``, ``context``, ``admit``...).

        With tracing off this is one shared no-op context (no generator per hop).
        """
        if name not in _HOPS:
            raise ValueError(f"unknown hop {name!r}")
        if not self.enabled:
            return _NO_HOP
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
        self._tracer.start_span("route", context=_call_context(), attributes=attrs).end()

    @contextlib.contextmanager
    def attempt(
        self, endpoint: str, attempt: int, retry_reason: str | None = None
    ) -> Iterator[dict[str, str]]:
        """One upstream attempt; yields the headers (``traceparent``) to send to the engine.

        The span ends with an error status when the body raises; ``fail(reason)`` on the span
        marks an attempt that returned an error without raising.
        """
        attrs = {"inferplane.endpoint": endpoint, "inferplane.attempt": attempt}
        if retry_reason is not None:
            attrs["inferplane.retry.reason"] = retry_reason
        with self._child("upstream", attrs, kind=SpanKind.CLIENT) as span:
            headers: dict[str, str] = {}
            if span.is_recording():
                _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
            yield headers

    def fail_current(self, reason: str, status: int | None = None) -> None:
        """Mark the current span (an attempt, a hop) failed with ``reason``."""
        span = trace.get_current_span()
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        span.set_status(Status(StatusCode.ERROR, reason))

    def resumption(self, from_endpoint: str, num_tokens: int, reason: str) -> None:
        """A stream broke after ``num_tokens`` and will continue on another endpoint."""
        if not self.enabled:
            return
        attrs: dict[str, AttributeValue] = {
            "inferplane.resume.from": from_endpoint,
            "inferplane.resume.tokens": num_tokens,
            "inferplane.resume.reason": reason,
        }
        self._tracer.start_span("resumption", context=_call_context(), attributes=attrs).end()

    def note(self, span: Span, **attributes: Any) -> None:
        """Set ``inferplane.<name>`` attributes (None values skipped) on a hop's span.

        The caller guards the call with ``tracer.enabled`` (off: not even the keywords)."""
        _note(span, attributes)

    @contextlib.contextmanager
    def _child(
        self, name: str, attributes: Mapping[str, Any], kind: SpanKind = SpanKind.INTERNAL
    ) -> Iterator[Span]:
        if not self.enabled:
            yield trace.INVALID_SPAN
            return
        attrs = {k if k.startswith(("inferplane.", "http.")) else f"inferplane.{k}": v
                 for k, v in attributes.items() if v is not None}  # fmt: skip
        with self._tracer.start_as_current_span(
            name,
            context=_call_context(),
            kind=kind,
            attributes=attrs,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except Exception as exc:
                _failed(span, exc)
                raise


def _call_context() -> Context | None:
    """The context whose current span is the call's root (None: the current context)."""
    call = _CALL_SPAN.get()
    return None if call is None else trace.set_span_in_context(call)


def _note(span: Span, attributes: Mapping[str, Any]) -> None:
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"inferplane.{key}", value)


def _refused(span: Span, status: int, reason: str) -> None:
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("inferplane.reject.reason", reason)
    span.set_status(Status(StatusCode.ERROR, reason))


def _failed(span: Span, exc: Exception) -> None:
    """A hop raised: a refusal names its code; other errors keep a status already set."""
    if isinstance(exc, ApiError):
        _refused(span, exc.status, exc.code or exc.error_type)
    elif not isinstance(span, ReadableSpan) or span.status.status_code is StatusCode.UNSET:
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _otlp(endpoint: str) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:  # pragma: no cover - depends on an optional package
        raise RuntimeError(
            "tracing.otlp_endpoint needs the package opentelemetry-exporter-otlp-proto-http"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint)
    return exporter


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
