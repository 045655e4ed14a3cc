"""Writing an engine's answer to the client: whole JSON, a stream across segments, errors.

``Responder`` holds the response side of a call (``CallState``): the non-streaming answer
read whole, the SSE stream prepared once and fed from every segment (the first upstream and
any continuations), the clean end (cost comment, ``[DONE]``), a stream closed after its last
token was lost only in transit, and the error the client gets when nothing is left to try.
Failures another endpoint might not have are raised as ``AttemptFailed`` for the proxy's
retry and resumption logic; ``sent`` says whether the client has received bytes already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from inferplane.core.resumption import ResumptionPlan, StreamKind
from inferplane.core.retry import FailureKind
from inferplane.core.stitcher import StreamStitcher
from inferplane.gateway.context import ApiKind, RequestContext
from inferplane.gateway.errors import ApiError, is_error_json, sse_error_event
from inferplane.gateway.exchange import Exchange, Finisher
from inferplane.gateway.sse_filter import DONE, EventFilter, read_usage
from inferplane.gateway.tracing import GatewayTracer

__all__ = ["AttemptFailed", "CallState", "Responder", "drain", "err", "read_or_fail"]

JSON_HEADERS = {"Content-Type": "application/json"}


class AttemptFailed(Exception):
    """An attempt failed in a way another endpoint might not (``sent``: mid-stream)."""

    def __init__(self, kind: FailureKind, error: ApiError, *, sent: bool = False) -> None:
        super().__init__(error.message)
        self.kind, self.error, self.sent = kind, error, sent


#: A timeout this close to the call's deadline is the deadline's (timers fire a little late).
_DEADLINE_SLACK_S = 0.002


def timed_out(ctx: RequestContext, now: float, error: ApiError, sent: bool) -> AttemptFailed:
    """An attempt that ran out of time: the engine's failure (``error``, counted against it),
    unless the call's own deadline has passed, which says nothing of the engine: then it is
    ``EXPIRED`` (not counted, not retried) and the client is told so."""
    if ctx.deadline_s is not None and now >= ctx.deadline_s - _DEADLINE_SLACK_S:
        expired = err(504, "the call's deadline (X-Deadline-Ms) passed", "deadline_exceeded")
        return AttemptFailed(FailureKind.EXPIRED, expired, sent=sent)
    return AttemptFailed(FailureKind.TIMEOUT, error, sent=sent)


@dataclass(slots=True, init=False)
class CallState:
    """One call's state across its attempts (owned by one ``forward``)."""

    request: web.Request
    ctx: RequestContext
    ex: Exchange
    finish: Finisher
    tracer: GatewayTracer | None
    tried: list[str] = field(default_factory=list)
    out: web.StreamResponse | None = None  # the client's stream, once prepared
    events: EventFilter | None = None
    continuation: dict[str, Any] | None = None  # the body resuming a broken stream
    attempt_started_s: float = 0.0  # when the current attempt was sent

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        request: web.Request,
        ctx: RequestContext,
        ex: Exchange,
        finish: Finisher,
        tracer: GatewayTracer | None,
        tried: list[str] | None = None,
        out: web.StreamResponse | None = None,
        events: EventFilter | None = None,
        continuation: dict[str, Any] | None = None,
        attempt_started_s: float = 0.0,
    ) -> None:
        self.request = request
        self.ctx = ctx
        self.ex = ex
        self.finish = finish
        self.tracer = tracer
        self.tried = list() if tried is None else tried
        self.out = out
        self.events = events
        self.continuation = continuation
        self.attempt_started_s = attempt_started_s


class Responder:
    """Writes answers to clients; ``clock`` times tokens."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    async def relay_error(self, resp: aiohttp.ClientResponse, ex: Exchange) -> web.Response:
        ex.status, ex.reason = resp.status, "upstream_refused"
        raw = await read_or_fail(resp)
        try:
            ok = is_error_json(orjson.loads(raw))
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            text = raw[:200].decode(errors="replace")
            raise ApiError(resp.status, f"engine refused the request: {text}", code="upstream")
        return web.Response(
            status=resp.status, body=raw, headers={**JSON_HEADERS, **ex.extra_headers}
        )

    async def whole(self, call: CallState, resp: aiohttp.ClientResponse) -> web.Response:
        ex = call.ex
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, OSError):  # e.g. the engine crashed mid-generation
            error = err(502, "engine connection broke", "upstream_disconnect")
            raise AttemptFailed(FailureKind.RESET, error) from None
        except TimeoutError:
            error = err(504, "engine did not answer in time", "upstream_timeout")
            raise timed_out(call.ctx, self.clock(), error, False) from None
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            raise ApiError(502, "engine returned invalid JSON", code="upstream_garbage")
        read_usage(payload.get("usage"), ex)
        ex.first_token(self.clock())
        ex.last_chunk_s = ex.first_token_s
        ex.status, ex.completed = 200, True
        headers = {
            "Content-Type": "application/json",
            "X-Inferplane-Endpoint": ex.endpoint or "",
            "X-Request-Id": call.ctx.request_id,
        }
        headers.update(ex.route_headers())
        if ex.extra_headers:
            headers.update(ex.extra_headers)
        cost = call.finish(ex)
        if cost is not None:
            headers["X-Inferplane-Cost-Usd"] = format(cost, ".12g")
        return web.Response(body=raw, headers=headers)  # Content-Type given: no parsing

    async def stream(self, call: CallState, resp: aiohttp.ClientResponse) -> web.StreamResponse:
        ex, ctx = call.ex, call.ctx
        if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            raw = await read_or_fail(resp)
            text = raw[:120].decode(errors="replace")
            error = err(502, f"engine did not stream: {text}", "upstream")
            if call.out is not None:
                raise AttemptFailed(FailureKind.SERVER_ERROR, error, sent=True)
            raise error
        if call.out is None:
            kind = StreamKind.CHAT if ctx.path == ApiKind.CHAT else StreamKind.COMPLETION
            stitcher = StreamStitcher(kind, client_wants_usage=True)
            call.events = EventFilter(ctx.client_wants_usage, ex, self.clock, stitcher)
            call.events.new_segment(call.attempt_started_s)
            out = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Inferplane-Endpoint": ex.endpoint or "",
                    "X-Request-Id": ctx.request_id,
                    **ex.route_headers(),
                    **ex.extra_headers,
                }
            )
            await out.prepare(call.request)
            call.out = out
            ex.status = 200
            if call.tracer is not None:
                call.tracer.stream_open()
        assert call.events is not None
        try:
            await self._pump(call, resp, call.out, call.events)
        except ConnectionResetError:
            ex.status, ex.reason = 499, "client_disconnected"
        return call.out

    async def _pump(
        self,
        call: CallState,
        resp: aiohttp.ClientResponse,
        out: web.StreamResponse,
        events: EventFilter,
    ) -> None:
        ex = events.ex
        try:
            async for data in resp.content.iter_any():
                chunk = events.feed(data)
                if chunk:
                    if ex.tap is not None:
                        ex.tap(chunk)
                    await out.write(chunk)
                if events.done:
                    await self.end(call, b"")
                    return
                if events.broken:
                    error = err(502, "engine failed mid-stream", "upstream_error_event")
                    raise AttemptFailed(FailureKind.SERVER_ERROR, error, sent=True)
            error = err(502, "engine closed the stream early", "upstream_closed_early")
            raise AttemptFailed(FailureKind.RESET, error, sent=True)
        except (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            error = err(502, "engine connection broke mid-stream", "upstream_closed_early")
            raise AttemptFailed(FailureKind.RESET, error, sent=True) from None
        except TimeoutError:
            error = err(504, "engine stalled mid-stream", "upstream_timeout")
            raise timed_out(call.ctx, self.clock(), error, True) from None

    async def end(self, call: CallState, chunk: bytes) -> None:
        """Write the last events, the cost comment and [DONE]; close the stream."""
        ex, out = call.ex, call.out
        assert out is not None and call.events is not None
        stitcher = call.events.stitcher
        if stitcher is not None and stitcher.segments > 1:
            ex.wasted_prefill_tokens = stitcher.wasted_prefill_tokens
        cost = call.finish(ex)
        tail = b"" if cost is None else f": inferplane cost_usd={cost:.12g}\n\n".encode()
        final = chunk + tail + DONE + b"\n\n"
        if ex.tap is not None:
            ex.tap(final)
        await out.write(final)
        await out.write_eof()

    async def close(self, call: CallState, plan: ResumptionPlan) -> None:
        """The stream broke after its last token: end it cleanly (a FINISH plan)."""
        events = call.events
        assert events is not None and events.stitcher is not None
        closing = events.stitcher.closing_events(plan.finish_reason)
        events.new_segment(self.clock())
        chunk = events.feed(b"".join(e + b"\n\n" for e in closing), stitch=False)
        call.ex.completed = True
        try:
            await self.end(call, chunk)
        except ConnectionResetError:
            call.ex.status, call.ex.reason = 499, "client_disconnected"

    async def give_up(self, call: CallState, error: ApiError) -> web.StreamResponse:
        """No attempt left: an OpenAI error, or an SSE error event once streaming."""
        ex, out = call.ex, call.out
        if out is None:
            raise error
        if ex.completed or ex.status == 499:
            return out  # closed cleanly (FINISH) or the client left
        ex.reason = error.code or "upstream_error"
        try:
            await out.write(sse_error_event(error.message, error.error_type, error.code))
        except ConnectionResetError:
            ex.status, ex.reason = 499, "client_disconnected"
        return out


def err(status: int, message: str, code: str) -> ApiError:
    return ApiError(status, message, code=code)


async def read_or_fail(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientError, OSError):
        raise ApiError(502, "engine connection broke", code="upstream_disconnect") from None
    except TimeoutError:
        raise ApiError(504, "engine did not answer in time", code="upstream_timeout") from None


async def drain(resp: aiohttp.ClientResponse) -> None:
    try:
        await asyncio.wait_for(resp.read(), timeout=1.0)
    except (aiohttp.ClientError, OSError, TimeoutError):
        resp.close()
