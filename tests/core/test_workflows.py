"""The admission ledger of workflows: standing, retries, TTL and bounds."""

from __future__ import annotations

import pytest

from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.types import CallContext, PriorityClass
from inferplane.core.workflows import WorkflowLedger


def wcall(wf: str | None, step: int | None = None, steps: int | None = None) -> CallContext:
    return CallContext(
        f"{wf}-{step}", "t", "m", PriorityClass.STANDARD, 0.0, 10, 10,
        workflow_id=wf, workflow_step=step, workflow_steps=steps,
    )  # fmt: skip


def serve(ledger: WorkflowLedger, c: CallContext, now: float, tokens: int = 100) -> None:
    ledger.on_admit(c, now)
    ledger.on_dispatch(c, now)
    assert c.workflow_id is not None
    ledger.on_finish(c.workflow_id, now, num_tokens=tokens, cost_usd=0.01, success=True)


def test_standing_of_new_known_and_plain_calls() -> None:
    ledger = WorkflowLedger(WorkflowConfig(assumed_remaining_steps=2.0))
    assert ledger.standing(wcall(None)) is None
    first = ledger.standing(wcall("w", 1))
    assert first is not None and first.is_new and first.progress == 0.0
    for s in (1, 2):
        serve(ledger, wcall("w", s), float(s))
    unknown_total = ledger.standing(wcall("w", 3))
    assert unknown_total is not None and not unknown_total.is_new
    assert unknown_total.progress == pytest.approx(2 / (2 + 2.0))  # steps assumed to come
    known = ledger.standing(wcall("w", 3, steps=4))
    assert known is not None and known.progress == pytest.approx(0.5)
    rec = ledger.get("w")
    assert rec is not None and (rec.steps_done, rec.tokens, rec.max_step) == (2, 200, 2)
    assert rec.cost_usd == pytest.approx(0.02) and rec.in_flight == 0


def test_only_dispatched_steps_count_as_retries() -> None:
    ledger = WorkflowLedger(WorkflowConfig(retry_allowance=1))
    c = wcall("w", 1)
    ledger.on_admit(c, 0.0)  # queued, then evicted: never ran
    ledger.on_finish("w", 0.0, num_tokens=0, cost_usd=0.0, success=False)
    again = ledger.standing(c)
    assert again is not None and not again.is_retry
    ledger.on_admit(c, 1.0)
    ledger.on_dispatch(c, 1.0)
    ledger.on_finish("w", 1.0, num_tokens=5, cost_usd=0.0, success=False)
    retry = ledger.standing(c)
    assert retry is not None and retry.is_retry and retry.protected
    ledger.on_admit(c, 2.0)
    ledger.on_dispatch(c, 2.0)
    rec = ledger.get("w")
    assert rec is not None and rec.retries_used == 1
    exhausted = ledger.standing(c)
    assert exhausted is not None and not exhausted.protected


def test_idle_workflows_expire_but_busy_ones_stay() -> None:
    ledger = WorkflowLedger(WorkflowConfig(idle_ttl_s=10.0))
    serve(ledger, wcall("idle", 1), 0.0)
    ledger.on_admit(wcall("busy", 1), 0.0)
    assert ledger.expire(5.0) == []
    assert ledger.expire(10.0) == ["idle"]
    assert ledger.get("busy") is not None and len(ledger) == 1
    assert ledger.end("busy") and not ledger.end("busy")


def test_bounded_dropping_idle_workflows_first() -> None:
    ledger = WorkflowLedger(WorkflowConfig(max_workflows=3))
    ledger.on_admit(wcall("busy", 1), 0.0)
    for i in range(10):
        serve(ledger, wcall(f"w{i}", 1), float(i + 1))
    assert len(ledger) == 3 and ledger.get("busy") is not None and ledger.get("w9") is not None
