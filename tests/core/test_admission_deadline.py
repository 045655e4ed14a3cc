"""The deadline test for a call that would wait for a slot: it waits in the gateway queue
(late binding), not at a full engine, so the full engines' own slot waits (the predictor's
prior of a slot held ``mean_output_tokens``) do not refuse it; a call that cannot make it
even so is still refused."""

from __future__ import annotations

import pytest

from inferplane.core.admission import Admission, Enqueue, Reject
from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.admission_deadline import deadline_miss, overtaken
from inferplane.core.capacity import ready_estimate, slot_freed
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.queueing import WorkAhead
from inferplane.core.routing_config import EndpointPrior
from inferplane.core.types import EndpointState, EndpointView, PriorityClass
from tests.core.routing_helpers import view
from tests.core.test_admission import NO_HEADROOM, call

# the peers' emulated 16-slot engine at time scale 10 (gateway/priors.py figures, rounded)
PRIOR = EndpointPrior(
    prefill_tokens_per_s=2928.0, decode_base_s=0.0727, decode_per_seq_s=0.00065,
    decode_full_kv_s=0.208, throughput_tokens_per_s=194.0, max_num_seqs=16,
)  # fmt: skip
STD = PriorityClass.STANDARD


def _predictor(names: tuple[str, ...] = ("a", "b")) -> LatencyPredictor:
    pred = LatencyPredictor()
    for name in names:
        pred.set_prior(name, PRIOR)
    return pred


def _full(name: str) -> EndpointView:
    return view(name, in_flight=18, running=16, waiting=2, kv=0.1)


def test_a_full_endpoint_is_predicted_as_it_will_be_with_a_free_slot() -> None:
    pred, full = _predictor(), _full("a")
    freed = slot_freed(full, 16)
    assert (freed.in_flight, freed.load.num_running, freed.load.num_waiting) == (15, 15, 0)
    assert freed.load.kv_usage == full.load.kv_usage
    idle = view("b", in_flight=3, running=3)
    assert slot_freed(idle, 16) is idle
    plain = pred.predict(full, "m", 300, 0.0).ttft_s
    ready = pred.predict(freed, "m", 300, 0.0).ttft_s
    assert plain > 3.0 > 0.5 > ready  # two calls over the slots x 256 tokens vs none


def test_ready_estimate_takes_the_best_endpoint_as_it_will_be() -> None:
    pred, cfg = _predictor(), AdmissionConfig(headroom=NO_HEADROOM)
    pool = [_full("a"), view("b", in_flight=6, running=6)]
    best = ready_estimate("m", STD, 300, pool, pred, cfg, 0.0)
    assert best is not None
    assert best.ttft_s == pytest.approx(pred.predict(pool[1], "m", 300, 0.0).ttft_s)
    down = [view("a", state=EndpointState.EJECTED)]
    assert ready_estimate("m", STD, 300, down, pred, cfg, 0.0) is None


def _admission() -> Admission:
    return Admission(AdmissionConfig(headroom=NO_HEADROOM), _predictor())


def test_a_call_on_a_full_pool_is_queued_when_the_queue_lets_it_make_its_deadline() -> None:
    pool = [_full("a"), _full("b")]
    c = call("r", prompt=300, max_tokens=20, deadline_s=4.0)
    # the plain test alone refuses it: two slot waits of 256 tokens each on every engine
    cap_best = _predictor().predict(pool[0], "m", 300, 0.0)
    assert deadline_miss(c, cap_best, cap_best.ttft_s, 0.0, 20, 1.0) is not None
    decision = _admission().admit(c, pool, 0.0)
    assert isinstance(decision, Enqueue), decision
    off = AdmissionConfig(headroom=NO_HEADROOM, queued_deadline_test=False)
    refused = Admission(off, _predictor()).admit(c, pool, 0.0)
    assert isinstance(refused, Reject) and refused.code == "deadline_unreachable"


def test_a_call_that_cannot_make_it_even_with_a_free_slot_is_refused() -> None:
    pool = [_full("a"), _full("b")]
    decision = _admission().admit(call("r", prompt=300, max_tokens=20, deadline_s=1.0), pool, 0.0)
    assert isinstance(decision, Reject) and decision.code == "deadline_unreachable"


def test_the_queue_ahead_still_counts() -> None:
    a, pool = _admission(), [_full("a"), _full("b")]
    for i in range(8):  # 8 queued calls of 500 output tokens: ~10 s at 388 tok/s
        queued = a.admit(call(f"q{i}", prompt=300, max_tokens=500, deadline_s=90.0), pool, 0.0)
        assert isinstance(queued, Enqueue)
    late = a.admit(call("late", prompt=300, max_tokens=20, deadline_s=4.0), pool, 0.0)
    assert isinstance(late, Reject) and late.code == "deadline_unreachable"
    assert "queue " in late.message and "x TPOT" in late.message  # the parts, for diagnosis


def test_overtaken_keeps_the_share_not_overtaken() -> None:
    whole, first = WorkAhead(10, 1000, 500), WorkAhead(2, 200, 100)
    assert overtaken(whole, first, 1.0) == first
    assert overtaken(whole, first, 0.0) == whole
    assert overtaken(whole, first, 0.5) == WorkAhead(6, 600, 300)
