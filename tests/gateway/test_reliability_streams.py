"""Reliability end to end on emulated engines: crashes and stalls are resumed or replayed.

The emulated engines generate greedily and deterministically, so a stream that breaks on
one engine and is continued on another must read, token for token, like an uninterrupted
run of the same request; the client must see one stream with one final usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from inferplane.config import parse_config
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.gateway.app import Gateway
from tests.gateway.fakes import chat_body, running_gateway

MODEL = "llama-3-8b"
CHAT = "/v1/chat/completions"


def _body(max_tokens: int, stream: bool = True, prompt: str = "Tell me about failover.") -> Any:
    return chat_body(MODEL, max_tokens, stream, prompt)


@asynccontextmanager
async def _setup(
    count: int = 3, time_scale: float = 0.05, **gateway: Any
) -> AsyncIterator[tuple[Fleet, Gateway, str, aiohttp.ClientSession]]:
    async with Fleet([EngineSpec(model=MODEL, count=count, time_scale=time_scale)]) as fleet:
        gw_cfg = {"auth": {"mode": "anonymous"}, "log_requests": False, **gateway}
        cfg = parse_config(
            {"gateway": gw_cfg, "endpoints": [e.endpoint_config() for e in fleet.engines]}
        )
        async with running_gateway(cfg) as (gw, url), aiohttp.ClientSession() as session:
            yield fleet, gw, url, session


def _parse_stream(raw: bytes) -> tuple[str, list[dict[str, Any]], list[Any], int]:
    """(text, usage objects, error events, [DONE] count) of an SSE body."""
    text, usages, errors = "", [], []
    for event in raw.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        obj = orjson.loads(event[6:])
        if "error" in obj:
            errors.append(obj)
        for choice in obj.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
        if obj.get("usage"):
            usages.append(obj["usage"])
    return text, usages, errors, raw.count(b"data: [DONE]")


async def _stream(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, bytes]:
    async with session.post(url + CHAT, json=body) as resp:
        return resp.status, await resp.read()


async def _arm(session: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with session.post(url + "/admin/faults", json=faults) as resp:
        assert resp.status == 200, await resp.text()


async def test_crash_mid_stream_is_resumed_token_for_token() -> None:
    async with _setup() as (fleet, gw, url, session):
        body = _body(max_tokens=30)
        status, raw = await _stream(session, url, body)
        assert status == 200
        baseline, base_usages, _, _ = _parse_stream(raw)
        assert base_usages[-1]["completion_tokens"] == 30
        for engine in fleet.engines:  # whichever serves it crashes after 12 tokens
            await _arm(session, engine.url, {"crash_after_tokens": 12})
        status, raw = await _stream(session, url, body)
        text, usages, errors, done = _parse_stream(raw)
        assert status == 200 and not errors and done == 1
        assert text == baseline
        assert len(usages) == 1
        assert usages[0]["completion_tokens"] == 30
        assert usages[0]["prompt_tokens"] == base_usages[-1]["prompt_tokens"]
        # 12 + 12 + 6 tokens: two continuations, each on an engine not tried before.
        assert gw.proxy.reliability.counts["resumptions"] == 2


async def test_crash_without_usage_asked_still_resumes_and_hides_usage() -> None:
    async with _setup() as (fleet, gw, url, session):
        body = _body(max_tokens=20)
        del body["stream_options"]
        _, raw = await _stream(session, url, body)
        baseline = _parse_stream(raw)[0]
        for engine in fleet.engines:
            await _arm(session, engine.url, {"crash_after_tokens": 7})
        _, raw = await _stream(session, url, body)
        text, usages, errors, done = _parse_stream(raw)
        assert text == baseline and not usages and not errors and done == 1
        assert raw.count(b'"role"') == 1  # the continuation's second role delta is dropped
        assert gw.proxy.reliability.counts["resumptions"] == 2  # 7 + 7 + 6 tokens


async def test_crash_of_a_non_stream_call_is_replayed_elsewhere() -> None:
    async with _setup() as (fleet, gw, url, session):
        for engine in fleet.engines[:2]:
            await _arm(session, engine.url, {"crash_after_tokens": 10})
        bodies = [_body(25, stream=False, prompt=f"Question {i} about failover?") for i in range(6)]
        answers = []
        for body in bodies:  # distinct prompts spread over the engines
            async with session.post(url + CHAT, json=body) as resp:
                assert resp.status == 200
                answers.append(await resp.json())
        crashes = sum(e.server.faults.num_crashes for e in fleet.engines)
        assert crashes >= 1
        # Nothing reached the client before a crash: replays (also of calls sent to the
        # engine while it restarts cold, answering 503), never a resumption.
        counts = gw.proxy.reliability.counts
        assert counts["retry_replay"] >= crashes and counts["resumptions"] == 0
        for body, answer in zip(bodies, answers, strict=True):  # as an undisturbed run
            async with session.post(url + CHAT, json=body) as resp:
                again = await resp.json()
            assert answer["choices"][0]["message"] == again["choices"][0]["message"]
            assert answer["usage"]["completion_tokens"] == 25


@pytest.mark.slow
async def test_hang_mid_stream_hits_the_stall_timeout_and_resumes() -> None:
    timeouts = {"inter_token_s": 0.4}
    async with _setup(time_scale=0.2, timeouts=timeouts) as (fleet, gw, url, session):
        body = _body(max_tokens=200)
        _, raw = await _stream(session, url, body)
        baseline = _parse_stream(raw)[0]
        by_name = {e.name: e for e in fleet.engines}
        async with session.post(url + CHAT, json=body) as resp:
            first = by_name[resp.headers["X-Inferplane-Endpoint"]]
            head = await resp.content.readuntil(b"\n\n")
            await _arm(session, first.url, {"hang": True})
            raw = head + await resp.content.read()
        text, usages, errors, done = _parse_stream(raw)
        assert not errors and done == 1 and text == baseline
        assert usages[-1]["completion_tokens"] == 200
        assert gw.proxy.reliability.counts["resumptions"] == 1
        await _arm(session, first.url, {"clear": True})


@pytest.mark.timeout(30)
async def test_whole_pool_down_gives_a_clear_503() -> None:
    async with _setup(count=2) as (fleet, _gw, url, session):
        for engine in fleet.engines:
            await engine.server.stop()
        statuses = []
        for stream in (True, False):
            async with session.post(url + CHAT, json=_body(5, stream=stream)) as resp:
                statuses.append(resp.status)
                error = (await resp.json())["error"]
                assert error["code"] and error["message"] and error["type"]
        assert all(s in (502, 503) for s in statuses)
        # Once the connect errors marked them cold, refusals are immediate 503s.
        async with session.post(url + CHAT, json=_body(5)) as resp:
            assert resp.status == 503
            assert "Retry-After" in resp.headers
            assert (await resp.json())["error"]["code"]
