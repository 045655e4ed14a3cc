"""Accounting: exact cost split, task outcomes, bounds and the snapshot shape."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.accounting import Accountant, RequestRecord, TaskOutcome
from inferplane.core.types import EndpointInfo, EndpointState, EngineKind, PriorityClass

PRICE_A = 3600.0  # 1 USD per second: costs read as seconds
PRICE_B = 7200.0


def _info(name: str, price: float, tp: int = 1) -> EndpointInfo:
    return EndpointInfo(
        name, f"http://{name}", EngineKind.VLLM, ("m",), "h100", price, "r", tensor_parallel=tp
    )


def _acct(**kwargs: object) -> Accountant:
    infos = [_info("a", PRICE_A), _info("b", PRICE_B, tp=2)]
    acct = Accountant(infos, 0.0, **kwargs)  # type: ignore[arg-type]
    for name in ("a", "b"):
        acct.on_endpoint_state(name, EndpointState.READY, 0.0)
    return acct


def _rec(
    rid: str,
    endpoint: str | None = "a",
    *,
    ok: bool = True,
    wf: str | None = None,
    step: int | None = None,
    steps: int | None = None,
    tenant: str = "t",
    model: str = "m",
) -> RequestRecord:
    return RequestRecord(
        rid,
        tenant,
        model,
        endpoint,
        PriorityClass.STANDARD,
        wf,
        step,
        100,
        40,
        10,
        ok,
        workflow_steps=steps,
    )


def test_single_request_pays_its_endpoint_time() -> None:
    acct = _acct()
    acct.on_request_start("r1", "a", 2.0)
    cost = acct.on_request_end(_rec("r1"), 5.0)
    assert cost.usd == pytest.approx(3.0)
    assert cost.gpu_seconds == pytest.approx(3.0)


def test_overlapping_requests_split_equally() -> None:
    acct = _acct()
    acct.on_request_start("r1", "a", 0.0)
    acct.on_request_start("r2", "a", 2.0)
    c2 = acct.on_request_end(_rec("r2"), 4.0)
    c1 = acct.on_request_end(_rec("r1"), 6.0)
    # r1: alone 0-2 (2) + shared 2-4 (1) + alone 4-6 (2); r2: shared 2-4 (1)
    assert c1.usd == pytest.approx(5.0)
    assert c2.usd == pytest.approx(1.0)


def test_tensor_parallel_scales_gpu_seconds_not_price_share() -> None:
    acct = _acct()
    acct.on_request_start("r1", "b", 0.0)
    cost = acct.on_request_end(_rec("r1", "b"), 1.5)
    assert cost.usd == pytest.approx(3.0)  # 2 USD/s
    assert cost.gpu_seconds == pytest.approx(3.0)  # 2 GPUs


def test_idle_and_warming_spend_by_state() -> None:
    acct = Accountant([_info("a", PRICE_A)], 0.0)  # starts cold
    acct.on_endpoint_state("a", EndpointState.WARMING, 4.0)
    acct.on_endpoint_state("a", EndpointState.READY, 6.0)
    acct.on_request_start("r", "a", 7.0)
    acct.on_request_end(_rec("r"), 8.0)
    snap = acct.snapshot(10.0)
    assert snap.warming_usd == pytest.approx(6.0)
    assert snap.idle_usd == pytest.approx(3.0)
    assert snap.busy_usd == pytest.approx(1.0)
    assert snap.fleet_spend_usd == pytest.approx(10.0)
    assert snap.endpoints[0].busy_share == pytest.approx(0.1)


def test_failover_carries_the_first_attempt_cost() -> None:
    acct = _acct()
    acct.on_request_start("r", "a", 0.0)
    acct.on_request_start("r", "b", 1.0)  # moved after 1 s on a
    cost = acct.on_request_end(_rec("r", "b"), 2.0)
    assert cost.usd == pytest.approx(1.0 + 2.0)
    snap = acct.snapshot(2.0)
    assert snap.retry_usd == pytest.approx(1.0)
    assert snap.num_in_flight == 0
    assert snap.endpoints[0].in_flight == 0


def test_failed_request_is_wasted_and_a_failed_task() -> None:
    acct = _acct()
    acct.on_request_start("r1", "a", 0.0)
    acct.on_request_end(_rec("r1", ok=False), 2.0)
    acct.on_request_start("r2", "a", 2.0)
    acct.on_request_end(_rec("r2"), 3.0)
    snap = acct.snapshot(4.0)
    assert snap.wasted_usd == pytest.approx(2.0)
    assert snap.tasks["failure"] == 1 and snap.tasks["success"] == 1
    assert snap.cost_per_successful_task_usd == pytest.approx(snap.fleet_spend_usd)
    assert snap.success_per_dollar == pytest.approx(1.0 / snap.fleet_spend_usd)


def test_rejected_request_costs_nothing_but_counts() -> None:
    acct = _acct()
    acct.on_request_rejected(_rec("r", None), 1.0)
    snap = acct.snapshot(1.0)
    assert snap.num_rejected == 1 and snap.charged_usd == 0.0
    assert snap.tasks["failure"] == 1
    assert snap.models[0].rejected == 1
    assert snap.cost_per_successful_task_usd is None


def test_workflow_succeeds_on_last_step_and_sums_cost() -> None:
    acct = _acct()
    for step in (1, 2, 3):
        rid = f"w{step}"
        acct.on_request_start(rid, "a", float(step), workflow_id="w")
        acct.on_request_end(_rec(rid, wf="w", step=step, steps=3), step + 0.5)
    snap = acct.snapshot(5.0)
    assert snap.tasks["success"] == 1 and snap.tasks["open"] == 0
    top = snap.top_workflows[0]
    assert (top.workflow_id, top.outcome, top.steps_done) == ("w", "success", 3)
    assert top.cost_usd == pytest.approx(1.5)
    assert top.prompt_tokens == 300


def test_end_workflow_reports_outcome_and_unknown_is_false() -> None:
    acct = _acct()
    acct.on_request_start("r", "a", 0.0, workflow_id="w")
    acct.on_request_end(_rec("r", wf="w", step=1), 1.0)
    assert acct.end_workflow("w", TaskOutcome.FAILURE, 2.0) is True
    assert acct.end_workflow("w", TaskOutcome.FAILURE, 2.0) is False
    assert acct.end_workflow("nope", TaskOutcome.SUCCESS, 2.0) is False
    assert acct.snapshot(2.0).tasks["failure"] == 1


def test_idle_workflow_expires_but_busy_one_does_not() -> None:
    acct = _acct(workflow_idle_ttl_s=10.0)
    acct.on_request_start("r1", "a", 0.0, workflow_id="idle")
    acct.on_request_end(_rec("r1", wf="idle", step=1), 1.0)
    acct.on_request_start("r2", "a", 0.0, workflow_id="busy")  # long call still running
    assert acct.expire(5.0) == []
    assert acct.expire(11.0) == ["idle"]
    assert acct.snapshot(11.0).tasks["abandoned"] == 1
    assert acct.snapshot(11.0).tasks["open"] == 1


def test_open_workflows_bounded_oldest_abandoned() -> None:
    acct = _acct(max_open_workflows=2)
    for i in range(3):
        acct.on_request_start(f"r{i}", "a", float(i), workflow_id=f"w{i}")
        acct.on_request_end(_rec(f"r{i}", wf=f"w{i}", step=1), i + 0.5)
    snap = acct.snapshot(3.0)
    assert snap.tasks["open"] == 2 and snap.tasks["abandoned"] == 1
    assert acct.end_workflow("w0", TaskOutcome.SUCCESS, 3.0) is False


def test_per_key_totals_are_bounded() -> None:
    acct = _acct(max_keys=2)
    for i in range(4):
        acct.on_request_start(f"r{i}", "a", float(i))
        acct.on_request_end(_rec(f"r{i}", tenant=f"t{i}"), i + 1.0)
    tenants = {t.key: t for t in acct.snapshot(5.0).tenants}
    assert set(tenants) == {"t0", "t1", "(other)"}
    assert tenants["(other)"].requests == 2
    assert tenants["t0"].prompt_tokens == 100 and tenants["t0"].cached_tokens == 40


def test_top_workflows_ordered_and_capped() -> None:
    acct = _acct()
    for i in range(12):
        acct.on_request_start(f"r{i}", "a", 0.0, workflow_id=f"w{i}")
        acct.on_request_end(_rec(f"r{i}", wf=f"w{i}", step=1), 0.0)
        acct.on_request_start(f"x{i}", "a", 100.0 + 10 * i, workflow_id=f"w{i}")
        acct.on_request_end(_rec(f"x{i}", wf=f"w{i}", step=2), 100.0 + 10 * i + i)
    top = acct.snapshot(300.0).top_workflows
    assert len(top) == 10
    assert [w.workflow_id for w in top[:2]] == ["w11", "w10"]
    assert all(top[k].cost_usd >= top[k + 1].cost_usd for k in range(9))


def test_snapshot_is_json_ready_and_read_only() -> None:
    acct = _acct()
    acct.on_request_start("r", "a", 0.0, workflow_id="w")
    first = acct.snapshot(5.0)
    text = json.dumps(dataclasses.asdict(first))
    assert '"state": "ready"' in text and '"outcome": "open"' in text
    assert acct.snapshot(5.0) == first
    assert first.in_flight_usd == pytest.approx(5.0)


def test_unknown_endpoint_and_backward_time_are_harmless() -> None:
    acct = _acct()
    assert acct.on_request_start("r", "zzz", 1.0) is False
    acct.on_endpoint_state("zzz", EndpointState.READY, 1.0)
    acct.on_request_start("r2", "a", 5.0)
    cost = acct.on_request_end(_rec("r2"), 4.0)  # clock went back: clamped
    assert cost.usd == 0.0


_EVENT = st.tuples(
    st.sampled_from(["start", "end", "state"]),
    st.integers(0, 5),
    st.sampled_from(["a", "b"]),
    st.floats(0.0, 3.0),
    st.sampled_from(list(EndpointState)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_EVENT, max_size=40), st.floats(0.0, 5.0))
def test_costs_plus_idle_equal_fleet_spend(
    events: list[tuple[str, int, str, float, EndpointState]], tail_s: float
) -> None:
    acct = Accountant([_info("a", PRICE_A), _info("b", PRICE_B, tp=2)], 0.0)
    now, total = 0.0, 0.0
    for kind, rid, endpoint, dt, state in events:
        now += dt
        if kind == "start":
            acct.on_request_start(f"r{rid}", endpoint, now)
        elif kind == "end":
            total += acct.on_request_end(_rec(f"r{rid}", endpoint, ok=rid % 2 == 0), now).usd
        else:
            acct.on_endpoint_state(endpoint, state, now)
    mid = acct.snapshot(now + tail_s)
    parts = [mid.charged_usd, mid.in_flight_usd, mid.idle_usd, mid.warming_usd]
    assert math.fsum(parts) == pytest.approx(mid.fleet_spend_usd, rel=1e-9, abs=1e-9)
    assert mid.charged_usd == pytest.approx(total, rel=1e-9, abs=1e-9)
    for rid in range(6):  # finish everything: only charged + idle remain
        total += acct.on_request_end(_rec(f"r{rid}"), now + tail_s).usd
    end = acct.snapshot(now + tail_s)
    assert end.in_flight_usd == pytest.approx(0.0, abs=1e-9)
    assert math.fsum([total, end.idle_usd, end.warming_usd]) == pytest.approx(
        end.fleet_spend_usd, rel=1e-9, abs=1e-9
    )
    assert end.fleet_spend_usd == pytest.approx(3.0 * (now + tail_s))
