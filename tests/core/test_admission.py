"""Admission: the early-rejection rule against a predictor stub, shedding by capacity and
class, workflow protection, Retry-After from drain time, quotas, late-binding dispatch."""

from __future__ import annotations

import random

import pytest

from inferplane.core.admission import Admission, Admit, Enqueue, Reject
from inferplane.core.admission_config import (
    AdmissionConfig,
    HeadroomConfig,
    PerClass,
    QueueConfig,
    QuotaLimits,
    QuotasConfig,
    WorkflowConfig,
)
from inferplane.core.predictor import LatencyEstimate
from inferplane.core.queueing import ExitKind
from inferplane.core.routing_config import EndpointPrior
from inferplane.core.types import CallContext, EndpointState, EndpointView, PriorityClass
from tests.core.routing_helpers import view

CRIT, STD, SHED = PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE
PRIOR = EndpointPrior(max_num_seqs=4, prefill_tokens_per_s=10_000.0, throughput_tokens_per_s=100.0)


class StubPredictor:
    """Fixed predictions: TTFT = wait + prompt / 10k tok/s; TPOT fixed; rates from PRIOR."""

    def __init__(self, wait_s: float = 0.1, tpot_s: float = 0.01) -> None:
        self.wait_s, self.tpot_s = wait_s, tpot_s

    def prior(self, view: EndpointView, model: str) -> EndpointPrior:
        return PRIOR

    def predict(
        self, view: EndpointView, model: str, num_uncached_tokens: int, now: float
    ) -> LatencyEstimate:
        prefill_s = num_uncached_tokens / PRIOR.prefill_tokens_per_s
        ttft_s = self.wait_s + prefill_s
        return LatencyEstimate(ttft_s, self.tpot_s, self.wait_s, prefill_s, ttft_s, self.tpot_s)

    def prefill_s(self, view: EndpointView, model: str, num_tokens: int, now: float) -> float:
        return num_tokens / PRIOR.prefill_tokens_per_s

    def throughput_tokens_per_s(self, view: EndpointView, model: str, now: float) -> float:
        return PRIOR.throughput_tokens_per_s


def call(
    rid: str = "r",
    *,
    prio: PriorityClass = STD,
    prompt: int = 1000,
    max_tokens: int = 100,
    arrival: float = 0.0,
    ttft_budget_s: float | None = None,
    deadline_s: float | None = None,
    tenant: str = "t",
    wf: str | None = None,
    step: int | None = None,
    steps: int | None = None,
) -> CallContext:
    return CallContext(
        rid, tenant, "m", prio, arrival, prompt, max_tokens, deadline_s, ttft_budget_s,
        wf, step, steps,
    )  # fmt: skip


INF = float("inf")
NO_HEADROOM = HeadroomConfig(
    slot_share=PerClass(critical=0.0, standard=0.0, sheddable=0.0),
    kv_share=PerClass(critical=0.0, standard=0.0, sheddable=0.0),
    max_wait_s=PerClass(critical=INF, standard=INF, sheddable=INF),
)


SAT_ONLY = PerClass(critical=0.0, standard=0.0, sheddable=0.0)


def adm(stub: StubPredictor | None = None, **cfg: object) -> Admission:
    """A controller without critical headroom unless the test asks (its own tests below),
    shedding on saturation alone (``shed_min_ttft_s`` 0; the TTFT gate's tests set it)."""
    cfg.setdefault("headroom", NO_HEADROOM)
    cfg.setdefault("shed_min_ttft_s", SAT_ONLY)
    return Admission(AdmissionConfig(**cfg), stub or StubPredictor())  # type: ignore[arg-type]


IDLE = [view("a"), view("b")]


def busy(in_flight: int, kv: float = 0.0) -> list[EndpointView]:
    """Two endpoints with ``in_flight`` outstanding each (4 slots + 1 allowance each)."""
    return [view("a", in_flight=in_flight, kv=kv), view("b", in_flight=in_flight, kv=kv)]


# -- the early-rejection rule ----------------------------------------------------------


def test_ttft_budget_against_the_prediction() -> None:
    a = adm(StubPredictor(wait_s=0.1))  # TTFT = 0.1 + 1000/10k = 0.2 s
    ok = a.admit(call("fits", ttft_budget_s=0.25), IDLE, 0.0)
    assert isinstance(ok, Admit) and ok.predicted_ttft_s == pytest.approx(0.2)
    no = a.admit(call("misses", ttft_budget_s=0.15), IDLE, 0.0)
    assert isinstance(no, Reject) and no.code == "deadline_unreachable" and no.status == 429
    assert "0.20s" in no.message
    # Time already spent waiting counts against the budget.
    late = a.admit(call("late", ttft_budget_s=0.25, arrival=0.0), IDLE, 0.1)
    assert isinstance(late, Reject)


def test_deadline_against_predicted_completion() -> None:
    a = adm(StubPredictor(wait_s=0.1, tpot_s=0.01), expected_output_tokens=50)
    # completion = 0.2 + 0.01 x 49 = 0.69 s (max_tokens 100 capped at the expected 50)
    assert isinstance(a.admit(call("ok", deadline_s=10.7), IDLE, 10.0), Admit)
    assert isinstance(a.admit(call("no", deadline_s=10.6), IDLE, 10.0), Reject)
    short = a.admit(call("short", deadline_s=10.3, max_tokens=5), IDLE, 10.0)  # 0.24 s
    assert isinstance(short, Admit)


def test_critical_is_queued_not_rejected_on_a_predicted_miss_unless_configured() -> None:
    a = adm(StubPredictor(wait_s=5.0))
    d = a.admit(call("c", prio=CRIT, ttft_budget_s=1.0), IDLE, 0.0)
    assert isinstance(d, Admit)
    queued = a.admit(call("c2", prio=CRIT, ttft_budget_s=1.0), busy(5), 0.0)
    assert isinstance(queued, Enqueue)  # no slot: waits, but only while it can still make it
    assert queued.item.expires_at_s == pytest.approx(1.0 - 1000 / 10_000)
    assert [e.kind for e in a.poll(0.95, lambda m: IDLE)] == [ExitKind.EXPIRED]
    strict = adm(StubPredictor(wait_s=5.0), reject_critical_on_deadline=True)
    assert isinstance(strict.admit(call("c", prio=CRIT, ttft_budget_s=1.0), IDLE, 0.0), Reject)


def test_retry_after_comes_from_drain_time_and_is_at_least_one_second() -> None:
    a = adm(StubPredictor(wait_s=0.2))
    quick = a.admit(call("x", ttft_budget_s=0.01), IDLE, 0.0)
    assert isinstance(quick, Reject) and quick.retry_after_s == 1  # 0.2 s drain, floor 1
    # Queue critical work: 10 calls x (1000 prompt, max 100 out: 83 expected from the 256
    # prior, core/output_lengths.py) on 2 x (10k prefill, 100 tok/s).
    for i in range(10):
        assert isinstance(a.admit(call(f"q{i}", prio=CRIT), busy(5), 0.0), Enqueue)
    slow = a.admit(call("y", ttft_budget_s=0.5), busy(5), 0.0)
    assert a.outputs.expected("m", 100) == 83
    drain_s = 0.2 + 10 * 1000 / 20_000 + 10 * 83 / 200
    assert isinstance(slow, Reject) and slow.retry_after_s == int(drain_s) + 1
    capped = adm(StubPredictor(wait_s=1e6)).admit(call("z", ttft_budget_s=1.0), IDLE, 0.0)
    assert isinstance(capped, Reject) and capped.retry_after_s == 120


def test_the_deadline_test_counts_only_the_queued_calls_due_before_it() -> None:
    """EDF within the class: a call due sooner overtakes queued calls due later, so their
    work does not count against its deadline; a call due after them waits for them all."""
    a = adm(StubPredictor(wait_s=0.1, tpot_s=0.01), edf_overtake_share=1.0)
    for i in range(10):  # 10 x (1000 prompt, 10 out) due at 30 s: 0.1 s each to drain
        q = call(f"q{i}", deadline_s=30.0, max_tokens=10)
        assert isinstance(a.admit(q, busy(5), 0.0), Enqueue)
    # Due at 1 s: behind all ten it would start at 0.2 + 1.0 s (a miss); it goes first.
    soon = a.admit(call("soon", deadline_s=1.0, max_tokens=10), busy(5), 0.0)
    assert isinstance(soon, Enqueue) and soon.predicted_ttft_s == pytest.approx(0.2)
    later = a.admit(call("later", deadline_s=40.0, max_tokens=10), busy(5), 0.0)
    assert isinstance(later, Enqueue) and later.predicted_ttft_s == pytest.approx(0.2 + 1.1)
    assert a.queue.work_ahead(STD, 1.0).num_calls == 1
    assert a.queue.work_ahead(STD).num_calls == 12


@pytest.mark.parametrize(("share", "ttft_s"), [(0.0, 1.2), (0.5, 0.7), (1.0, 0.2)])
def test_the_share_of_later_keyed_work_a_call_overtakes(share: float, ttft_s: float) -> None:
    a = adm(StubPredictor(wait_s=0.1, tpot_s=0.01), edf_overtake_share=share)
    for i in range(10):  # 0.1 s each to drain, due at 30 s
        assert isinstance(
            a.admit(call(f"q{i}", deadline_s=30.0, max_tokens=10), busy(5), 0.0), Enqueue
        )
    soon = a.admit(call("soon", deadline_s=20.0, max_tokens=10), busy(5), 0.0)
    assert isinstance(soon, Enqueue) and soon.predicted_ttft_s == pytest.approx(ttft_s)


# -- shedding by capacity and class ----------------------------------------------------


def test_sheddable_first_then_standard_critical_never() -> None:
    a = adm()
    sat1 = busy(in_flight=9)  # waiting 5 beyond 4 slots: saturation 1.0
    assert isinstance(a.admit(call("s", prio=SHED), sat1, 0.0), Reject)
    assert isinstance(a.admit(call("d", prio=STD), sat1, 0.0), Enqueue)
    sat2 = busy(in_flight=14)  # saturation 2.0
    d = a.admit(call("d2", prio=STD), sat2, 0.0)
    assert isinstance(d, Reject) and d.code == "saturated" and "standard" in d.message
    assert isinstance(a.admit(call("c", prio=CRIT), busy(in_flight=1000, kv=1.0), 0.0), Enqueue)


def test_saturation_sheds_only_while_the_predicted_ttft_is_long() -> None:
    """A saturated pool whose queue drains well inside the class's wait queues the call;
    the same saturation with a long predicted TTFT sheds it, the message saying both."""
    gate = PerClass(critical=INF, standard=2.0, sheddable=1.0)
    sat2 = busy(in_flight=14)  # saturation 2.0: over both thresholds
    quick = adm(StubPredictor(wait_s=0.5), shed_min_ttft_s=gate)  # TTFT 0.6 s
    assert isinstance(quick.admit(call("s", prio=SHED), sat2, 0.0), Enqueue)
    assert isinstance(quick.admit(call("d", prio=STD), sat2, 0.0), Enqueue)
    slow = adm(StubPredictor(wait_s=1.5), shed_min_ttft_s=gate)  # TTFT 1.6 s
    shed = slow.admit(call("s", prio=SHED), sat2, 0.0)
    assert isinstance(shed, Reject) and shed.code == "saturated"
    assert "predicted TTFT 1.60 s >= 1.00 s" in shed.message
    assert isinstance(slow.admit(call("d", prio=STD), sat2, 0.0), Enqueue)  # 1.6 < 2.0
    # The queue ahead counts: 8 critical calls queued drain in 8 x (0.05 + 0.5) s.
    for i in range(8):
        assert isinstance(quick.admit(call(f"c{i}", prio=CRIT), sat2, 0.0), Enqueue)
    late = quick.admit(call("d2", prio=STD), sat2, 0.0)
    assert isinstance(late, Reject) and late.code == "saturated"
    # Under the saturation threshold a long predicted TTFT alone sheds nothing.
    under = slow.admit(call("s2", prio=SHED), busy(in_flight=5), 0.0)
    assert isinstance(under, Enqueue)


def test_a_stated_ttft_budget_sets_the_gate_while_no_higher_class_waits() -> None:
    """A saturated pool queues a call predicted under what is left of its own TTFT budget
    (refusing it protects no one) and keeps the class's bar while a higher class has
    demand; past the demand window the budget counts again."""
    gate = PerClass(critical=INF, standard=2.0, sheddable=1.0)
    sat2 = busy(in_flight=14)  # saturation 2.0: over both thresholds

    def fresh() -> Admission:
        return adm(StubPredictor(wait_s=2.1), shed_min_ttft_s=gate)  # TTFT 2.2 s

    assert isinstance(fresh().admit(call("plain"), sat2, 0.0), Reject)  # no budget: 2.2 >= 2
    assert isinstance(fresh().admit(call("b3", ttft_budget_s=3.0), sat2, 0.0), Enqueue)
    shed = fresh().admit(call("s5", prio=SHED, ttft_budget_s=5.0), sat2, 0.0)
    assert isinstance(shed, Enqueue)  # sheddable: its 5 s budget over its 1 s bar
    # A critical call arrived: standard and sheddable are held to their classes' bars.
    a = fresh()
    a.note_arrival(call("c", prio=CRIT), 0.0)
    held = a.admit(call("b3-held", ttft_budget_s=3.0, arrival=1.0), sat2, 1.0)
    assert isinstance(held, Reject) and held.code == "saturated" and ">= 2.00 s" in held.message
    # Past the demand window the critical call no longer counts: the budget does again.
    later_s = 1.0 + a.config.headroom.demand_window_s
    free = a.admit(call("b3-after", ttft_budget_s=3.0, arrival=later_s), sat2, later_s)
    assert isinstance(free, Enqueue)


def test_the_ttft_gate_scales_with_workflow_progress() -> None:
    gate = PerClass(critical=INF, standard=2.0, sheddable=1.0)
    a = adm(StubPredictor(wait_s=2.1), shed_min_ttft_s=gate)  # TTFT 2.2 s
    _run_steps(a, "old", 4, 5)  # progress 4/5: threshold x (2.0 + 0.4) / 2.0 = 2.4 s
    sat = busy(in_flight=24)  # saturation 3.0: over every workflow threshold
    assert isinstance(a.admit(call("plain"), sat, 10.0), Reject)  # 2.2 >= 2.0
    old = a.admit(call("old-5", wf="old", step=5, steps=5), sat, 10.0)
    assert isinstance(old, Enqueue)  # 2.2 < 2.4: queued, not killed at step 5


def test_kv_pressure_saturates_and_a_kv_bound_engine_keeps_a_short_queue() -> None:
    a = adm(kv_queue_allowance=2)
    assert isinstance(a.admit(call("s", prio=SHED), busy(in_flight=0, kv=0.8), 0.0), Reject)
    # KV at the threshold: the call waits at the engine, which admits it as blocks free ...
    assert isinstance(a.admit(call("d", prio=STD), busy(in_flight=0, kv=0.9), 0.0), Admit)
    one_waits = [view(n, running=1, in_flight=2, kv=0.9) for n in "ab"]
    assert isinstance(a.admit(call("d1", prio=STD, tenant="u"), one_waits, 0.0), Admit)
    # ... until the allowance waits there: scraped, or sent since the scrape (in flight
    # beyond the calls running)
    scraped = [view(n, running=1, waiting=2, in_flight=3, kv=0.9) for n in "ab"]
    assert isinstance(a.admit(call("d2", prio=STD, tenant="v"), scraped, 0.0), Enqueue)
    sent = [view(n, running=1, in_flight=3, kv=0.9) for n in "ab"]
    assert isinstance(a.admit(call("d3", prio=STD, tenant="w"), sent, 0.0), Enqueue)
    # allowance 0: the gateway holds every call while KV reads full (the rule before)
    b = adm(kv_queue_allowance=0)
    assert isinstance(b.admit(call("e", prio=STD), busy(in_flight=0, kv=0.8), 0.0), Enqueue)


def test_a_kv_bound_engine_queues_only_classes_with_no_kv_kept_above_them() -> None:
    a = adm(headroom=HEADROOM, kv_queue_allowance=2)
    a.note_arrival(call("c0", prio=CRIT), 0.0)  # critical demand: standard keeps 0.1 of KV
    assert isinstance(a.admit(call("s", prio=STD), busy(0, kv=0.72), 0.0), Enqueue)
    assert isinstance(a.admit(call("c", prio=CRIT), busy(0, kv=0.95), 0.0), Admit)
    two_wait = [view(n, running=1, in_flight=3, kv=0.95) for n in "ab"]
    assert isinstance(a.admit(call("c2", prio=CRIT, tenant="u"), two_wait, 0.0), Enqueue)


def test_the_gateway_queue_counts_toward_saturation_and_capacity_scales_it() -> None:
    a = adm()
    full = busy(in_flight=5)  # no free slot, engine saturation 1/5 = 0.2
    for i in range(8):  # 8 queued / (2 endpoints x 5) = +0.8 -> 1.0
        assert isinstance(a.admit(call(f"q{i}"), full, 0.0), Enqueue)
    assert isinstance(a.admit(call("s", prio=SHED), full, 0.0), Reject)
    # Twice the endpoints: the same queue is half the saturation, sheddable is queued.
    wider = [*full, view("c", in_flight=5), view("d", in_flight=5)]
    assert isinstance(a.admit(call("s2", prio=SHED), wider, 0.0), Enqueue)
    # Critical sees only critical work ahead: admitted at once when a slot is free.
    assert isinstance(a.admit(call("c", prio=CRIT), [view("e")], 0.0), Admit)


def test_no_endpoint_accepting_work() -> None:
    a = adm()
    cold = [view("a", state=EndpointState.COLD), view("b", state=EndpointState.EJECTED)]
    d = a.admit(call("s"), cold, 0.0)
    assert isinstance(d, Reject) and d.status == 503 and d.code == "no_capacity"
    assert isinstance(a.admit(call("c", prio=CRIT), cold, 0.0), Enqueue)


# -- workflows -------------------------------------------------------------------------


def _run_steps(a: Admission, wf: str, steps: int, total: int) -> None:
    for s in range(1, steps + 1):
        c = call(f"{wf}-{s}", wf=wf, step=s, steps=total)
        assert isinstance(a.admit(c, IDLE, float(s)), Admit)
        a.on_finish(c, float(s), num_tokens=1100)


def test_new_workflows_are_refused_before_old_ones() -> None:
    a = adm(shed_saturation={"critical": float("inf"), "standard": 1.0, "sheddable": 0.5})
    _run_steps(a, "old", 4, 5)
    sat = busy(in_flight=9)  # saturation 1.0: the standard threshold
    assert isinstance(a.admit(call("plain"), sat, 10.0), Reject)
    assert isinstance(a.admit(call("new", wf="new", step=1, steps=5), sat, 10.0), Reject)
    old = a.admit(call("old-5", wf="old", step=5, steps=5), sat, 10.0)
    assert isinstance(old, Enqueue)  # progress 4/5 raises its threshold by 0.4
    assert old.item.keep == pytest.approx(0.8)
    # Just under the threshold a plain call is queued but a new workflow is refused.
    under = busy(in_flight=8)  # saturation 0.95 (with 1 queued ahead: 0.9 + 0.1)
    assert isinstance(a.admit(call("new2", wf="new2", step=1), under, 10.0), Reject)
    assert isinstance(a.admit(call("plain2"), under, 10.0), Enqueue)


def test_retry_allowance_then_protection_is_lost() -> None:
    a = adm(workflows=WorkflowConfig(retry_allowance=1))
    _run_steps(a, "w", 3, 4)
    retry = call("w-3b", wf="w", step=3, steps=4)
    standing = a.workflows.standing(retry)
    assert standing is not None and standing.is_retry and standing.protected
    assert isinstance(a.admit(retry, IDLE, 5.0), Admit)
    a.on_finish(retry, 5.0, num_tokens=10, success=False)
    again = a.workflows.standing(call("w-3c", wf="w", step=3, steps=4))
    assert again is not None and not again.protected and again.keep == 0.0


def test_queue_order_credits_progress_and_charges_attained_service() -> None:
    a = adm(workflows=WorkflowConfig(progress_credit_s=2.0, service_penalty_s=2.0))
    _run_steps(a, "far", 8, 10)  # progress 0.8, 8800 tokens attained
    full = busy(in_flight=5)
    plain = a.admit(call("plain", ttft_budget_s=10.0, arrival=20.0), full, 20.0)
    c = call("far-9", wf="far", step=9, steps=10, ttft_budget_s=10.0, arrival=20.0)
    far = a.admit(c, full, 20.0)
    assert isinstance(plain, Enqueue) and isinstance(far, Enqueue)
    share = 8800 / (8800 + 200_000)
    assert plain.item.order_key_s == pytest.approx(30.0)
    assert far.item.order_key_s == pytest.approx(30.0 - 2.0 * 0.8 + 2.0 * share)
    assert [e.item.request_id for e in a.poll(21.0, lambda m: IDLE, limit=1)] == ["far-9"]


# -- quotas, dispatch, accounting ------------------------------------------------------


def test_quota_refusal_names_the_quota_and_frees_nothing_else() -> None:
    quotas = QuotasConfig(tenants={"t": QuotaLimits(requests_per_min=1)})
    a = adm(quotas=quotas)
    assert isinstance(a.admit(call("a"), IDLE, 0.0), Admit)
    d = a.admit(call("b"), IDLE, 0.0)
    assert isinstance(d, Reject) and d.code == "quota_requests_per_min" and d.retry_after_s == 60
    snap = a.snapshot()
    assert snap.admitted == {"standard": 1} and snap.rejected == {
        "standard": {"quota_requests_per_min": 1}
    }


def test_late_binding_dispatch_when_a_slot_frees() -> None:
    quotas = QuotasConfig(default_tenant=QuotaLimits(max_concurrency=100))
    a = adm(quotas=quotas)
    pools = {"m": busy(in_flight=5)}
    for i, prio in enumerate([SHED, STD, CRIT]):
        assert isinstance(a.admit(call(f"r{i}", prio=prio), pools["m"], 0.0), Enqueue)
    assert a.poll(1.0, lambda m: pools[m]) == []  # still no free slot
    pools["m"] = [view("a", in_flight=3), view("b", in_flight=5)]  # two slots free on a
    out = a.poll(2.0, lambda m: pools[m])
    assert [(e.item.request_id, e.kind) for e in out] == [
        ("r2", ExitKind.DISPATCHED),
        ("r1", ExitKind.DISPATCHED),
    ]
    assert out[0].waited_s == 2.0 and len(a.queue) == 1
    assert a.quotas.concurrency("tenant", "t") == 3  # dispatched calls still hold theirs
    snap = a.snapshot()
    assert snap.exits["critical"] == {"dispatched": 1} and snap.queue_depth["sheddable"] == 1


def test_expired_and_evicted_calls_give_back_their_quota() -> None:
    quotas = QuotasConfig(default_tenant=QuotaLimits(max_concurrency=100))
    a = adm(quotas=quotas, queue=QueueConfig(max_items=1))
    full = busy(in_flight=5)
    first = a.admit(call("s", prio=SHED, ttft_budget_s=3.0), full, 0.0)
    assert isinstance(first, Enqueue)
    second = a.admit(call("d", prio=STD, ttft_budget_s=3.0), full, 0.0)
    assert isinstance(second, Enqueue) and [e.item.request_id for e in second.evicted] == ["s"]
    assert a.quotas.concurrency("tenant", "t") == 1
    third = a.admit(call("d2", prio=STD), full, 0.0)
    assert isinstance(third, Reject) and third.code == "queue_full" and third.retry_after_s >= 1
    out = a.poll(5.0, lambda m: full)  # past its budget: expired, never dispatched
    assert [(e.item.request_id, e.kind) for e in out] == [("d", ExitKind.EXPIRED)]
    assert a.quotas.concurrency("tenant", "t") == 0 and len(a.queue) == 0


def _pool(num_running: int) -> list[EndpointView]:
    half = num_running // 2
    return [view("a", in_flight=half), view("b", in_flight=num_running - half)]


def test_every_call_gets_exactly_one_outcome_under_overload() -> None:
    """Random overload: each call is finished, rejected, or leaves the queue; once."""
    rng = random.Random(7)
    a = adm(queue=QueueConfig(max_items=20))
    outcomes: dict[str, list[str]] = {}
    prio: dict[str, PriorityClass] = {}
    running: list[CallContext] = []
    for n in range(400):
        now = n * 0.05
        c = call(
            f"r{n}",
            prio=rng.choice(list(PriorityClass)),
            ttft_budget_s=rng.choice([None, 1.0, 5.0]),
            arrival=now,
        )
        prio[c.request_id] = c.priority
        d = a.admit(c, _pool(len(running)), now)
        if isinstance(d, Enqueue):
            for e in d.evicted:
                outcomes.setdefault(e.item.request_id, []).append(e.kind.value)
        elif isinstance(d, Admit):
            running.append(c)
        else:
            outcomes.setdefault(c.request_id, []).append(d.code)
        if running and rng.random() < 0.4:
            done = running.pop(0)
            a.on_finish(done, now, num_tokens=100)
            outcomes.setdefault(done.request_id, []).append("finished")
        for e in a.poll(now, lambda m: _pool(len(running)), limit=1):
            if e.kind is ExitKind.DISPATCHED:
                running.append(e.item.call)
            else:
                outcomes.setdefault(e.item.request_id, []).append(e.kind.value)
    for done in running:
        outcomes.setdefault(done.request_id, []).append("finished")
    for e in a.poll(1e9, lambda m: []):
        outcomes.setdefault(e.item.request_id, []).append(e.kind.value)
    assert len(outcomes) == 400 and all(len(o) == 1 for o in outcomes.values())
    assert len(a.queue) == 0 and a.quotas.num_open() == 0
    kinds = {o[0] for o in outcomes.values()}
    assert {"finished", "saturated"} <= kinds  # overload did shed, and work was served
    shed_critical = [r for r, o in outcomes.items() if prio[r] is CRIT and o[0] == "saturated"]
    assert shed_critical == []


# -- headroom for critical ---------------------------------------------------------------

HEADROOM = HeadroomConfig(
    slot_share=PerClass(critical=0.0, standard=0.25, sheddable=0.5),
    kv_share=PerClass(critical=0.0, standard=0.1, sheddable=0.3),
)


def test_lower_classes_leave_slots_free_for_critical() -> None:
    a = adm(headroom=HEADROOM)  # 4 slots + 1 allowance: standard stops at 4, sheddable at 3
    a.note_arrival(call("c0", prio=CRIT), 0.0)  # critical demand to protect
    pool = busy(in_flight=3)
    assert isinstance(a.admit(call("s", prio=STD), pool, 0.0), Admit)
    assert isinstance(a.admit(call("x", prio=SHED), pool, 0.0), Enqueue)
    pool = busy(in_flight=4)
    assert isinstance(a.admit(call("s2", prio=STD, tenant="u"), pool, 0.0), Enqueue)
    assert isinstance(a.admit(call("c", prio=CRIT), pool, 0.0), Admit)


def test_lower_classes_leave_kv_free_for_critical() -> None:
    a = adm(headroom=HEADROOM)  # kv threshold 0.8: standard under 0.7, sheddable under 0.5
    a.note_arrival(call("c0", prio=CRIT), 0.0)  # critical demand to protect
    assert isinstance(a.admit(call("x", prio=SHED), busy(0, kv=0.45), 0.0), Admit)
    assert isinstance(a.admit(call("x2", prio=SHED), busy(0, kv=0.55), 0.0), Enqueue)
    assert isinstance(a.admit(call("s", prio=STD), busy(0, kv=0.75), 0.0), Enqueue)
    assert isinstance(a.admit(call("c", prio=CRIT), busy(0, kv=0.75), 0.0), Admit)


def test_slots_and_kv_are_held_only_for_classes_with_demand_above() -> None:
    a = adm(headroom=HEADROOM)  # no critical call seen: standard may use every slot and KV
    assert isinstance(a.admit(call("s", prio=STD), busy(in_flight=4), 0.0), Admit)
    assert isinstance(a.admit(call("s2", prio=STD, tenant="u"), busy(0, kv=0.75), 0.0), Admit)
    # standard demand holds sheddable back (slots and KV), as critical demand would ...
    b = adm(headroom=HEADROOM)
    b.note_arrival(call("s0", prio=STD), 0.0)
    assert isinstance(b.admit(call("x", prio=SHED), busy(0, kv=0.55), 0.0), Enqueue)
    # ... until the demand window has passed: then nothing above sheddable is protected
    c = adm(headroom=HEADROOM)
    c.note_arrival(call("s0", prio=STD), 0.0)
    later = 0.1 + c.config.headroom.demand_window_s
    assert isinstance(c.admit(call("x", prio=SHED), busy(0, kv=0.55), later), Admit)


def test_poll_dispatches_lower_classes_only_above_their_headroom() -> None:
    a = adm(headroom=HEADROOM)
    full = busy(in_flight=5)
    for rid, prio in (("x", SHED), ("s", STD), ("c", CRIT)):
        assert isinstance(a.admit(call(rid, prio=prio), full, 0.0), Enqueue)
    pools = {"m": [view("a", in_flight=3), view("b", in_flight=5)]}  # two slots free on a
    out = a.poll(1.0, lambda m: pools[m])
    assert [e.item.request_id for e in out] == ["c"]  # standard would leave no headroom
    pools["m"] = [view("a", in_flight=1), view("b", in_flight=5)]  # four free on a
    out = a.poll(2.0, lambda m: pools[m])
    assert [e.item.request_id for e in out] == ["s", "x"]  # 4-1=3 for std, 3-1=2 for shed
    assert len(a.queue) == 0


def test_headroom_shares_are_validated() -> None:
    with pytest.raises(ValueError, match="headroom"):
        HeadroomConfig(slot_share=PerClass(critical=0.0, standard=1.0, sheddable=0.0))


def test_headroom_never_takes_the_last_slot_nor_all_kv() -> None:
    one = EndpointPrior(max_num_seqs=1, prefill_tokens_per_s=1e4, throughput_tokens_per_s=1e2)

    class OneSlot(StubPredictor):
        def prior(self, view: EndpointView, model: str) -> EndpointPrior:
            return one

    a = Admission(AdmissionConfig(engine_queue_allowance=0), OneSlot())
    assert isinstance(a.admit(call("x", prio=SHED), [view("a")], 0.0), Admit)
    with pytest.raises(ValueError, match="kv_threshold"):
        AdmissionConfig(kv_threshold=0.2, headroom=HEADROOM)


WAIT_CAP = NO_HEADROOM.model_copy(
    update={"max_wait_s": PerClass(critical=INF, standard=1.0, sheddable=0.5)}
)


def test_lower_classes_are_held_while_the_engines_queue_too_long() -> None:
    a = adm(StubPredictor(wait_s=0.6), headroom=WAIT_CAP)
    a.note_arrival(call("c0", prio=CRIT), 0.0)  # critical demand to protect (no budget)
    assert isinstance(a.admit(call("x", prio=SHED), IDLE, 0.0), Enqueue)  # 0.6 > 0.5
    assert isinstance(a.admit(call("s", prio=STD), IDLE, 0.0), Admit)  # 0.6 <= 1.0
    assert isinstance(a.admit(call("c", prio=CRIT), IDLE, 0.0), Admit)
    assert a.poll(1.0, lambda m: IDLE) == []  # still over the cap: stays queued


def test_dispatch_charges_the_wait_of_the_calls_it_sends() -> None:
    a = adm(StubPredictor(wait_s=0.4), headroom=WAIT_CAP)
    a.note_arrival(call("c0", prio=CRIT), 0.0)  # critical demand to protect (no budget)
    full = busy(in_flight=5)
    for i in range(3):
        assert isinstance(a.admit(call(f"x{i}", prio=SHED, prompt=2000), full, 0.0), Enqueue)
    # Pool prefill rate 2 x 10k tok/s: each 2000-token call adds 0.1 s to the 0.4 s wait.
    out = a.poll(1.0, lambda m: IDLE)
    assert [e.item.request_id for e in out] == ["x0", "x1"]  # 0.4, 0.5 <= 0.5; 0.6 is not
    assert len(a.queue) == 1


def test_default_headroom_keeps_a_share_of_a_big_batch_for_critical() -> None:
    big = EndpointPrior(max_num_seqs=256, prefill_tokens_per_s=1e4, throughput_tokens_per_s=1e2)

    class BigBatch(StubPredictor):
        def prior(self, view: EndpointView, model: str) -> EndpointPrior:
            return big

    def decide(prio: PriorityClass, in_flight: int) -> object:  # a fresh, empty controller
        a = Admission(AdmissionConfig(), BigBatch())
        a.note_arrival(call("c0", prio=CRIT), 0)  # critical demand to protect
        return a.admit(call(prio=prio), busy(in_flight), 0)

    # 256 + 1 slots per endpoint: standard leaves 17 (0.07) free, sheddable 33 (0.13).
    assert isinstance(decide(STD, 239), Admit) and isinstance(decide(STD, 240), Enqueue)
    assert isinstance(decide(SHED, 223), Admit) and isinstance(decide(SHED, 224), Enqueue)
    assert isinstance(decide(CRIT, 256), Admit) and isinstance(decide(CRIT, 257), Enqueue)
