"""The synced workflow ledger: its deltas rebuild its own record under the store's rules,
coalescing them changes nothing the store ends up with, and merging a record from another
replica keeps the larger of every counter (so sharing converges in any order)."""

from __future__ import annotations

import random
from dataclasses import replace

from inferplane.core.state import WorkflowDelta, apply_workflow_delta
from inferplane.core.types import CallContext, PriorityClass
from inferplane.core.workflow_sync import SyncedLedger, coalesce
from inferplane.core.workflows import WorkflowLedger, WorkflowRecord


def _call(wid: str, step: int, steps: int | None = 10, rid: str = "r") -> CallContext:
    return CallContext(
        request_id=rid, tenant="t", model="m", priority=PriorityClass.STANDARD, arrival_s=0.0,
        num_prompt_tokens=10, max_tokens=10, workflow_id=wid, workflow_step=step,
        workflow_steps=steps,
    )  # fmt: skip


def _replay(changes: list[tuple[str, WorkflowDelta]]) -> dict[str, WorkflowRecord]:
    out: dict[str, WorkflowRecord] = {}
    for i, (wid, delta) in enumerate(changes):
        out[wid] = apply_workflow_delta(out.get(wid), wid, delta, float(i))
    return out


def _counters(r: WorkflowRecord) -> tuple[object, ...]:
    return (r.tenant, r.steps_done, r.steps_expected, r.max_step, r.tokens,
            round(r.cost_usd, 9), r.retries_used, r.in_flight)  # fmt: skip


def _random_run(ledger: WorkflowLedger, rng: random.Random, num_calls: int) -> None:
    """Calls of three workflows, admitted, dispatched (some re-running a step) and
    finished, interleaved as concurrent calls would be."""
    open_calls: list[CallContext] = []
    steps = {"a": 0, "b": 0, "c": 0}
    for i in range(num_calls):
        wid = rng.choice("abc")
        retry = steps[wid] > 0 and rng.random() < 0.2
        steps[wid] += 0 if retry else 1
        call = _call(wid, steps[wid], rid=str(i))
        ledger.on_admit(call, float(i))
        ledger.on_dispatch(call, float(i))
        open_calls.append(call)
        while open_calls and rng.random() < 0.6:
            done = open_calls.pop(rng.randrange(len(open_calls)))
            ledger.on_finish(done.workflow_id or "", float(i), num_tokens=rng.randint(1, 99),
                             cost_usd=rng.random() / 100, success=rng.random() < 0.8)  # fmt: skip
    for done in open_calls:
        ledger.on_finish(done.workflow_id or "", 1e6, num_tokens=1, cost_usd=0.0, success=True)


def test_deltas_rebuild_the_ledger_under_the_store_rules() -> None:
    ledger = SyncedLedger()
    _random_run(ledger, random.Random(7), 60)
    rebuilt = _replay(ledger.drain())
    assert set(rebuilt) == {"a", "b", "c"}
    for wid, record in rebuilt.items():
        own = ledger.get(wid)
        assert own is not None
        assert _counters(record) == _counters(own)
    assert ledger.outbox == []  # drained


def test_coalescing_changes_nothing_the_store_ends_up_with() -> None:
    for seed in range(20):
        ledger = SyncedLedger()
        _random_run(ledger, random.Random(seed), 40)
        changes = ledger.drain()
        packed = coalesce(changes)
        assert len(packed) < len(changes)  # admit and dispatch at least become one update
        plain, merged = _replay(changes), _replay(packed)
        assert {w: _counters(r) for w, r in plain.items()} == {
            w: _counters(r) for w, r in merged.items()
        }, seed


def test_every_change_is_announced_and_a_full_outbox_drops_the_oldest() -> None:
    told: list[int] = []
    ledger = SyncedLedger(on_change=lambda: told.append(1), max_outbox=3)
    call = _call("w", 1)
    ledger.on_admit(call, 0.0)
    ledger.on_dispatch(call, 0.0)
    ledger.on_finish("w", 1.0, num_tokens=5, cost_usd=0.1, success=True)
    ledger.on_finish("unknown", 1.0, num_tokens=5, cost_usd=0.1, success=True)  # not queued
    assert len(told) == 3
    ledger.on_admit(_call("w", 2), 2.0)
    assert ledger.dropped == 1
    assert [d.in_flight for _, d in ledger.outbox] == [0, -1, 1]  # the admit fell out first


def test_merge_keeps_the_larger_counters_and_the_local_in_flight() -> None:
    ledger = WorkflowLedger()
    call = _call("w", 2, steps=4)
    ledger.on_admit(call, 10.0)
    ledger.on_dispatch(call, 10.0)
    elsewhere = WorkflowRecord("w", "t", 3, 4, 3, 900, 0.5, 1, 7, 1e9, 1e9)
    ledger.merge(elsewhere, 11.0)
    ledger.merge(elsewhere, 12.0)  # idempotent
    got = ledger.get("w")
    assert got is not None
    assert (got.steps_done, got.max_step, got.tokens, got.cost_usd, got.retries_used) == (
        3, 3, 900, 0.5, 1,
    )  # fmt: skip
    assert got.in_flight == 1  # this process holds one call; the other 6 are elsewhere
    assert got.last_seen_s == 12.0  # the local clock, not the record's
    ledger.merge(replace(elsewhere, steps_done=1, tokens=10), 13.0)  # an older view
    again = ledger.get("w")
    assert again is not None and (again.steps_done, again.tokens) == (3, 900)


def test_a_merged_workflow_is_weighed_with_its_history() -> None:
    ledger = WorkflowLedger()
    call = _call("fresh-here", 4, steps=4)
    before = ledger.standing(call)
    assert before is not None and before.progress == 0.0
    ledger.merge(WorkflowRecord("fresh-here", "t", 3, 4, 3, 100, 0.2, 0, 0, 0.0, 0.0), 1.0)
    after = ledger.standing(call)
    assert after is not None
    assert not after.is_new and not after.is_retry
    assert after.progress == 0.75 and after.keep == 0.75
    retry = ledger.standing(_call("fresh-here", 3, steps=4))
    assert retry is not None and retry.is_retry  # step 3 was dispatched elsewhere
