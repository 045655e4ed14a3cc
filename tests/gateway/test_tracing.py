"""Tracing helpers: span-tree shape and attributes of a normal, rejected, retried and resumed
call, W3C traceparent in (client) and out (to a real engine over loopback HTTP), sampling."""

from __future__ import annotations

import time
from collections.abc import Sequence

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from inferplane.core.types import AxisScore, RankedEndpoint, RouteDecision
from inferplane.gateway.tracing import GatewayTracer, TracingConfig

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"

DECISION = RouteDecision(
    ranked=(
        RankedEndpoint("e0", 0.9, (AxisScore("prefix", 1.0), AxisScore("queue", 0.8)), 0.05),
        RankedEndpoint("e1", 0.4, (AxisScore("prefix", 0.0), AxisScore("queue", 0.8)), 0.2),
    ),
    reason="best prefix match",
)


def _tree(spans: Sequence[ReadableSpan]) -> dict[str, list[str]]:
    """Parent span name -> child span names, in start order."""
    by_id = {s.context.span_id: s for s in spans}
    out: dict[str, list[str]] = {}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        out.setdefault(parent.name if parent else "<root>", []).append(s.name)
    return out


def _named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_normal_call_has_a_span_per_hop_under_the_client_trace() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    with tracer.call({"Traceparent": TRACEPARENT}, "req-1", "/v1/chat/completions") as call:
        with tracer.hop("authenticate", tenant="acme"):
            pass
        with tracer.hop("context", model="m", priority="standard"):
            pass
        with tracer.hop("cache", hit=False):
            pass
        with tracer.hop("admit", decision="admit"):
            pass
        tracer.route(DECISION, target="m")
        with tracer.attempt("e0", 1) as headers:
            assert headers["traceparent"].split("-")[1] == CLIENT_TRACE
        with tracer.hop("account", cost_usd=0.001, completion_tokens=12):
            pass
        call.finish(200)
    spans = exporter.get_finished_spans()
    assert _tree(spans) == {
        "<root>": ["inferplane.call"],
        "inferplane.call": [
            "authenticate", "context", "cache", "admit", "route", "upstream", "account",
        ],
    }  # fmt: skip
    (root,) = _named(spans, "inferplane.call")
    # The client's trace continues: same trace id, its span is our parent.
    assert f"{root.context.trace_id:032x}" == CLIENT_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CLIENT_PARENT
    assert root.kind is SpanKind.SERVER and root.status.status_code is StatusCode.UNSET
    assert root.attributes is not None and root.attributes["inferplane.request_id"] == "req-1"
    (route,) = _named(spans, "route")
    attrs = route.attributes or {}
    assert attrs["inferplane.route.ranked"] == ("e0", "e1")
    assert attrs["inferplane.score.e0.prefix"] == 1.0
    assert attrs["inferplane.score.e1.prefix"] == 0.0
    assert attrs["inferplane.predicted_ttft_s.e1"] == 0.2
    (account,) = _named(spans, "account")
    assert (account.attributes or {})["inferplane.cost_usd"] == 0.001
    (upstream,) = _named(spans, "upstream")
    assert upstream.kind is SpanKind.CLIENT
    assert (upstream.attributes or {})["inferplane.endpoint"] == "e0"


def test_rejected_call_ends_at_admission_with_the_reason() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    with tracer.call({}, "req-2", "/v1/chat/completions") as call:
        with tracer.hop("authenticate"):
            pass
        with tracer.hop("context"):
            pass
        with tracer.hop("admit") as admit:
            admit.set_attribute("inferplane.decision", "reject")
            tracer.fail_current("predicted_deadline_miss", 429)
        call.reject(429, "predicted_deadline_miss")
    spans = exporter.get_finished_spans()
    assert _tree(spans)["inferplane.call"] == ["authenticate", "context", "admit"]
    assert not _named(spans, "upstream") and not _named(spans, "route")
    (root,) = _named(spans, "inferplane.call")
    assert root.parent is None  # no client trace: a new one
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["inferplane.reject.reason"] == "predicted_deadline_miss"
    (admit_span,) = _named(spans, "admit")
    assert admit_span.status.status_code is StatusCode.ERROR
    assert (admit_span.attributes or {})["http.response.status_code"] == 429


def test_retried_call_has_one_upstream_span_per_attempt() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    with tracer.call({}, "req-3", "/v1/completions") as call:
        tracer.route(DECISION)
        with pytest.raises(ConnectionError), tracer.attempt("e0", 1):
            raise ConnectionError("refused")
        with tracer.attempt("e1", 2, retry_reason="connect_error") as headers:
            second = headers["traceparent"]
        call.finish(200)
    spans = exporter.get_finished_spans()
    assert _tree(spans)["inferplane.call"] == ["route", "upstream", "upstream"]
    first, retry = sorted(_named(spans, "upstream"), key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["inferplane.endpoint"] == "e0"
    assert retry.status.status_code is StatusCode.UNSET
    assert (retry.attributes or {})["inferplane.retry.reason"] == "connect_error"
    assert (retry.attributes or {})["inferplane.attempt"] == 2
    # Each attempt propagates its own span id to its engine.
    assert second.split("-")[2] == f"{retry.context.span_id:016x}"


def test_resumed_call_shows_the_break_and_the_continuation() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    with tracer.call({}, "req-4", "/v1/chat/completions") as call:
        with tracer.attempt("e0", 1):
            tracer.fail_current("stream_broken")
        tracer.resumption("e0", 37, "stream_broken")
        with tracer.attempt("e1", 2, retry_reason="resume"):
            pass
        call.finish(200)
    spans = exporter.get_finished_spans()
    assert _tree(spans)["inferplane.call"] == ["upstream", "resumption", "upstream"]
    (resume,) = _named(spans, "resumption")
    assert (resume.attributes or {})["inferplane.resume.tokens"] == 37
    assert (resume.attributes or {})["inferplane.resume.from"] == "e0"
    broken = min(_named(spans, "upstream"), key=lambda s: s.start_time or 0)
    assert broken.status.status_code is StatusCode.ERROR


def test_admit_ends_where_the_queue_wait_begins() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    with tracer.call({}, "req-5", "/v1/chat/completions"):
        with tracer.hop("admit"), tracer.hop("queue"):  # the gate queues inside ``admit``
            time.sleep(0.05)
        with tracer.hop("admit"):
            pass
    spans = exporter.get_finished_spans()
    assert _tree(spans)["inferplane.call"] == ["admit", "queue", "admit"]  # all siblings
    queued, admitted = sorted(_named(spans, "admit"), key=lambda s: s.start_time or 0)
    (queue,) = _named(spans, "queue")
    assert (queued.attributes or {})["inferplane.admit.decision"] == "queued"
    assert (admitted.attributes or {})["inferplane.admit.decision"] == "admitted"
    assert (queued.end_time or 0) <= (queue.start_time or 0)
    assert (queue.end_time or 0) - (queue.start_time or 0) >= 50_000_000


def test_a_race_has_a_span_per_racer_and_failures_go_to_the_racer_that_leads() -> None:
    tracer, exporter = GatewayTracer.in_memory()
    call = tracer.call({}, "req-6", "/v1/chat/completions")
    with call, pytest.raises(ConnectionError), tracer.attempt("e0", 1) as first_headers:
        race = tracer.race()
        assert race is not None
        span, headers = tracer.hedge(race, "e1", 2, 0.3)
        race.out(race.spans[0], "failed", "reset")  # the first drops out of the race
        race.lead(span, "e1", won=False)  # the hedge is the attempt now ...
        tracer.fail_current("upstream_error", 502)  # ... and fails last
        raise ConnectionError
    spans = exporter.get_finished_spans()
    assert _tree(spans)["inferplane.call"] == ["upstream", "upstream"]
    first, hedge = sorted(_named(spans, "upstream"), key=lambda s: s.start_time or 0)
    f, h = first.attributes or {}, hedge.attributes or {}
    assert (f["inferplane.hedge.role"], f["inferplane.hedge.outcome"]) == ("primary", "failed")
    assert first.status.status_code is StatusCode.ERROR and first.status.description == "reset"
    assert (h["inferplane.hedge.role"], h["inferplane.attempt"]) == ("hedge", 2)
    assert hedge.status.description == "upstream_error" and h["http.response.status_code"] == 502
    assert "inferplane.hedge.outcome" not in h and "inferplane.hedge.winner" not in f
    assert first_headers["traceparent"].split("-")[2] == f"{first.context.span_id:016x}"
    assert headers["traceparent"].split("-")[2] == f"{hedge.context.span_id:016x}"
    assert tracer.race() is None  # outside the attempt


async def test_traceparent_reaches_the_engine_over_http() -> None:
    seen: list[str | None] = []

    async def engine(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tracer, exporter = GatewayTracer.in_memory()
    try:
        with tracer.call({"traceparent": TRACEPARENT}, "r", "/x"), tracer.attempt("e0", 1) as h:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=h) as r,
            ):
                assert r.status == 200
    finally:
        await runner.cleanup()
    (upstream,) = _named(exporter.get_finished_spans(), "upstream")
    assert seen == [f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01"]


def test_disabled_tracing_records_nothing_and_sends_no_header() -> None:
    tracer = GatewayTracer(TracingConfig())
    with tracer.call({"traceparent": TRACEPARENT}, "r", "/x") as call:
        with tracer.hop("admit"):
            pass
        tracer.route(DECISION)
        with tracer.attempt("e0", 1) as headers:
            assert headers == {}
        call.finish(200)
    with pytest.raises(ValueError), tracer.hop("no-such-hop"):
        pass


def test_sampling_ratio_zero_drops_new_traces_but_follows_a_sampled_parent() -> None:
    tracer, exporter = GatewayTracer.in_memory(sample_ratio=0.0)
    with tracer.call({}, "r", "/x"), tracer.hop("admit"):
        pass
    assert exporter.get_finished_spans() == ()
    with tracer.call({"traceparent": TRACEPARENT}, "r", "/x"), tracer.hop("admit"):
        pass
    assert {s.name for s in exporter.get_finished_spans()} == {"inferplane.call", "admit"}


async def test_middleware_traces_gateway_calls_and_rejections() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferplane.gateway.app import Gateway, start_server
    from tests.gateway.fakes import fake_engines, fleet_config

    async with fake_engines(1) as engines:
        config = fleet_config(engines).model_copy(update={"tracing": TracingConfig(enabled=True)})
        gateway = Gateway(config)
        app = gateway.build_app()
        tracer = gateway.tracer
        exporter = InMemorySpanExporter()
        tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
        runner, port = await start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    url + "/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
                ) as r:
                    assert r.status == 200
                async with s.post(url + "/v1/chat/completions", json={**body, "model": "x"}) as r:
                    assert r.status == 404
                async with s.get(url + "/health") as r:
                    assert r.status == 200
        finally:
            await runner.cleanup()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "inferplane.call"]
    ok, rejected = sorted(roots, key=lambda s: s.start_time or 0)
    hops = {s.name for s in spans if s.context.trace_id == ok.context.trace_id} - {ok.name}
    assert {"authenticate", "context", "cache", "admit", "route", "account"} <= hops
    assert f"{ok.context.trace_id:032x}" == CLIENT_TRACE
    assert (ok.attributes or {})["http.response.status_code"] == 200
    assert (ok.attributes or {})["inferplane.endpoint"] == engines[0].name
    assert ok.status.status_code is StatusCode.UNSET
    assert rejected.parent is None and rejected.status.status_code is StatusCode.ERROR
    assert (rejected.attributes or {})["inferplane.reject.reason"] == "model_not_found"
