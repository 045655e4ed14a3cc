"""Tracing through a live gateway over loopback HTTP: the span tree of a normal, a refused, a
queued, a retried, a resumed, a streamed and a hedged call, and the ``traceparent`` each
engine received.

The engines are the fakes of ``fakes.py`` with a shared fault script (the first requests,
on whichever engine the router picks, misbehave as scripted), so the tests do not depend on
which endpoint ranks first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from inferplane.config import FleetConfig, hash_api_key
from inferplane.core.admission_config import AdmissionConfig, QuotaLimits, QuotasConfig
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.reliability_config import ReliabilityConfig
from inferplane.gateway.tracing import TracingConfig
from tests.gateway.fakes import FakeEngine, fleet_config, serving, until
from tests.gateway.test_admission_wiring import _one_slot

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HOPS_BEFORE_ROUTE = ["authenticate", "context", "cache", "admit"]
WAIT_S = 0.2  # how long a queued call is kept waiting


@dataclass
class TracedEngine(FakeEngine):
    """A fake engine that records the ``traceparent`` of each call and takes its mode from a
    script shared by all engines (one entry per call, then ``ok``); ``hold`` keeps calls
    waiting until it is set."""

    script: list[str] = field(default_factory=list)
    hold: asyncio.Event | None = None
    traceparents: list[str | None] = field(default_factory=list)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.traceparents.append(request.headers.get("traceparent"))
        self.mode = self.script.pop(0) if self.script else "ok"
        if self.hold is not None:
            await self.hold.wait()
        if self.mode == "stall":  # no first token until the gateway gives up on it
            await asyncio.sleep(30)
        return await super()._generate(request)


@contextlib.asynccontextmanager
async def _engines(n: int, script: Sequence[str] = ()) -> AsyncIterator[list[TracedEngine]]:
    shared = list(script)
    async with serving([TracedEngine(name=f"e{i}", script=shared) for i in range(n)]) as engines:
        yield engines


def _fleet(engines: Sequence[FakeEngine], **gateway: Any) -> FleetConfig:
    return fleet_config(list(engines), **gateway)


@contextlib.asynccontextmanager
async def _traced(config: FleetConfig) -> AsyncIterator[tuple[Gateway, str, InMemorySpanExporter]]:
    """A gateway with tracing on, its spans kept in memory, serving on loopback."""
    gateway = Gateway(config.model_copy(update={"tracing": TracingConfig(enabled=True)}))
    app = gateway.build_app()
    exporter = InMemorySpanExporter()
    gateway.tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield gateway, f"http://127.0.0.1:{port}", exporter
    finally:
        await runner.cleanup()


async def _post(url: str, body: Any = CHAT, **headers: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        return r.status, await r.read()


class Trace:
    """The spans of one call (one trace id), with the root and its children by name."""

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self.spans = sorted(spans, key=lambda s: s.start_time or 0)
        (self.root,) = [s for s in self.spans if s.name == "inferplane.call"]
        root_id = self.root.context.span_id
        # Every other span hangs directly off the call's root span.
        by_id = {s.context.span_id: s.name for s in self.spans}
        misplaced = [
            (s.name, by_id.get(s.parent.span_id) if s.parent is not None else None)
            for s in self.children
            if s.parent is None or s.parent.span_id != root_id
        ]
        assert not misplaced, f"(span, parent) not under inferplane.call: {misplaced}"

    @property
    def children(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s is not self.root]

    def names(self) -> list[str]:
        return [s.name for s in self.children]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.all(name)
        return span

    def all(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.children if s.name == name]

    def attrs(self, name: str) -> dict[str, AttributeValue]:
        return dict(self.one(name).attributes or {})


def _traces(exporter: InMemorySpanExporter) -> list[Trace]:
    """One ``Trace`` per call, in the order the calls started."""
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_trace.setdefault(span.context.trace_id, []).append(span)
    return sorted((Trace(s) for s in by_trace.values()), key=lambda t: t.root.start_time or 0)


def _traceparent_of(span: ReadableSpan) -> str:
    """The W3C header for ``span`` (flags as its context has them: sampled, maybe random)."""
    ctx = span.context
    assert ctx.trace_flags.sampled
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


async def test_normal_call_has_every_hop_and_sends_its_traceparent_to_the_engine() -> None:
    async with _engines(1) as engines, _traced(_fleet(engines)) as (_, url, exporter):
        status, _ = await _post(url, traceparent=TRACEPARENT, **{"X-Workflow-Id": "wf-1"})
    assert status == 200
    (call,) = _traces(exporter)
    assert call.names() == [*HOPS_BEFORE_ROUTE, "route", "upstream", "account"]
    root = call.root.attributes or {}
    assert f"{call.root.context.trace_id:032x}" == CLIENT_TRACE
    assert root["http.response.status_code"] == 200 and root["inferplane.endpoint"] == "e0"
    assert call.attrs("authenticate")["inferplane.tenant"] == "anonymous"
    context = call.attrs("context")
    assert context["inferplane.model"] == "m" and context["inferplane.priority"] == "standard"
    assert context["inferplane.workflow_id"] == "wf-1"  # the client's id, not the tenant-scoped
    assert call.attrs("admit")["inferplane.admit.decision"] == "admitted"
    upstream = call.one("upstream")
    assert upstream.kind is SpanKind.CLIENT and upstream.status.status_code is StatusCode.UNSET
    assert (upstream.attributes or {})["inferplane.endpoint"] == "e0"
    account = call.attrs("account")
    assert account["inferplane.attempts"] == 1 and account["inferplane.completion_tokens"] == 5
    assert float(account["inferplane.cost_usd"]) > 0  # type: ignore[arg-type]
    # The proxy sent the engine the upstream span's own context, in the client's trace.
    assert engines[0].traceparents == [_traceparent_of(upstream)]


async def test_refused_calls_end_at_the_hop_that_refused_them() -> None:
    auth = {"keys": [{"key_sha256": hash_api_key("sk-ci"), "tenant": "t", "name": "ci"}]}
    async with _engines(1) as engines:
        base = _fleet(engines, auth=auth)
        quotas = QuotasConfig(keys={"ci": QuotaLimits(requests_per_min=1)})
        config = base.model_copy(update={"admission": AdmissionConfig(quotas=quotas)})
        async with _traced(config) as (_, url, exporter):
            statuses = [
                (await _post(url, Authorization="Bearer sk-ci"))[0],
                (await _post(url, Authorization="Bearer sk-ci"))[0],  # over the quota
                (await _post(url, Authorization="Bearer sk-wrong"))[0],
            ]
    assert statuses == [200, 429, 401]
    ok, over_quota, bad_key = _traces(exporter)
    assert ok.attrs("authenticate")["inferplane.tenant"] == "t"
    assert over_quota.names() == HOPS_BEFORE_ROUTE  # no route, upstream or account
    assert over_quota.attrs("admit")["inferplane.admit.decision"] == "rejected"
    for span in (over_quota.root, over_quota.one("admit")):
        attrs = span.attributes or {}
        assert span.status.status_code is StatusCode.ERROR
        assert attrs["http.response.status_code"] == 429
        assert attrs["inferplane.reject.reason"] == "quota_requests_per_min"
    assert bad_key.names() == ["authenticate"]
    assert bad_key.one("authenticate").status.status_code is StatusCode.ERROR
    assert bad_key.attrs("authenticate")["inferplane.reject.reason"] == "invalid_api_key"
    assert (bad_key.root.attributes or {})["http.response.status_code"] == 401
    assert len(engines[0].traceparents) == 1  # only the admitted call reached the engine


async def test_a_call_that_waits_in_the_queue_has_a_queue_hop_after_its_admit_hop() -> None:
    async with _engines(1) as engines:
        engine = engines[0]
        engine.hold = asyncio.Event()
        async with _traced(_one_slot(_fleet(engines))) as (gw, url, exporter):
            first = asyncio.ensure_future(_post(url))
            await until(lambda: len(engine.traceparents) == 1)  # holds the only slot
            second = asyncio.ensure_future(_post(url))
            await until(lambda: bool(gw.gate.core.queue))
            await asyncio.sleep(WAIT_S)
            engine.hold.set()
            assert [(await first)[0], (await second)[0]] == [200, 200]
    served, queued = _traces(exporter)
    assert served.names() == [*HOPS_BEFORE_ROUTE, "route", "upstream", "account"]
    assert queued.names() == [*HOPS_BEFORE_ROUTE, "queue", "route", "upstream", "account"]
    queue = queued.attrs("queue")
    assert queue["inferplane.queue.exit"] == "dispatched"
    assert queue["inferplane.priority"] == "standard" and queue["inferplane.queue.reason"]
    waited = queue["inferplane.queued_s"]
    assert isinstance(waited, float) and waited >= WAIT_S
    # ``admit`` times the decision and ends as the wait begins; ``queue`` times the wait.
    admit, wait = queued.one("admit"), queued.one("queue")
    assert queued.attrs("admit")["inferplane.admit.decision"] == "queued"
    assert _seconds(admit) < WAIT_S / 2 and _seconds(wait) >= WAIT_S
    assert (admit.end_time or 0) <= (wait.start_time or 0)
    assert served.attrs("admit")["inferplane.admit.decision"] == "admitted"


async def test_retried_call_has_an_upstream_span_per_attempt_each_sent_to_its_engine() -> None:
    async with (
        _engines(2, script=["error500"]) as engines,
        _traced(_fleet(engines)) as (_, url, exporter),
    ):
        status, _ = await _post(url)
    assert status == 200
    (call,) = _traces(exporter)
    assert call.names() == [*HOPS_BEFORE_ROUTE, "route", "upstream", "upstream", "account"]
    failed, retry = call.all("upstream")
    failed_attrs, retry_attrs = failed.attributes or {}, retry.attributes or {}
    assert failed.status.status_code is StatusCode.ERROR
    assert failed_attrs["http.response.status_code"] == 502
    assert failed_attrs["inferplane.attempt"] == 1 and "inferplane.retry.reason" not in failed_attrs
    assert retry.status.status_code is StatusCode.UNSET
    assert retry_attrs["inferplane.attempt"] == 2
    assert retry_attrs["inferplane.retry.reason"] == "upstream_error"
    assert retry_attrs["inferplane.endpoint"] != failed_attrs["inferplane.endpoint"]
    assert (call.root.attributes or {})["inferplane.endpoint"] == retry_attrs["inferplane.endpoint"]
    assert call.attrs("account")["inferplane.attempts"] == 2
    # Each engine saw the traceparent of its own attempt.
    sent = {e.name: e.traceparents for e in engines}
    assert sent[str(failed_attrs["inferplane.endpoint"])] == [_traceparent_of(failed)]
    assert sent[str(retry_attrs["inferplane.endpoint"])] == [_traceparent_of(retry)]


async def test_resumed_stream_shows_the_break_the_resumption_and_the_continuation() -> None:
    body = {**CHAT, "stream": True}
    async with (
        _engines(2, script=["close_early"]) as engines,  # the first stream breaks after 2 tokens
        _traced(_fleet(engines)) as (_, url, exporter),
    ):
        status, raw = await _post(url, body)
    assert status == 200 and b'"error"' not in raw and raw.count(b"data: [DONE]") == 1
    (call,) = _traces(exporter)
    assert call.names() == [
        *HOPS_BEFORE_ROUTE, "route", "upstream", "stream", "resumption", "upstream", "account",
    ]  # fmt: skip
    stream = call.attrs("stream")
    assert stream["inferplane.segments"] == 2 and stream["inferplane.status"] == 200
    broken, continued = call.all("upstream")
    broken_at = str((broken.attributes or {})["inferplane.endpoint"])
    assert broken.status.status_code is StatusCode.ERROR
    resumption = call.attrs("resumption")
    assert resumption["inferplane.resume.tokens"] == 2
    assert resumption["inferplane.resume.from"] == broken_at
    cont = continued.attributes or {}
    assert cont["inferplane.retry.reason"] == "resume" and cont["inferplane.endpoint"] != broken_at
    assert call.attrs("account")["inferplane.resumptions"] == 1
    sent = {e.name: e.traceparents for e in engines}
    assert sent[broken_at] == [_traceparent_of(broken)]
    assert sent[str(cont["inferplane.endpoint"])] == [_traceparent_of(continued)]


async def test_streamed_call_has_a_stream_span_while_the_client_stream_is_open() -> None:
    async with _engines(1) as engines, _traced(_fleet(engines)) as (_, url, exporter):
        status, raw = await _post(url, {**CHAT, "stream": True})
    assert status == 200 and raw.count(b"data: [DONE]") == 1
    (call,) = _traces(exporter)
    assert call.names() == [*HOPS_BEFORE_ROUTE, "route", "upstream", "stream", "account"]
    stream, upstream = call.one("stream"), call.one("upstream")
    assert stream.status.status_code is StatusCode.UNSET
    attrs = call.attrs("stream")
    assert attrs["inferplane.completion_tokens"] == 5 and attrs["inferplane.segments"] == 1
    assert attrs["inferplane.status"] == 200 and int(attrs["inferplane.chunks"]) >= 5  # type: ignore[call-overload]
    ttft_s = attrs["inferplane.ttft_s"]
    assert isinstance(ttft_s, float) and 0 < ttft_s < _seconds(call.root)
    # It opens once the engine answered (inside the attempt) and closes with the relay.
    assert (upstream.start_time or 0) < (stream.start_time or 0)
    assert (stream.end_time or 0) <= (call.root.end_time or 0)
    (whole,) = _traces(await _one_call(CHAT))
    assert "stream" not in whole.names()  # a whole answer has no client stream


async def _one_call(body: Any) -> InMemorySpanExporter:
    async with _engines(1) as engines, _traced(_fleet(engines)) as (_, url, exporter):
        assert (await _post(url, body))[0] == 200
    return exporter


HEDGE_S = 0.2  # a short fixed hedge delay (no engine profile to predict from)
HEDGE = {"enabled": True, "min_delay_s": HEDGE_S, "default_delay_s": HEDGE_S, "p95_over_mean": 1e-9}


async def test_hedged_call_has_an_upstream_span_per_racer_naming_hedge_and_winner() -> None:
    async with _engines(2, script=["stall"]) as engines:  # the first attempt never answers
        hedged = {"reliability": ReliabilityConfig.model_validate({"hedge": HEDGE})}
        async with _traced(_fleet(engines).model_copy(update=hedged)) as (_, url, exporter):
            status, raw = await _post(url, {**CHAT, "stream": True}, **{"X-Priority": "critical"})
    assert status == 200 and raw.count(b"data: [DONE]") == 1
    (call,) = _traces(exporter)
    racers = ["upstream", "upstream"]  # the first attempt, then its hedge
    assert call.names() == [*HOPS_BEFORE_ROUTE, "route", *racers, "stream", "account"]
    primary, hedge = call.all("upstream")
    p, h = primary.attributes or {}, hedge.attributes or {}
    assert primary.kind is SpanKind.CLIENT and hedge.kind is SpanKind.CLIENT
    assert (p["inferplane.hedge.role"], p["inferplane.hedge.outcome"]) == ("primary", "lost")
    assert (h["inferplane.hedge.role"], h["inferplane.hedge.outcome"]) == ("hedge", "won")
    assert (p["inferplane.attempt"], h["inferplane.attempt"]) == (1, 2)
    winner = h["inferplane.endpoint"]
    assert p["inferplane.hedge.winner"] == p["inferplane.hedge.endpoint"] == winner
    assert p["inferplane.endpoint"] != h["inferplane.endpoint"]
    assert float(h["inferplane.hedge.after_s"]) >= HEDGE_S  # type: ignore[arg-type]
    assert "inferplane.retry.reason" not in h  # a hedge races; it is not a retry
    assert primary.status.status_code is StatusCode.UNSET  # lost, not failed
    assert hedge.status.status_code is StatusCode.UNSET
    # The loser's span ends when it lost; the winner's once it has relayed the answer.
    assert (primary.end_time or 0) <= (call.one("stream").start_time or 0)
    assert (hedge.end_time or 0) >= (call.one("account").end_time or 0)
    assert (call.root.attributes or {})["inferplane.endpoint"] == h["inferplane.endpoint"]
    assert call.attrs("account")["inferplane.attempts"] == 2
    # Each engine worked under its own racer's span.
    sent = {e.name: e.traceparents for e in engines}
    assert sent[str(p["inferplane.endpoint"])] == [_traceparent_of(primary)]
    assert sent[str(h["inferplane.endpoint"])] == [_traceparent_of(hedge)]


def _seconds(span: ReadableSpan) -> float:
    return ((span.end_time or 0) - (span.start_time or 0)) / 1e9
