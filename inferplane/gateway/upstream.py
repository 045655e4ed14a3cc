"""A lean HTTP/1.1 client for the gateway's calls to engines: keep-alive pool on asyncio.

Why not aiohttp's client: per call it builds a request object, a URL object, header
multidicts, a connection wrapper, a payload writer and a response object with its stream
reader, which cost the gateway more CPU than its own routing and accounting did (the
overhead bench). An engine call is always the same shape (POST, JSON body, one known host),
so this client writes one buffer per request and parses the answer in the connection's
``data_received``: the head, then the body by Content-Length, chunked coding, or until the
engine closes.

It looks like the small part of aiohttp's client the proxy uses (``post`` with a
``ClientTimeout``; a response with ``status``, ``headers.get``, ``read``,
``content.iter_any``, ``close`` and ``async with``), and it fails with aiohttp's exception
classes (connect errors, disconnects, malformed answers) and ``TimeoutError``, so the
proxy's error handling reads the same for both. Behaviour the gateway relies on:

- keep-alive: a connection whose answer was read whole goes back to the pool at once; one
  whose body is still arriving when its reader is done (a stream ends at ``[DONE]`` before
  the terminating chunk) is drained in the background, then pooled (closed after a second);
- cancellation and early close abort the connection, so the engine sees its client leave
  and aborts the request;
- timeouts: ``total`` (send to last body byte), ``sock_connect`` and ``sock_read`` (the
  longest wait for the next bytes, the stall limit of streams) raise ``TimeoutError``;
- a pooled connection the engine closed while idle is replaced once, transparently, when
  it dies before any answer byte (as browsers do); other failures are the caller's.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from inferplane.gateway.upstream_conn import IDLE, Connection
from inferplane.gateway.upstream_response import (
    ResponseHeaders,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamProtocolError,
    UpstreamResponse,
)

__all__ = [
    "ResponseHeaders",
    "UpstreamClient",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamProtocolError",
    "UpstreamResponse",
]

_CONCAT_LIMIT_BYTES = 64 * 1024  # head and body sent as one buffer below this size
_Limits = tuple[float | None, float | None, float | None]  # total, read, connect seconds


@dataclass(frozen=True, slots=True)
class _Target:
    """A URL parsed once: where to connect and the request line plus Host header."""

    host: str
    port: int
    tls: bool  # https
    prefix: bytes  # b"POST /path HTTP/1.1\r\nHost: h:p\r\n"
    key: tuple[str, int, bool]  # (host, port, tls): the pool it draws connections from


class UpstreamClient:
    """Keep-alive connections to engines; at most ``limit`` open at once (0: no limit)."""

    def __init__(self, limit: int = 0, *, max_idle_per_host: int = 256) -> None:
        self.loop = asyncio.get_running_loop()
        self._limit = limit
        self._max_idle = max_idle_per_host
        self._open: set[Connection] = set()
        self._idle: dict[tuple[str, int, bool], list[Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._tls: ssl.SSLContext | None = None
        self._timeouts: dict[int, tuple[aiohttp.ClientTimeout, _Limits]] = {}
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def num_open(self) -> int:
        return len(self._open)

    def num_idle(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def post(
        self,
        url: str,
        *,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> UpstreamResponse:
        """Send ``data`` to ``url``; returns once the answer's head has arrived."""
        if self._closed:
            raise UpstreamClosed("the upstream client is closed")
        target = self._targets.get(url) or self._target(url)
        request = _encode(target.prefix, data, headers)
        total_s, sock_read_s, connect_s = self._limits(timeout)
        started_s = self.loop.time()
        for attempt in (0, 1):
            conn, reused = await self._acquire(target, connect_s)
            left_s = None if total_s is None else total_s - (self.loop.time() - started_s)
            if left_s is not None and left_s <= 0:
                conn.abort(TimeoutError())
                raise TimeoutError("engine did not answer in time")
            resp = UpstreamResponse(conn, sock_read_s)
            conn.start(resp, left_s)
            assert conn.transport is not None
            if isinstance(request, bytes):
                conn.transport.write(request)
            else:
                conn.transport.writelines(request)
            try:
                await resp._head()
                return resp
            except UpstreamDisconnected:
                if attempt or not reused or conn.got_bytes:
                    raise
            except BaseException:  # cancelled or timed out: the engine must see us leave
                resp.close()
                raise
        raise AssertionError("unreachable")

    def _limits(self, timeout: aiohttp.ClientTimeout | None) -> _Limits:
        """(total, read, connect) seconds of ``timeout``; the proxy reuses a few objects."""
        if timeout is None:
            return None, None, None
        found = self._timeouts.get(id(timeout))
        if found is not None and found[0] is timeout:
            return found[1]
        limits = (timeout.sock_connect, timeout.connect, timeout.total)
        connect_s = min((s for s in limits if s), default=None)  # total covers it too
        out = (timeout.total, timeout.sock_read, connect_s)
        if len(self._timeouts) >= 256:
            self._timeouts.clear()
        self._timeouts[id(timeout)] = (timeout, out)
        return out

    def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            bad = OSError(errno.EINVAL, f"not an http(s) URL: {url[:200]!r}")
            raise UpstreamConnectError(parts.hostname or "", parts.port or 0, bad)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        netloc = parts.netloc.rpartition("@")[2]
        prefix = f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\n".encode("latin-1")
        target = _Target(parts.hostname, port, tls, prefix, (parts.hostname, port, tls))
        if len(self._targets) < 4096:
            self._targets[url] = target
        return target

    async def _acquire(self, target: _Target, connect_s: float | None) -> tuple[Connection, bool]:
        """A pooled connection to ``target`` (True), else a new one once the limit allows."""
        key = target.key
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                transport = conn.transport
                if not conn.lost and transport is not None and not transport.is_closing():
                    return conn, True
                self.forget(conn)
            if not self._limit or len(self._open) < self._limit or self._close_one_idle():
                return await self._connect(target, key, connect_s), False
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter

    async def _connect(
        self, target: _Target, key: tuple[str, int, bool], timeout_s: float | None
    ) -> Connection:
        conn = Connection(self, key)
        self._open.add(conn)
        try:
            tls = self._tls_context() if target.tls else None
            coro = self.loop.create_connection(
                lambda: conn, target.host, target.port, ssl=tls,
                server_hostname=target.host if tls is not None else None,
            )  # fmt: skip
            if timeout_s is None:
                await coro
            else:
                async with asyncio.timeout(timeout_s):
                    await coro
        except TimeoutError:
            # A slow connect is a timeout, not a refused connection: it must not read as
            # "the engine is down" (TimeoutError is an OSError; the proxy would mark the
            # endpoint cold on a loaded but healthy engine).
            self.forget(conn)
            raise
        except OSError as exc:
            self.forget(conn)
            raise UpstreamConnectError(target.host, target.port, exc) from None
        except BaseException:
            self.forget(conn)
            raise
        if self._closed:
            conn.abort(UpstreamClosed("the upstream client is closed"))
            raise UpstreamClosed("the upstream client is closed")
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def release(self, conn: Connection) -> None:
        """A connection whose answer ended cleanly: keep it for the next call."""
        if self._closed or conn.lost:
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self._max_idle:
            conn.lost = True
            assert conn.transport is not None
            conn.transport.close()
            self.forget(conn)
            return
        idle.append(conn)
        self._wake_one()

    def forget(self, conn: Connection) -> None:
        """``conn`` is closed or closing: it no longer counts against the limit."""
        if conn.forgotten:
            return
        conn.forgotten = True
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        """Let one call waiting for a connection look again."""
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _close_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                conn = idle.pop()
                conn.lost = True
                if conn.transport is not None:
                    conn.transport.close()
                self.forget(conn)
                return True
        return False

    async def close(self) -> None:
        """Close every connection; answers still being read fail with ``UpstreamClosed``."""
        self._closed = True
        for conn in list(self._open):
            if conn.state == IDLE:
                conn.lost = True
                if conn.transport is not None:
                    conn.transport.close()
                self.forget(conn)
            else:
                conn.abort(UpstreamClosed("the upstream client is closed"))
        self._idle.clear()
        await asyncio.sleep(0)  # let transports deliver their connection_lost


def _encode(
    prefix: bytes, body: bytes, headers: Mapping[str, str] | None
) -> bytes | tuple[bytes, bytes]:
    """The request head (with Content-Length) and body, as one buffer when small."""
    extra = ""
    if headers:
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} contains a line break")
            extra += f"{name}: {value}\r\n"
    head = prefix + f"{extra}Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
    if len(body) < _CONCAT_LIMIT_BYTES:
        return head + body
    return head, body
