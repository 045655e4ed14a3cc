"""The in-memory store: bucket rules, workflow records as the core ledger keeps them,
ejections, route records and the cache, and their bounds."""

from __future__ import annotations

import pytest

from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.state import BucketSpec, BucketTake, Ejection, WorkflowDelta
from inferplane.core.types import CallContext, PriorityClass
from inferplane.core.workflows import WorkflowLedger
from inferplane.state.memory import MemoryStore

RPM = BucketSpec("rpm", 60.0, 1.0)
TPM = BucketSpec("tpm", 1000.0, 1000.0 / 60)


async def test_take_is_all_or_nothing_and_names_the_refusing_bucket() -> None:
    s = MemoryStore()
    assert (await s.take([BucketTake(RPM, 1), BucketTake(TPM, 900)], 0.0)).admitted
    refused = await s.take([BucketTake(RPM, 1), BucketTake(TPM, 200)], 0.0)
    assert not refused.admitted and refused.refused_index == 1
    assert refused.wait_s == pytest.approx((200 - 100) / TPM.refill_per_s)
    assert await s.bucket(RPM, 0.0) == pytest.approx(59.0)  # the refused call took nothing
    assert await s.bucket(TPM, 0.0) == pytest.approx(100.0)


async def test_refill_wait_is_exact_and_large_calls_run_into_debt() -> None:
    s = MemoryStore()
    for _ in range(60):
        assert (await s.take([BucketTake(RPM, 1)], 10.0)).admitted
    r = await s.take([BucketTake(RPM, 1)], 10.0)
    assert not r.admitted and r.wait_s == pytest.approx(1.0)
    assert (await s.take([BucketTake(RPM, 1)], 11.0)).admitted  # refilled one exactly
    big = BucketSpec("big", 100.0, 100.0 / 60)
    assert (await s.take([BucketTake(big, 250)], 0.0)).admitted  # needs only a full bucket
    assert await s.bucket(big, 0.0) == pytest.approx(-150.0)
    assert not (await s.take([BucketTake(big, 1)], 60.0)).admitted  # still in debt


async def test_charge_refunds_up_to_capacity() -> None:
    s = MemoryStore()
    await s.take([BucketTake(TPM, 500)], 0.0)
    await s.charge([BucketTake(TPM, -200)], 0.0)
    assert await s.bucket(TPM, 0.0) == pytest.approx(700.0)
    await s.charge([BucketTake(TPM, -5000)], 0.0)
    assert await s.bucket(TPM, 0.0) == pytest.approx(1000.0)


def _call(step: int, steps: int | None = None) -> CallContext:
    return CallContext(f"r{step}", "t", "m", PriorityClass.STANDARD, 0.0, 10, 10,
                       workflow_id="w", workflow_step=step, workflow_steps=steps)  # fmt: skip


async def test_workflow_deltas_reproduce_the_core_ledger() -> None:
    ledger = WorkflowLedger(WorkflowConfig())
    s = MemoryStore()
    steps = [(1, True, 50), (2, False, 10), (2, True, 70), (3, True, 5)]
    for i, (step, ok, tokens) in enumerate(steps):
        now = float(i)
        c = _call(step, steps=4)
        ledger.on_admit(c, now)
        ledger.on_dispatch(c, now)
        ledger.on_finish("w", now + 0.5, num_tokens=tokens, cost_usd=0.01, success=ok)
        d = WorkflowDelta("t", steps_expected=4, in_flight=1, dispatched_step=step)
        await s.workflow_update("w", d, now, 300.0)
        done = WorkflowDelta("t", in_flight=-1, tokens=tokens, cost_usd=0.01, steps_done=int(ok))
        await s.workflow_update("w", done, now + 0.5, 300.0)
    assert await s.workflow_get("w", 10.0) == ledger.get("w")
    rec = ledger.get("w")
    assert rec is not None and rec.retries_used == 1 and rec.steps_done == 3


async def test_workflows_expire_after_their_idle_ttl_and_end() -> None:
    s = MemoryStore()
    await s.workflow_update("w", WorkflowDelta("t", in_flight=1), 0.0, 10.0)
    assert await s.workflow_get("w", 9.0) is not None
    assert await s.workflow_get("w", 10.5) is None
    await s.workflow_update("v", WorkflowDelta("t"), 0.0, 10.0)
    assert await s.workflow_end("v") and not await s.workflow_end("v")


async def test_ejection_keeps_the_later_expiry_and_drops_expired() -> None:
    s = MemoryStore()
    await s.eject(Ejection("a", 100.0, "errors"))
    await s.eject(Ejection("a", 50.0, "latency"))
    await s.eject(Ejection("b", 20.0))
    found = await s.ejections(30.0)
    assert set(found) == {"a"} and found["a"].until_s == 100.0
    assert found["a"].reason == "latency"
    assert await s.ejections(100.0) == {}


async def test_route_records_match_leading_unexpired_run_and_are_bounded() -> None:
    s = MemoryStore(max_route_keys=3)
    await s.record_route("e1", [1, 2, 3], 100.0)
    await s.record_route("e2", [1], 10.0)
    assert await s.match_routes([1, 2, 3, 4], ["e1", "e2", "e3"], 5.0) == {
        "e1": 3, "e2": 1, "e3": 0,
    }  # fmt: skip
    assert (await s.match_routes([1], ["e2"], 10.0))["e2"] == 0
    await s.record_route("e1", [9], 100.0)  # over the cap: the oldest (1) goes
    assert (await s.match_routes([1, 2], ["e1"], 5.0))["e1"] == 0
    assert (await s.match_routes([2, 3, 9], ["e1"], 5.0))["e1"] == 3


async def test_cache_expires_and_is_bounded_in_bytes() -> None:
    s = MemoryStore(max_cache_bytes=10)
    await s.cache_put("a", b"12345", 100.0)
    await s.cache_put("b", b"12345", 100.0)
    assert await s.cache_get("a", 1.0) == b"12345"
    await s.cache_put("c", b"123", 100.0)  # 13 bytes > 10: least recently used (b) goes
    assert await s.cache_get("b", 1.0) is None and await s.cache_get("a", 1.0) == b"12345"
    assert await s.cache_get("c", 100.0) is None
