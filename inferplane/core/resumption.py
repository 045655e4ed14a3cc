"""Stream resumption: continue a broken stream on another endpoint, as one stream.

An endpoint that dies after streaming N tokens cannot simply be retried: the client holds
the N tokens, and a replay would send them again (or different ones). Instead another
endpoint *continues* the partial answer (as Dynamo's request migration does, REFERENCE §5):
chat appends it as a final assistant message with ``continue_final_message: true,
add_generation_prompt: false`` (vLLM's extension; appended to the client's own final
assistant message when it was already continuing one); completions send prompt + partial
text, or prompt ids + generated ids when the gateway knows them (exact, no
re-tokenisation). ``max_tokens`` / ``max_completion_tokens`` and ``min_tokens`` shrink by
the tokens sent; usage is always asked for.

``plan_resumption`` decides (continue, finish, give up) with a reason. ``StreamStitcher``
watches the forwarded stream and rewrites the continuation's chunks so the client sees one
stream: the original ``id``/``created``/``model``, no second role delta, one final usage
with the original ``prompt_tokens`` and the summed ``completion_tokens``. The prefill a
continuation recomputes (its prompt tokens not served from cache) is counted as wasted.
The first segment is only kept as raw bytes and parsed if it breaks, so the normal path
costs one list append per event. Caveat: a stop string straddling the break is not seen
by the continuing engine. Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferplane.core.retry import FailureKind

__all__ = [
    "ResumeAction",
    "ResumptionPlan",
    "StreamKind",
    "StreamProgress",
    "StreamStitcher",
    "plan_resumption",
]


class StreamKind(enum.Enum):
    CHAT = "chat"  # /v1/chat/completions
    COMPLETION = "completion"  # /v1/completions


class ResumeAction(enum.Enum):
    CONTINUE = "continue"  # send ``body`` elsewhere and stitch its stream on
    FINISH = "finish"  # nothing is left to generate: close the stream cleanly
    GIVE_UP = "give_up"  # cannot resume: end the stream with an error event


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """What the client has received so far."""

    text: str = ""
    num_tokens: int = 0  # token chunks counted (exact where an engine reported usage)
    finish_reason: str | None = None
    usage_seen: bool = False  # the stream reached its usage chunk: it was complete
    has_tool_calls: bool = False
    overflowed: bool = False  # too many events to keep: cannot be resumed


@dataclass(frozen=True, slots=True)
class ResumptionPlan:
    action: ResumeAction
    reason: str
    body: Mapping[str, Any] | None = None  # the continuation request (CONTINUE only)
    num_tokens_sent: int = 0
    max_tokens_left: int | None = None
    recompute_tokens_estimate: int = 0  # prefill to redo, before any prefix-cache hit
    finish_reason: str | None = None  # FINISH: the reason to close with


_LIMIT_KEYS = ("max_completion_tokens", "max_tokens")


def plan_resumption(
    kind: StreamKind,
    original: Mapping[str, Any],
    progress: StreamProgress,
    failure: FailureKind,
    *,
    resumptions_made: int = 0,
    max_resumptions: int = 2,
    prompt_tokens: int | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    generated_token_ids: Sequence[int] | None = None,
) -> ResumptionPlan:
    """How to go on after ``failure`` broke the stream of ``original`` after ``progress``."""
    sent = progress.num_tokens
    if progress.usage_seen or progress.finish_reason is not None:
        why = "stream had finished; only its end was lost"
        return ResumptionPlan(ResumeAction.FINISH, why, None, sent, 0, 0, progress.finish_reason)
    refusal = _refusal(original, progress, failure, max_resumptions - resumptions_made)
    if refusal is not None:
        return ResumptionPlan(ResumeAction.GIVE_UP, refusal, num_tokens_sent=sent)
    limit_key = next((k for k in _LIMIT_KEYS if isinstance(original.get(k), int)), None)
    left = None if limit_key is None else int(original[limit_key]) - sent
    if left is not None and left <= 0:
        why = f"all {sent} tokens allowed were sent"
        return ResumptionPlan(ResumeAction.FINISH, why, None, sent, 0, 0, "length")
    body = dict(original)
    if kind is StreamKind.CHAT:
        problem = _continue_chat(body, progress.text)
    else:
        ids = _token_ids(original, prompt_token_ids, generated_token_ids)
        problem = _continue_completion(body, progress.text, ids)
    if problem is not None:
        return ResumptionPlan(ResumeAction.GIVE_UP, problem, num_tokens_sent=sent)
    body["stream"] = True
    options = original.get("stream_options")
    body["stream_options"] = {
        **(options if isinstance(options, Mapping) else {}),
        "include_usage": True,
    }
    if limit_key is not None and left is not None:
        body[limit_key] = left
    if isinstance(original.get("min_tokens"), int):
        body["min_tokens"] = max(0, int(original["min_tokens"]) - sent)
    recompute = (prompt_tokens or 0) + sent
    why = f"continue after {sent} tokens ({failure.value})"
    return ResumptionPlan(ResumeAction.CONTINUE, why, body, sent, left, recompute)


def _refusal(
    original: Mapping[str, Any], progress: StreamProgress, failure: FailureKind, left: int
) -> str | None:
    if not failure.retryable:
        return f"{failure.value} is not resumed"
    if left <= 0:
        return "already resumed as often as allowed"
    if progress.overflowed:
        return "stream too long to keep for resumption"
    if progress.has_tool_calls:
        return "a tool call was streaming"
    if original.get("n", 1) not in (1, None) or original.get("best_of", 1) not in (1, None):
        return "several choices cannot be resumed"
    if original.get("echo"):
        return "echo cannot be resumed"
    fmt = original.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        return "structured output cannot be resumed"
    return None


def _continue_chat(body: dict[str, Any], text: str) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no messages to continue"
    if not text:
        return None  # nothing sent yet: the original request as it was
    messages = list(messages)
    last = messages[-1]
    continuing = body.get("continue_final_message") is True
    if continuing and isinstance(last, Mapping) and last.get("role") == "assistant":
        content = last.get("content") or ""
        if not isinstance(content, str):
            return "cannot append to a non-text assistant message"
        messages[-1] = {**last, "content": content + text}
    else:
        messages.append({"role": "assistant", "content": text})
    body["messages"] = messages
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    return None


def _token_ids(
    original: Mapping[str, Any], prompt_ids: Sequence[int] | None, generated: Sequence[int] | None
) -> list[int] | None:
    """prompt ids + generated ids, when both are known."""
    prompt = original.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and _is_ids(prompt[0]):
        prompt = prompt[0]
    base = prompt_ids if prompt_ids is not None else (prompt if _is_ids(prompt) else None)
    return None if base is None or generated is None else [*base, *generated]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _continue_completion(body: dict[str, Any], text: str, ids: list[int] | None) -> str | None:
    prompt = body.get("prompt")
    if ids is not None:
        body["prompt"] = ids
    elif isinstance(prompt, str):
        body["prompt"] = prompt + text
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        body["prompt"] = [prompt[0] + text]
    elif _is_ids(prompt) and not text:
        pass  # nothing sent yet
    else:
        return "token-id prompt needs the generated token ids"
    return None


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
