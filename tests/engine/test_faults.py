"""Fault injection: crash mid-stream, hang, error rate, slowdown, restart; admin API."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from inferplane.engine.faults import FaultConfig, FaultError, FaultInjector, merge_update
from inferplane.engine.fleet import EngineSpec
from inferplane.engine.types import EngineState
from tests.engine.engine_helpers import MODEL, running_fleet, sse_payloads, stream_text, wait_for

STREAM_BODY: dict[str, Any] = {
    "model": MODEL,
    "prompt": "tell a story",
    "max_tokens": 60,
    "ignore_eos": True,
    "stream": True,
}


def test_merge_update_validates_and_merges() -> None:
    base = FaultConfig(slowdown=2.0)
    merged, restart = merge_update(base, {"error_rate": 0.5, "error_status": 429})
    assert merged == FaultConfig(slowdown=2.0, error_rate=0.5, error_status=429) and not restart
    cleared, restart = merge_update(merged, {"clear": True, "restart": True})
    assert cleared == FaultConfig() and restart
    for bad in ({"slowdown": 0.5}, {"hang": 1}, {"error_status": 200}, {"what": 1}):
        with pytest.raises(FaultError):
            merge_update(base, bad)


def test_error_draws_follow_the_seeded_rate() -> None:
    injector = FaultInjector(FaultConfig(error_rate=0.3), seed=7)
    draws = [injector.draw_error_status() for _ in range(1000)]
    again = FaultInjector(FaultConfig(error_rate=0.3), seed=7)
    assert draws == [again.draw_error_status() for _ in range(1000)]
    failures = sum(d == 503 for d in draws)
    assert 220 <= failures <= 380 and set(draws) == {None, 503}


async def _read_until_cut(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> list[bytes]:
    """The lines of a stream that must break: the client sees a payload error."""
    chunks: list[bytes] = []
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for line in resp.content:
                chunks.append(line)
    return chunks


async def test_crash_cuts_streams_after_n_tokens_and_restarts_cold() -> None:
    spec = EngineSpec(time_scale=0.01, faults=FaultConfig(crash_after_tokens=5))
    with running_fleet(spec) as fleet:
        url, server = fleet.engines[0].url, fleet.engines[0].server
        async with aiohttp.ClientSession() as session:
            chunks = await _read_until_cut(session, url, STREAM_BODY)
            payloads, done = sse_payloads(b"".join(chunks))
            assert not done and len(payloads) == 5, chunks
            assert fleet.call(lambda: server.faults.config.crash_after_tokens) is None
            assert fleet.call(lambda: server.model.state) is not EngineState.READY
            async with session.get(url + "/health") as health:
                assert health.status == 503
            ready = await wait_for(lambda: server.model.state is EngineState.READY, 10.0)
            assert ready
            async with session.post(url + "/v1/completions", json=STREAM_BODY) as resp:
                payloads, done = sse_payloads(await resp.read())
        assert done and payloads[-1]["choices"][0]["finish_reason"] == "length"


async def test_crash_delivers_exactly_n_tokens_before_the_cut() -> None:
    spec = EngineSpec(time_scale=0.01, faults=FaultConfig(crash_after_tokens=7))
    with running_fleet(spec) as fleet:
        async with aiohttp.ClientSession() as session:
            body = {**STREAM_BODY, "prompt": "another story"}
            chunks = await _read_until_cut(session, fleet.engines[0].url, body)
        payloads, done = sse_payloads(b"".join(chunks))
        assert not done, chunks
        assert len([p for p in payloads if p["choices"][0]["text"]]) == 7


async def test_hang_stalls_tokens_until_cleared() -> None:
    with running_fleet(EngineSpec(time_scale=0.01)) as fleet:
        url, server = fleet.engines[0].url, fleet.engines[0].server
        async with aiohttp.ClientSession() as session:
            await session.post(url + "/admin/faults", json={"hang": True})
            resp = await session.post(url + "/v1/completions", json=STREAM_BODY)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.readline(), 0.3)
            assert fleet.call(lambda: server.driver.num_in_flight) == 1
            await session.post(url + "/admin/faults", json={"hang": False})
            payloads, done = sse_payloads(await resp.read())
            resp.close()
        assert done and len(stream_text(payloads).split()) >= 50


async def test_error_rate_answers_with_the_chosen_status() -> None:
    faults = FaultConfig(error_rate=1.0, error_status=429)
    with running_fleet(EngineSpec(time_scale=0.01, faults=faults)) as fleet:
        url = fleet.engines[0].url
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 429
                    assert (await resp.json())["error"]["code"] == "injected_fault"
            await session.post(url + "/admin/faults", json={"error_rate": 0})
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200


async def test_slowdown_stretches_the_model_steps() -> None:
    with running_fleet(EngineSpec(time_scale=0.01)) as fleet:
        url, server = fleet.engines[0].url, fleet.engines[0].server
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/admin/faults", json={"slowdown": 4}) as resp:
                assert (await resp.json())["slowdown"] == 4
            async with session.get(url + "/admin/faults") as resp:
                assert (await resp.json())["slowdown"] == 4
        assert fleet.call(lambda: server.model.slowdown) == 4.0


async def test_a_failing_engine_step_fails_requests_instead_of_hanging() -> None:
    with running_fleet(EngineSpec(time_scale=0.01)) as fleet:
        server = fleet.engines[0].server
        original = server.model.advance
        calls = [0]

        def broken(now: float, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 5:
                raise RuntimeError("injected model bug")
            return original(now, **kwargs)

        fleet.call(lambda: setattr(server.model, "advance", broken))
        async with aiohttp.ClientSession() as session:
            chunks = await _read_until_cut(session, fleet.engines[0].url, STREAM_BODY)
        payloads, done = sse_payloads(b"".join(chunks))
        assert not done and len(payloads) < 60
        assert fleet.call(lambda: server.driver.num_in_flight) == 0


async def test_crash_drops_non_streaming_requests_too() -> None:
    spec = EngineSpec(time_scale=0.01, faults=FaultConfig(crash_after_tokens=5))
    with running_fleet(spec) as fleet:
        body = {**STREAM_BODY, "stream": False}
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await session.post(fleet.engines[0].url + "/v1/completions", json=body)
