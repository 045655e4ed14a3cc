"""The lean front server's request and response: the head parsed, the answer encoded.

``parse_head`` reads the request line and headers of one HTTP/1.1 request, and accepts only
the plain case the front server answers itself: ``POST`` to a hot path, HTTP/1.1, a
``Content-Length`` body (or none), no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, no
control characters, well-formed header names. Anything else returns None and the connection
goes to aiohttp's server, which answers odd requests as it always did (its 400s included).

``FrontRequest`` is the part of aiohttp's ``web.Request`` the generation handlers and
middlewares use (headers, body, app, path, and what ``StreamResponse.prepare`` needs to
stream through aiohttp's own writer). ``encode_response`` writes a plain ``web.Response`` in
one piece, with the headers aiohttp would send (Content-Length, Date, Server, Connection).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion, HttpVersion11
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["FrontRequest", "Head", "encode_response", "parse_head"]

#: A header block whose every line is ``token ":" value`` with no control character but tab
#: (so no bare CR or LF either): checked in one pass before the lines are split.
_LINE = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*"
_HEADER_BLOCK = re.compile(rb"(?:" + _LINE + rb"\r\n)*" + _LINE)
#: Request headers the front server acts on: how the body is framed and the connection kept.
_NOT_PLAIN = frozenset({"transfer-encoding", "expect", "upgrade"})
_CONNECTION = {"keep-alive": True, "close": False}
_SPECIAL = frozenset({"content-length", "connection", *_NOT_PLAIN})


@dataclass(frozen=True, slots=True, init=False)
class Head:
    """A plain request's line and headers, as the front server accepted them."""

    path: str
    headers: CIMultiDictProxy[str]
    content_length: int | None
    keep_alive: bool

    # Written out (init=False): mypyc compiles it; a named tuple's __new__ runs interpreted.
    def __init__(
        self,
        path: str,
        headers: CIMultiDictProxy[str],
        content_length: int | None,
        keep_alive: bool,
    ) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "content_length", content_length)
        object.__setattr__(self, "keep_alive", keep_alive)


def parse_head(head: bytes | bytearray, hot_paths: frozenset[str]) -> Head | None:
    """The head (request line and headers, without the blank line) of a plain hot request,
    or None when aiohttp should have the request (and the connection)."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    if not line.startswith(b"POST ") or not line.endswith(b" HTTP/1.1"):
        return None
    path = line[5:-9].decode("latin-1")
    if path not in hot_paths:
        return None
    pairs: list[tuple[str, str]] = []
    length: int | None = None
    keep_alive = True
    if line_end >= 0:
        block = head[line_end + 2 :]
        if _HEADER_BLOCK.fullmatch(block) is None:
            return None
        for field in block.decode("utf-8", "surrogateescape").split("\r\n"):
            name, _, value = field.partition(":")
            value = value.strip(" \t")
            pairs.append((name, value))
            key = name.lower()
            if key not in _SPECIAL:
                continue
            if key == "content-length":
                if length is not None or not value.isdigit() or not value.isascii():
                    return None
                length = int(value)
            elif key == "connection" and value.lower() in _CONNECTION:
                keep_alive = _CONNECTION[value.lower()]
            else:
                return None
    return Head(path, CIMultiDictProxy(CIMultiDict(pairs)), length, keep_alive)


class FrontRequest:
    """One request served by the front server, shaped like the ``web.Request`` it stands for
    (only what the generation handlers, the middlewares and ``StreamResponse`` use)."""

    __slots__ = ("_body", "_head", "_hooked", "_protocol", "_writer", "app", "task")

    method = "POST"
    version: HttpVersion = HttpVersion11
    match_info: Mapping[str, str] = MappingProxyType({})

    def __init__(self, app: web.Application, head: Head, body: bytes, protocol: BaseProtocol):
        self.app = app
        self._head = head
        self._body = body
        self._protocol = protocol
        self._writer: StreamWriter | None = None
        self._hooked: web.StreamResponse | None = None  # the response the signal was sent for
        self.task: asyncio.Task[Any] | None = None

    @property
    def path(self) -> str:
        return self._head.path

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._head.headers

    @property
    def content_length(self) -> int | None:
        return self._head.content_length

    @property
    def keep_alive(self) -> bool:
        return self._head.keep_alive

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._protocol.transport

    async def read(self) -> bytes:
        return self._body

    @property
    def _payload_writer(self) -> StreamWriter:
        """aiohttp's writer on this connection, for a response the handler prepares itself."""
        if self._writer is None:
            self._writer = StreamWriter(self._protocol, self._protocol._loop)
        return self._writer

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        """The app's ``on_response_prepare`` signal, once per response."""
        if self.app.on_response_prepare and self._hooked is not response:
            self._hooked = response
            await self.app.on_response_prepare.send(cast(web.Request, self), response)


#: Response headers the encoder writes itself.
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


def encode_response(resp: web.StreamResponse, keep_alive: bool) -> bytes | None:
    """A plain, unprepared ``web.Response`` with a bytes body as one HTTP/1.1 message, or
    None when aiohttp's own ``prepare``/``write_eof`` must write it (anything unusual)."""
    if type(resp) is not web.Response or resp.prepared:
        return None
    body = resp.body
    status = resp.status
    if (
        not isinstance(body, bytes)
        or status < 200
        or status in (204, 304)
        or resp.chunked
        or resp.compression
        or getattr(resp, "_cookies", None)
    ):
        return None
    lines = [f"HTTP/1.1 {status} {resp.reason}\r\n"]
    has_type = has_date = has_server = False
    for name, value in resp.headers.items():
        key = name.lower()
        if key in _OWN_HEADERS:
            continue
        has_type = has_type or key == "content-type"
        has_date = has_date or key == "date"
        has_server = has_server or key == "server"
        lines.append(f"{name}: {value}\r\n")
    if not has_type and body:
        lines.append("Content-Type: application/octet-stream\r\n")
    if not has_date:
        lines.append(f"Date: {rfc822_formatted_time()}\r\n")
    if not has_server:
        lines.append(f"Server: {SERVER_SOFTWARE}\r\n")
    if not keep_alive:
        lines.append("Connection: close\r\n")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    text = "".join(lines)
    if text.count("\n") != len(lines) + 1 or text.count("\r") != len(lines) + 1:
        return None  # a CR or LF inside a header: aiohttp's writer refuses it
    return text.encode("utf-8") + body
