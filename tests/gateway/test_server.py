"""The lean front server: hot requests served by it, everything else by aiohttp, on one port.

Raw HTTP/1.1 over a socket, so what goes on the wire (keep-alive, pipelining, hand-over of a
connection mid-way, chunked bodies, malformed heads) is exactly what the test writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from inferplane.gateway import server
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.server import FRONT_ROUTES, Front, FrontRoutes, FrontSite
from inferplane.gateway.server_request import parse_head
from tests.gateway.fakes import fake_engines, fleet_config

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
HOT = frozenset({"/v1/chat/completions", "/v1/completions"})


def _post(body: bytes, path: str = "/v1/chat/completions", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


@contextlib.asynccontextmanager
async def _gateway(**gateway: Any) -> AsyncIterator[tuple[Gateway, Front, int]]:
    async with fake_engines(1) as engines:
        gw = Gateway(fleet_config(engines, **gateway))
        runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
        try:
            site = next(iter(runner.sites))
            assert isinstance(site, FrontSite) and site.front is not None
            yield gw, site.front, port
        finally:
            await runner.cleanup()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response (Content-Length or chunked body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, body
        body += chunk[:-2]


async def test_hot_requests_keep_alive_and_pipelining_on_the_front_server() -> None:
    async with _gateway() as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(CHAT))
        status, headers, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
        assert headers["content-type"] == "application/json"
        assert headers["x-inferplane-endpoint"] == "e0" and "date" in headers
        # Two pipelined requests in one write: two answers, in order, same connection.
        writer.write(_post(CHAT, extra="X-Request-Id: first\r\n") + _post(b"{bad"))
        first = await _read_response(reader)
        second = await _read_response(reader)
        assert first[0] == 200 and first[1]["x-request-id"] == "first"
        assert second[0] == 400 and orjson.loads(second[2])["error"]["type"]
        assert front.served == 3 and front.handed_off == 0
        writer.close()


async def test_other_routes_hand_the_connection_to_aiohttp() -> None:
    async with _gateway() as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(CHAT))
        assert (await _read_response(reader))[0] == 200
        # The same connection asks for /v1/models, then chats again: aiohttp serves both.
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" + _post(CHAT))
        status, _, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["data"][0]["id"] == "m"
        assert (await _read_response(reader))[0] == 200
        assert front.served == 1 and front.handed_off == 1
        writer.close()


async def test_chunked_body_and_malformed_head_are_aiohttps() -> None:
    async with _gateway() as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        writer.write(head + b"\r\n" + f"{len(CHAT):x}\r\n".encode() + CHAT + b"\r\n0\r\n\r\n")
        status, _, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 5
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nBad Header: x\r\n\r\n")
        status, _, _ = await _read_response(reader)
        assert status == 400
        assert front.served == 0 and front.handed_off == 2
        writer.close()


async def test_body_limit_and_connection_close() -> None:
    async with _gateway(max_body_bytes=2000) as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"x" * 3000))
        status, _, body = await _read_response(reader)
        assert status == 413 and orjson.loads(body)["error"]["code"] == "body_too_large"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(CHAT, extra="Connection: close\r\n"))
        status, headers, _ = await _read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await reader.read() == b""  # the server closed the connection
        assert front.served == 1
        writer.close()


async def test_streams_are_served_chunked_and_a_vanished_client_cancels_the_call() -> None:
    async with fake_engines(1, token_delay_s=0.05, num_tokens=40) as engines:
        gw = Gateway(fleet_config(engines))
        runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
        try:
            body = orjson.dumps({**orjson.loads(CHAT), "stream": True})
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(body))
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"Transfer-Encoding: chunked" in head and b"text/event-stream" in head
            assert b"data: {" in await reader.readuntil(b"\n\n")
            writer.close()  # gone mid-stream: the engine's request is aborted
            for _ in range(100):
                if engines[0].aborted:
                    break
                await asyncio.sleep(0.02)
            assert engines[0].aborted == 1 and engines[0].completed == 0
            assert gw.in_flight == 0
        finally:
            await runner.cleanup()


def test_parse_head_takes_only_the_plain_case() -> None:
    ok = parse_head(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length:  12 ", HOT)
    assert ok is not None and ok.content_length == 12 and ok.keep_alive
    assert ok.headers["host"] == "x" and ok.path == "/v1/completions"
    refused = [
        b"GET /v1/completions HTTP/1.1\r\nHost: x",
        b"POST /v1/models HTTP/1.1\r\nHost: x",
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: x",
        b"POST /v1/completions HTTP/1.0\r\nHost: x",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked",
        b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue",
        b"POST /v1/completions HTTP/1.1\r\nConnection: upgrade",
        b"POST /v1/completions HTTP/1.1\r\n folded: x",
        b"POST /v1/completions HTTP/1.1\r\nA: b\nC: d",
        b"POST /v1/completions HTTP/1.1\r\nA: b\x00",
        b"POST  /v1/completions HTTP/1.1",
    ]
    for head in refused:
        assert parse_head(head, HOT) is None, head
    closing = parse_head(b"POST /v1/completions HTTP/1.1\r\nConnection: Close", HOT)
    assert closing is not None and not closing.keep_alive


async def test_an_app_without_hot_routes_is_plain_aiohttp() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/x", ok)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        site = next(iter(runner.sites))
        assert isinstance(site, FrontSite) and site.front is None
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await _read_response(reader))[2] == b"ok"
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_body_arriving_in_many_pieces_is_read_whole() -> None:
    async with _gateway() as (_, front, port):
        text = "long " * 40_000
        data = _post(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(0, len(data), 4096):
            writer.write(data[i : i + 4096])
            await writer.drain()
            await asyncio.sleep(0)
        status, _, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["usage"]["prompt_tokens"] == 10
        assert front.served == 1 and front.handed_off == 0
        writer.close()


class _Transport(asyncio.Transport):
    """Records what the server writes; no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.out = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_a_client_that_does_not_read_gets_no_new_answers_until_it_does() -> None:
    seen: list[bytes] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.Response(body=b"ok", content_type="application/json")

    app = web.Application()
    app[FRONT_ROUTES] = FrontRoutes({"/v1/completions": echo}, 1 << 20)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        assert runner.server is not None
        proto = Front(asyncio.get_running_loop(), app, runner.server).protocol()
        transport = _Transport()
        proto.connection_made(transport)
        proto.pause_writing()  # the transport's buffer is full
        proto.data_received(_post(b"1", "/v1/completions") + _post(b"2", "/v1/completions"))
        await asyncio.sleep(0.01)
        assert seen == [] and transport.out == b""
        proto.resume_writing()  # drained: both pipelined requests are answered, in order
        for _ in range(50):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        assert seen == [b"1", b"2"] and transport.out.count(b"HTTP/1.1 200 OK") == 2
        proto.connection_lost(None)
    finally:
        await runner.cleanup()


async def test_a_head_over_aiohttps_line_limit_gets_aiohttps_answer() -> None:
    async with _gateway() as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(CHAT, extra=f"X-Long: {'a' * 9000}\r\n"))
        status, _, _ = await _read_response(reader)
        assert status == 400  # aiohttp refuses a header line over 8190 bytes
        assert front.served == 0 and front.handed_off == 1
        writer.close()


async def test_idle_keep_alive_connections_close_but_a_body_in_progress_does_not(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(server, "KEEPALIVE_TIMEOUT_S", 0.2)
    async with _gateway() as (_, front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(CHAT))
        assert (await _read_response(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 5) == b""  # idle: closed by the server
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = _post(CHAT)
        writer.write(data[:-10])  # the head and part of the body
        await asyncio.sleep(1.5)  # beyond the idle timeout (checked at least once a second)
        writer.write(data[-10:])
        assert (await _read_response(reader))[0] == 200
        assert front.served == 2
        writer.close()


async def test_response_prepare_hooks_run_once_per_answer() -> None:
    calls: list[str] = []

    async def tag(request: web.Request, response: web.StreamResponse) -> None:
        calls.append(request.path)
        response.headers["X-Tag"] = "t"

    async with fake_engines(1) as engines:
        gw = Gateway(fleet_config(engines))
        app = gw.build_app()
        app.on_response_prepare.append(tag)
        runner, port = await start_server(app, "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(CHAT))
            status, headers, _ = await _read_response(reader)
            assert status == 200 and headers["x-tag"] == "t"
            writer.write(_post(orjson.dumps({**orjson.loads(CHAT), "stream": True})))
            status, headers, body = await _read_response(reader)
            assert status == 200 and headers["x-tag"] == "t" and body.endswith(b"[DONE]\n\n")
            assert calls == ["/v1/chat/completions"] * 2
            writer.close()
        finally:
            await runner.cleanup()
