"""Hedging in the live gateway, on emulated engines: a stalled first attempt is raced.

A critical call whose engine produces no first token by the predicted p95 TTFT gets a
second attempt on another engine; the first token wins, the loser is aborted at its engine,
and the client sees one clean answer. Calls that are fast, of a class that is not hedged,
or that find the retry budget spent are never hedged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from inferplane.config import parse_config
from inferplane.engine.fleet import EngineHandle, EngineSpec, Fleet
from inferplane.engine.types import FinishReason
from inferplane.gateway.app import Gateway
from tests.gateway.fakes import chat_body, running_gateway

MODEL = "llama-3-8b"
CHAT = "/v1/chat/completions"
CRITICAL = {"X-Priority": "critical"}
# A fast fleet and a short, fixed hedge delay: the timing is not what is under test.
HEDGE = {"enabled": True, "min_delay_s": 0.3, "default_delay_s": 0.3, "p95_over_mean": 1e-9}
WAIT_S = 0.9  # three hedge delays


def _body(stream: bool, max_tokens: int = 12, prompt: str = "Hedge me, please.") -> Any:
    return chat_body(MODEL, max_tokens, stream, prompt)


@asynccontextmanager
async def _setup(
    reliability: dict[str, Any] | None = None, count: int = 2
) -> AsyncIterator[tuple[Fleet, Gateway, str, aiohttp.ClientSession]]:
    rel = {"hedge": HEDGE, **(reliability or {})}
    async with Fleet([EngineSpec(model=MODEL, count=count, time_scale=0.05)]) as fleet:
        gw_cfg = {"auth": {"mode": "anonymous"}, "log_requests": False}
        cfg = parse_config(
            {
                "gateway": gw_cfg,
                "reliability": rel,
                "endpoints": [e.endpoint_config() for e in fleet.engines],
            }
        )
        async with running_gateway(cfg) as (gw, url), aiohttp.ClientSession() as session:
            yield fleet, gw, url, session


async def _call(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, str, bytes]:
    async with session.post(url + CHAT, json=body, headers=headers or {}) as resp:
        return resp.status, resp.headers.get("X-Inferplane-Endpoint", ""), await resp.read()


async def _arm(session: aiohttp.ClientSession, engine: EngineHandle, faults: Any) -> None:
    async with session.post(engine.url + "/admin/faults", json=faults) as resp:
        assert resp.status == 200, await resp.text()


def _stream_text(raw: bytes) -> tuple[str, int, int, int]:
    """(text, usage events, error events, [DONE] count) of an SSE body."""
    text, usages, errors = "", 0, 0
    for event in raw.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        obj = orjson.loads(event[6:])
        errors += "error" in obj
        usages += bool(obj.get("usage"))
        for choice in obj.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text, usages, errors, raw.count(b"data: [DONE]")


def _aborts(engine: EngineHandle) -> int:
    return engine.server.metrics.finished[FinishReason.ABORT]


async def _stall_first(
    fleet: Fleet, session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str]
) -> tuple[asyncio.Task[tuple[int, str, bytes]], EngineHandle, EngineHandle]:
    """Start a call with every engine hung, then revive all but the one it went to (well
    within the hedge delay): returns (the call, its stalled engine, the other engine)."""
    for engine in fleet.engines:
        await _arm(session, engine, {"hang": True})
    call = asyncio.create_task(_call(session, url, body, headers))
    for _ in range(200):
        hung = [e for e in fleet.engines if e.server.driver.num_in_flight]
        if hung:
            break
        await asyncio.sleep(0.002)
    assert len(hung) == 1
    other = next(e for e in fleet.engines if e is not hung[0])
    await _arm(session, other, {"clear": True})
    return call, hung[0], other


@pytest.mark.parametrize("stream", [True, False])
async def test_hedge_wins_against_a_stalled_engine_and_the_loser_is_aborted(
    stream: bool,
) -> None:
    async with _setup() as (fleet, gw, url, session):
        body = _body(stream)
        _, _, baseline = await _call(session, url, body)
        call, hung, other = await _stall_first(fleet, session, url, body, CRITICAL)
        aborts_before = _aborts(hung)
        status, name, raw = await call
        assert status == 200 and name == other.name
        if stream:
            text, usages, errors, done = _stream_text(raw)
            assert (text, usages, errors, done) == (_stream_text(baseline)[0], 1, 0, 1)
            assert raw.count(b'"role"') == 1
        else:
            assert orjson.loads(raw)["choices"] == orjson.loads(baseline)["choices"]
        counts = gw.proxy.reliability.counts
        assert counts["hedges"] == 1 and counts["hedge_wins"] == 1
        assert counts["hedge_cancelled"] == 1
        for _ in range(100):  # the engine aborts once it sees the connection close
            if _aborts(hung) > aborts_before:
                break
            await asyncio.sleep(0.02)
        assert _aborts(hung) == aborts_before + 1
        assert hung.server.driver.num_in_flight == 0
        assert gw.tracker.in_flight(hung.name) == 0 and gw.tracker.in_flight(other.name) == 0
        await _arm(session, hung, {"clear": True})


async def test_a_fast_first_attempt_never_hedges() -> None:
    async with _setup() as (fleet, gw, url, session):
        for i in range(4):
            for stream in (True, False):
                status, _, _ = await _call(session, url, _body(stream, prompt=f"q{i}"), CRITICAL)
                assert status == 200
        counts = gw.proxy.reliability.counts
        assert counts["hedges"] == 0 and counts["hedge_cancelled"] == 0
        assert sum(_aborts(e) for e in fleet.engines) == 0


async def test_a_class_that_is_not_hedged_waits_for_its_engine() -> None:
    async with _setup() as (fleet, gw, url, session):
        body = _body(True)
        call, hung, _ = await _stall_first(fleet, session, url, body, {"X-Priority": "standard"})
        await asyncio.sleep(WAIT_S)
        assert not call.done()
        assert gw.proxy.reliability.counts["hedges"] == 0
        assert hung.server.driver.num_in_flight == 1  # still waiting there, not raced
        await _arm(session, hung, {"clear": True})
        status, name, _ = await call
        assert status == 200 and name == hung.name
        assert gw.proxy.reliability.counts["hedges"] == 0


async def test_no_hedge_when_the_retry_budget_is_spent() -> None:
    spent = {"retry": {"budget_ratio": 0.0, "min_concurrent_retries": 0}}
    async with _setup(spent) as (fleet, gw, url, session):
        body = _body(True)
        call, hung, _ = await _stall_first(fleet, session, url, body, CRITICAL)
        await asyncio.sleep(WAIT_S)
        counts = gw.proxy.reliability.counts
        assert not call.done()
        assert counts["hedges"] == 0 and counts["hedge_denied_budget"] == 1
        await _arm(session, hung, {"clear": True})
        status, name, _ = await call
        assert status == 200 and name == hung.name


async def test_hedging_off_in_the_config_never_hedges() -> None:
    async with _setup({"hedge": {**HEDGE, "enabled": False}}) as (fleet, gw, url, session):
        body = _body(False)
        call, hung, _ = await _stall_first(fleet, session, url, body, CRITICAL)
        await asyncio.sleep(WAIT_S)
        assert not call.done() and gw.proxy.reliability.counts["hedges"] == 0
        await _arm(session, hung, {"clear": True})
        assert (await call)[0] == 200


async def _wait_for(predicate: Any, timeout_s: float = 3.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def _race_on_hung_engines(
    fleet: Fleet, gw: Gateway, session: aiohttp.ClientSession, url: str
) -> tuple[asyncio.Task[tuple[int, str, bytes]], EngineHandle, EngineHandle]:
    """A critical call raced on two hung engines: (the call, first engine, hedge engine)."""
    for engine in fleet.engines:
        await _arm(session, engine, {"hang": True})
    call = asyncio.create_task(_call(session, url, _body(True), CRITICAL))
    holding = lambda: [e for e in fleet.engines if e.server.driver.num_in_flight]  # noqa: E731
    await _wait_for(lambda: len(holding()) == 1)
    first = holding()[0]
    await _wait_for(lambda: len(holding()) == 2)
    assert gw.proxy.reliability.counts["hedges"] == 1
    return call, first, next(e for e in fleet.engines if e is not first)


async def test_a_first_attempt_that_fails_during_the_race_leaves_the_hedge_to_answer() -> None:
    async with _setup() as (fleet, gw, url, session):
        call, first, hedge = await _race_on_hung_engines(fleet, gw, session, url)
        await _arm(session, first, {"restart": True})  # its stream is cut: it drops out
        counts = gw.proxy.reliability.counts
        await _wait_for(lambda: counts["hedge_race_failures"] == 1)
        assert not call.done()
        await _arm(session, hedge, {"clear": True})
        status, name, raw = await call
        assert status == 200 and name == hedge.name
        text, usages, errors, done = _stream_text(raw)
        assert text and (usages, errors, done) == (1, 0, 1)
        assert counts["hedge_cancelled"] == 0
        assert gw.tracker.in_flight(first.name) == 0 and gw.tracker.in_flight(hedge.name) == 0


async def test_a_client_that_leaves_during_the_race_cancels_every_attempt() -> None:
    async with _setup() as (fleet, gw, url, session):
        call, first, hedge = await _race_on_hung_engines(fleet, gw, session, url)
        before = _aborts(first) + _aborts(hedge)
        call.cancel()
        await _wait_for(lambda: _aborts(first) + _aborts(hedge) == before + 2)
        assert first.server.driver.num_in_flight == 0 == hedge.server.driver.num_in_flight
        await _wait_for(lambda: gw.tracker.in_flight(first.name) == 0)
        assert gw.tracker.in_flight(hedge.name) == 0
        assert gw.proxy.reliability.counts["hedge_cancelled"] == 1  # the hedge; the first
        # attempt is the proxy's own, cancelled with the handler
