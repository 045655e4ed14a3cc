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

``plan_resumption`` decides (continue, finish, give up) with a reason;
:mod:`inferplane.core.stitcher` makes the client see one stream. Caveat: a stop string
straddling the break is not seen by the continuing engine. Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferplane.core.retry import FailureKind

__all__ = [
    "ResumeAction",
    "ResumptionPlan",
    "StreamKind",
    "StreamProgress",
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
