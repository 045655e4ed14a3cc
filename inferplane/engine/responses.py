"""OpenAI response bodies and SSE chunks of the emulated engine, prebuilt as bytes.

A stream sends one chunk per token, so the per-token path must not build and encode a
JSON object each time: ``ResponseFormat`` encodes the chunk once around a sentinel and
keeps the bytes before and after it; a token chunk is then ``prefix + piece + suffix``
where ``piece`` is the token's JSON-escaped text, precomputed by the tokenizer.

Shapes follow vLLM: ``chat.completion.chunk`` / ``text_completion`` chunks with ``id``,
``created`` (epoch seconds), ``model``; the chat stream opens with a role delta; the
finish reason comes in a chunk of its own; with ``include_usage`` a last chunk carries
``usage`` (with ``prompt_tokens_details.cached_tokens``) and empty ``choices``.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferplane.engine.protocol import ApiKind

DONE = b"data: [DONE]\n\n"
_SENTINEL = "\x00piece\x00"
_SENTINEL_JSON = orjson.dumps(_SENTINEL)[1:-1]


def usage(num_prompt: int, num_completion: int, num_cached: int) -> dict[str, Any]:
    """OpenAI usage with vLLM's cached-token detail."""
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }


class ResponseFormat:
    """Chunk and body builder for one response (id, created and model fixed)."""

    __slots__ = ("_head", "_kind", "_suffix", "_token_prefix", "created", "model", "response_id")

    def __init__(self, kind: ApiKind, response_id: str, created: int, model: str) -> None:
        self._kind = kind
        self.response_id = response_id
        self.created = created
        self.model = model
        obj = "chat.completion.chunk" if kind is ApiKind.CHAT else "text_completion"
        self._head = {"id": response_id, "object": obj, "created": created, "model": model}
        template = orjson.dumps({**self._head, "choices": [self._choice(_SENTINEL, None)]})
        before, after = template.split(_SENTINEL_JSON)
        self._token_prefix = b"data: " + before
        self._suffix = after + b"\n\n"

    def _choice(self, text: str | None, finish_reason: str | None) -> dict[str, Any]:
        if self._kind is ApiKind.CHAT:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {
            "index": 0,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }

    def _sse(self, payload: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def token_chunk(self, json_piece: bytes) -> bytes:
        """A chunk carrying ``json_piece`` (JSON-escaped text without quotes)."""
        return self._token_prefix + json_piece + self._suffix

    def role_chunk(self) -> bytes:
        """The chat stream's opening chunk: ``delta: {"role": "assistant", "content": ""}``."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._sse({**self._head, "choices": [choice]})

    def finish_chunk(self, finish_reason: str) -> bytes:
        return self._sse({**self._head, "choices": [self._choice(None, finish_reason)]})

    def usage_chunk(self, usage_body: dict[str, Any]) -> bytes:
        return self._sse({**self._head, "choices": [], "usage": usage_body})

    def body(self, text: str, finish_reason: str, usage_body: dict[str, Any]) -> bytes:
        """The non-streaming response."""
        if self._kind is ApiKind.CHAT:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = self._choice(text, finish_reason)
            obj = "text_completion"
        return orjson.dumps({**self._head, "object": obj, "choices": [choice], "usage": usage_body})
