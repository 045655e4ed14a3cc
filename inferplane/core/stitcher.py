"""Stream stitching: the client sees one stream across a resumed stream's segments.

``StreamStitcher`` watches the forwarded stream and rewrites the continuation's chunks
(planned by :mod:`inferplane.core.resumption`): the original ``id``/``created``/``model``,
no second role delta, one final usage with the original ``prompt_tokens`` and the summed
``completion_tokens``. The prefill a continuation recomputes (its prompt tokens not served
from cache) is counted as wasted. The first segment is only kept as raw bytes and parsed
if it breaks, so the normal path costs one list append per event. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferplane.core.resumption import StreamKind, StreamProgress

__all__ = ["StreamStitcher"]


@dataclass(slots=True)
class _Seen:
    """What the stitcher has absorbed from parsed events (mutable, internal)."""

    pieces: list[str] = field(default_factory=list)
    tokens_before: int = 0  # exact or counted tokens of the finished segments
    segment_tokens: int = 0  # token chunks counted in the current segment
    response_id: Any = None
    created: Any = None
    model: Any = None
    finish_reason: str | None = None
    usage_seen: bool = False
    role_sent: bool = False
    tool_calls: bool = False


class StreamStitcher:
    """Watches one client stream across its segments; rewrites continuation events.

    Feed every SSE event (one ``data: ...`` block, without the blank line) through
    ``feed``; it returns the bytes to forward (None: drop). Segment 0 passes unchanged.
    After a break: ``progress()`` for the plan, then ``start_continuation()`` before the
    continuation's first event, or ``closing_events()`` for a FINISH plan.
    """

    def __init__(
        self,
        kind: StreamKind,
        *,
        client_wants_usage: bool,
        prompt_tokens: int | None = None,
        max_events: int = 65_536,
    ) -> None:
        self._kind = kind
        self._wants_usage = client_wants_usage
        self._prompt_tokens = prompt_tokens
        self._max_events = max_events
        self._raw: list[bytes] = []
        self._overflowed = False
        self._seen = _Seen()
        self.segments = 1
        self.wasted_prefill_tokens = 0

    def feed(self, event: bytes) -> bytes | None:
        if self.segments == 1:
            if len(self._raw) < self._max_events:
                self._raw.append(event)
            else:
                self._overflowed = True
            return event
        obj = _parse(event)
        if obj is None or "error" in obj:
            return event
        return self._rewrite(obj)

    def progress(self) -> StreamProgress:
        self._catch_up()
        s = self._seen
        num_tokens = s.tokens_before + s.segment_tokens
        text = "".join(s.pieces)
        return StreamProgress(
            text, num_tokens, s.finish_reason, s.usage_seen, s.tool_calls, self._overflowed
        )

    def start_continuation(self) -> None:
        """The events fed from now on come from a new (continuation) upstream."""
        self._catch_up()
        s = self._seen
        s.tokens_before += s.segment_tokens
        s.segment_tokens = 0
        self.segments += 1

    def closing_events(self, finish_reason: str | None) -> list[bytes]:
        """Events that end the stream cleanly (a FINISH plan); [DONE] is the caller's."""
        self._catch_up()
        s = self._seen
        out: list[bytes] = []
        if s.finish_reason is None:
            s.finish_reason = finish_reason or "stop"
            out.append(_sse({**self._head(), "choices": [self._finish_choice(s.finish_reason)]}))
        if self._wants_usage and not s.usage_seen:
            s.usage_seen = True
            usage = self._usage(s.tokens_before + s.segment_tokens, None)
            out.append(_sse({**self._head(), "choices": [], "usage": usage}))
        return out

    def usage(self) -> dict[str, Any]:
        """The stitched usage so far (what accounting should charge)."""
        s = self._seen
        return self._usage(s.tokens_before + s.segment_tokens, None)

    def _catch_up(self) -> None:
        for event in self._raw:
            obj = _parse(event)
            if obj is not None and "error" not in obj:
                self._absorb(obj)
        self._raw.clear()

    def _absorb(self, obj: dict[str, Any]) -> None:
        s = self._seen
        if s.response_id is None:
            s.response_id, s.created, s.model = obj.get("id"), obj.get("created"), obj.get("model")
        for choice in _choices(obj):
            piece = self._piece(choice)
            if piece:
                s.pieces.append(piece)
                s.segment_tokens += 1
            if choice.get("finish_reason"):
                s.finish_reason = str(choice["finish_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict) and self.segments == 1:
            s.usage_seen = True
            if self._prompt_tokens is None and isinstance(usage.get("prompt_tokens"), int):
                self._prompt_tokens = usage["prompt_tokens"]

    def _piece(self, choice: dict[str, Any]) -> str:
        if self._kind is StreamKind.COMPLETION:
            text = choice.get("text")
            return text if isinstance(text, str) else ""
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        if "role" in delta:
            self._seen.role_sent = True
        if delta.get("tool_calls"):
            self._seen.tool_calls = True
        content = delta.get("content")
        return content if isinstance(content, str) else ""

    def _rewrite(self, obj: dict[str, Any]) -> bytes | None:
        s = self._seen
        had_role = s.role_sent
        self._absorb(obj)
        obj.update(self._head(obj))
        choices = [c for c in _choices(obj) if not (had_role and _strip_role(c))]
        if "choices" in obj:
            obj["choices"] = choices
        usage = obj.get("usage")
        if isinstance(usage, dict):
            stitched = self._stitched_usage(usage)
            obj["usage"] = stitched if self._wants_usage else None
            s.usage_seen = s.usage_seen or self._wants_usage
        if not choices and obj.get("usage") is None:
            return None
        return _sse(obj)

    def _stitched_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        s = self._seen
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            s.segment_tokens = completion  # the engine's exact count replaces ours
        prompt = usage.get("prompt_tokens")
        cached = _cached(usage)
        if isinstance(prompt, int):
            self.wasted_prefill_tokens += max(0, prompt - cached)
            if self._prompt_tokens is None:
                self._prompt_tokens = max(0, prompt - s.tokens_before)
        return self._usage(s.tokens_before + s.segment_tokens, cached)

    def _usage(self, num_completion: int, cached: int | None) -> dict[str, Any]:
        prompt = self._prompt_tokens or 0
        out: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": num_completion,
            "total_tokens": prompt + num_completion,
        }
        if cached is not None:
            out["prompt_tokens_details"] = {"cached_tokens": min(prompt, cached)}
        return out

    def _head(self, obj: Mapping[str, Any] | None = None) -> dict[str, Any]:
        s, other = self._seen, obj or {}
        rid, created, model = (
            (s.response_id, s.created, s.model)
            if s.response_id is not None
            else (other.get("id"), other.get("created"), other.get("model"))
        )
        return {"id": rid, "object": _OBJECT[self._kind], "created": created, "model": model}

    def _finish_choice(self, reason: str) -> dict[str, Any]:
        if self._kind is StreamKind.CHAT:
            return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}


_OBJECT = {StreamKind.CHAT: "chat.completion.chunk", StreamKind.COMPLETION: "text_completion"}


def _parse(event: bytes) -> dict[str, Any] | None:
    if not event.startswith(b"data:"):
        return None
    try:
        obj = orjson.loads(event[5:])
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _choices(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return []
    return [c for c in choices if isinstance(c, dict)]


def _strip_role(choice: dict[str, Any]) -> bool:
    """Remove a repeated role from a chat delta; True when nothing is left to send."""
    delta = choice.get("delta")
    if not isinstance(delta, dict) or "role" not in delta:
        return False
    del delta["role"]
    empty = not delta.get("content") and not any(k != "content" for k in delta)
    return empty and not choice.get("finish_reason")


def _cached(usage: Mapping[str, Any]) -> int:
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return 0


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj)
