"""A lean Redis client: RESP2 over one pipelined asyncio connection.

The shared store makes one or two small calls on every request (a quota take, a workflow
read, a ledger delta). redis-py's asyncio client spends about 90-150 us of CPU on each of
them (a pool checkout, a command packer written for every case, a parser that awaits a
stream ``readline`` per reply element); this client spends about 25 us, and that is the
difference between a Redis-state gateway and an in-memory one on loopback.

How it works: one connection (an :class:`asyncio.Protocol`), every command written at once
and answered in order, so a FIFO of futures pairs replies with callers and concurrent
callers share the connection without a pool (Redis runs one command at a time anyway).
A caller that gives up (timeout, cancellation) leaves its future in the FIFO; the late
reply is dropped when it comes, so the stream never goes out of step. A connection whose
oldest reply is overdue by ``stale_s`` is dropped and every caller on it fails at once
(the next call reconnects); so is one that has ``max_pending`` replies owed.

Failures: a lost or refused connection raises :class:`ConnectionError`, a command past its
deadline :class:`TimeoutError`, an error reply :class:`ReplyError`. No retries: the caller
(:class:`~inferplane.state.resilient.ResilientStore`) decides.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

__all__ = ["Address", "ReplyError", "RespClient", "Script", "pack_command", "parse_reply"]

Arg = bytes | str | int | float


class ReplyError(Exception):
    """Redis answered a command with an error reply (``-ERR ...``)."""


class _Incomplete(Exception):
    """The buffer ends inside a reply."""


_INCOMPLETE = _Incomplete()


def pack_command(args: Sequence[Arg]) -> bytes:
    """One command in RESP: an array of bulk strings (floats as ``repr``, exact)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if type(a) is str else a if type(a) is bytes else _encode(a)
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _encode(a: Arg) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, float):
        return repr(a).encode()
    return b"%d" % a


def parse_reply(buf: bytes, pos: int) -> tuple[Any, int]:
    """The reply starting at ``buf[pos]`` and where the next one starts; raise
    ``_Incomplete`` if the buffer ends first. Error replies are returned as
    :class:`ReplyError` values (so one error inside a transaction stays in its place)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _INCOMPLETE
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        stop = end + 2 + n
        if len(buf) < stop + 2:
            raise _INCOMPLETE
        return buf[end + 2 : stop], stop + 2
    if kind == 58:  # : integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 42:  # * array
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        items: list[Any] = []
        pos = end + 2
        size = len(buf)
        for _ in range(n):  # bulk strings inline (most replies), the rest recursively
            if pos < size and buf[pos] == 36:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    raise _INCOMPLETE
                length = int(buf[pos + 1 : end])
                if length < 0:
                    items.append(None)
                    pos = end + 2
                    continue
                pos = end + 2 + length
                if size < pos + 2:
                    raise _INCOMPLETE
                items.append(buf[end + 2 : pos])
                pos += 2
            else:
                item, pos = parse_reply(buf, pos)
                items.append(item)
        return items, pos
    if kind == 43:  # + simple string
        return buf[pos + 1 : end], end + 2
    if kind == 45:  # - error
        return ReplyError(buf[pos + 1 : end].decode(errors="replace")), end + 2
    raise ValueError(f"not a RESP2 reply: {buf[pos : pos + 16]!r}")


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect, from a ``redis://``, ``rediss://`` or ``unix://`` URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a unix socket
    tls: bool = False
    username: str | None = None
    password: str | None = None
    db: int = 0

    @classmethod
    def from_url(cls, url: str) -> Address:
        u = urlsplit(url)
        if u.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
        query = dict(p.split("=", 1) for p in u.query.split("&") if "=" in p)
        db = query.get("db", u.path.strip("/") if u.scheme != "unix" else "") or "0"
        return cls(
            host=u.hostname or "127.0.0.1",
            port=u.port or 6379,
            path=u.path if u.scheme == "unix" else None,
            tls=u.scheme == "rediss",
            username=unquote(u.username) if u.username else None,
            password=unquote(u.password) if u.password else None,
            db=int(db),
        )


class Script:
    """A Lua script, run by its SHA-1 (``EVALSHA``), loaded by ``EVAL`` when the server
    lacks it (first use, or a restarted server)."""

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()  # Redis names scripts by SHA-1


class _Connection(asyncio.Protocol):
    def __init__(self, client: RespClient) -> None:
        self._client = client
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._chunks: list[bytes] = []  # the start of a reply not yet whole
        self._have = 0  # bytes in _chunks
        self._need = 0  # bytes the reply needs at least (a long bulk string's whole size)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._chunks:  # inside a reply: parse again only once it can be whole
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            data, self._chunks = b"".join(self._chunks), []
        pos, size, pending = 0, len(data), self.pending
        try:
            while pos < size:
                reply, pos = parse_reply(data, pos)
                if not pending:  # a reply nobody asked for: the stream is out of step
                    self.abort("unexpected reply")
                    return
                fut = pending.popleft()[0]
                if fut.done():  # the caller gave up
                    continue
                if isinstance(reply, ReplyError):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
        except _Incomplete:
            rest = data[pos:]
            self._chunks, self._have, self._need = [rest], len(rest), _size_hint(rest)
        except ValueError:
            self.abort("malformed reply")

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection to Redis lost ({exc or 'closed by the server'})")

    def abort(self, why: str) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._fail(why)

    def _fail(self, why: str) -> None:
        self.transport = None
        self._client._dropped(self)
        while self.pending:
            fut = self.pending.popleft()[0]
            if not fut.done():
                fut.set_exception(ConnectionError(why))


class RespClient:
    """Commands to one Redis server over one pipelined connection (see the module doc)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        op_timeout_s: float = 0.05,
        connect_timeout_s: float | None = None,
        stale_s: float | None = None,
        max_pending: int = 10_000,
    ) -> None:
        self.address = Address.from_url(url)
        self.op_timeout_s = op_timeout_s
        self.connect_timeout_s = op_timeout_s if connect_timeout_s is None else connect_timeout_s
        self.stale_s = max(1.0, 10 * op_timeout_s) if stale_s is None else stale_s
        self.max_pending = max_pending
        self._conn: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self.connects = 0  # connections opened (a reconnect after a loss counts)

    # ---- commands ------------------------------------------------------------------------

    async def execute(self, *args: Arg) -> Any:
        """Send one command; its reply (bytes, int, None or a list of those)."""
        conn = self._conn if self._conn is not None else await self._connect()
        fut = self._send(conn, pack_command(args), 1)[0]
        async with asyncio.timeout(self.op_timeout_s):
            return await fut

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Send several commands in one write; their replies in order (an error reply is
        raised, after every reply has come)."""
        conn = self._conn if self._conn is not None else await self._connect()
        data = b"".join(pack_command(c) for c in commands)
        futs = self._send(conn, data, len(commands))
        out: list[Any] = []
        failed: BaseException | None = None
        async with asyncio.timeout(self.op_timeout_s):
            for fut in futs:
                try:
                    out.append(await fut)
                except ReplyError as exc:
                    failed = failed or exc
                    out.append(exc)
        if failed is not None:
            raise failed
        return out

    async def transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """``MULTI``, the commands, ``EXEC``: applied together; EXEC's replies."""
        replies = await self.pipeline([("MULTI",), *commands, ("EXEC",)])
        result = replies[-1]
        if not isinstance(result, list):
            raise ReplyError("transaction aborted")
        return result

    async def run_script(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """``EVALSHA`` (``EVAL`` when the server does not have the script yet)."""
        try:
            return await self.execute(b"EVALSHA", script.sha, len(keys), *keys, *args)
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.execute(b"EVAL", script.source, len(keys), *keys, *args)

    def _send(self, conn: _Connection, data: bytes, n: int) -> list[asyncio.Future[Any]]:
        pending = conn.pending
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if pending and (now - pending[0][1] > self.stale_s or len(pending) >= self.max_pending):
            conn.abort("Redis is not answering (replies overdue)")
            raise ConnectionError("Redis is not answering (replies overdue)")
        if conn.transport is None:
            raise ConnectionError("connection to Redis lost")
        futs = [loop.create_future() for _ in range(n)]
        pending.extend((f, now) for f in futs)
        conn.transport.write(data)
        return futs

    # ---- connection ----------------------------------------------------------------------

    async def _connect(self) -> _Connection:
        """The live connection, opening it if needed. Concurrent callers share one try,
        which goes on (bounded by ``connect_timeout_s``) when a caller gives up first."""
        connecting = self._connecting
        if connecting is None or connecting.done():
            connecting = self._connecting = asyncio.ensure_future(self._open())
            connecting.add_done_callback(_retrieve)
        return await asyncio.shield(connecting)

    async def _open(self) -> _Connection:
        loop, a = asyncio.get_running_loop(), self.address
        where = a.path or f"{a.host}:{a.port}"
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if a.path is not None:
                    _, conn = await loop.create_unix_connection(lambda: _Connection(self), a.path)
                else:
                    tls = ssl.create_default_context() if a.tls else None
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self), a.host, a.port, ssl=tls
                    )
                for fut in self._send(conn, *_handshake(a)):
                    await fut
        except (TimeoutError, ReplyError, ConnectionError) as exc:
            if conn is not None:
                conn.abort("handshake failed")
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            raise ConnectionError(f"cannot connect to Redis at {where}: {why}") from None
        if conn.transport is None:  # lost during the handshake
            raise ConnectionError(f"connection to Redis at {where} lost")
        self._conn = conn
        self.connects += 1
        return conn

    def _dropped(self, conn: _Connection) -> None:
        if self._conn is conn:
            self._conn = None

    @property
    def connected(self) -> bool:
        return self._conn is not None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()


def _size_hint(head: bytes) -> int:
    """How many bytes a reply starting with ``head`` needs at least (a bulk string's
    header tells its length, so a large value is parsed once, not once per chunk)."""
    end = head.find(b"\r\n")
    if head[:1] != b"$" or end < 0:
        return 0
    return end + 2 + int(head[1:end]) + 2


def _retrieve(fut: asyncio.Future[_Connection]) -> None:
    """Mark a failed connection attempt's error as seen (its callers may have left)."""
    if not fut.cancelled():
        fut.exception()


def _handshake(a: Address) -> tuple[bytes, int]:
    """AUTH and SELECT as the address asks (nothing for the default user and db 0)."""
    hello: list[tuple[Arg, ...]] = []
    if a.password is not None:
        hello.append(
            ("AUTH", a.password) if a.username is None else ("AUTH", a.username, a.password)
        )
    if a.db:
        hello.append(("SELECT", a.db))
    return b"".join(pack_command(c) for c in hello), len(hello)
