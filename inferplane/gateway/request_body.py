"""The body of a generation call: parsed once, checked, and re-encoded only when it must be.

``parse_json_object`` turns the raw bytes into a JSON object (or a 400 saying why not),
``parse_body`` reads the few fields the gateway needs (model, stream, usage option, a prompt
size estimate, max tokens) and rejects wrong types by name, and ``upstream_body`` gives the
bytes an engine receives: the client's own unless a route alias or ``include_usage`` must
change them. Split from ``context`` (headers and the caller) so each stays one concern.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from inferplane.gateway.errors import ApiError

__all__ = ["ApiKind", "parse_body", "parse_json_object", "upstream_body"]

#: Rough characters per token, to estimate prompt size before any tokenizer sees it.
_CHARS_PER_TOKEN = 4
_PER_MESSAGE_TOKENS = 4
_DEFAULT_MAX_TOKENS = 256


class ApiKind:
    """The two generation APIs the gateway proxies (upstream path is the same)."""

    # Final: class constants (mypyc, bench/gateway_compile.py, reads plain ones as instance
    # attributes of a compiled class).
    CHAT: Final = "/v1/chat/completions"
    COMPLETIONS: Final = "/v1/completions"
    ALL: Final = (CHAT, COMPLETIONS)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not."""
    if not raw:
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _expect(body: Mapping[str, Any], name: str, types: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int subclass: accept it only where bool itself is asked for.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ApiError(400, f"'{name}' must be {what}", param=name, code="invalid_type")
    return value


def _text_tokens(content: Any, param: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content) // _CHARS_PER_TOKEN + 1
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(400, f"'{param}' parts must be objects", param=param)
            text = part.get("text")
            total += len(text) // _CHARS_PER_TOKEN + 1 if isinstance(text, str) else 1
        return total
    raise ApiError(400, f"'{param}' must be a string or a list of parts", param=param)


def _chat_prompt_tokens(body: Mapping[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", param="messages")
    total = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ApiError(400, f"messages[{i}] needs a string 'role'", param=f"messages[{i}]")
        total += _PER_MESSAGE_TOKENS + _text_tokens(msg.get("content"), f"messages[{i}].content")
    return total


def _completion_prompt_tokens(body: Mapping[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) // _CHARS_PER_TOKEN + 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) // _CHARS_PER_TOKEN + 1 for p in prompt)
        if all(isinstance(p, list) for p in prompt):
            return sum(len(p) for p in prompt)
    raise ApiError(
        400, "'prompt' must be a string, a list of strings or a list of token ids", param="prompt"
    )


def parse_body(path: str, body: Mapping[str, Any]) -> tuple[str, bool, bool, int, int]:
    """(model, stream, client_wants_usage, prompt tokens estimate, max tokens) of a body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a non-empty string", param="model")
    stream = bool(_expect(body, "stream", (bool,), "a boolean"))
    options = _expect(body, "stream_options", (dict,), "an object")
    wants_usage = False
    if options is not None:
        wants_usage = bool(_expect(options, "include_usage", (bool,), "a boolean"))
    limit = _expect(body, "max_completion_tokens", (int,), "an integer")
    if limit is None:
        limit = _expect(body, "max_tokens", (int,), "an integer")
    if limit is not None and limit < 1:
        raise ApiError(400, "'max_tokens' must be at least 1", param="max_tokens")
    _expect(body, "n", (int,), "an integer")
    _expect(body, "temperature", (int, float), "a number")
    _expect(body, "top_p", (int, float), "a number")
    if path == ApiKind.CHAT:
        prompt_tokens = _chat_prompt_tokens(body)
    else:
        prompt_tokens = _completion_prompt_tokens(body)
    return model, stream, wants_usage, prompt_tokens, limit or _DEFAULT_MAX_TOKENS


def upstream_body(raw: bytes, body: dict[str, Any], model: str, stream: bool) -> bytes:
    """The bytes to send upstream: the client's own when possible, else re-encoded once.

    Re-encoding happens only when the served model name differs (a route alias) or a stream
    must ask for usage (``include_usage``) that the client did not request.
    """
    needs_usage = stream and not (body.get("stream_options") or {}).get("include_usage")
    if body.get("model") == model and not needs_usage:
        return raw
    out = dict(body)
    out["model"] = model
    if needs_usage:
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(out)
