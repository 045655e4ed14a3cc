"""The upstream half of a call: send it to an engine, pass the answer back, measure it.

Non-streaming answers are read whole, parsed once for ``usage`` and forwarded as the same
bytes. Streams are forwarded event by event as they arrive: the gateway parses an event only
until the first token (to time TTFT) and when it carries ``usage``; every other event is
passed on as bytes. Usage is always asked of the engine (``include_usage``) and the usage
event is dropped again when the client did not ask for it. A stream's cost cannot travel in a
header (headers are gone before the cost is known), so it is sent as an SSE comment line
(``: inferplane cost_usd=...``) just before ``data: [DONE]``; SSE clients ignore comments.

Failures before the first byte reaches the client (connect error, 5xx) move to the next
ranked endpoint, up to ``retries`` times; after that they become an OpenAI error (JSON, or an
SSE error event once a stream has begun). A client that goes away cancels the handler, which
closes the upstream connection, which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from inferplane.config import TimeoutsConfig
from inferplane.core.types import PriorityClass
from inferplane.gateway.context import RequestContext
from inferplane.gateway.errors import ApiError, is_error_json, sse_error_event
from inferplane.gateway.tracker import EndpointTracker

_JSON = {"Content-Type": "application/json"}
_DONE = b"data: [DONE]"


@dataclass(slots=True)
class Exchange:
    """What happened to one call, filled in as it goes (owned by one handler)."""

    endpoint: str | None = None
    status: int = 0
    reason: str = ""
    attempts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    first_token_s: float | None = None
    last_chunk_s: float | None = None
    completed: bool = False
    tbt_s: list[float] | None = None
    #: Called once with the time the first token arrived (the predictor learns TTFT).
    on_first_token: Callable[[float], None] | None = None
    #: Called with every SSE chunk just before it is written to the client (cache fill).
    tap: Callable[[bytes], None] | None = None
    #: Headers added to the client's response on both paths (JSON and SSE).
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: Prompt tokens an engine computed for a stream that broke and was resumed elsewhere.
    wasted_prefill_tokens: int = 0
    #: Streams resumed on another endpoint after a break.
    resumptions: int = 0

    def first_token(self, now: float) -> None:
        self.first_token_s = now
        if self.on_first_token is not None:
            self.on_first_token(now)

    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, when measurable."""
        if self.first_token_s is None or self.last_chunk_s is None or self.completion_tokens < 2:
            return None
        span_s = self.last_chunk_s - self.first_token_s
        return span_s / (self.completion_tokens - 1) if span_s > 0 else None


#: Called once when the call is over; returns its cost in USD (None when unknown).
Finisher = Callable[[Exchange], float | None]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint to try and the exact bytes to send it."""

    endpoint: str
    url: str
    body: bytes


class _Retryable(Exception):
    """A failure before the first byte that another endpoint might not have."""


def read_usage(usage: Any, ex: Exchange) -> None:
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int):
        ex.prompt_tokens = prompt
    if isinstance(completion, int):
        ex.completion_tokens = completion
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        ex.cached_tokens = details["cached_tokens"]


class Proxy:
    """Sends calls upstream over one shared client session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        tracker: EndpointTracker,
        timeouts: TimeoutsConfig,
        retries: int,
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._tracker = tracker
        self._timeouts = timeouts
        self._retries = retries
        self._clock = clock
        self._timeout_of: dict[tuple[PriorityClass, bool], aiohttp.ClientTimeout] = {}

    def _timeout(self, ctx: RequestContext) -> aiohttp.ClientTimeout:
        if ctx.deadline_s is None:  # the common case: one shared value per class and mode
            key = (ctx.priority, ctx.stream)
            found = self._timeout_of.get(key)
            if found is None:
                found = self._timeout_of[key] = self._build_timeout(ctx)
            return found
        return self._build_timeout(ctx)

    def _build_timeout(self, ctx: RequestContext) -> aiohttp.ClientTimeout:
        total = self._timeouts.for_class(ctx.priority)
        if ctx.deadline_s is not None:
            total = max(0.001, min(total, ctx.deadline_s - self._clock()))
        return aiohttp.ClientTimeout(
            total=total,
            sock_connect=self._timeouts.connect_s,
            sock_read=self._timeouts.inter_token_s if ctx.stream else None,
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
        """Try candidates in order; answer the client from the first that responds.

        ``on_attempt(endpoint, retry_reason)`` is called before each attempt (the reason is
        None for the first one).
        """
        last_error = ApiError(503, "no endpoint available", code="no_endpoint")
        for cand in candidates[: self._retries + 1]:
            on_attempt(cand.endpoint, (last_error.code or "error") if ex.attempts else None)
            ex.attempts += 1
            ex.endpoint = cand.endpoint
            self._tracker.acquire(cand.endpoint)
            try:
                return await self._attempt(request, ctx, cand, ex, finish)
            except _Retryable as exc:
                last_error = exc.args[0]
            finally:
                self._tracker.release(cand.endpoint)
        raise last_error

    async def _attempt(
        self,
        request: web.Request,
        ctx: RequestContext,
        cand: Candidate,
        ex: Exchange,
        finish: Finisher,
    ) -> web.StreamResponse:
        try:
            resp = await self._session.post(
                cand.url, data=cand.body, headers=_JSON, timeout=self._timeout(ctx)
            )
        except aiohttp.ClientConnectorError:
            self._tracker.report_connect_error(cand.endpoint)
            raise _Retryable(
                ApiError(502, "cannot connect to the engine", code="connect_error")
            ) from None
        except (aiohttp.ClientError, OSError):
            raise _Retryable(
                ApiError(502, "engine closed the connection", code="upstream_disconnect")
            ) from None
        except TimeoutError:
            raise ApiError(504, "engine did not answer in time", code="upstream_timeout") from None
        async with resp:
            if resp.status >= 500:
                await _drain(resp)
                raise _Retryable(
                    ApiError(502, f"engine failed with HTTP {resp.status}", code="upstream_error")
                )
            if resp.status != 200:
                return await self._relay_error(resp, ex)
            if ctx.stream:
                return await self._stream(request, ctx, resp, ex, finish)
            return await self._whole(ctx, resp, ex, finish)

    async def _relay_error(self, resp: aiohttp.ClientResponse, ex: Exchange) -> web.Response:
        ex.status, ex.reason = resp.status, "upstream_refused"
        raw = await _read_or_fail(resp)
        try:
            ok = is_error_json(orjson.loads(raw))
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            text = raw[:200].decode(errors="replace")
            raise ApiError(resp.status, f"engine refused the request: {text}", code="upstream")
        return web.Response(status=resp.status, body=raw, headers=_JSON)

    async def _whole(
        self, ctx: RequestContext, resp: aiohttp.ClientResponse, ex: Exchange, finish: Finisher
    ) -> web.Response:
        raw = await _read_or_fail(resp)
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            raise ApiError(502, "engine returned invalid JSON", code="upstream_garbage")
        read_usage(payload.get("usage"), ex)
        ex.first_token(self._clock())
        ex.last_chunk_s = ex.first_token_s
        ex.status, ex.completed = 200, True
        headers = {"X-Inferplane-Endpoint": ex.endpoint or "", "X-Request-Id": ctx.request_id}
        headers.update(ex.extra_headers)
        cost = finish(ex)
        if cost is not None:
            headers["X-Inferplane-Cost-Usd"] = format(cost, ".12g")
        return web.Response(status=200, body=raw, content_type="application/json", headers=headers)

    async def _stream(
        self,
        request: web.Request,
        ctx: RequestContext,
        resp: aiohttp.ClientResponse,
        ex: Exchange,
        finish: Finisher,
    ) -> web.StreamResponse:
        if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            raw = await _read_or_fail(resp)
            raise ApiError(
                502, f"engine did not stream: {raw[:120].decode(errors='replace')}", code="upstream"
            )
        out = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Inferplane-Endpoint": ex.endpoint or "",
                "X-Request-Id": ctx.request_id,
                **ex.extra_headers,
            }
        )
        await out.prepare(request)
        ex.status = 200
        try:
            await self._pump(
                resp, out, _EventFilter(ctx.client_wants_usage, ex, self._clock), finish
            )
            await out.write_eof()
        except ConnectionResetError:
            ex.status, ex.reason = 499, "client_disconnected"
        return out

    async def _pump(
        self,
        resp: aiohttp.ClientResponse,
        out: web.StreamResponse,
        events: _EventFilter,
        finish: Finisher,
    ) -> None:
        ex = events.ex
        try:
            async for data in resp.content.iter_any():
                chunk = events.feed(data)
                if events.done:
                    cost = finish(ex)
                    tail = (
                        b"" if cost is None else f": inferplane cost_usd={cost:.12g}\n\n".encode()
                    )
                    final = chunk + tail + _DONE + b"\n\n"
                    if ex.tap is not None:
                        ex.tap(final)
                    await out.write(final)
                    return
                if chunk:
                    if ex.tap is not None:
                        ex.tap(chunk)
                    await out.write(chunk)
            ex.reason = "upstream_closed_early"
            await out.write(sse_error_event("engine closed the stream early", code=ex.reason))
        except (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            ex.reason = "upstream_closed_early"
            await out.write(sse_error_event("engine connection broke mid-stream", code=ex.reason))
        except TimeoutError:
            ex.reason = "upstream_timeout"
            await out.write(
                sse_error_event("engine stalled mid-stream", "timeout_error", ex.reason)
            )


class _EventFilter:
    """Splits SSE bytes into events; times tokens, reads usage, drops unasked usage events."""

    __slots__ = ("_buf", "_clock", "_keep_usage", "done", "ex")

    def __init__(self, keep_usage: bool, ex: Exchange, clock: Callable[[], float]) -> None:
        self._buf = b""
        self._keep_usage = keep_usage
        self.ex = ex
        self._clock = clock
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """Complete events ready to forward (without [DONE], which sets ``done``)."""
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out: list[bytes] = []
        now = self._clock()
        for event in events:
            if event.startswith(_DONE) or event.startswith(b"data:[DONE]"):
                self.done = True
                self.ex.completed = True
                break
            kept = self._event(event, now)
            if kept is not None:
                out.append(kept)
                out.append(b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes, now: float) -> bytes | None:
        if not event.startswith(b"data:"):
            return event or None
        ex = self.ex
        payload = event[5:]
        if ex.first_token_s is None or (b'"usage"' in payload and b'"usage":null' not in payload):
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return event
            if not isinstance(obj, dict):
                return event
            return self._parsed(event, obj, now)
        self._tick(now)
        return event

    def _parsed(self, event: bytes, obj: dict[str, Any], now: float) -> bytes | None:
        ex = self.ex
        choices = obj.get("choices")
        if ex.first_token_s is None and _has_token(choices):
            ex.first_token(now)
        usage = obj.get("usage")
        if usage is not None:
            read_usage(usage, ex)
            if not self._keep_usage:
                if not choices:
                    return None
                obj["usage"] = None
                event = b"data: " + orjson.dumps(obj)
        if choices:
            self._tick(now)
        if "error" in obj:
            ex.reason = "upstream_error_event"
        return event

    def _tick(self, now: float) -> None:
        ex = self.ex
        if ex.first_token_s is not None and ex.last_chunk_s is not None:
            if ex.tbt_s is None:
                ex.tbt_s = []
            if len(ex.tbt_s) < 4096:
                ex.tbt_s.append(now - ex.last_chunk_s)
        if ex.first_token_s is not None:
            ex.last_chunk_s = now
            ex.chunks += 1


def _has_token(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False


async def _read_or_fail(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientError, OSError):
        raise ApiError(502, "engine connection broke", code="upstream_disconnect") from None
    except TimeoutError:
        raise ApiError(504, "engine did not answer in time", code="upstream_timeout") from None


async def _drain(resp: aiohttp.ClientResponse) -> None:
    try:
        await asyncio.wait_for(resp.read(), timeout=1.0)
    except (aiohttp.ClientError, OSError, TimeoutError):
        resp.close()
