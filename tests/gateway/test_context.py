"""Context parsing: auth, headers and body essentials, each error naming its field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from inferplane.config import AuthConfig, hash_api_key
from inferplane.core.types import PriorityClass
from inferplane.gateway.context import (
    ApiKind,
    Authenticator,
    parse_body,
    parse_headers,
    upstream_body,
)
from inferplane.gateway.errors import ApiError

AUTH = Authenticator(
    AuthConfig(
        mode="api_keys",
        keys=(
            {"key_sha256": hash_api_key("sk-a"), "tenant": "a", "max_priority": "standard"},  # type: ignore[arg-type]
        ),
    )
)


def test_headers_parsed_once() -> None:
    h = parse_headers(
        {
            "Authorization": "Bearer sk-a",
            "X-Priority": "Sheddable",
            "X-Deadline-Ms": "1500",
            "X-TTFT-Budget-Ms": "200",
            "X-Claude-Code-Session-Id": "sess-1",
            "X-Workflow-Step": "3",
            "X-Workflow-Steps": "9",
            "X-Request-Id": "abc-123",
        },
        AUTH,
        now=100.0,
    )
    assert h.caller.tenant == "a" and h.request_id == "abc-123"
    assert h.priority is PriorityClass.SHEDDABLE
    assert h.deadline_s == pytest.approx(101.5) and h.ttft_budget_s == pytest.approx(0.2)
    # kept per tenant: another tenant's sess-1 is another workflow
    assert (h.workflow_id, h.workflow_step, h.workflow_steps) == ("a|sess-1", 3, 9)


def test_priority_is_clamped_to_the_key_ceiling() -> None:
    h = parse_headers({"X-Api-Key": "sk-a", "X-Priority": "critical"}, AUTH, 0.0)
    assert h.priority is PriorityClass.STANDARD


@pytest.mark.parametrize(
    ("headers", "status", "param"),
    [
        ({}, 401, None),
        ({"Authorization": "Bearer nope"}, 401, None),
        ({"Authorization": "Bearer sk-a", "X-Priority": "high"}, 400, "X-Priority"),
        ({"Authorization": "Bearer sk-a", "X-Deadline-Ms": "soon"}, 400, "X-Deadline-Ms"),
        ({"Authorization": "Bearer sk-a", "X-Workflow-Step": "-1"}, 400, "X-Workflow-Step"),
        ({"Authorization": "Bearer sk-a", "X-Session-Id": ""}, 400, "X-Session-Id"),
    ],
)
def test_bad_headers(headers: dict[str, str], status: int, param: str | None) -> None:
    with pytest.raises(ApiError) as info:
        parse_headers(headers, AUTH, 0.0)
    assert info.value.status == status and info.value.param == param


def test_anonymous_mode_accepts_anyone() -> None:
    anon = Authenticator(AuthConfig(mode="anonymous", anonymous_tenant="demo"))
    assert parse_headers({}, anon, 0.0).caller.tenant == "demo"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (ApiKind.CHAT, {"model": "m"}, "messages"),
        (ApiKind.CHAT, {"model": "m", "messages": [{"content": "x"}]}, "messages[0]"),
        (
            ApiKind.CHAT,
            {"model": "m", "messages": [{"role": "u", "content": 5}]},
            "messages[0].content",
        ),
        (ApiKind.COMPLETIONS, {"model": "m", "prompt": [1, "a"]}, "prompt"),
        (ApiKind.COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        (ApiKind.COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        (ApiKind.COMPLETIONS, {"model": "m", "prompt": "x", "stream_options": 1}, "stream_options"),
    ],
)
def test_bad_bodies_name_the_field(path: str, body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_body(path, body)
    assert info.value.status == 400 and info.value.param == param


def test_body_essentials_and_upstream_bytes() -> None:
    body = {"model": "alias", "messages": [{"role": "user", "content": "x" * 40}], "stream": True}
    raw = orjson.dumps(body)
    model, stream, wants_usage, prompt_tokens, max_tokens = parse_body(ApiKind.CHAT, body)
    assert (model, stream, wants_usage) == ("alias", True, False)
    assert prompt_tokens > 10 and max_tokens > 0
    sent = orjson.loads(upstream_body(raw, body, "served", True))
    assert sent["model"] == "served" and sent["stream_options"] == {"include_usage": True}
    plain = {"model": "m", "prompt": [1, 2, 3]}
    assert upstream_body(orjson.dumps(plain), plain, "m", False) == orjson.dumps(plain)
