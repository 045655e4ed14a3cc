"""The ledger sync without Redis: two admission controllers share one in-memory store.

Covers the rules the Redis tests cannot force: a read that hangs is given up after the
read timeout (the call is judged on the local view, counted), a read within the freshness
window is skipped, and the flusher leaves both the store and the writer's own ledger with
the same record. And ``GET /v1/workflows/{id}`` shows a tenant only its own workflows,
and token settlements reach the store summed (one charge per scope per interval).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from inferplane.config import ApiKeyConfig, AuthConfig
from inferplane.core.admission import Admission
from inferplane.core.admission_config import AdmissionConfig, QuotaLimits, QuotasConfig
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.state import BucketTake, WorkflowDelta
from inferplane.core.types import CallContext, PriorityClass
from inferplane.core.workflows import WorkflowRecord
from inferplane.gateway.admission_gate import AdmissionGate
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.shared_ledger import SharedLedger
from inferplane.state.memory import MemoryStore
from inferplane.state.quota_client import SharedQuotas
from tests.gateway.fakes import fake_engines, fleet_config
from tests.gateway.test_shared_ledger import start_gateway


def _call(step: int, wid: str = "w") -> CallContext:
    return CallContext(
        request_id=f"r{step}", tenant="t", model="m", priority=PriorityClass.STANDARD,
        arrival_s=0.0, num_prompt_tokens=10, max_tokens=10, workflow_id=wid,
        workflow_step=step, workflow_steps=4,
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class HangingStore(MemoryStore):
    """Reads never answer (a store that stalls); counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        self.reads += 1
        await asyncio.sleep(3600)
        return None


async def test_a_hanging_read_is_given_up_and_the_call_judged_locally() -> None:
    store = HangingStore()
    sync = SharedLedger(store, Admission(), Clock(), read_timeout_s=0.01)
    started = time.monotonic()
    await sync.hydrate(_call(3))
    assert time.monotonic() - started < 2.0  # bounded, not the hour the store would take
    stats = sync.stats()
    assert (stats.hydration_timeouts, stats.hydrations, store.reads) == (1, 0, 1)
    assert sync.ledger.get("w") is None  # nothing invented


async def test_writes_reach_the_store_and_the_other_controller_reads_them() -> None:
    store, clock = MemoryStore(), Clock()
    core_a, core_b = Admission(), Admission()
    sync_a = SharedLedger(store, core_a, clock, fresh_s=0.5)
    sync_b = SharedLedger(store, core_b, clock, fresh_s=0.5)
    for step in (1, 2, 3):
        call = _call(step)
        core_a.workflows.on_admit(call, clock.now)
        core_a.workflows.on_dispatch(call, clock.now)
        core_a.on_finish(call, clock.now, num_tokens=100, cost_usd=0.25, success=True)
    assert len(sync_a.ledger.outbox) == 9
    await sync_a.flush()
    assert sync_a.ledger.outbox == [] and sync_a.stats().updates <= 6  # coalesced
    shared = await store.workflow_get("w", time.time())
    own = core_a.workflows.get("w")
    assert shared is not None and own is not None
    fields: Any = ("steps_done", "max_step", "tokens", "cost_usd", "in_flight", "steps_expected")
    assert [getattr(shared, f) for f in fields] == [3, 3, 300, 0.75, 0, 4]
    assert [getattr(own, f) for f in fields] == [getattr(shared, f) for f in fields]

    await sync_b.hydrate(_call(4))
    standing = core_b.workflows.standing(_call(4))
    assert standing is not None and standing.progress == 0.75
    done_elsewhere = WorkflowDelta("t", steps_done=1, tokens=10)  # just after B's read
    await store.workflow_update("w", done_elsewhere, time.time(), 300.0)
    await sync_b.hydrate(_call(4))  # within fresh_s: not read again
    assert sync_b.stats().hydrations == 1
    clock.now += 1.0
    await sync_b.hydrate(_call(4))  # stale: read again, and the new step is seen
    got = core_b.workflows.get("w")
    assert sync_b.stats().hydrations == 2 and got is not None and got.steps_done == 4


async def test_the_workflow_view_shows_a_tenant_only_its_own_workflows() -> None:
    keys = {"k-acme": "acme", "k-other": "other"}
    auth = AuthConfig(mode="api_keys", keys=tuple(
        ApiKeyConfig(key_sha256=hashlib.sha256(k.encode()).hexdigest(), tenant=t)
        for k, t in keys.items()
    ))  # fmt: skip
    async with fake_engines(1) as engines:
        base = fleet_config(engines, log_requests=False)
        config = base.model_copy(update={"gateway": base.gateway.model_copy(update={"auth": auth})})
        _, url, stop = await start_gateway(config)  # memory state: the local view
        try:
            async with aiohttp.ClientSession() as session:
                hdrs = {"Authorization": "Bearer k-acme", "X-Workflow-Id": "wf-acme",
                        "X-Workflow-Step": "1"}  # fmt: skip
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(f"{url}/v1/chat/completions", json=body, headers=hdrs):
                    pass
                got = {}
                for key in ("k-acme", "k-other", None):
                    auth_hdr = {"Authorization": f"Bearer {key}"} if key else {}
                    async with session.get(f"{url}/v1/workflows/wf-acme", headers=auth_hdr) as r:
                        got[key] = (r.status, await r.json())
        finally:
            await stop()
    assert got["k-acme"][0] == 200
    view = got["k-acme"][1]
    assert view["shared"] is None and view["store"] == "local"
    assert view["local"]["tenant"] == "acme" and view["local"]["max_step"] == 1
    assert got["k-other"][0] == 404  # another tenant's workflow reads as unknown
    assert got["k-other"][1]["error"]["code"] == "workflow_not_found"
    assert got[None][0] == 401


class CountingStore(MemoryStore):
    """Records every charge (settlements) it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.charges: list[list[BucketTake]] = []

    async def charge(self, takes: Sequence[BucketTake], now: float) -> None:
        self.charges.append(list(takes))
        await super().charge(takes, now)


async def test_token_settlements_are_summed_into_one_charge_per_scope() -> None:
    store = CountingStore()
    limits = QuotaLimits(requests_per_min=1000, tokens_per_min=100_000)
    config = AdmissionConfig(quotas=QuotasConfig(default_tenant=limits))
    shared = SharedQuotas(store, config.quotas)
    gate = AdmissionGate(
        config, LatencyPredictor(), lambda now, model: [], Clock(), GatewayMetrics(), shared
    )
    calls = [_call(step, wid=f"w{step}") for step in range(1, 6)]
    for call in calls:
        await gate._take_shared(call, None)
    reserved = shared.reserve_tokens(10, 10)
    for call in calls:
        gate.leave(call, num_tokens=15)
    assert store.charges == []  # not one store call per request...
    await asyncio.sleep(gate.settle_interval_s * 4)
    assert len(store.charges) == 1  # ...one for all five, with their sum
    (charge,) = store.charges[0]
    assert charge.bucket.key.endswith("tokens_per_min")
    assert charge.amount == 5 * (15 - reserved)
