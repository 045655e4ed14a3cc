"""Task-aware admission of new workflows: the odds table, what counts as a death, decay,
and the rule inside the controller (refused at step 0 while committed workflows of its
class die; long agents first; critical never; open again once deaths decay)."""

from __future__ import annotations

import pytest

from inferplane.core.admission import Admission, Admit, Enqueue, Reject
from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.admission_workflow import WorkflowGate, WorkflowOutcomes
from inferplane.core.types import CallContext, PriorityClass
from tests.core.test_admission import IDLE, adm, busy, call

CRIT, STD, SHED = PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE
#: No decay, so the table reads as counts.
CFG = WorkflowConfig(
    min_finish_share=0.5, step_prior_calls=20.0, abandon_after_s=20.0, step_outcome_half_life_s=1e12
)


def _serve(gate: WorkflowGate | WorkflowOutcomes, c: CallContext, now: float) -> None:
    """``c`` is admitted, served and ends at ``now``."""
    gate.opened(c, now)
    gate.decided(c, False, now)
    gate.closed(c, now)


def _gate(
    deaths: int, served: int, cfg: WorkflowConfig = CFG, prio: PriorityClass = STD
) -> WorkflowGate:
    """``served`` workflows serve their last step (step 2 of 2); ``deaths`` start a 30-step
    workflow and go silent; read at ``abandon_after_s``."""
    gate = WorkflowGate(cfg)
    for i in range(served):
        _serve(gate, call(f"s{i}", prio=prio, wf=f"s{i}", step=2, steps=2), 0.0)
    for i in range(deaths):
        _serve(gate, call(f"d{i}", prio=prio, wf=f"d{i}", step=1, steps=30), 0.0)
    gate.outcomes.sweep(cfg.abandon_after_s)
    return gate


def _first(steps: int | None, prio: PriorityClass = STD) -> CallContext:
    return call("first", prio=prio, wf="new", step=1, steps=steps)


NOW = CFG.abandon_after_s


# deaths, steps served (+20 served pseudo-steps); steps of the new workflow; refused?
@pytest.mark.parametrize(
    ("deaths", "served", "steps", "refused"),
    [
        (0, 0, 50, False),  # nothing seen: every workflow may start
        (0, 100, 50, False),  # committed workflows all finish
        (10, 70, 3, False),  # h = 10 / 100: 2 steps to go, odds 0.81
        (10, 70, 10, True),  # 9 steps to go: odds 0.39
        (2, 178, 30, False),  # h = 0.01: 29 steps, odds 0.75
        (2, 178, 80, True),  # 79 steps at the same hazard: odds 0.45 (long agents first)
        (3, 0, 5, False),  # three early deaths against the prior: h = 3 / 23, odds 0.57
        (3, 0, 6, True),  # one step more: odds 0.497
    ],
)
def test_odds_table(deaths: int, served: int, steps: int, refused: bool) -> None:
    gate = _gate(deaths, served)
    odds = gate.odds(_first(steps), None, NOW)
    assert odds.hazard == pytest.approx(deaths / (deaths + served + 20.0))
    assert odds.finish_share == pytest.approx((1 - odds.hazard) ** (steps - 1))
    assert (gate.refusal(_first(steps), None, NOW) is not None) is refused


def test_critical_and_a_disabled_gate_never_refuse() -> None:
    assert _gate(30, 0).refusal(_first(50, CRIT), None, NOW) is None
    off = _gate(30, 0, CFG.model_copy(update={"finish_gate": False}))
    assert off.refusal(_first(50), None, NOW) is None
    assert _gate(30, 0).refusal(_first(50), None, NOW) is not None


def test_classes_are_counted_apart() -> None:
    gate = _gate(30, 0, prio=SHED)
    assert gate.refusal(_first(20, SHED), None, NOW) is not None
    assert gate.refusal(_first(20, STD), None, NOW) is None


def test_steps_to_go_from_the_header_else_learned_else_assumed() -> None:
    gate = _gate(10, 10)  # h = 0.25
    assert gate.odds(_first(7), 3.0, NOW).steps_left == 6.0  # the header wins
    assert gate.odds(_first(None), 3.0, NOW).steps_left == 2.0  # learned mean length
    assumed = CFG.assumed_remaining_steps
    assert gate.odds(_first(None), None, NOW).steps_left == assumed
    assert gate.refusal(_first(None), 3.0, NOW) is None
    assert gate.refusal(_first(None), None, NOW) is not None  # 10 steps at h 0.25


def _hazard(out: WorkflowOutcomes, now: float) -> float:
    return out.hazard(STD, now)


def test_what_counts_as_a_death() -> None:
    out = WorkflowOutcomes(CFG)
    out.decided(call("r", wf="never", step=1, steps=9), True, 0.0)  # refused at step 0
    _serve(out, call("a", wf="done", step=3, steps=3), 0.0)  # served its last step
    _serve(out, call("b", wf="left", step=2, steps=5), 0.0)  # 3 steps to go
    _serve(out, call("c", wf="quiet"), 0.0)  # length unknown, served
    _serve(out, call("d", wf="gave-up"), 0.0)  # length unknown, served...
    out.decided(call("d2", wf="gave-up"), True, 0.0)  # ...then refused
    assert len(out) == 4  # the refused first call is not watched
    served = 2 + 20.0  # the steps numbered above 1 (and the prior)
    assert _hazard(out, 19.9) == pytest.approx(1 / (1 + served))  # "gave-up", at once
    assert _hazard(out, 20.0) == pytest.approx(2 / (2 + served))  # "left": silent 20 s
    assert len(out) == 0


def test_a_workflow_with_a_call_open_or_that_comes_back_is_alive() -> None:
    out = WorkflowOutcomes(CFG)
    _serve(out, call("a", wf="w", step=1, steps=5), 0.0)
    out.decided(call("b", wf="w", step=2, steps=5), True, 0.0)  # refused: dead...
    assert _hazard(out, 0.0) == pytest.approx(1 / 21)
    retry = call("b2", wf="w", step=2, steps=5)
    out.opened(retry, 15.0)  # ...until its retry comes back and waits in the queue 30 s
    assert _hazard(out, 15.0) == pytest.approx(0.0, abs=1e-12)
    assert _hazard(out, 40.0) == pytest.approx(0.0, abs=1e-12) and len(out) == 1
    out.decided(retry, False, 45.0)  # ...and is served
    out.closed(retry, 50.0)
    _serve(out, call("c", wf="w", step=5, steps=5), 60.0)
    assert _hazard(out, 100.0) == 0.0 and len(out) == 0  # it finished


def test_counts_halve_every_half_life_and_the_gate_reopens() -> None:
    cfg = CFG.model_copy(update={"step_outcome_half_life_s": 10.0})
    gate = _gate(30, 0, cfg)
    assert gate.odds(_first(20), None, NOW).hazard == pytest.approx(30 / 50)
    assert gate.odds(_first(20), None, NOW + 10.0).hazard == pytest.approx(15 / 35)
    assert gate.refusal(_first(20), None, NOW) is not None
    assert gate.refusal(_first(20), None, NOW + 200.0) is None  # 20 half-lives later


def test_watched_workflows_are_bounded() -> None:
    out = WorkflowOutcomes(CFG.model_copy(update={"max_workflows": 3}))
    for i in range(5):
        _serve(out, call(f"c{i}", wf=f"w{i}", step=1, steps=4), float(i))
    assert len(out) == 3


def test_zero_prior_and_nothing_seen_is_no_hazard() -> None:
    out = WorkflowOutcomes(CFG.model_copy(update={"step_prior_calls": 0.0}))
    assert out.hazard(SHED, 5.0) == 0.0


# -- inside the controller ---------------------------------------------------------------


def _dying_workflows(a: Admission, count: int, now: float) -> None:
    """``count`` 30-step workflows start, then their step 2 cannot make its TTFT budget."""
    for i in range(count):
        first = call(f"w{i}-1", wf=f"w{i}", step=1, steps=30, arrival=now)
        assert isinstance(a.admit(first, IDLE, now), Admit)
        a.on_finish(first, now, num_tokens=10)
    for i in range(count):
        step = call(f"w{i}-2", wf=f"w{i}", step=2, steps=30, arrival=now, ttft_budget_s=0.01)
        refused = a.admit(step, IDLE, now)
        assert isinstance(refused, Reject) and refused.code == "deadline_unreachable"


def test_new_workflows_are_refused_at_step_0_while_committed_ones_die() -> None:
    a = adm()
    _dying_workflows(a, 10, 0.0)  # refused with 29 steps to go: dead unless they come back
    long = a.admit(call("L-1", wf="L", step=1, steps=30), IDLE, 1.0)
    assert isinstance(long, Reject) and long.code == "workflow_unlikely_to_finish"
    assert long.status == 429 and long.retry_after_s >= 1
    assert a.workflows.get("L") is None  # nothing committed: no sunk cost
    short = a.admit(call("S-1", wf="S", step=1, steps=2), IDLE, 1.0)
    assert isinstance(short, Admit)  # h = 10 / 30: 1 step to go, odds 0.67
    assert isinstance(a.admit(call("plain"), IDLE, 1.0), Admit)  # chats are not gated
    later = a.admit(call("L2-1", wf="L2", step=1, steps=30), IDLE, 1000.0)
    assert isinstance(later, Admit)  # the deaths decayed away


def test_a_refused_step_that_is_retried_and_served_is_no_death() -> None:
    a = adm()
    _dying_workflows(a, 10, 0.0)
    for i in range(10):  # every retry gets through
        retry = call(f"w{i}-2b", wf=f"w{i}", step=2, steps=30, arrival=2.0)
        assert isinstance(a.admit(retry, IDLE, 2.0), Admit)
    assert a.gate.outcomes.hazard(STD, 2.0) == pytest.approx(0.0, abs=1e-12)
    assert isinstance(a.admit(call("L-1", wf="L", step=1, steps=30), IDLE, 2.0), Admit)


def test_queued_steps_count_when_they_leave_the_queue() -> None:
    a = adm()
    for i in range(3):
        first = call(f"q{i}-1", wf=f"q{i}", step=1, steps=10)
        assert isinstance(a.admit(first, IDLE, 0.0), Admit)
        a.on_finish(first, 0.0, num_tokens=1)
    for i in range(3):
        waiting = call(f"q{i}-2", wf=f"q{i}", step=2, steps=10)
        assert isinstance(a.admit(waiting, busy(in_flight=5), 0.0), Enqueue)
    assert a.gate.outcomes.hazard(STD, 0.0) == 0.0  # queued: alive, nothing served yet
    a.poll(0.5, lambda model: IDLE, limit=1)  # q0's step 2 dispatched: a step served
    a.on_finish(call("q0-2", wf="q0", step=2, steps=10), 60.0, num_tokens=1)  # alive at 60
    a.poll(61.0, lambda model: busy(in_flight=5))  # q1, q2 waited too long: expired
    served = 2 ** (-60.5 / 30.0)  # q0's step, decayed since
    assert a.gate.outcomes.hazard(STD, 61.0) == pytest.approx(2 / (2 + served + 20))
    # q0 is silent from 60 with steps to go: dead at 70 (abandon_after_s 10)
    deaths = 2 ** (-1 / 30.0) + 2 * 2 ** (-10 / 30.0)
    served = 2 ** (-70.5 / 30.0)
    assert a.gate.outcomes.hazard(STD, 71.0) == pytest.approx(deaths / (deaths + served + 20))


def test_mean_steps_learned_from_workflows_that_end() -> None:
    a = adm(workflows=WorkflowConfig(idle_ttl_s=10.0))
    assert a.workflows.mean_steps() is None
    for wf, steps in (("x", 2), ("y", 4)):
        for s in range(1, steps + 1):
            c = call(f"{wf}{s}", wf=wf, step=s)
            a.admit(c, IDLE, 0.0)
            a.on_finish(c, 0.0, num_tokens=1)
    assert a.workflows.end("x")
    assert a.workflows.mean_steps() == 2.0
    assert a.expire_workflows(100.0) == ["y"]
    assert a.workflows.mean_steps() == 3.0
