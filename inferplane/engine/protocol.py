"""OpenAI request bodies as the emulated engine accepts them: validation into values.

Every check raises ``ApiError`` with an OpenAI-style body (``{"error": {"message",
"type", "param", "code"}}``) and the matching HTTP status, so bad input never reaches
the engine model and never becomes a 500. Sampling knobs that do not change an
emulated model's greedy output (``temperature``, ``top_p``, ``seed``...) are type-checked
and otherwise ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from inferplane.tokenizer import TemplateError, Tokenizer


class ApiError(Exception):
    """An error answered as OpenAI-style JSON with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        err_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.err_type, "param": self.param}
        error["code"] = self.code
        return orjson.dumps({"error": error})


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


class ApiKind(enum.Enum):
    """Which OpenAI endpoint a request came through (chunk and body shapes differ)."""

    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated generation request, ready to become an ``EngineRequest``."""

    kind: ApiKind
    model: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    stop: tuple[str, ...]
    priority: int


_NUMBER_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "top_k")
_MAX_STOP_STRINGS = 16


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    return body


def check_model(body: Mapping[str, Any], served_model: str, *, required: bool = True) -> str:
    model = body.get("model")
    if model is None and not required:
        return served_model
    if not isinstance(model, str):
        raise bad_request("'model' is required and must be a string", "model")
    if model != served_model:
        raise ApiError(
            404,
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    return model


def _opt(body: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise bad_request(f"'{key}' must be {what}", key)
    return value


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = _opt(body, key, bool, "a boolean")
    return default if value is None else bool(value)


def _stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if (
        isinstance(stop, list)
        and len(stop) <= _MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in stop)
    ):
        return tuple(s for s in stop if s)
    raise bad_request(f"'stop' must be a string or a list of at most {_MAX_STOP_STRINGS}", "stop")


def _check_sampling(body: Mapping[str, Any]) -> None:
    for key in _NUMBER_FIELDS:
        _opt(body, key, (int, float), "a number")
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not 0 <= temperature <= 2:
        raise bad_request("'temperature' must be between 0 and 2", "temperature")
    _opt(body, "seed", int, "an integer")
    n = _opt(body, "n", int, "an integer")
    if n is not None and n != 1:
        raise bad_request("Only n=1 is supported by this engine", "n")
    for key in ("logprobs", "echo"):
        if body.get(key) not in (None, False):
            raise bad_request(f"'{key}' is not supported by this engine", key)


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    if not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream")
    return _flag(options, "include_usage", False)


def _max_tokens(body: Mapping[str, Any], num_prompt: int, max_model_len: int) -> int:
    requested = _opt(body, "max_completion_tokens", int, "an integer")
    if requested is None:
        requested = _opt(body, "max_tokens", int, "an integer")
    if requested is not None and requested < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    if num_prompt >= max_model_len or (
        requested is not None and num_prompt + requested > max_model_len
    ):
        total = num_prompt + (requested or 0)
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {total} tokens ({num_prompt} in the messages, {requested or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            "messages",
        )
    return requested if requested is not None else max_model_len - num_prompt


def chat_prompt_ids(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[int]:
    """The chat template applied to ``messages`` with vLLM's continuation flags."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    continue_final = _flag(body, "continue_final_message", False)
    add_generation = _flag(body, "add_generation_prompt", not continue_final)
    try:
        return tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation,
            continue_final_message=continue_final,
        )
    except TemplateError as exc:
        raise bad_request(str(exc), "messages") from None


def completion_prompt_ids(
    body: Mapping[str, Any], tokenizer: Tokenizer, key: str = "prompt"
) -> list[int]:
    """``prompt`` as token ids: a string, one-element list of strings, or a list of ids."""
    prompt = body.get(key)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    add_special = _flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=add_special)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        try:
            tokenizer.check_ids(prompt)
        except ValueError as exc:
            raise bad_request(str(exc), key) from None
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise bad_request("Batched prompts are not supported; send one prompt", key)
    raise bad_request(f"'{key}' must be a string or a non-empty list of token ids", key)


def parse_generation(
    body: Mapping[str, Any],
    kind: ApiKind,
    *,
    served_model: str,
    max_model_len: int,
    tokenizer: Tokenizer,
) -> GenerationRequest:
    """Validate a chat or completion body into a ``GenerationRequest`` (or ApiError)."""
    model = check_model(body, served_model)
    _check_sampling(body)
    stream = _flag(body, "stream", False)
    include_usage = _stream_options(body, stream)
    if kind is ApiKind.CHAT:
        prompt = chat_prompt_ids(body, tokenizer)
    else:
        prompt = completion_prompt_ids(body, tokenizer)
    priority = _opt(body, "priority", int, "an integer")
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_token_ids=tuple(prompt),
        max_tokens=_max_tokens(body, len(prompt), max_model_len),
        stream=stream,
        include_usage=include_usage,
        ignore_eos=_flag(body, "ignore_eos", False),
        stop=_stop_strings(body),
        priority=priority or 0,
    )
