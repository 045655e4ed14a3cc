"""The request context, parsed once at the front door: who calls, what for, how urgently.

Authentication (API key -> tenant through the SHA-256 of the key, or an explicit anonymous
mode), the context headers of DESIGN.md (X-Priority, X-Deadline-Ms, X-TTFT-Budget-Ms, the
workflow id and the session headers agent tools send instead, X-Workflow-Step/Steps) and the
few body fields the gateway needs (model, stream, usage option, token counts) are read here and
nowhere else. Anything malformed becomes an :class:`ApiError` naming the bad header or field.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from inferplane.config import AuthConfig
from inferplane.core.types import PriorityClass, scoped_workflow_id
from inferplane.gateway.context_types import Caller, HeaderContext, RequestContext
from inferplane.gateway.errors import ApiError
from inferplane.gateway.request_body import (
    ApiKind,
    parse_body,
    parse_json_object,
    upstream_body,
)

__all__ = [
    "WORKFLOW_HEADERS",
    "ApiKind",
    "Authenticator",
    "Caller",
    "HeaderContext",
    "RequestContext",
    "context_headers",
    "parse_body",
    "parse_headers",
    "parse_json_object",
    "read_context",
    "request_id_from",
    "upstream_body",
]

#: Headers that carry a workflow (task) id, in order of precedence. Agent tools send their
#: own session headers; we take the first one present.
WORKFLOW_HEADERS: tuple[str, ...] = (
    "X-Workflow-Id",
    "X-Session-Id",
    "X-Claude-Code-Session-Id",
    "X-Agent-Session-Id",
    "X-Conversation-Id",
    "Session_Id",
    "Session-Id",
    "Conversation_Id",
)
_MAX_ID_CHARS = 128
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,128}$")


class Authenticator:
    """Maps API keys to callers through their SHA-256 (keys themselves are never stored)."""

    def __init__(self, auth: AuthConfig) -> None:
        self._anonymous = auth.mode == "anonymous"
        self._anon = Caller(auth.anonymous_tenant, PriorityClass.STANDARD, PriorityClass.CRITICAL)
        self._by_hash = {
            k.key_sha256: Caller(k.tenant, k.default_priority, k.max_priority, k.name)
            for k in auth.keys
        }

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The caller of a request with these headers (raises ApiError 401)."""
        return self.caller_for(_api_key(context_headers(headers)))

    def caller_for(self, key: str | None) -> Caller:
        """The caller presenting API key ``key`` (None: no key given)."""
        if key is not None:
            found = self._by_hash.get(hashlib.sha256(key.encode()).hexdigest())
            if found is not None:
                return found
        if self._anonymous:
            return self._anon
        if key is None:
            raise ApiError(401, "missing API key (Authorization: Bearer <key>)", code="no_api_key")
        raise ApiError(401, "incorrect API key provided", code="invalid_api_key")


#: Every header the context reads, by lower-case name.
_CONTEXT_HEADERS = frozenset(
    name.lower()
    for name in (
        "X-Request-Id", "Authorization", "X-Api-Key", "Api-Key", "X-Priority",
        "X-Deadline-Ms", "X-TTFT-Budget-Ms", "X-Workflow-Step", "X-Workflow-Steps",
        "X-Allow-Fallback", *WORKFLOW_HEADERS,
    )
)  # fmt: skip


def context_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The context headers present, by lower-case name (the first of repeated ones).

    One pass over the request's few headers instead of a case-insensitive lookup for each
    of the ~17 names the context knows; most calls carry none of them.
    """
    found: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key in _CONTEXT_HEADERS and key not in found:
            found[key] = value
    return found


def _api_key(found: Mapping[str, str]) -> str | None:
    auth = found.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    for name in ("x-api-key", "api-key"):
        other = found.get(name)
        if other:
            return other.strip()
    return None


def request_id_from(headers: Mapping[str, str]) -> str:
    """The caller's X-Request-Id when it is a sane token, else a fresh one."""
    given = context_headers(headers).get("x-request-id")
    return _request_id(given)


def _request_id(given: str | None) -> str:
    if given and _SAFE_ID.match(given):
        return given
    # 32 hex digits, like uuid4().hex: 64 random bits drawn once per process, then a counter
    # (a fifth of the CPU of 128 fresh random bits per call; distinct across processes).
    # format(), not an f-string's format spec: half the time once compiled (mypyc).
    return _id_prefix + format(next(_ID_COUNTER), "016x")


def _new_id_prefix() -> None:
    """A fresh random half for the process's request ids (at import, and in a forked child,
    whose ids must not repeat its parent's)."""
    global _id_prefix
    _id_prefix = os.urandom(8).hex()


_id_prefix = ""
_ID_COUNTER = itertools.count()
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)


def _positive_ms(found: Mapping[str, str], name: str) -> float | None:
    raw = found.get(name.lower())
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 < value < 1e9):
        raise ApiError(400, f"{name} must be a positive number of milliseconds", param=name)
    return value / 1000.0


def _non_negative_int(found: Mapping[str, str], name: str) -> int | None:
    raw = found.get(name.lower())
    if raw is None:
        return None
    if not raw.strip().isdigit() or len(raw) > 9:
        raise ApiError(400, f"{name} must be a non-negative integer", param=name)
    return int(raw)


def _priority(found: Mapping[str, str], caller: Caller) -> PriorityClass:
    raw = found.get("x-priority")
    if raw is None:
        return caller.default_priority
    try:
        asked = PriorityClass(raw.strip().lower())
    except ValueError:
        names = ", ".join(p.value for p in PriorityClass)
        raise ApiError(400, f"X-Priority must be one of {names}", param="X-Priority") from None
    # A key may not raise itself above its ceiling; it is clamped, not refused.
    return asked if asked.rank >= caller.max_priority.rank else caller.max_priority


_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def _flag(found: Mapping[str, str], name: str, default: bool) -> bool:
    raw = found.get(name.lower())
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ApiError(400, f"{name} must be true or false", param=name)


def _tenant_workflow(tenant: str, found: Mapping[str, str]) -> str | None:
    """The call's workflow id, kept per tenant (``scoped_workflow_id``)."""
    workflow_id = _workflow_id(found)
    return None if workflow_id is None else scoped_workflow_id(tenant, workflow_id)


def _workflow_id(found: Mapping[str, str]) -> str | None:
    for name in WORKFLOW_HEADERS:
        value = found.get(name.lower())
        if value is not None:
            value = value.strip()
            if not value or len(value) > _MAX_ID_CHARS or not value.isprintable():
                raise ApiError(400, f"{name} must be 1-{_MAX_ID_CHARS} printable chars", param=name)
            return value
    return None


def parse_headers(
    headers: Mapping[str, str], auth: Authenticator, now: float, caller: Caller | None = None
) -> HeaderContext:
    """Authenticate and read the context headers (raises ApiError 401/400).

    ``caller``: already authenticated (``auth.caller``; the traced gateway does it in a hop of
    its own), so the key is not looked up again.
    """
    found = context_headers(headers)
    request_id = _request_id(found.get("x-request-id"))
    if caller is None:
        caller = auth.caller_for(_api_key(found))
    if not found:  # the common case: no context headers, the caller's defaults
        return HeaderContext(request_id, caller, caller.default_priority)
    deadline_ms = _positive_ms(found, "X-Deadline-Ms")
    return HeaderContext(
        request_id=request_id,
        caller=caller,
        priority=_priority(found, caller),
        deadline_s=None if deadline_ms is None else now + deadline_ms,
        ttft_budget_s=_positive_ms(found, "X-TTFT-Budget-Ms"),
        workflow_id=_tenant_workflow(caller.tenant, found),
        workflow_step=_non_negative_int(found, "X-Workflow-Step"),
        workflow_steps=_non_negative_int(found, "X-Workflow-Steps"),
        allow_fallback=_flag(found, "X-Allow-Fallback", True),
    )


#: Content types that cannot be a JSON body. Others are tried as JSON: curl -d sends
#: form-urlencoded and some clients octet-stream, with perfectly good JSON inside.
_NOT_JSON_TYPES = ("multipart/", "text/html", "application/xml", "text/xml")


async def read_context(
    request: web.Request,
    path: str,
    auth: Authenticator,
    now: float,
    max_body_bytes: int,
    caller: Caller | None = None,
) -> tuple[RequestContext, bytes, dict[str, Any]]:
    """Authenticate (unless ``caller`` is given), read and check the body: the call's
    context, raw body and parsed JSON."""
    hdr = parse_headers(request.headers, auth, now, caller)
    ctype = request.headers.get("Content-Type")
    if ctype and ctype.lower().startswith(_NOT_JSON_TYPES):
        raise ApiError(415, f"unsupported Content-Type {ctype[:60]!r}; send JSON")
    limit = max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body over {limit} bytes", code="body_too_large")
    raw = await request.read()
    body = parse_json_object(raw)
    model, stream, wants_usage, prompt_tokens, max_tokens = parse_body(path, body)
    ctx = RequestContext(
        request_id=hdr.request_id,
        tenant=hdr.caller.tenant,
        priority=hdr.priority,
        arrival_s=now,
        model=model,
        path=path,
        stream=stream,
        client_wants_usage=wants_usage,
        num_prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        deadline_s=hdr.deadline_s,
        ttft_budget_s=hdr.ttft_budget_s,
        workflow_id=hdr.workflow_id,
        workflow_step=hdr.workflow_step,
        workflow_steps=hdr.workflow_steps,
        api_key_name=hdr.caller.key_name,
        allow_fallback=hdr.allow_fallback,
    )
    return ctx, raw, body
