"""The official openai SDK works unchanged through the gateway against emulated engines.

The fleet and the gateway run on a background event loop (a thread), so the synchronous
client can block this thread while the gateway serves it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from inferplane.config import parse_config
from inferplane.engine.fleet import EngineSpec, Fleet, new_event_loop
from inferplane.gateway.app import Gateway, start_server

MODEL = "llama-3.2-1b"


class GatewayThread:
    """An emulated fleet plus a gateway on a loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""
        self.gateway: Gateway | None = None
        self.fleet: Fleet | None = None
        self._runner: Any = None

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> None:
        self.fleet = Fleet([EngineSpec(model=MODEL, gpu="h100", count=2, time_scale=1.0)])
        await self.fleet.start()
        config = parse_config(
            {
                "gateway": {"scrape_interval_s": 0.05, "log_requests": False},
                "endpoints": [e.endpoint_config() for e in self.fleet.engines],
            }
        )
        self.gateway = Gateway(config)
        self._runner, port = await start_server(self.gateway.build_app(), "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.fleet is not None:
            await self.fleet.stop()

    def __enter__(self) -> GatewayThread:
        self.thread.start()
        self.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def live() -> Iterator[GatewayThread]:
    with GatewayThread() as g:
        yield g


MESSAGES: list[Any] = [{"role": "user", "content": "Say something short."}]


def test_sync_chat_and_completions(live: GatewayThread) -> None:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens <= 8
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4
    )
    assert raw.headers["x-inferplane-endpoint"].startswith(MODEL)
    assert float(raw.headers["x-inferplane-cost-usd"]) > 0
    comp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
    assert comp.choices[0].text and comp.usage is not None
    models = [m.id for m in client.models.list()]
    assert models == [MODEL]


def test_sync_streams(live: GatewayThread) -> None:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(c.usage is None for c in chunks)  # not asked for: stripped
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    comp = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in comp if c.choices)


async def test_async_client(live: GatewayThread) -> None:
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    chat = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
    assert chat.choices[0].message.content
    stream = await client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    seen = [c async for c in stream]
    assert seen[-1].usage is not None
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    await client.close()


async def test_client_cancel_reaches_the_engine(live: GatewayThread) -> None:
    assert live.fleet is not None and live.gateway is not None
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    got = 0
    async for _ in stream:
        got += 1
        if got == 3:
            break
    drivers = [e.server.driver for e in live.fleet.engines]
    assert sum(live.run(_in_flight(drivers))) == 1  # still generating on one engine
    await stream.close()
    for _ in range(100):
        if sum(live.run(_in_flight(drivers))) == 0:
            break
        await asyncio.sleep(0.02)
    assert sum(live.run(_in_flight(drivers))) == 0  # the engine aborted the request
    await client.close()


async def _in_flight(drivers: list[Any]) -> list[int]:
    return [d.num_in_flight for d in drivers]
