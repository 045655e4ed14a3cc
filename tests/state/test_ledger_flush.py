"""The workflow ledger's write-behind: changes wait ``flush_delay_s`` and go out coalesced,
so a call that ends within the delay costs the store one update, not two; a flusher
stopped while changes wait still sends them."""

from __future__ import annotations

import asyncio
import time

from inferplane.core.admission import Admission
from inferplane.core.state import WorkflowDelta
from inferplane.core.types import CallContext, PriorityClass
from inferplane.core.workflows import WorkflowRecord
from inferplane.gateway.shared_ledger import SharedLedger
from inferplane.state.memory import MemoryStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.updates = 0

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord:
        self.updates += 1
        return await super().workflow_update(workflow_id, delta, now, ttl_s)


def _call(wid: str) -> CallContext:
    return CallContext(
        request_id=f"r-{wid}", tenant="t", model="m", priority=PriorityClass.STANDARD,
        arrival_s=0.0, num_prompt_tokens=10, max_tokens=10, workflow_id=wid,
        workflow_step=1, workflow_steps=3,
    )  # fmt: skip


async def _one_call(delay_s: float, finish_after_s: float) -> tuple[int, WorkflowRecord | None]:
    store, core = CountingStore(), Admission()
    sync = SharedLedger(store, core, lambda: 100.0, flush_delay_s=delay_s)
    flusher = asyncio.create_task(sync.run())
    call = _call("w")
    core.workflows.on_admit(call, 100.0)
    core.workflows.on_dispatch(call, 100.0)
    await asyncio.sleep(finish_after_s)
    core.on_finish(call, 100.0, num_tokens=50, cost_usd=0.5, success=True)
    await asyncio.sleep(delay_s + 0.05)  # a timer after the flusher's: it has flushed
    assert not sync.ledger.outbox
    flusher.cancel()
    await asyncio.gather(flusher, return_exceptions=True)
    return store.updates, await store.workflow_get("w", time.time())


async def test_a_call_that_ends_within_the_delay_is_one_update() -> None:
    updates, record = await _one_call(delay_s=0.2, finish_after_s=0.02)
    assert updates == 1
    assert record is not None and (record.steps_done, record.in_flight, record.tokens) == (1, 0, 50)


async def test_without_a_delay_the_admit_goes_out_before_the_finish() -> None:
    updates, record = await _one_call(delay_s=0.0, finish_after_s=0.05)
    assert updates == 2
    assert record is not None and (record.steps_done, record.in_flight, record.tokens) == (1, 0, 50)


async def test_changes_waiting_when_the_flusher_stops_are_sent() -> None:
    store, core = CountingStore(), Admission()
    sync = SharedLedger(store, core, lambda: 100.0, flush_delay_s=3600.0)
    flusher = asyncio.create_task(sync.run())
    for wid in ("a", "b", "c"):
        core.workflows.on_admit(_call(wid), 100.0)
    await asyncio.sleep(0.01)  # the flusher is waiting out its delay
    assert store.updates == 0
    flusher.cancel()
    await asyncio.gather(flusher, return_exceptions=True)
    assert store.updates == 3 and not sync.ledger.outbox
    for wid in ("a", "b", "c"):
        record = await store.workflow_get(wid, time.time())
        assert record is not None and record.in_flight == 1
