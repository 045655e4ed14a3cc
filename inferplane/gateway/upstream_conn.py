"""The connection half of the upstream client: one keep-alive HTTP/1.1 connection as an
asyncio Protocol that parses each answer as it arrives.

``Connection.data_received`` parses the head, then the body by Content-Length, chunked coding or
until the engine closes, and hands body bytes to the current :class:`UpstreamResponse`,
waking its reader only when it asked for them (a whole-body reader is woken once, at the
end). A connection whose answer ended cleanly goes back to its pool (``UpstreamClient`` in
``upstream``); any failure (a malformed answer, a timeout, a close by the reader before the
end) aborts it. Failures are aiohttp's exception classes, so callers handle both clients
alike (see ``upstream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol, cast

from inferplane.gateway.upstream_response import (
    ResponseHeaders,
    UpstreamDisconnected,
    UpstreamProtocolError,
    UpstreamResponse,
)

__all__ = ["BODY", "HEAD", "IDLE", "Connection"]

_MAX_HEAD_BYTES = 64 * 1024
_MAX_CHUNK_LINE_BYTES = 1024
_DRAIN_LIMIT_S = 1.0  # how long a finished reader's leftover body may take to arrive

# parser states of a connection
IDLE, HEAD, BODY = 0, 1, 2
# chunked-coding states
_SIZE, _DATA, _CRLF, _TRAILER = 0, 1, 2, 3


class _Pool(Protocol):
    """What a connection needs of its pool."""

    loop: asyncio.AbstractEventLoop

    def release(self, conn: Connection) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection and the parser of the answer currently on it."""

    def __init__(self, pool: _Pool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.forgotten = False
        self.resp: UpstreamResponse | None = None
        self.state = IDLE
        self.got_bytes = False
        self.head = b""
        self.remaining = 0  # Content-Length bytes still due
        self.chunked = False
        self.until_close = False
        self.keep_alive = True
        self.cstate = _SIZE
        self.cbuf = b""
        # The current answer's total-time limit: ``deadline_at`` (None: none), checked by a
        # timer armed at or before it; a clean answer leaves the timer armed for the next one
        # (one ``call_at`` per connection while limits stay alike, not one per answer).
        self.deadline_at: float | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_armed_at = 0.0
        self.draining: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not TCP: nothing to tune
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.state == IDLE:  # bytes nobody asked for: the connection is unusable
            self.abort(UpstreamProtocolError("unexpected bytes on an idle connection"))
            return
        self.got_bytes = True
        try:
            if self.state == HEAD:
                data = self._feed_head(data)
            if self.state == BODY and data:
                self._feed_body(data)
        except UpstreamProtocolError as exc:
            self.abort(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_timers()
        if self.state == BODY and self.until_close:
            self._complete()
        elif self.state != IDLE:
            self._end(UpstreamDisconnected("engine closed the connection"))
        self.pool.forget(self)

    # ---- one request --------------------------------------------------------------------

    def start(self, resp: UpstreamResponse, total_s: float | None) -> None:
        self.resp = resp
        self.state = HEAD
        self.got_bytes = False
        self.head = b""
        self.cstate = _SIZE
        self.cbuf = b""
        if total_s is None:
            self.deadline_at = None
            return
        at = self.deadline_at = self.loop.time() + total_s
        if self.deadline is None or self.deadline_armed_at > at:
            self._arm_deadline(at)

    def _arm_deadline(self, at: float) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_at(at, self._check_deadline)
        self.deadline_armed_at = at

    def _check_deadline(self) -> None:
        """The deadline timer fired: time the answer out when its limit has passed, else
        wait for the current limit (a later answer's)."""
        self.deadline = None
        at = self.deadline_at
        if at is None or self.state == IDLE:
            return
        if self.loop.time() >= at:
            self.timed_out()
        else:
            self._arm_deadline(at)

    def timed_out(self) -> None:
        self.abort(TimeoutError("engine did not answer in time"))

    def abort(self, exc: BaseException) -> None:
        """End the current answer with ``exc`` and drop the connection."""
        self._end(exc)
        self.lost = True
        if self.transport is not None:
            self.transport.abort()
        self.pool.forget(self)

    def drain(self) -> None:
        """The reader is done before the body ended: pool the connection when it does."""
        self.draining = self.loop.call_later(_DRAIN_LIMIT_S, self.timed_out)

    def _end(self, exc: BaseException) -> None:
        resp = self.resp
        self._stop_timers()
        self.resp = None
        self.state = IDLE
        if resp is not None:
            resp._fail(exc)

    def _stop_timers(self, keep_deadline: bool = False) -> None:
        self.deadline_at = None
        if self.deadline is not None and not keep_deadline:
            self.deadline.cancel()
            self.deadline = None
        if self.draining is not None:
            self.draining.cancel()
            self.draining = None

    def _complete(self) -> None:
        resp = self.resp
        self._stop_timers(keep_deadline=self.keep_alive and not self.lost)
        self.resp = None
        self.state = IDLE
        if resp is not None:
            resp._done = True
            resp._conn = None
            resp._wake()
        if self.keep_alive and not self.lost and not self.until_close:
            self.pool.release(self)
        elif not self.lost:
            self.lost = True
            if self.transport is not None:
                self.transport.close()
            self.pool.forget(self)

    # ---- parsing ------------------------------------------------------------------------

    def _feed_head(self, data: bytes) -> bytes:
        buf = self.head + data if self.head else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise UpstreamProtocolError("response head too large")
                self.head = buf
                return b""
            self.head = b""
            status = self._parse_head(buf[:end])
            buf = buf[end + 4 :]
            if status >= 200 or status == 101:
                return buf
            if not buf:  # an informational answer (100 Continue): the real one follows
                return b""

    def _parse_head(self, head: bytes) -> int:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise UpstreamProtocolError(f"bad status line {lines[0][:64]!r}")
        status = int(parts[1])
        if not 100 <= status <= 999:
            raise UpstreamProtocolError(f"bad status {status}")
        if status < 200:
            return status
        by_name: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise UpstreamProtocolError(f"bad header line {line[:64]!r}")
            by_name[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
        resp = self.resp
        assert resp is not None
        resp.status, resp.headers = status, ResponseHeaders(by_name)
        resp._wake()
        self._body_mode(status, by_name, http10=parts[0] == b"HTTP/1.0")
        return status

    def _body_mode(self, status: int, by_name: dict[str, str], *, http10: bool) -> None:
        connection = by_name.get("connection", "").lower()
        self.keep_alive = "keep-alive" in connection if http10 else "close" not in connection
        self.chunked = "chunked" in by_name.get("transfer-encoding", "").lower()
        self.until_close = False
        self.state = BODY
        if status in (204, 304):
            self._complete()
        elif self.chunked:
            pass
        elif "content-length" in by_name:
            raw = by_name["content-length"]
            if not raw.isdigit():
                raise UpstreamProtocolError(f"bad Content-Length {raw[:32]!r}")
            self.remaining = int(raw)
            if not self.remaining:
                self._complete()
        else:
            self.until_close = True

    def _feed_body(self, data: bytes) -> None:
        if self.chunked:
            self._feed_chunked(data)
            return
        if self.until_close:
            self._deliver(data)
            return
        if len(data) > self.remaining:
            raise UpstreamProtocolError("engine sent more than its Content-Length")
        self.remaining -= len(data)
        self._deliver(data)
        if not self.remaining:
            self._complete()

    def _deliver(self, data: bytes) -> None:
        resp = self.resp
        if resp is not None and not resp._discard:
            resp._chunks.append(data)
            if resp._wake_any:
                resp._wake()

    def _feed_chunked(self, data: bytes) -> None:
        buf = self.cbuf + data if self.cbuf else data
        pos, size = 0, len(buf)
        while pos < size and self.state == BODY:
            if self.cstate == _DATA:
                take = buf[pos : pos + self.remaining]
                pos += len(take)
                self.remaining -= len(take)
                self._deliver(take)
                if self.remaining:
                    break
                self.cstate = _CRLF
                continue
            if self.cstate == _CRLF:
                if size - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise UpstreamProtocolError("chunk not followed by CRLF")
                pos += 2
                self.cstate = _SIZE
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if size - pos > _MAX_CHUNK_LINE_BYTES:
                    raise UpstreamProtocolError("chunk size line too long")
                break
            line, pos = buf[pos:end], end + 2
            if self.cstate == _TRAILER:
                if not line:
                    self._complete()
                continue
            self._chunk_size(line)
        self.cbuf = buf[pos:] if self.state == BODY else b""

    def _chunk_size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0].strip()
        try:
            self.remaining = int(digits, 16)
        except ValueError:
            raise UpstreamProtocolError(f"bad chunk size {line[:32]!r}") from None
        if self.remaining < 0:
            raise UpstreamProtocolError("negative chunk size")
        self.cstate = _DATA if self.remaining else _TRAILER
