"""A tiny fake OpenAI engine on loopback and a helper that runs a gateway in front of fakes.

The fake speaks just enough of vLLM's API (chat and completions, streaming with
``include_usage``, ``/metrics`` with vLLM names, ``/health``) and can misbehave on demand:
HTTP 500, garbage bodies, streams that stop early, slow tokens. It counts what it saw so
tests can check what reached the engine (bodies, aborts).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from aiohttp import web

from inferplane.config import FleetConfig, parse_config
from inferplane.gateway.app import Gateway, start_server

T = TypeVar("T")


async def until(cond: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll ``cond`` on the loop every 10 ms until it is true; AssertionError after
    ``timeout_s`` (an upper bound on a wait, never a timing the test asserts)."""
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


@dataclass
class FakeEngine:
    """One fake engine; mutate ``mode``/``health_status`` to change its behaviour."""

    name: str
    mode: str = "ok"  # ok | error500 | unavailable | garbage | close_early | slow
    health_status: int = 200
    num_tokens: int = 5
    token_delay_s: float = 0.0
    waiting: int = 0
    running: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    active: int = 0
    aborted: int = 0
    completed: int = 0
    url: str = ""
    runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status, text="ok")

    async def _metrics(self, request: web.Request) -> web.Response:
        text = (
            "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
            f'vllm:num_requests_running{{model_name="m"}} {self.running + self.active}\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        )
        return web.Response(text=text)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "error500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.mode == "unavailable":
            return web.json_response({"error": {"message": "not ready"}}, status=503)
        if self.mode == "garbage":
            return web.Response(status=200, body=b"<html>not json", content_type="text/html")
        chat = request.path.endswith("chat/completions")
        self.active += 1
        try:
            if body.get("stream"):
                return await self._stream(request, body, chat)
            await asyncio.sleep(self.token_delay_s * self.num_tokens)
            self.completed += 1
            return web.json_response(_whole(body, chat, self.num_tokens, self.name))
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            raise
        finally:
            self.active -= 1

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.num_tokens):
            if self.mode == "close_early" and i == 2:
                if request.transport is not None:
                    request.transport.close()
                return resp
            await asyncio.sleep(self.token_delay_s)
            await resp.write(b"data: " + orjson.dumps(_chunk(chat, f"t{i} ")) + b"\n\n")
        last = _chunk(chat, "", finish="length")
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "x", "object": "chunk", "choices": [], "usage": _usage(self.num_tokens)}
            await resp.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        self.completed += 1
        return resp


def _usage(n: int) -> dict[str, Any]:
    return {
        "prompt_tokens": 10,
        "completion_tokens": n,
        "total_tokens": 10 + n,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def _whole(body: dict[str, Any], chat: bool, n: int, name: str) -> dict[str, Any]:
    text = "".join(f"t{i} " for i in range(n))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": f"cmpl-{name}",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": body.get("model", "m"),
        "choices": [choice],
        "usage": _usage(n),
    }


def _chunk(chat: bool, text: str, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    return {
        "id": "c",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": "m",
        "choices": [choice],
    }


@contextlib.asynccontextmanager
async def fake_engines(n: int, **kwargs: Any) -> AsyncIterator[list[FakeEngine]]:
    async with serving([FakeEngine(name=f"e{i}", **kwargs) for i in range(n)]) as engines:
        yield engines


E = TypeVar("E", bound=FakeEngine)


@contextlib.asynccontextmanager
async def serving(engines: list[E]) -> AsyncIterator[list[E]]:
    """Serve ``engines`` (a FakeEngine or a subclass) on loopback; each gets its ``url``."""
    try:
        for eng in engines:
            eng.runner = web.AppRunner(eng.app(), handler_cancellation=True, access_log=None)
            await eng.runner.setup()
            site = web.TCPSite(eng.runner, "127.0.0.1", 0)
            await site.start()
            eng.url = f"http://127.0.0.1:{eng.runner.addresses[0][1]}"
        yield engines
    finally:
        for eng in engines:
            if eng.runner is not None:
                await eng.runner.cleanup()


def fleet_config(
    engines: list[FakeEngine], models: tuple[str, ...] = ("m",), **gateway: Any
) -> FleetConfig:
    gw: dict[str, Any] = {"scrape_interval_s": 0.05, "health_interval_s": 0.2, **gateway}
    return parse_config(
        {
            "gateway": gw,
            "endpoints": [
                {
                    "name": e.name,
                    "url": e.url,
                    "gpu": "h100" if i % 2 == 0 else "a100",
                    "price_per_hour_usd": 3.6 if i % 2 == 0 else 1.8,
                    "models": list(models),
                }
                for i, e in enumerate(engines)
            ],
        }
    )


@contextlib.asynccontextmanager
async def running_gateway(config: FleetConfig) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(config)
    runner, port = await start_server(gateway.build_app(), "127.0.0.1", 0)
    try:
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class BackgroundLoop:
    """An event loop in a daemon thread, for synchronous tests (hypothesis, blocking clients)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def chat_body(
    model: str, max_tokens: int, stream: bool = True, prompt: str = "Tell me about failover."
) -> dict[str, Any]:
    """A deterministic chat request for emulated engines (``ignore_eos``: exactly
    ``max_tokens`` tokens; a stream asks for usage)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
