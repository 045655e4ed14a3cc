"""Upstream timeouts per priority class: a slow engine times a sheddable call out (504, the
engine's request aborted) while a standard call on it finishes; a retry or resumption gets what
is left of the class's limit since the call arrived, and none once it is spent. A call whose own
deadline passes is told so (``deadline_exceeded``) and that is not held against the engine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest

from inferplane.config import parse_config
from inferplane.core.retry import FailureKind
from inferplane.core.types import PriorityClass
from inferplane.gateway.context import RequestContext
from inferplane.gateway.proxy import Proxy
from inferplane.gateway.relay import err, timed_out
from inferplane.gateway.tracker import EndpointTracker
from tests.gateway.fakes import FakeEngine, fake_engines, fleet_config, running_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ONE_ENDPOINT = [
    {"name": "e0", "url": "http://127.0.0.1:9", "gpu": "h100", "price_per_hour_usd": 2.0,
     "models": ["m"]},
]  # fmt: skip


@contextlib.asynccontextmanager
async def _slow_engine_behind_a_gateway(
    **gateway: Any,
) -> AsyncIterator[tuple[FakeEngine, str, aiohttp.ClientSession]]:
    """One engine taking 0.6 s per whole answer, a gateway in front, a client session."""
    async with fake_engines(1) as engines:
        engine = engines[0]
        engine.num_tokens, engine.token_delay_s = 4, 0.15
        async with (
            running_gateway(fleet_config(engines, **gateway)) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            yield engine, url + "/v1/chat/completions", s


async def test_a_slow_engine_times_out_the_sheddable_class_only() -> None:
    timeouts = {"sheddable_s": 0.2, "standard_s": 30.0}
    async with _slow_engine_behind_a_gateway(timeouts=timeouts) as (engine, url, s):
        async with s.post(url, json=CHAT, headers={"X-Priority": "sheddable"}) as r:
            body = await r.json()
            assert r.status == 504, body
            assert body["error"]["code"] == "upstream_timeout"
        async with s.post(url, json=CHAT) as r:
            assert r.status == 200
    assert engine.aborted == 1 and engine.completed == 1


def _ctx(priority: PriorityClass, arrival_s: float, deadline_s: float | None) -> RequestContext:
    return RequestContext(
        request_id="r1", tenant="t", priority=priority, arrival_s=arrival_s, model="m",
        path="/v1/chat/completions", stream=False, client_wants_usage=False,
        num_prompt_tokens=8, max_tokens=4, deadline_s=deadline_s, ttft_budget_s=None,
        workflow_id=None, workflow_step=None, workflow_steps=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("now_s", "deadline_s", "again", "want_total_s"),
    [
        (100.0, None, False, 2.0),  # a first attempt: the class's whole limit
        (100.5, None, False, 2.0),  # (whatever time admission took)
        (100.5, None, True, 1.5),  # a retry: what is left since arrival
        (101.9, None, True, 0.1),
        (102.5, None, True, None),  # spent: no further attempt
        (100.5, 101.0, True, 0.5),  # the client's deadline comes first
        (101.5, 101.0, False, 0.001),  # past the deadline: a first attempt still answers
    ],
)
def test_attempt_limits(
    now_s: float, deadline_s: float | None, again: bool, want_total_s: float | None
) -> None:
    cfg = parse_config({"gateway": {"timeouts": {"sheddable_s": 2.0}}, "endpoints": ONE_ENDPOINT})
    clock = [now_s]
    tracker = EndpointTracker(cfg.endpoints, cfg.gateway, lambda: clock[0])
    session = cast(aiohttp.ClientSession, object())  # never used: no attempt is sent
    proxy = Proxy(session, tracker, cfg.gateway.timeouts, 1, lambda: clock[0])
    timeout = proxy._timeout(_ctx(PriorityClass.SHEDDABLE, 100.0, deadline_s), again)
    if want_total_s is None:
        assert timeout is None
    else:
        assert timeout is not None and timeout.total == pytest.approx(want_total_s)


def test_timeouts_config_is_per_class() -> None:
    timeouts = {"critical_s": 9, "sheddable_s": 1}
    t = parse_config(
        {"gateway": {"timeouts": timeouts}, "endpoints": ONE_ENDPOINT}
    ).gateway.timeouts
    assert [t.for_class(p) for p in PriorityClass] == [9.0, t.standard_s, 1.0]


async def test_a_call_past_its_deadline_is_told_so() -> None:
    async with (
        _slow_engine_behind_a_gateway() as (engine, url, s),
        s.post(url, json=CHAT, headers={"X-Deadline-Ms": "250"}) as r,
    ):
        body = await r.json()
        assert r.status == 504, body
        assert body["error"]["code"] == "deadline_exceeded"
    assert engine.aborted == 1


@pytest.mark.parametrize(
    ("deadline_s", "now_s", "want"),
    [
        (None, 50.0, FailureKind.TIMEOUT),  # no deadline: the engine's
        (100.0, 99.0, FailureKind.TIMEOUT),  # the engine's limit fired first
        (100.0, 99.999, FailureKind.EXPIRED),  # at the deadline (timers fire a little late)
        (100.0, 100.5, FailureKind.EXPIRED),
    ],
)
def test_a_timeout_is_the_callers_once_its_deadline_has_passed(
    deadline_s: float | None, now_s: float, want: FailureKind
) -> None:
    engines_error = err(504, "engine did not answer in time", "upstream_timeout")
    failed = timed_out(_ctx(PriorityClass.STANDARD, 0.0, deadline_s), now_s, engines_error, True)
    assert failed.kind is want and failed.sent
    code = "upstream_timeout" if want is FailureKind.TIMEOUT else "deadline_exceeded"
    assert failed.error.code == code
    # the caller's deadline is no failure of the engine's, and nothing is tried again
    assert failed.kind.counts_against_endpoint is (want is FailureKind.TIMEOUT)
    assert failed.kind.retryable is (want is FailureKind.TIMEOUT)
