"""The lean upstream client against scripted raw HTTP servers on loopback.

Each test's server reads one request at a time (head and Content-Length body) and answers
with exact bytes, so framing (Content-Length, chunked split anywhere, until close), keep-alive,
timeouts, cancellation and malformed answers are checked byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from inferplane.gateway.upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamProtocolError,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """Counts connections, requests and the connections the client closed."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.client_closed = asyncio.Event()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                await self.script(reader, writer, len(self.requests))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_closed.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serve(script: Script) -> AsyncIterator[Server]:
    server = Server(script)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with srv:
        yield server


async def until_client_leaves(reader: asyncio.StreamReader) -> None:
    """Wait (at most 5 s) for the client to close its end; raise as a dropped connection."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.read(1), 5)
    raise ConnectionError


def answer(body: bytes, extra: bytes = b"") -> Script:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body)
        await w.drain()

    return script


def chunked(body: bytes, step: int) -> bytes:
    parts = [
        b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + 5]), body[i : i + 5])
        for i in range(0, len(body), 5)
    ]
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(parts)
    return wire + b"0\r\nX-Trailer: t\r\n\r\n"


async def test_keep_alive_reuses_one_connection_and_sends_the_body() -> None:
    async with serve(answer(b'{"ok":true}')) as server:
        client = UpstreamClient()
        for i in range(3):
            body = b'{"n":%d}' % i
            resp = await client.post(server.url, data=body, headers={"X-A": "b"})
            async with resp:
                assert resp.status == 200 and await resp.read() == b'{"ok":true}'
            assert server.requests[-1].endswith(body)
            assert b"\r\nX-A: b\r\n" in server.requests[-1]
            assert b"\r\nHost: 127.0.0.1:" in server.requests[-1]
        assert server.connections == 1 and client.num_idle() == 1
        await client.close()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
async def test_chunked_body_split_anywhere(step: int) -> None:
    body = b"data: " + bytes(range(48, 120)) + b"\n\n"
    wire = chunked(body, 5)

    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        for i in range(0, len(wire), step):
            w.write(wire[i : i + step])
            await w.drain()
            await asyncio.sleep(0)

    async with serve(script) as server:
        client = UpstreamClient()
        resp = await client.post(server.url, data=b"{}")
        async with resp:
            got = b"".join([part async for part in resp.content.iter_any()])
        assert got == body
        resp = await client.post(server.url, data=b"{}")  # the same connection, pooled
        async with resp:
            assert await resp.read() == body
        assert server.connections == 1
        await client.close()


async def test_empty_bodies_and_body_until_close() -> None:
    replies = [
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
    ]

    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        w.write(replies[n - 1])
        await w.drain()
        if n == 3:
            w.close()

    async with serve(script) as server:
        client = UpstreamClient()
        got = []
        for _ in replies:
            async with await client.post(server.url, data=b"{}") as resp:
                got.append((resp.status, await resp.read()))
        assert got == [(204, b""), (200, b""), (200, b"to the end")]
        await client.close()


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_malformed_answers_are_client_errors(wire: bytes) -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        w.write(wire)
        await w.drain()

    async with serve(script) as server:
        client = UpstreamClient()
        with pytest.raises(UpstreamProtocolError) as caught:
            async with await client.post(server.url, data=b"{}") as resp:
                await resp.read()
        assert isinstance(caught.value, aiohttp.ClientError)
        assert client.num_open == 0
        await client.close()


async def test_close_before_answer_and_stale_pooled_connection() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n == 1:  # answers, then closes the kept-alive connection while it is idle
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
        w.close()
        raise ConnectionError

    async with serve(script) as server:
        client = UpstreamClient()
        async with await client.post(server.url, data=b"{}") as resp:
            assert await resp.read() == b"ok"
        await asyncio.sleep(0.05)
        # the pooled connection is dead: a fresh one is opened; that one closes unanswered
        with pytest.raises(UpstreamDisconnected):
            await client.post(server.url, data=b"{}")
        assert server.connections == 2
        await client.close()


async def test_connect_error_is_aiohttps_connector_error() -> None:
    async with serve(answer(b"")) as server:
        url = server.url
    client = UpstreamClient()
    with pytest.raises(aiohttp.ClientConnectorError) as caught:
        await client.post(url, data=b"{}")
    assert isinstance(caught.value, UpstreamConnectError) and client.num_open == 0
    await client.close()


class _SlowConnectLoop:
    """The running loop, except that connecting never completes (a SYN nobody answers)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def __getattr__(self, name: str) -> object:
        return getattr(self._loop, name)

    async def create_connection(self, *args: object, **kwargs: object) -> None:
        await asyncio.sleep(3600)


async def test_connect_timeout_is_a_timeout_not_a_connect_error() -> None:
    client = UpstreamClient()
    client.loop = _SlowConnectLoop(client.loop)  # type: ignore[assignment]
    with pytest.raises(TimeoutError) as caught:
        await client.post(
            "http://127.0.0.1:9/x", data=b"{}", timeout=aiohttp.ClientTimeout(total=0.1)
        )
    # The proxy marks an endpoint cold on a connector error; a slow connect must not be one.
    assert not isinstance(caught.value, aiohttp.ClientConnectorError)
    assert client.num_open == 0
    await client.close()


async def test_total_and_read_timeouts_abort_the_connection() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n == 2:
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await w.drain()
        await until_client_leaves(r)

    async with serve(silent) as server:
        client = UpstreamClient()
        with pytest.raises(TimeoutError):
            await client.post(server.url, data=b"{}", timeout=aiohttp.ClientTimeout(total=0.1))
        await asyncio.wait_for(server.client_closed.wait(), 2)
        server.client_closed.clear()
        stall = aiohttp.ClientTimeout(total=10, sock_read=0.1)
        resp = await client.post(server.url, data=b"{}", timeout=stall)
        assert await resp.content.readany() == b"abc"
        with pytest.raises(TimeoutError):
            await resp.content.readany()
        await asyncio.wait_for(server.client_closed.wait(), 2)
        assert client.num_open == 0
        await client.close()


async def test_cancelled_call_closes_its_connection() -> None:
    async def slow(r: asyncio.StreamReader, _w: asyncio.StreamWriter, _n: int) -> None:
        await until_client_leaves(r)

    async with serve(slow) as server:
        client = UpstreamClient()
        task = asyncio.create_task(client.post(server.url, data=b"{}"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.client_closed.wait(), 2)  # the engine sees us leave
        assert client.num_open == 0
        await client.close()


async def test_reader_done_early_drains_then_pools() -> None:
    async def tail_later(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[DONE\r\n")
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"0\r\n\r\n")
        await w.drain()

    async with serve(tail_later) as server:
        client = UpstreamClient()
        async with await client.post(server.url, data=b"{}") as resp:
            assert await resp.content.readany() == b"[DONE"
        assert client.num_idle() == 0  # still draining the terminating chunk
        await asyncio.sleep(0.2)
        assert client.num_idle() == 1 and client.num_open == 1
        await client.close()


async def test_connection_limit_makes_calls_wait() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await asyncio.sleep(0.05)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()

    async with serve(script) as server:
        client = UpstreamClient(limit=1)
        most = 0

        async def one() -> bytes:
            nonlocal most
            resp = await client.post(server.url, data=b"{}")
            most = max(most, client.num_open)
            async with resp:
                return await resp.read()

        assert await asyncio.gather(one(), one(), one()) == [b"ok"] * 3
        assert most == 1 and server.connections == 1
        await client.close()


async def test_https_urls_speak_tls_and_bad_urls_are_connect_errors() -> None:
    hellos: list[bytes] = []

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.read(3))
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # not a TLS server hello
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(plain, "127.0.0.1", 0)
    async with srv:
        client = UpstreamClient()
        tls_url = f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions"
        with pytest.raises(UpstreamConnectError):
            await client.post(tls_url, data=b"{}", timeout=aiohttp.ClientTimeout(total=5))
        assert hellos and hellos[0][:1] == b"\x16"  # a TLS handshake record, not clear text
        with pytest.raises(UpstreamConnectError):
            await client.post("ftp://127.0.0.1/x", data=b"{}")
        assert client.num_open == 0
        await client.close()
        await asyncio.sleep(0)
