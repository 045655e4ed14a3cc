"""The gateway end to end against fake engines: proxying, streaming, usage, retries, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from inferplane.config import hash_api_key
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway, until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


async def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as s:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with s.post(url, data=data, headers=headers or {}) as r:
            raw = await r.read()
            return r.status, r.headers, raw


def _sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


async def test_non_stream_chat_is_forwarded_with_headers() -> None:
    async with fake_engines(2) as engines, running_gateway(fleet_config(engines)) as (_, url):
        status, headers, raw = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 200
        body = orjson.loads(raw)
        assert body["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 "
        assert headers["X-Inferplane-Endpoint"] in {"e0", "e1"}
        assert float(headers["X-Inferplane-Cost-Usd"]) >= 0.0
        assert len(headers["X-Request-Id"]) >= 8
        # The request reached exactly one engine, unchanged (no stream: no usage injection).
        seen = [b for e in engines for b in e.bodies]
        assert seen == [CHAT]


async def test_stream_usage_is_stripped_unless_asked() -> None:
    async with fake_engines(1) as engines, running_gateway(fleet_config(engines)) as (_, url):
        status, _, raw = await _post(url + "/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200
        # Upstream was asked for usage ...
        assert engines[0].bodies[-1]["stream_options"] == {"include_usage": True}
        events = _sse_events(raw)
        assert events[-1] == b"data: [DONE]"
        data = [orjson.loads(e[6:]) for e in events if e.startswith(b"data: {")]
        # ... but the client, who did not ask, gets no usage chunk.
        assert all(d.get("usage") is None for d in data)
        assert "".join(d["choices"][0]["delta"].get("content", "") for d in data) == (
            "t0 t1 t2 t3 t4 "
        )
        assert any(e.startswith(b": inferplane cost_usd=") for e in events)

        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        _, _, raw = await _post(url + "/v1/chat/completions", body)
        usage = [orjson.loads(e[6:])["usage"] for e in _sse_events(raw) if b'"usage"' in e]
        assert usage and usage[-1]["completion_tokens"] == 5


async def test_retry_to_next_endpoint_on_5xx_before_first_byte() -> None:
    async with fake_engines(2) as engines, running_gateway(fleet_config(engines)) as (gw, url):
        engines[0].mode = "error500"
        engines[1].waiting = 5  # e0 looks least loaded, so it is always tried first
        await until(lambda: gw.tracker.views(gw.clock())[1].load.num_waiting == 5)
        for _ in range(4):
            status, headers, _ = await _post(url + "/v1/chat/completions", CHAT)
            assert status == 200
            assert headers["X-Inferplane-Endpoint"] == "e1"
        assert engines[1].completed == 4
        assert len(engines[0].bodies) == 4  # each call failed over from e0 to e1
        assert 'inferplane_retries_total{reason="upstream_error"} 4.0' in (
            gw.recorder.metrics.render().decode()
        )
        # Both broken: a clean 502 in OpenAI's shape, not a 500.
        engines[1].mode = "error500"
        status, _, raw = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 502
        assert orjson.loads(raw)["error"]["code"] == "upstream_error"


async def test_engine_503_fails_over_and_takes_the_endpoint_out_at_once() -> None:
    # A restarted engine answers 503 (not ready) with an empty queue: routing would rank it
    # first until health checks noticed; the first 503 takes it out instead.
    async with fake_engines(2) as engines, running_gateway(fleet_config(engines)) as (gw, url):
        engines[0].mode = "unavailable"
        engines[1].waiting = 5  # e0 looks least loaded, so it is tried first
        await until(lambda: gw.tracker.views(gw.clock())[1].load.num_waiting == 5)
        status, headers, _ = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 200 and headers["X-Inferplane-Endpoint"] == "e1"
        assert gw.tracker.state("e0").value == "cold"  # at once, not after health checks
        for _ in range(3):
            status, headers, _ = await _post(url + "/v1/chat/completions", CHAT)
            assert status == 200 and headers["X-Inferplane-Endpoint"] == "e1"
        assert len(engines[0].bodies) == 1  # no call went to it again
        # A 500 is a failure of that call, not unavailability: the endpoint stays in.
        engines[1].mode = "error500"
        status, _, _ = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 502
        assert gw.tracker.state("e1").value != "cold"


async def test_connect_error_retries_and_marks_endpoint_cold() -> None:
    async with fake_engines(2) as engines, running_gateway(fleet_config(engines)) as (gw, url):
        assert engines[0].runner is not None
        await engines[0].runner.cleanup()
        engines[0].runner = None
        for _ in range(10):
            status, headers, _ = await _post(url + "/v1/chat/completions", CHAT)
            assert status == 200
            assert headers["X-Inferplane-Endpoint"] == "e1"
        # Either a refused connection or the health checks took it out.
        for _ in range(50):
            if gw.tracker.state("e0").value == "cold":
                break
            await asyncio.sleep(0.02)
        assert gw.tracker.state("e0").value == "cold"
        assert engines[1].completed == 10


async def test_upstream_garbage_and_early_close_are_clean_errors() -> None:
    async with fake_engines(1) as engines, running_gateway(fleet_config(engines)) as (_, url):
        engines[0].mode = "garbage"
        status, _, raw = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 502
        assert orjson.loads(raw)["error"]["code"] == "upstream_garbage"
        engines[0].mode = "close_early"
        status, _, raw = await _post(url + "/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200  # the stream had begun; the error arrives as an SSE event
        last = _sse_events(raw)[-1]
        assert b'"error"' in last and b"upstream_closed_early" in last
        # The gateway is fine afterwards.
        engines[0].mode = "ok"
        status, _, _ = await _post(url + "/v1/chat/completions", CHAT)
        assert status == 200


async def test_bad_requests_get_openai_errors() -> None:
    async with fake_engines(1) as engines:
        cfg = fleet_config(engines, max_body_bytes=2048)
        async with running_gateway(cfg) as (_, url):
            cases: list[tuple[Any, int, str | None]] = [
                (b"{not json", 400, None),
                (b"[1,2]", 400, None),
                ({"model": 3, "messages": []}, 400, "model"),
                ({**CHAT, "stream": "yes"}, 400, "stream"),
                ({**CHAT, "max_tokens": "many"}, 400, "max_tokens"),
                ({"model": "m", "messages": "hi"}, 400, "messages"),
                ({**CHAT, "model": "nope"}, 404, "model"),
                (b"x" * 5000, 413, None),
            ]
            for body, want_status, param in cases:
                status, _, raw = await _post(url + "/v1/chat/completions", body)
                assert status == want_status, (body, raw)
                err = orjson.loads(raw)["error"]
                assert set(err) == {"message", "type", "param", "code"}
                if param is not None:
                    assert err["param"] == param
            status, _, raw = await _post(url + "/v1/completions", {"model": "m", "prompt": {}})
            assert status == 400 and orjson.loads(raw)["error"]["param"] == "prompt"
            async with aiohttp.ClientSession() as s, s.get(url + "/v1/chat/completions") as r:
                assert r.status == 405
                assert "error" in orjson.loads(await r.read())
            assert engines[0].bodies == []  # nothing bad reached the engine


async def test_api_keys_and_context_headers() -> None:
    async with fake_engines(1) as engines:
        auth = {
            "mode": "api_keys",
            "keys": [{"key_sha256": hash_api_key("sk-good"), "tenant": "acme"}],
        }
        async with running_gateway(fleet_config(engines, auth=auth)) as (gw, url):
            endpoint = url + "/v1/chat/completions"
            status, _, raw = await _post(endpoint, CHAT)
            assert status == 401 and orjson.loads(raw)["error"]["code"] == "no_api_key"
            status, _, raw = await _post(endpoint, CHAT, {"Authorization": "Bearer sk-bad"})
            assert status == 401 and orjson.loads(raw)["error"]["code"] == "invalid_api_key"
            good = {"Authorization": "Bearer sk-good"}
            status, _, raw = await _post(endpoint, CHAT, {**good, "X-Priority": "urgent"})
            assert status == 400 and orjson.loads(raw)["error"]["param"] == "X-Priority"
            status, _, raw = await _post(endpoint, CHAT, {**good, "X-Deadline-Ms": "-5"})
            assert status == 400 and orjson.loads(raw)["error"]["param"] == "X-Deadline-Ms"
            hdrs = {**good, "X-Session-Id": "wf-1", "X-Workflow-Step": "1", "X-Workflow-Steps": "1"}
            status, _, _ = await _post(endpoint, CHAT, hdrs)
            assert status == 200
            snap = gw.recorder.snapshot(gw.clock())
            assert snap.tasks["success"] == 1  # the workflow's last step succeeded
            assert [t.key for t in snap.tenants] == ["acme"]


async def test_workflow_end_and_stats() -> None:
    async with fake_engines(1) as engines, running_gateway(fleet_config(engines)) as (_, url):
        await _post(url + "/v1/chat/completions", CHAT, {"X-Workflow-Id": "job-7"})
        status, _, raw = await _post(url + "/v1/workflows/job-7/end", {"outcome": "failure"})
        assert status == 200 and orjson.loads(raw)["closed"] is True
        status, _, _ = await _post(url + "/v1/workflows/job-7/end", {"outcome": "failure"})
        assert status == 404
        status, _, _ = await _post(url + "/v1/workflows/x/end", {"outcome": "maybe"})
        assert status == 400
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/stats") as r:
                stats = orjson.loads(await r.read())
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
            async with s.get(url + "/v1/models") as r:
                models = orjson.loads(await r.read())
            async with s.get(url + "/ready") as r:
                assert r.status == 200
        assert stats["accounting"]["tasks"]["failure"] == 1
        assert stats["endpoints"][0]["state"] == "ready"
        assert 'inferplane_endpoint_state{endpoint="e0",state="ready"} 1.0' in metrics
        assert "inferplane_ttft_seconds_bucket" in metrics
        assert [m["id"] for m in models["data"]] == ["m"]


async def test_scrape_reads_engine_load() -> None:
    async with (
        fake_engines(1, waiting=3) as engines,
        running_gateway(fleet_config(engines)) as (gw, _),
    ):
        for _ in range(40):
            view = gw.tracker.views(gw.clock())[0]
            if view.load.num_waiting == 3:
                break
            await asyncio.sleep(0.025)
        assert view.load.num_waiting == 3
        assert view.load.kv_usage == 0.25


async def test_accounting_adds_up() -> None:
    """Sum of per-request costs (as clients saw them) + idle + warming == fleet spend."""
    async with (
        fake_engines(3, token_delay_s=0.002) as engines,
        running_gateway(fleet_config(engines)) as (gw, url),
    ):
        endpoint = url + "/v1/chat/completions"
        costs: list[float] = []

        async def one(i: int) -> None:
            if i % 2:
                _, headers, _ = await _post(endpoint, CHAT)
                costs.append(float(headers["X-Inferplane-Cost-Usd"]))
                return
            _, _, raw = await _post(endpoint, {**CHAT, "stream": True})
            comment = [e for e in _sse_events(raw) if e.startswith(b": inferplane cost_usd=")]
            costs.append(float(comment[0].split(b"=")[1]))

        for _ in range(3):
            await asyncio.gather(*(one(i) for i in range(12)))
            await asyncio.sleep(0.03)
        snap = gw.recorder.snapshot(gw.clock())
        assert snap.num_in_flight == 0 and snap.num_requests == 36
        assert all(c > 0 for c in costs)
        total = sum(costs) + snap.idle_usd + snap.warming_usd
        assert abs(total - snap.fleet_spend_usd) <= 1e-9 * max(1.0, snap.fleet_spend_usd) + 1e-12
        assert snap.busy_usd > 0 and snap.idle_usd > 0
