"""The proxy's view of an upstream SSE stream: split into events, timed, usage read.

``EventFilter`` turns the bytes an engine streams into the events to forward to the client.
Every event first goes through the call's ``StreamStitcher`` (which passes the first
segment unchanged and rewrites a resumed continuation so the client sees one stream); then
the filter times tokens (the call's TTFT and time between tokens, and the current
segment's, which the breaker judges the endpoint by), reads ``usage``, and drops the usage
event again when the client did not ask for it. An engine's error event is not forwarded:
it marks the segment ``broken`` (a mid-stream 5xx) and the proxy decides what the client
sees. It parses an event as JSON only until the first token and when it carries usage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from inferplane.core.stitcher import StreamStitcher

if TYPE_CHECKING:
    from inferplane.gateway.exchange import Exchange

__all__ = ["DONE", "EventFilter", "has_token", "read_usage"]

DONE = b"data: [DONE]"


def read_usage(usage: Any, ex: Exchange) -> None:
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int):
        ex.prompt_tokens = prompt
    if isinstance(completion, int):
        ex.completion_tokens = completion
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        ex.cached_tokens = details["cached_tokens"]


class EventFilter:
    """Splits SSE bytes into events; times tokens, reads usage, drops unasked usage events."""

    __slots__ = (
        "_buf",
        "_clock",
        "_keep_usage",
        "broken",
        "done",
        "ex",
        "seg_chunks",
        "seg_first_s",
        "seg_gaps_s",
        "seg_last_s",
        "seg_start_s",
        "stitcher",
    )

    def __init__(
        self,
        keep_usage: bool,
        ex: Exchange,
        clock: Callable[[], float],
        stitcher: StreamStitcher | None = None,
    ) -> None:
        self._buf = b""
        self._keep_usage = keep_usage
        self.ex = ex
        self._clock = clock
        self.stitcher = stitcher
        self.done = False
        self.broken = False
        self.new_segment(clock())

    def new_segment(self, now: float) -> None:
        """A new upstream (the first, or a continuation) starts streaming now."""
        self._buf = b""
        self.broken = False
        self.seg_start_s = now
        self.seg_first_s: float | None = None
        self.seg_last_s: float | None = None
        self.seg_chunks = 0
        self.seg_gaps_s: list[float] = []

    def seg_tbt_s(self) -> float | None:
        """Time between the current segment's token chunks, robust to stalls.

        The mean of the gaps with the largest tenth left out: a healthy engine that stalls
        a stream once (a preemption, a long prefill batched in) keeps its pace, while an
        engine that is slow on every token still reads slow. Streams of fewer than ten gaps
        are averaged whole.
        """
        gaps = self.seg_gaps_s
        if not gaps:
            return None
        kept = sorted(gaps)[: len(gaps) - len(gaps) // 10]
        total_s = sum(kept)
        return total_s / len(kept) if total_s > 0 else None

    def feed(self, data: bytes, *, stitch: bool = True) -> bytes:
        """Complete events ready to forward (without [DONE], which sets ``done``)."""
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out: list[bytes] = []
        now = self._clock()
        stitcher = self.stitcher if stitch else None
        for event in events:
            if event.startswith(DONE) or event.startswith(b"data:[DONE]"):
                self.done = True
                self.ex.completed = True
                break
            if stitcher is not None and event:
                fed = stitcher.feed(event)
                if fed is None:
                    continue
                event = fed
            kept = self._event(event, now)
            if self.broken:
                break
            if kept is not None:
                out.append(kept)
                out.append(b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes, now: float) -> bytes | None:
        if not event.startswith(b"data:"):
            return event or None
        ex = self.ex
        payload = event[5:]
        if (
            self.seg_first_s is None
            or (b'"usage"' in payload and b'"usage":null' not in payload)
            or b'"error"' in payload
        ):
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return event
            if not isinstance(obj, dict):
                return event
            return self._parsed(event, obj, now)
        if ex.first_token_s is not None:
            self._tick(now)
        return event

    def _parsed(self, event: bytes, obj: dict[str, Any], now: float) -> bytes | None:
        ex = self.ex
        if "error" in obj:
            ex.reason = "upstream_error_event"
            self.broken = True
            return None
        choices = obj.get("choices")
        if self.seg_first_s is None and has_token(choices):
            self.seg_first_s = now
            if ex.first_token_s is None:
                ex.first_token(now)
        usage = obj.get("usage")
        if usage is not None:
            read_usage(usage, ex)
            if not self._keep_usage:
                if not choices:
                    return None
                obj["usage"] = None
                event = b"data: " + orjson.dumps(obj)
        if choices:
            self._tick(now)
        return event

    def _tick(self, now: float) -> None:
        ex = self.ex
        if self.seg_first_s is not None:
            last = self.seg_last_s
            if last is not None and len(self.seg_gaps_s) < 4096:
                self.seg_gaps_s.append(now - last)
            self.seg_last_s = now
            self.seg_chunks += 1
        if ex.first_token_s is not None and ex.last_chunk_s is not None:
            if ex.tbt_s is None:
                ex.tbt_s = []
            if len(ex.tbt_s) < 4096:
                ex.tbt_s.append(now - ex.last_chunk_s)
        if ex.first_token_s is not None:
            ex.last_chunk_s = now
            ex.chunks += 1


def has_token(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False
