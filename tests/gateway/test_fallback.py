"""Moving the work between a route's models: when the primary misses the latency budget the
fallback serves, if the route and the request (``X-Allow-Fallback``) allow it; the response
headers, ``/metrics`` and the accounting say so."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from inferplane.config import FleetConfig, parse_config
from inferplane.gateway.app import Gateway
from tests.gateway.fakes import FakeEngine, fake_engines, running_gateway, until

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello there " * 50}]}
BUDGET = {"X-TTFT-Budget-Ms": "500"}


def _config(engines: list[FakeEngine], allow_fallback: bool = True) -> FleetConfig:
    return parse_config(
        {
            "gateway": {"scrape_interval_s": 0.05, "health_interval_s": 0.2},
            "endpoints": [
                {"name": "e0", "url": engines[0].url, "gpu": "h100",
                 "price_per_hour_usd": 3.6, "models": ["big"]},
                {"name": "e1", "url": engines[1].url, "gpu": "a100",
                 "price_per_hour_usd": 1.8, "models": ["small"]},
            ],
            "routes": [
                {"name": "chat", "targets": ["big", "small"], "allow_fallback": allow_fallback}
            ],
        }
    )  # fmt: skip


async def _post(url: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", data=orjson.dumps(CHAT), headers=headers) as r,
    ):
        return r.status, r.headers, await r.read()


async def _overload_primary(gw: Gateway, engines: list[FakeEngine]) -> None:
    """``big``'s only engine reports a long queue: its predicted TTFT misses the budget."""
    engines[0].waiting = 400
    await until(lambda: gw.tracker.view("e0", gw.clock()).load.num_waiting == 400)


async def test_primary_serves_when_it_meets_the_budget() -> None:
    async with fake_engines(2) as engines, running_gateway(_config(engines)) as (gw, url):
        status, headers, _ = await _post(url, BUDGET)
        assert status == 200
        assert headers["X-Inferplane-Endpoint"] == "e0"
        assert headers["X-Inferplane-Model"] == "big"
        assert "X-Inferplane-Fallback" not in headers
        assert gw.recorder.snapshot(gw.clock()).num_fallbacks == 0


async def test_fallback_serves_when_primary_misses_budget() -> None:
    async with fake_engines(2) as engines, running_gateway(_config(engines)) as (gw, url):
        await _overload_primary(gw, engines)
        status, headers, _ = await _post(url, BUDGET)
        assert status == 200
        assert headers["X-Inferplane-Endpoint"] == "e1"
        assert headers["X-Inferplane-Model"] == "small"
        assert headers["X-Inferplane-Fallback"] == "big"
        # The engine was asked for the fallback model by name.
        assert engines[1].bodies[-1]["model"] == "small"
        snap = gw.recorder.snapshot(gw.clock())
        assert snap.num_fallbacks == 1
        small = next(m for m in snap.models if m.key == "small")
        assert (small.requests, small.fallbacks) == (1, 1)
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            text = await r.text()
        assert 'inferplane_fallbacks_total{model="small",route="chat"} 1.0' in text
        # A stream says the same in its headers.
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({**CHAT, "stream": True})
            async with s.post(url + "/v1/chat/completions", data=body, headers=BUDGET) as r:
                assert r.status == 200
                assert r.headers["X-Inferplane-Fallback"] == "big"
                assert (await r.read()).endswith(b"data: [DONE]\n\n")


async def test_request_can_refuse_fallback() -> None:
    async with fake_engines(2) as engines, running_gateway(_config(engines)) as (gw, url):
        await _overload_primary(gw, engines)
        # Without fallback the primary alone must meet the budget: it cannot, so the call is
        # refused at once (429 with a reason), and the fallback's engine never sees it.
        status, headers, _ = await _post(url, {**BUDGET, "X-Allow-Fallback": "false"})
        assert status == 429
        assert headers["X-Inferplane-Reason"]
        assert "Retry-After" in headers
        assert engines[1].bodies == []
        # Once the primary's queue is gone it serves the call itself.
        engines[0].waiting = 0
        await until(lambda: gw.tracker.view("e0", gw.clock()).load.num_waiting == 0)
        status, headers, _ = await _post(url, {**BUDGET, "X-Allow-Fallback": "no"})
        assert status == 200
        assert headers["X-Inferplane-Model"] == "big"
        assert "X-Inferplane-Fallback" not in headers
        assert engines[1].bodies == []


async def test_route_without_fallback_ignores_the_request_header() -> None:
    config = _config
    async with fake_engines(2) as engines, running_gateway(config(engines, False)) as (gw, url):
        await _overload_primary(gw, engines)
        status, headers, _ = await _post(url, {**BUDGET, "X-Allow-Fallback": "true"})
        assert status == 429
        assert headers["X-Inferplane-Reason"]
        assert engines[1].bodies == []


async def test_bad_allow_fallback_header_is_a_400() -> None:
    async with fake_engines(2) as engines, running_gateway(_config(engines)) as (_, url):
        status, _, raw = await _post(url, {"X-Allow-Fallback": "maybe"})
        assert status == 400
        error = orjson.loads(raw)["error"]
        assert error["param"] == "X-Allow-Fallback"
        assert engines[0].bodies == engines[1].bodies == []
