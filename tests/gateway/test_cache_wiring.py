"""The response cache in the live gateway: deterministic repeats are served from cache (JSON
and SSE, byte for byte), sampled calls bypass it, and hits show in /v1/stats and /metrics."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.gateway.fakes import fake_engines, fleet_config, running_gateway

MESSAGES = [{"role": "user", "content": "hi"}]


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.startswith(b"data:")]


async def test_gateway_serves_deterministic_repeats_from_cache() -> None:
    seen: list[tuple[str | None, bytes]] = []
    async with (
        fake_engines(1, num_tokens=6) as engines,
        running_gateway(fleet_config(engines)) as (_gw, url),
        aiohttp.ClientSession() as s,
    ):
        bodies: list[dict[str, Any]] = [
            {"model": "m", "temperature": 0, "messages": MESSAGES},
            {"model": "m", "temperature": 0, "stream": True, "messages": MESSAGES},
        ]
        for body in bodies:
            for _ in range(2):
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    seen.append((r.headers.get("X-Inferplane-Cache"), await r.read()))
        sampled = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        async with s.post(url + "/v1/chat/completions", json=sampled) as r:
            assert r.status == 200
            assert r.headers["X-Inferplane-Cache"] == "bypass"
        async with s.get(url + "/v1/stats") as r:
            stats = orjson.loads(await r.read())["cache"]
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    assert [h for h, _ in seen] == ["miss", "hit-exact", "miss", "hit-exact"]
    assert seen[1][1] == seen[0][1]
    assert _events(seen[3][1]) == _events(seen[2][1]) and len(_events(seen[2][1])) == 8
    assert engines[0].completed == 3  # two misses and the bypass reached the engine
    assert stats["hits_exact"] == 2 and stats["stores"] == 2
    assert 'inferplane_response_cache{kind="hits_exact"} 2.0' in text
