"""What callers of the upstream client hold: the response and its headers (the errors are in
:mod:`upstream_errors`, re-exported here).

:class:`UpstreamResponse` is fed by its connection (``upstream_conn``) and read by the proxy
as aiohttp's ``ClientResponse`` would be (``status``, ``headers.get``, ``read``,
``content.readany``/``iter_any``, ``close``/``release``, ``async with``). It is on every
call's path and compiles with it (``bench/gateway_compile.py``), so it holds no async
generator: ``iter_any`` returns an iterator object.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING

from inferplane.gateway.upstream_errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamProtocolError,
)

if TYPE_CHECKING:
    from inferplane.gateway.upstream_conn import Connection

__all__ = [
    "ResponseHeaders",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamProtocolError",
    "UpstreamResponse",
]


class UpstreamResponse:
    """One engine answer; the body is delivered by the connection as it arrives."""

    __slots__ = (
        "_body",
        "_chunks",
        "_conn",
        "_discard",
        "_done",
        "_exc",
        "_sock_read_s",
        "_waiter",
        "_wake_any",
        "headers",
        "status",
    )

    def __init__(self, conn: Connection, sock_read_s: float | None) -> None:
        self._conn: Connection | None = conn
        self._sock_read_s = sock_read_s
        self.status = 0
        self.headers = ResponseHeaders({})
        self._chunks: list[bytes] = []
        self._body: bytes | None = None
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._wake_any = True
        self._discard = False

    # ---- fed by the connection ----------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._exc is None and not self._done:
            self._exc = exc
        self._conn = None
        self._wake()

    # ---- what readers use ---------------------------------------------------------------

    @property
    def content(self) -> UpstreamResponse:
        """aiohttp's ``resp.content``: this object (``iter_any`` is here)."""
        return self

    async def _wait(self) -> None:
        conn = self._conn
        if conn is None:
            raise self._exc or UpstreamClosed("response is closed")
        loop = conn.loop
        waiter = self._waiter = loop.create_future()
        timer = None
        if self._sock_read_s is not None:
            timer = loop.call_later(self._sock_read_s, conn.timed_out)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _head(self) -> None:
        while not self.status:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def read(self) -> bytes:
        """The whole body (waits for its end)."""
        if self._body is not None:
            return self._body
        self._wake_any = False
        while not self._done:
            if self._exc is not None:
                raise self._exc
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._body

    async def readany(self) -> bytes:
        """The next body bytes as they arrive (the network's boundaries); b"" at the end."""
        self._wake_any = True
        while not self._chunks:
            if self._done:
                return b""
            if self._exc is not None:
                raise self._exc
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def iter_any(self) -> BodyChunks:
        """``readany`` until the body ends (``async for``)."""
        return BodyChunks(self)

    def close(self) -> None:
        """Stop reading: an unfinished answer's connection is aborted (the engine sees it)."""
        conn = self._conn
        if conn is not None and not self._done:
            conn.abort(UpstreamClosed("response is closed"))
        self._conn = None

    def release(self) -> None:
        """Reading is over: pool the connection once the rest of the body has arrived."""
        conn = self._conn
        if conn is None or self._done:
            return
        self._discard = True
        self._chunks = []
        conn.drain()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.release()
        else:
            self.close()


class ResponseHeaders:
    """Response headers by lower-case name (``get`` ignores case, as aiohttp's does)."""

    __slots__ = ("_by_name",)

    def __init__(self, by_name: dict[str, str]) -> None:
        self._by_name = by_name

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._by_name.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def items(self) -> list[tuple[str, str]]:
        return list(self._by_name.items())


class BodyChunks:
    """``async for data in resp.content.iter_any()``: the body's bytes as they arrive."""

    __slots__ = ("_resp",)

    def __init__(self, resp: UpstreamResponse) -> None:
        self._resp = resp

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        data = await self._resp.readany()
        if not data:
            raise StopAsyncIteration
        return data
