"""The I/O half of a hedging race: opening an attempt up to its first token, stopping one.

``open_attempt`` sends one attempt and reads until its first token (a stream's first event
carrying text, or anything that is not the chat stream's opening role chunk; a whole
answer's first byte); ``Primed`` hands the proxy that response with the bytes read so far
put back in front; ``stop`` cancels an attempt (its connection is closed, so the engine
aborts the request); ``failure_of`` and ``race_failure`` say how an attempt lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from inferplane.core.retry import FailureKind, failure_of_status
from inferplane.gateway.sse_filter import DONE, has_token

__all__ = ["Primed", "failure_of", "has_answer", "open_attempt", "race_failure", "stop"]

_MAX_HEAD_BYTES = 65_536  # stop looking for the first token after this much (it is an answer)


def failure_of(exc: BaseException) -> FailureKind:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return FailureKind.CONNECT
    if isinstance(exc, TimeoutError):
        return FailureKind.TIMEOUT
    return FailureKind.RESET


def race_failure(status: int, head: bytes) -> FailureKind | None:
    """Whether an attempt that answered lost the race by failing (None: it is an answer)."""
    if status == 200:
        return None if head else FailureKind.RESET
    kind = failure_of_status(status)
    return kind if kind is not None and kind.retryable else None


def stop(task: asyncio.Task[tuple[aiohttp.ClientResponse, bytes]]) -> None:
    """Stop a racer: cancelling closes its connection (the engine aborts); one that had
    already answered has its response closed."""
    if task.done():
        if not task.cancelled() and task.exception() is None:
            task.result()[0].close()
        return
    task.cancel()
    task.add_done_callback(_close_late)


def _close_late(task: asyncio.Task[tuple[aiohttp.ClientResponse, bytes]]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result()[0].close()


async def open_attempt(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    client_timeout: aiohttp.ClientTimeout,
    *,
    stream: bool,
) -> tuple[aiohttp.ClientResponse, bytes]:
    """Send one attempt and read up to its first token (its first byte when not a stream)."""
    resp = await session.post(url, data=body, headers=headers, timeout=client_timeout)
    try:
        if resp.status != 200:
            return resp, b""
        head = b""
        while True:
            data = await resp.content.readany()
            head += data
            if not data or not stream or len(head) > _MAX_HEAD_BYTES or has_answer(head):
                return resp, head
    except BaseException:
        resp.close()
        raise


def has_answer(head: bytes) -> bool:
    """Whether the complete SSE events in ``head`` include more than an opening role chunk:
    a token, a finish, usage, an error, [DONE] or anything unparsable."""
    if b"\r" in head:
        head = head.replace(b"\r\n", b"\n")
    for event in head.split(b"\n\n")[:-1]:
        if not event.startswith(b"data:"):
            continue
        payload = event[5:].strip()
        if payload.startswith(DONE[6:]):
            return True
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(obj, dict) or "error" in obj or obj.get("usage"):
            return True
        choices = obj.get("choices")
        if has_token(choices) or not choices:
            return True
        if any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
            return True
    return False


class _Content:
    """``resp.content`` with the bytes read during the race in front."""

    def __init__(self, resp: aiohttp.ClientResponse, head: bytes) -> None:
        self._resp, self._head = resp, head

    async def iter_any(self) -> AsyncIterator[bytes]:
        if self._head:
            head, self._head = self._head, b""
            yield head
        async for data in self._resp.content.iter_any():
            yield data

    def take_head(self) -> bytes:
        head, self._head = self._head, b""
        return head


class Primed:
    """A response whose first bytes were read during the race: reads replay them first."""

    def __init__(self, resp: aiohttp.ClientResponse, head: bytes) -> None:
        self._resp = resp
        self.content = _Content(resp, head)

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Any:
        return self._resp.headers

    async def read(self) -> bytes:
        head = self.content.take_head()
        return head + await self._resp.read()

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resp, name)

    async def __aenter__(self) -> Primed:
        await self._resp.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._resp.__aexit__(exc_type, exc, tb)
