"""The workflow ledger shared by two gateways through Redis (issue 11).

Two in-process gateways, each with its own state store, point at the same Redis under a
key prefix of this test's own. Steps run on gateway A are in the shared record, and
gateway B, which never saw the workflow, judges its next step with that history (sunk
progress, steps dispatched: a re-run is a retry); ``GET /v1/workflows/{id}`` shows the same
ledger on both. Redis must be up (127.0.0.1:6379): an unreachable Redis fails the test.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from inferplane.config import FleetConfig
from inferplane.core.types import scoped_workflow_id
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.shared_ledger import setup_workflow_routes
from inferplane.state.config import StateBackend, StateConfig
from inferplane.state.redis import RedisStore
from tests.gateway.fakes import FakeEngine, fake_engines, fleet_config
from tests.state.conftest import SHARED_URL, require_redis

pytestmark = [pytest.mark.redis]

WF = "wf-shared"
#: The id the gateways keep it under (the anonymous tenant's; ``scoped_workflow_id``).
KEY = scoped_workflow_id("anonymous", WF)


def redis_config(engines: list[FakeEngine], url: str, prefix: str, **state: Any) -> FleetConfig:
    base = fleet_config(engines, log_requests=False)
    cfg = StateConfig(backend=StateBackend.REDIS, redis_url=url, key_prefix=prefix, **state)
    return base.model_copy(update={"state": cfg})


async def start_gateway(config: FleetConfig) -> tuple[Gateway, str, Callable[[], Any]]:
    gateway = Gateway(config)
    app = gateway.build_app()
    setup_workflow_routes(app, gateway)
    runner, port = await start_server(app, "127.0.0.1", 0)
    return gateway, f"http://127.0.0.1:{port}", runner.cleanup


async def step(
    session: aiohttp.ClientSession, url: str, workflow: str, n: int, of: int, **extra: Any
) -> int:
    headers = {"X-Workflow-Id": workflow, "X-Workflow-Step": str(n), "X-Workflow-Steps": str(of)}
    body = {"model": "m", "messages": [{"role": "user", "content": f"step {n}"}], **extra}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        data = await r.json()
        assert r.status == 200, data
        assert data["choices"][0]["message"]["content"]
        return r.status


async def until(check: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def store_prefix() -> AsyncIterator[tuple[RedisStore, str]]:
    require_redis()
    prefix = f"test:ledger:{uuid.uuid4().hex[:12]}:"
    store = RedisStore(SHARED_URL, prefix=prefix, op_timeout_s=2.0, connect_timeout_s=2.0)
    yield store, prefix
    await store.clear()
    await store.close()


def judged(gateway: Gateway) -> tuple[int, int, int, int]:
    """(steps done, highest step, retries used, tokens) in B's own ledger: what its admission
    weighed a call with (``WorkflowLedger.standing`` reads exactly these). Read from the
    ledger rather than by wrapping ``standing``: a compiled build (``make compiled``) has no
    assignable methods."""
    rec = gateway.gate.core.workflows.get(KEY)
    assert rec is not None
    return rec.steps_done, rec.max_step, rec.retries_used, rec.tokens


async def test_steps_on_one_gateway_are_known_to_the_other(
    store_prefix: tuple[RedisStore, str],
) -> None:
    store, prefix = store_prefix
    async with fake_engines(2) as engines, aiohttp.ClientSession() as session:
        config = redis_config(engines, SHARED_URL, prefix, op_timeout_s=1.0)
        _, url_a, stop_a = await start_gateway(config)
        gw_b, url_b, stop_b = await start_gateway(config)
        try:
            for n in (1, 2, 3):
                await step(session, url_a, WF, n, 4)

            async def a_flushed() -> bool:
                rec = await store.workflow_get(KEY, time.time())
                return rec is not None and rec.steps_done == 3 and rec.in_flight == 0

            await until(a_flushed)
            shared = await store.workflow_get(KEY, time.time())
            assert shared is not None
            assert (shared.max_step, shared.steps_expected, shared.retries_used) == (3, 4, 0)
            assert shared.tokens == 3 * 15  # the fake engine's usage: 10 prompt + 5 output
            assert shared.cost_usd > 0
            assert gw_b.gate.core.workflows.get(KEY) is None  # B has never seen it

            await step(session, url_b, WF, 4, 4)
            hydrated = gw_b.gate.ledger_sync
            assert hydrated is not None and hydrated.stats().hydrations == 1
            # A's 3 steps and 45 tokens were known when step 4 was weighed (progress 3 of 4,
            # A's tokens as attained service), and step 4 was not a retry.
            assert judged(gw_b) == (4, 4, 0, 4 * 15)

            await step(session, url_b, WF, 2, 4)  # re-runs a step A dispatched: a retry
            assert judged(gw_b) == (5, 4, 1, 5 * 15)

            async def b_flushed() -> bool:
                rec = await store.workflow_get(KEY, time.time())
                return rec is not None and rec.steps_done == 5 and rec.in_flight == 0

            await until(b_flushed)
            views = []
            for url in (url_a, url_b):
                async with session.get(f"{url}/v1/workflows/{WF}") as r:
                    assert r.status == 200
                    views.append(await r.json())
            assert views[0]["shared"] == views[1]["shared"]
            got = views[0]["shared"]
            assert (got["steps_done"], got["max_step"], got["retries_used"]) == (5, 4, 1)
            assert got["tokens"] == 5 * 15
            for view in views:  # each gateway's own view caught up with the shared one
                local = view["local"]
                assert (local["steps_done"], local["tokens"], local["retries_used"]) == (5, 75, 1)
                assert view["store"] == "shared"

            async with session.get(f"{url_b}/v1/workflows/no-such-workflow") as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "workflow_not_found"
            async with session.get(f"{url_a}/v1/stats") as r:
                sync = (await r.json())["admission"]["workflow_sync"]
            assert sync["updates"] >= 3 and sync["update_errors"] == 0 and sync["pending"] == 0
        finally:
            await stop_a()
            await stop_b()
