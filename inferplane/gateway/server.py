"""A lean HTTP/1.1 front server for the generation routes, in front of aiohttp's server.

The gateway spends a large share of its CPU per call on its HTTP server. The two hot routes
(``POST /v1/chat/completions`` and ``/v1/completions``) are plain requests: a JSON body with
a Content-Length, a JSON answer or an SSE stream. ``FrontProtocol`` reads those itself
(``server_request.parse_head``), runs the app's middlewares and handler on a
``FrontRequest`` and writes a plain answer in one piece; a handler that streams writes through
aiohttp's own ``StreamWriter`` on the same connection. Every other request (another path, a
chunked or ``Expect`` body, HTTP/1.0, a body over the limit, a malformed head) hands the
connection, with every byte not yet consumed, to aiohttp's request handler, which serves it
and the rest of that connection exactly as before.

Semantics kept from aiohttp's server: a client that disconnects cancels its handler (which
aborts the engine's request), keep-alive with a 75 s idle timeout, ``Connection: close``,
pipelined requests answered in order, graceful shutdown (in-flight calls finish, then
connections close). ``FrontSite`` is a ``TCPSite`` that listens with this protocol when the
app declares its hot routes (``FRONT_ROUTES``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.tcp_helpers import tcp_nodelay
from aiohttp.web_runner import AppRunner, TCPSite
from aiohttp.web_server import Server

from inferplane.gateway.server_request import FrontRequest, Head, encode_response, parse_head

__all__ = ["FRONT_ROUTES", "FrontRoutes", "FrontSite", "start_server", "tune_gc"]

try:
    # The compiled build (bench/gateway_compile.py, mypyc) compiles the methods of the two
    # classes built on aiohttp's (whose ``__slots__`` a native class cannot take) as methods
    # of plain Python classes. mypy_extensions comes with mypy; without it nothing changes.
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover

    def mypyc_attr(*_: object, **__: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls


log = logging.getLogger("inferplane.gateway.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The longest request head (line and headers) the front server reads itself: aiohttp's
#: longest line, so a longer head goes to aiohttp, whose limits (and 400s) then decide.
MAX_HEAD_BYTES = 8190
#: An idle keep-alive connection is closed after this long (aiohttp's default).
KEEPALIVE_TIMEOUT_S = 75.0
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: 84\r\n\r\n"
    b'{"error":{"message":"internal gateway error","type":"server_error","code":"internal"}}'
)


@dataclass(frozen=True, slots=True)
class FrontRoutes:
    """The routes the front server answers itself: path -> POST handler."""

    handlers: Mapping[str, Handler]
    max_body_bytes: int


FRONT_ROUTES = web.AppKey("front_routes", FrontRoutes)


class Front:
    """State shared by one site's connections: the handler chain and the open connections."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, app: web.Application, server: Server
    ) -> None:
        routes = app[FRONT_ROUTES]
        self.loop, self.app, self.aiohttp = loop, app, server
        self.max_body_bytes = routes.max_body_bytes
        self.hot_paths = frozenset(routes.handlers)
        self.handlers = {p: _chain(app, h) for p, h in routes.handlers.items()}
        # The app is frozen once its runner is set up (before any site starts): its
        # response-prepare hooks (a worker's tag) are known now, not looked up per call.
        self.prepare_hooks = bool(app.on_response_prepare)
        self.connections: set[FrontProtocol] = set()
        self.closing = False
        self.served = 0  # requests answered here
        self.handed_off = 0  # connections given to aiohttp's server

    def protocol(self) -> FrontProtocol:
        return FrontProtocol(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Let in-flight calls finish (up to ``timeout_s``), then close every connection."""
        self.closing = True
        for conn in list(self.connections):
            if conn.request is None:
                conn.close()
        deadline = self.loop.time() + timeout_s
        while any(c.request is not None for c in self.connections):
            if self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()


def _chain(app: web.Application, handler: Handler) -> Handler:
    """The handler wrapped in the app's middlewares, as aiohttp would call it."""
    for middleware in reversed(app.middlewares):
        handler = functools.partial(middleware, handler=handler)
    return handler


@mypyc_attr(native_class=False)
class FrontProtocol(BaseProtocol):
    """One client connection: hot requests served here, anything else handed to aiohttp."""

    def __init__(self, front: Front) -> None:
        super().__init__(front.loop)
        self.front = front
        self.buf: bytes | bytearray = b""
        self._pending: tuple[Head, int] | None = None  # a head whose body is incomplete
        self.request: FrontRequest | None = None  # the one being served
        self._idle_since_s = front.loop.time()
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tcp_nodelay(cast(asyncio.Transport, transport), True)
        self.front.connections.add(self)
        self._idle = self.front.loop.call_later(KEEPALIVE_TIMEOUT_S, self._check_idle)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.front.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self.request is not None and self.request.task is not None:
            self.request.task.cancel()  # the client left: stop the call (and the engine's)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if not buf:
            self.buf = data
        elif isinstance(buf, bytearray):
            buf += data  # a large body in many pieces: appended, not copied each time
        else:
            self.buf = bytearray(buf)
            self.buf += data
        if self.request is None and not self._paused:
            self._next()
        elif len(self.buf) > self.front.max_body_bytes + MAX_HEAD_BYTES:
            self.pause_reading()  # pipelined beyond bounds: wait for the current answer

    def resume_writing(self) -> None:
        """The client has read its answers: serve what it sent meanwhile."""
        super().resume_writing()
        if self.request is None and self.buf and self.transport is not None:
            self._next()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _check_idle(self) -> None:
        self._idle = None
        if self.transport is None:
            return
        left_s = self._idle_since_s + KEEPALIVE_TIMEOUT_S - self.front.loop.time()
        if self.request is None and self._pending is None and left_s <= 0:
            self.close()
            return
        self._idle = self.front.loop.call_later(max(left_s, 1.0), self._check_idle)

    def _next(self) -> None:
        """Serve the next complete request in the buffer, or wait for more bytes."""
        buf, front = self.buf, self.front
        pending = self._pending
        if pending is None:
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._hand_off()
                return
            head = parse_head(buf[:end], front.hot_paths)
            if head is None or (head.content_length or 0) > front.max_body_bytes:
                self._hand_off()
                return
            pending = self._pending = (head, end + 4)
        head, start = pending
        size = start + (head.content_length or 0)
        if len(buf) < size:
            return  # the body is still arriving (its head is kept, not parsed again)
        self._pending = None
        body, self.buf = bytes(buf[start:size]), buf[size:]
        front.served += 1
        request = self.request = FrontRequest(front.app, head, body, self)
        request.task = front.loop.create_task(self._serve(request))

    def _hand_off(self) -> None:
        """Give the connection (and the bytes not yet consumed) to aiohttp's handler."""
        transport, data = self.transport, self.buf
        if transport is None:
            return
        self.front.connections.discard(self)
        self.front.handed_off += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        handler = self.front.aiohttp()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._reading_paused:
            self.resume_reading()
        self.buf, self._pending = b"", None
        if data:
            handler.data_received(bytes(data))

    async def _serve(self, request: FrontRequest) -> None:
        keep_alive = False
        try:
            handler = self.front.handlers[request.path]
            response = await handler(cast(web.Request, request))
            keep_alive = await self._respond(request, response)
        except (asyncio.CancelledError, ConnectionError):
            pass  # the client left (the transport is closed or closing)
        except Exception:
            log.exception("front server failed to answer", extra={"path": request.path})
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(_ERROR_500)
        finally:
            self.request = None
            self._idle_since_s = self.front.loop.time()
        if not keep_alive or self.front.closing or self.transport is None:
            self.close()
            return
        if self._reading_paused:
            self.resume_reading()
        # A client that reads slowly gets its next answer once it has read (resume_writing).
        if not self._paused and self.request is None and self.buf:
            self._next()

    async def _respond(self, request: FrontRequest, response: web.StreamResponse) -> bool:
        """Write the handler's answer; whether the connection stays open."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        if self.front.prepare_hooks and not response.prepared:  # a worker's tag goes first
            await request._prepare_hook(response)
        keep_alive = request.keep_alive and response.keep_alive is not False
        data = encode_response(response, keep_alive)
        if data is not None:
            transport.write(data)
            return keep_alive
        await response.prepare(cast(web.Request, request))
        await response.write_eof()
        return bool(response.keep_alive)


@mypyc_attr(native_class=False)
class FrontSite(TCPSite):
    """A TCP site whose connections go to the front server when the app has hot routes."""

    __slots__ = ("_front", "_front_shutdown_s")

    def __init__(self, runner: AppRunner, *args: Any, **kwargs: Any) -> None:
        self._front_shutdown_s = float(kwargs.pop("front_shutdown_timeout_s", 60.0))
        super().__init__(runner, *args, **kwargs)
        self._front: Front | None = None

    @property
    def front(self) -> Front | None:
        """The front server's state (None when the app has no hot routes)."""
        return self._front

    async def start(self) -> None:
        runner = cast(AppRunner, self._runner)
        server = runner.server
        if FRONT_ROUTES not in runner.app or server is None:
            await super().start()
            return
        self._runner._reg_site(self)  # what BaseSite.start does
        loop = asyncio.get_running_loop()
        self._front = Front(loop, runner.app, server)
        self._server = await loop.create_server(
            self._front.protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        # uvloop's server gives a list where typeshed says tuple (compiled code checks it)
        sockets: list[Any] = list(cast(Any, self._server).sockets)
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        if self._front is not None:
            await self._front.shutdown(self._front_shutdown_s)


async def start_server(
    app: web.Application, host: str, port: int, shutdown_timeout_s: float = 60.0
) -> tuple[AppRunner, int]:
    """Start serving ``app``; returns the runner and the bound port (port 0 picks one).

    Handler cancellation is on: a client that disconnects cancels its handler, which closes
    the upstream connection and so aborts the engine's work.
    """
    runner = AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout_s
    )
    await runner.setup()
    site = FrontSite(runner, host, port, backlog=2048, front_shutdown_timeout_s=shutdown_timeout_s)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)


#: Young-generation threshold of the cyclic GC while serving (CPython's default is 700).
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a server (the overhead bench: ~10% of
    the gateway's CPU went to collections). What exists once the gateway has started (the
    imported modules, config, routing state) lives as long as the process: ``gc.freeze``
    keeps it out of every later scan. A call allocates a few hundred short-lived containers
    that reference counting frees anyway, so young collections run less often.
    """
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
