"""The hedging race's pure parts: when an attempt has its first token, and what a lost race is."""

from __future__ import annotations

from inferplane.core.retry import FailureKind
from inferplane.gateway.hedge_io import has_answer, race_failure

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


def test_a_role_chunk_alone_is_not_a_first_token() -> None:
    assert not has_answer(ROLE)
    assert not has_answer(ROLE + TOKEN[:20])  # the token event is not complete yet
    assert has_answer(ROLE + TOKEN)
    assert has_answer(TOKEN.replace(b"\n\n", b"\r\n\r\n"))


def test_errors_finishes_usage_and_done_end_the_wait() -> None:
    assert has_answer(b'data: {"error":{"message":"boom"}}\n\n')
    assert has_answer(b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n')
    assert has_answer(b'data: {"choices":[],"usage":{"completion_tokens":0}}\n\n')
    assert has_answer(b"data: [DONE]\n\n")
    assert has_answer(b"data: not json\n\n")
    assert not has_answer(b": keep-alive comment\n\n")


def test_a_race_is_lost_by_retryable_failures_only() -> None:
    assert race_failure(200, b"x") is None
    assert race_failure(200, b"") is FailureKind.RESET  # closed before any byte
    assert race_failure(503, b"") is FailureKind.SERVER_ERROR
    assert race_failure(429, b"") is FailureKind.OVERLOADED
    assert race_failure(400, b"") is None  # the request's own fault: an answer, not a loss
