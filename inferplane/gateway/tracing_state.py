"""The state a call's trace keeps across hops, and the span helpers of :mod:`tracing`.

``CallSpan`` wraps the call's root span for the middleware; ``otlp_exporter`` builds the
optional OTLP exporter.

``CALL`` holds the call being served in this context (its root span, the ``admit`` span
until it ends, the ``stream`` span while the client's stream is open); ``ATTEMPT`` the
upstream attempt open in this context (every racer's span of a hedging race, and the one
standing for the attempt now). Both are context variables: set where the gateway opens the
call or the attempt, they are seen by everything it awaits in that task (the admission
gate's queue, the proxy's relay, the hedging race) and by nothing else.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferplane.gateway.errors import ApiError

__all__ = [
    "ATTEMPT", "CALL", "AttemptTrace", "CallSpan", "CallTrace", "call_context", "end_admit",
    "failed", "note", "otlp_exporter", "refused", "traceparent",
]  # fmt: skip

_PROPAGATOR = TraceContextTextMapPropagator()


class CallTrace:
    """The call being served: its root span, and the spans open across hops (``admit`` until
    it ends, ``stream`` while the client's stream is open)."""

    __slots__ = ("admit", "span", "stream")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.admit: Span | None = None
        self.stream: Span | None = None


class AttemptTrace:
    """One upstream attempt: every racer's span (the proxy's first), and the one standing for
    the attempt now (a hedge, once it took over: the proxy's relay and errors are its)."""

    __slots__ = ("span", "spans")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.spans = [span]

    def out(self, span: Span, outcome: str, reason: str | None = None) -> None:
        """A racer left the race, ``lost`` (cancelled by another's win) or ``failed``
        (``reason``): its span ends now."""
        if span.is_recording():
            span.set_attribute("inferplane.hedge.outcome", outcome)
            if reason is not None:
                span.set_status(Status(StatusCode.ERROR, reason))
            span.end()

    def lead(self, span: Span, endpoint: str, *, won: bool) -> None:
        """``span``'s racer (on ``endpoint``) stands for the attempt now; ``won``: it won the
        race (``inferplane.hedge.outcome`` ``won``, ``inferplane.hedge.winner`` on the
        first racer's span)."""
        self.span = span
        first = self.spans[0]
        if won and span.is_recording():
            span.set_attribute("inferplane.hedge.outcome", "won")
        if won and first.is_recording():
            first.set_attribute("inferplane.hedge.winner", endpoint)


#: The call being served in this context (None outside a call): every span of the call is
#: opened as a child of its root, wherever the gateway opens it.
CALL: contextvars.ContextVar[CallTrace | None] = contextvars.ContextVar(
    "inferplane_call", default=None
)
#: The upstream attempt open in this context (None outside one).
ATTEMPT: contextvars.ContextVar[AttemptTrace | None] = contextvars.ContextVar(
    "inferplane_attempt", default=None
)


def call_context() -> Context | None:
    """The context whose current span is the call's root (None: the current context)."""
    call = CALL.get()
    return None if call is None else trace.set_span_in_context(call.span)


def end_admit(decision: str) -> None:
    """The call's ``admit`` hop ends here with ``decision`` (its ``queue`` hop begins)."""
    call = CALL.get()
    if call is not None and call.admit is not None and call.admit.is_recording():
        call.admit.set_attribute("inferplane.admit.decision", decision)
        call.admit.end()


def traceparent(span: Span) -> dict[str, str]:
    """The W3C headers that make ``span`` the parent of an engine's work."""
    headers: dict[str, str] = {}
    if span.is_recording():
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    return headers


def note(span: Span, attributes: Mapping[str, Any]) -> None:
    """Set ``inferplane.<name>`` attributes on ``span``, None values skipped."""
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"inferplane.{key}", value)


def refused(span: Span, status: int, reason: str) -> None:
    """``span`` refused the call: its HTTP status and reason code."""
    if not span.is_recording():  # an ``admit`` that ended as its queue wait began
        return
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("inferplane.reject.reason", reason)
    span.set_status(Status(StatusCode.ERROR, reason))


def failed(span: Span, exc: Exception) -> None:
    """A hop raised: a refusal names its code; other errors keep a status already set."""
    if isinstance(exc, ApiError):
        refused(span, exc.status, exc.code or exc.error_type)
    elif span.is_recording() and (
        not isinstance(span, ReadableSpan) or span.status.status_code is StatusCode.UNSET
    ):
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class CallSpan:
    """The root span of one call; ends with a status (or a rejection with its reason)."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def set(self, **attributes: Any) -> None:
        note(self.span, attributes)

    def reject(self, status: int, reason: str) -> None:
        refused(self.span, status, reason)

    def finish(self, status: int, reason: str | None = None) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400 or reason:
            self.span.set_status(Status(StatusCode.ERROR, reason or str(status)))


def otlp_exporter(endpoint: str) -> SpanExporter:
    """The OTLP/HTTP exporter to ``endpoint`` (the optional package must be installed)."""
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
