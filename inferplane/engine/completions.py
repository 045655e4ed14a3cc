"""The generation endpoints' answer: stream or collect the tokens of one request.

``respond`` takes a validated request already submitted to the driver and writes either
an SSE stream (one prebuilt chunk per token, written together when several arrive in
one wake-up; a chat stream's role delta goes with its first output, as vLLM's and
SGLang's do) or one JSON body. A request that fails inside the engine (a crash) has its
connection cut without ``[DONE]``, as a dying server would. Stop strings are matched on
the decoded text; the request is then aborted in the model so its slot frees at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import orjson
from aiohttp import web

from inferplane.engine.driver import EngineDriver, RequestStream
from inferplane.engine.protocol import ApiKind, GenerationRequest
from inferplane.engine.responses import DONE, ResponseFormat, usage
from inferplane.engine.types import FinishReason
from inferplane.tokenizer import StreamDecoder, Tokenizer

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
}


class _StopMatcher:
    """Finds the first stop string in the growing text; keeps the text before it."""

    __slots__ = ("_longest", "_stops", "text")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._longest = max(len(s) for s in stops)
        self.text = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """The part of ``delta`` to emit, and whether a stop string was hit."""
        start = max(0, len(self.text) - self._longest)
        combined = self.text + delta
        hits = [i for i in (combined.find(s, start) for s in self._stops) if i >= 0]
        if not hits:
            self.text = combined
            return delta, False
        cut = min(hits)
        emitted = combined[len(self.text) : max(cut, len(self.text))]
        self.text = combined[:cut]
        return emitted, True


def _finish_reason(stream: RequestStream, stopped: bool) -> str:
    if stopped:
        return "stop"
    assert stream.finished is not None
    return stream.finished.reason.value


def _usage_of(gen: GenerationRequest, stream: RequestStream) -> dict[str, object]:
    finished = stream.finished
    num_cached = finished.num_cached_tokens if finished else stream.num_cached_tokens
    return usage(len(gen.prompt_token_ids), stream.num_tokens, num_cached)


def _cut(request: web.Request) -> None:
    """Drop the connection mid-response, the way a crashed server does."""
    transport = request.transport
    if transport is not None:
        transport.close()


class Completion:
    """Writes the answer of one submitted request (see the module docstring)."""

    def __init__(
        self,
        driver: EngineDriver,
        tokenizer: Tokenizer,
        gen: GenerationRequest,
        stream: RequestStream,
        fmt: ResponseFormat,
    ) -> None:
        self._driver = driver
        self._tokenizer = tokenizer
        self._gen = gen
        self._stream = stream
        self._fmt = fmt
        self._decoder: StreamDecoder = tokenizer.stream_decoder(gen.prompt_token_ids[-1])
        self._stop = _StopMatcher(gen.stop) if gen.stop else None
        self.stopped = False
        # vLLM and SGLang open a chat stream with the role delta when the first output
        # arrives, not on arrival: a call waiting at the engine shows nothing until then
        self._opening = fmt.role_chunk() if gen.kind is ApiKind.CHAT else b""

    def _failed(self) -> bool:
        finished = self._stream.finished
        return not self.stopped and finished is not None and finished.reason is FinishReason.ERROR

    def _stop_now(self) -> None:
        self.stopped = True
        self._driver.abort(self._stream.request_id)

    def _opened(self, data: bytes) -> bytes:
        """``data`` after the stream's opening chunk, the first time (module doc)."""
        if not self._opening:
            return data
        data, self._opening = self._opening + data, b""
        return data

    def _chunks(self, tokens: Sequence[int]) -> bytes:
        fmt, decoder = self._fmt, self._decoder
        if self._stop is None:
            parts = [decoder.push_json(t) for t in tokens]
            return b"".join([fmt.token_chunk(p) for p in parts if p])
        out: list[bytes] = []
        for token_id in tokens:
            emitted, hit = self._stop.feed(decoder.push(token_id))
            if emitted:
                out.append(fmt.token_chunk(orjson.dumps(emitted)[1:-1]))
            if hit:
                self._stop_now()
                break
        return b"".join(out)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        # a client that went away: the handler's caller aborts the request in the model
        with contextlib.suppress(ConnectionResetError):
            await self._pump(request, resp)
        return resp

    def _write_through(self, transport: asyncio.Transport) -> Callable[[Sequence[int]], None]:
        """A sink that frames each step's chunks as one HTTP/1.1 chunk on the socket.

        The response is already prepared (headers sent, chunked encoding), so writing the
        framed bytes straight to the transport keeps the byte stream valid and spares a
        task wake-up and an awaited write per token; the finish goes through aiohttp.
        """

        def sink(tokens: Sequence[int]) -> None:
            data = self._opened(self._chunks(tokens))
            if data and not transport.is_closing():
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))

        return sink

    async def _pump(self, request: web.Request, resp: web.StreamResponse) -> None:
        stream = self._stream
        transport = request.transport
        if self._stop is None and transport is not None:
            stream.attach(self._write_through(transport))
        while not self.stopped:
            tokens = await stream.next_tokens()
            if not tokens:
                break
            data = self._opened(self._chunks(tokens))
            if data:
                await resp.write(data)
        if self._failed():
            _cut(request)
            return
        tail = self._opened(self._fmt.finish_chunk(_finish_reason(stream, self.stopped)))
        if self._gen.include_usage:
            tail += self._fmt.usage_chunk(_usage_of(self._gen, stream))
        await resp.write(tail + DONE)

    async def collect(self, request: web.Request) -> web.StreamResponse:
        stream = self._stream
        pieces: list[str] = []
        if self._stop is None:
            push = self._decoder.push
            stream.attach(lambda tokens: pieces.extend([push(t) for t in tokens]))
        while not self.stopped:
            tokens = await stream.next_tokens()
            if not tokens:
                break
            if self._stop is None:
                pieces.extend(self._decoder.push(t) for t in tokens)
                continue
            for token_id in tokens:
                emitted, hit = self._stop.feed(self._decoder.push(token_id))
                pieces.append(emitted)
                if hit:
                    self._stop_now()
                    break
        if self._failed():
            _cut(request)
            return web.StreamResponse()
        reason = _finish_reason(stream, self.stopped)
        body = self._fmt.body("".join(pieces), reason, _usage_of(self._gen, stream))
        return web.Response(body=body, content_type="application/json")
