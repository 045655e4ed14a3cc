"""Latency-outlier ejection end to end: a degraded (slowed, still answering) emulated engine
among healthy peers is ejected under load, and the traffic moves to its peers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from inferplane.config import parse_config
from inferplane.core.types import EndpointState
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.gateway.app import Gateway
from tests.gateway.fakes import running_gateway

MODEL = "llama-3-8b"
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Explain outlier detection briefly."}],
    "max_tokens": 32,
    "ignore_eos": True,
    "stream": True,
}


async def _call(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.post(url + "/v1/chat/completions", json=BODY) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Inferplane-Endpoint", "")


async def _load_until_ejected(
    gw: Gateway, url: str, session: aiohttp.ClientSession, slow: str, deadline_s: float
) -> list[tuple[int, str]]:
    """Eight closed-loop clients until ``slow`` is ejected (or the deadline passes)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    results: list[tuple[int, str]] = []

    async def client() -> None:
        while loop.time() < end and gw.tracker.state(slow) is not EndpointState.EJECTED:
            results.append(await _call(session, url))

    await asyncio.gather(*(client() for _ in range(8)))
    return results


@pytest.mark.slow
async def test_a_slowed_engine_is_ejected_under_load_and_traffic_moves() -> None:
    async with Fleet([EngineSpec(model=MODEL, count=4, time_scale=1.0)]) as fleet:
        reliability: dict[str, Any] = {
            "breaker": {"base_ejection_s": 120.0, "sweep_interval_s": 0.2}
        }
        cfg = parse_config({
            "gateway": {"auth": {"mode": "anonymous"}, "log_requests": False},
            "reliability": reliability,
            "endpoints": [e.endpoint_config() for e in fleet.engines],
        })  # fmt: skip
        slow = fleet.engines[0]
        async with running_gateway(cfg) as (gw, url), aiohttp.ClientSession() as session:
            for _ in range(2):  # every engine has a healthy history first
                await asyncio.gather(*(_call(session, url) for _ in range(8)))
            async with session.post(slow.url + "/admin/faults", json={"slowdown": 5.0}) as r:
                assert r.status == 200
            during = await _load_until_ejected(gw, url, session, slow.name, deadline_s=20.0)
            assert gw.tracker.state(slow.name) is EndpointState.EJECTED
            assert all(status == 200 for status, _ in during)  # nobody failed meanwhile
            rel = gw.proxy.reliability
            assert rel.counts["breaker_latency_outlier"] == 1
            assert rel.breaker_state(slow.name) == "open"
            after = await asyncio.gather(*(_call(session, url) for _ in range(24)))
            assert all(status == 200 for status, _ in after)
            served = {name for _, name in after}
            assert slow.name not in served and len(served) >= 2  # the peers share it
            peers = [e.name for e in fleet.engines if e is not slow]
            assert all(rel.breaker_state(name) == "closed" for name in peers)
            assert all(gw.tracker.state(name) is EndpointState.READY for name in peers)
