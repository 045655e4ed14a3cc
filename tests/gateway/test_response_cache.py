"""The gateway cache hook over real HTTP: hits, stream replay, bypasses, tenant isolation.

A small harness app wires :class:`ResponseCache` the way the gateway does (lookup, answer a
hit, otherwise forward to a fake engine on loopback, tee the answer into the cache), so the
bytes a client receives on a miss can be compared with those it receives on the hit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.cache.backend import MemoryBackend
from inferplane.core.cache_config import CacheConfig, CacheRouteConfig, SemanticRouteConfig
from inferplane.core.types import PriorityClass
from inferplane.gateway.context import RequestContext, parse_body, parse_json_object
from inferplane.gateway.response_cache import (
    CACHE_HEADER,
    SIMILARITY_HEADER,
    ResponseCache,
    StreamCapture,
)
from tests.gateway.fakes import FakeEngine, fake_engines

CHAT = "/v1/chat/completions"


class WordsEmbedder:
    """A deterministic stand-in embedding: bag of hashed words (real model: tests/cache)."""

    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().replace("?", "").split():
                out[i, sum(word.encode()) % self.dim] += 1.0
            out[i] /= max(1e-9, float(np.linalg.norm(out[i])))
        return out


def context(tenant: str, path: str, body: dict[str, Any]) -> RequestContext:
    model, stream, usage, num_tokens, max_tokens = parse_body(path, body)
    return RequestContext(
        request_id="r1", tenant=tenant, priority=PriorityClass.STANDARD, arrival_s=0.0,
        model=model, path=path, stream=stream, client_wants_usage=usage,
        num_prompt_tokens=num_tokens, max_tokens=max_tokens, deadline_s=None,
        ttft_budget_s=None, workflow_id=None, workflow_step=None, workflow_steps=None,
    )  # fmt: skip


def harness(cache: ResponseCache, engine: FakeEngine) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = parse_json_object(raw)
        ctx = context(request.headers["X-Tenant"], request.path, body)
        found = await cache.lookup(ctx, body, request.headers)
        if found.hit:
            return await cache.respond(request, found, ctx.request_id)
        async with (
            aiohttp.ClientSession() as session,
            session.post(engine.url + request.path, data=raw) as up,
        ):
            if not ctx.stream:
                data = await up.read()
                await cache.store_json(found, data, cost_usd=0.01, gpu_seconds=0.2)
                return web.Response(
                    body=data, content_type="application/json", headers=found.headers()
                )
            out = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", **found.headers()}
            )
            await out.prepare(request)
            capture = cache.capture(found)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
                if capture is not None:
                    capture.feed(chunk)
            await out.write_eof()
            if capture is not None:
                await cache.store_stream(found, capture, cost_usd=0.01)
            return out

    app = web.Application()
    app.router.add_post(CHAT, handle)
    app.router.add_post("/v1/completions", handle)
    return app


@contextlib.asynccontextmanager
async def served(cache: ResponseCache, **engine: Any) -> AsyncIterator[tuple[str, FakeEngine]]:
    async with fake_engines(1, **engine) as (eng,):
        runner = web.AppRunner(harness(cache, eng), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}", eng
        finally:
            await runner.cleanup()


async def post(
    url: str, body: dict[str, Any], tenant: str = "a", **headers: str
) -> tuple[str, bytes, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + CHAT, json=body, headers={"X-Tenant": tenant, **headers}) as r,
    ):
        assert r.status == 200
        return r.headers.get(CACHE_HEADER, ""), await r.read(), dict(r.headers)


def new_cache(config: CacheConfig | None = None, **kwargs: Any) -> ResponseCache:
    return ResponseCache(config or CacheConfig(), asyncio.get_running_loop().time, **kwargs)


def body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def events(raw: bytes) -> list[bytes]:
    """The data events of an SSE body (comments are not content)."""
    return [e for e in raw.split(b"\n\n") if e.startswith(b"data:")]


async def test_exact_hit_serves_the_stored_json_without_the_engine() -> None:
    cache = new_cache()
    async with served(cache) as (url, eng):
        first = await post(url, body(temperature=0))
        second = await post(url, body(temperature=0))
    assert (first[0], second[0]) == ("miss", "hit-exact")
    assert second[1] == first[1] and eng.completed == 1
    assert second[2]["X-Inferplane-Cost-Usd"] == "0"
    stats = cache.stats()
    assert stats["hits_exact"] == 1 and stats["gpu_seconds_saved"] == 0.2


async def test_streaming_replay_equals_the_original_stream() -> None:
    cache = new_cache()
    async with served(cache, num_tokens=7) as (url, eng):
        for options in (None, {"include_usage": True}):
            req = body("stream me", temperature=0, stream=True, stream_options=options)
            first = await post(url, req)
            again = await post(url, req)
            assert (first[0], again[0]) == ("miss", "hit-exact")
            assert events(again[1]) == events(first[1])
            assert again[1].endswith(b"data: [DONE]\n\n")
            assert again[2]["Content-Type"].startswith("text/event-stream")
        assert eng.completed == 2  # one engine call per stream shape
        usage_events = [e for e in events(again[1]) if b'"usage"' in e]
        assert len(usage_events) == 1  # the usage chunk is replayed only where it was asked


async def test_nondeterministic_requests_are_never_served_from_cache() -> None:
    cache = new_cache()
    async with served(cache) as (url, eng):
        for req in (body(), body(temperature=0.7), body(temperature=0, n=2)):
            statuses = [(await post(url, req))[0] for _ in range(2)]
            assert statuses == ["bypass", "bypass"]
    assert eng.completed == 6 and cache.stats()["stores"] == 0


async def test_cache_control_headers_are_honoured() -> None:
    cache = new_cache()
    async with served(cache) as (url, eng):
        req = body(temperature=0)
        assert (await post(url, req, **{"Cache-Control": "no-store"}))[0] == "bypass"
        assert (await post(url, req))[0] == "miss"  # no-store kept nothing
        assert (await post(url, req, **{"Cache-Control": "no-cache"}))[0] == "bypass"
        assert (await post(url, req))[0] == "hit-exact"
    assert eng.completed == 3


async def test_forced_key_collision_never_serves_another_tenant() -> None:
    cache = new_cache(hasher=lambda _data: "0" * 64)  # every request gets the same key
    async with served(cache) as (url, eng):
        assert (await post(url, body("secret of a", temperature=0), tenant="a"))[0] == "miss"
        status, _, _ = await post(url, body("secret of a", temperature=0), tenant="b")
        assert status == "miss"
        assert (await post(url, body("other", temperature=0), tenant="b"))[0] == "miss"
    assert eng.completed == 3
    assert cache.stats()["lookups"].get("miss:key_collision", 0) >= 1


@settings(max_examples=25, deadline=None)
@given(
    tenants=st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=4, unique=True),
    texts=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=4),
    collide=st.booleans(),
)
def test_no_cross_tenant_hit_under_collisions_or_similarity(
    tenants: list[str], texts: list[str], collide: bool
) -> None:
    """Every tenant stores answers; any hit must be an answer stored by the same tenant."""
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.01))
    config = CacheConfig(default=route)
    hasher = (lambda _data: "f" * 64) if collide else None

    async def run() -> None:
        cache = ResponseCache(
            config, asyncio.get_running_loop().time, embedder=WordsEmbedder(),
            **({"hasher": hasher} if hasher else {}),
        )  # fmt: skip
        owner = tenants[0]
        for text in texts:
            req = body(text + " x", temperature=0)
            found = await cache.lookup(context(owner, CHAT, req), req, {})
            await cache.store_json(found, orjson.dumps({"owner": owner}))
        for tenant in tenants[1:]:
            for text in texts:  # same and near-duplicate questions
                for probe in (text + " x", text + " x?", text):
                    req = body(probe, temperature=0)
                    found = await cache.lookup(context(tenant, CHAT, req), req, {})
                    assert found.entry is None or found.entry.tenant == tenant

    asyncio.run(run())


async def test_semantic_hit_for_a_paraphrase_within_the_tenant_only() -> None:
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.8))
    cache = new_cache(CacheConfig(routes={"m": route}), embedder=WordsEmbedder())
    async with served(cache) as (url, eng):
        assert (await post(url, body("how do I reset my password", temperature=0)))[0] == "miss"
        status, raw, headers = await post(url, body("How do I reset my password?", temperature=0))
        assert status == "hit-semantic" and float(headers[SIMILARITY_HEADER]) >= 0.8
        assert (await post(url, body("how do I reset my password", temperature=0), "b"))[
            0
        ] == "miss"
        assert (await post(url, body("what is the refund policy", temperature=0)))[0] == "miss"
        long_chat = body("how do I reset my password", temperature=0)
        long_chat["messages"] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            *long_chat["messages"],
        ]
        assert (await post(url, long_chat))[0] == "miss"  # too many turns: exact only
    assert eng.completed == 4 and orjson.loads(raw)["choices"]


async def test_scanning_in_the_embedding_worker_serves_what_a_scan_on_the_loop_serves() -> None:
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.6))
    config = CacheConfig(default=route, semantic_memo_entries=0, semantic_max_entries_per_tenant=3)
    caches = [new_cache(config, embedder=WordsEmbedder(), one_hop=w) for w in (True, False)]
    asks = [("a", "reset my password"), ("a", "reset my password please"),
            ("b", "reset my password please"), ("a", "refund policy"),
            ("a", "the refund policy"), ("a", "shipping to mars"), ("a", "my password reset"),
            ("b", "reset password")]  # fmt: skip
    outcomes: list[list[tuple[str, bytes | None, float | None]]] = [[], []]
    for cache, out in zip(caches, outcomes, strict=True):
        for tenant, text in asks:
            req = body(text, temperature=0)
            found = await cache.lookup(context(tenant, CHAT, req), req, {})
            if found.entry is None:
                await cache.store_json(found, orjson.dumps({"q": text, "t": tenant}))
            got = None if found.entry is None else found.entry.payload
            similarity = None if found.similarity is None else round(found.similarity, 5)
            out.append((found.status.value, got, similarity))
        await cache.close()
    assert outcomes[0] == outcomes[1]
    assert [o[0] for o in outcomes[0]].count("hit-semantic") >= 2


def test_stream_capture_stores_only_clean_bounded_streams() -> None:
    clean = StreamCapture(max_bytes=1000)
    for part in (b'data: {"a":1}\n', b"\n: comment\n\ndata: {", b'"b":2}\n\ndata: [DONE]\n\n'):
        clean.feed(part)
    assert clean.payload() == b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    broken = StreamCapture(max_bytes=1000)
    broken.feed(b'data: {"a":1}\n\ndata: {"error": {"message": "x"}}\n\ndata: [DONE]\n\n')
    assert broken.payload() is None
    unfinished = StreamCapture(max_bytes=1000)
    unfinished.feed(b'data: {"a":1}\n\n')
    assert unfinished.payload() is None
    big = StreamCapture(max_bytes=10)
    big.feed(b'data: {"a":"0123456789"}\n\ndata: [DONE]\n\n')
    assert big.payload() is None


async def test_memory_backend_is_bounded() -> None:
    config = CacheConfig(max_entries=3)
    cache = new_cache(config)
    assert isinstance(cache.backend, MemoryBackend)
    for i in range(10):
        req = body(f"q{i}", temperature=0)
        found = await cache.lookup(context("a", CHAT, req), req, {})
        assert await cache.store_json(found, b"{}")
    assert cache.stats()["backend"]["entries"] == 3
    assert cache.stats()["backend"]["evictions"] == 7
