"""The wait-cap hold protects demand that exists (core/headroom.py, core/admission.py).

A lower class is held in the gateway queue while the predicted engine wait exceeds its
cap only while a higher class had a call within ``demand_window_s``; the cap follows the
TTFT budgets those calls carry. Before, a fleet serving standard calls alone was held at a
fixed 1 s of engine queue (the peer scoreboard's 0.7x shared-prefix run queued 347 calls).
"""

from __future__ import annotations

import math
import random

from inferplane.core.admission import Admit, Enqueue
from inferplane.core.admission_config import HeadroomConfig, PerClass
from inferplane.core.headroom import HeadroomDemand, decode_cap_s, decode_held
from inferplane.core.predictor import LatencyEstimate
from inferplane.core.routing_config import EndpointPrior
from tests.core.test_admission import (
    CRIT,
    IDLE,
    INF,
    PRIOR,
    SHED,
    STD,
    WAIT_CAP,
    StubPredictor,
    adm,
    call,
)


def test_no_higher_class_demand_means_no_hold() -> None:
    a = adm(StubPredictor(wait_s=5.0), headroom=WAIT_CAP)  # engines queue 5 s deep
    for i in range(20):  # standard and sheddable alone: nothing to keep headroom for
        assert isinstance(a.admit(call(f"s{i}", prio=STD), IDLE, float(i)), Admit)
    assert a.headroom.wait_caps(20.0).standard == INF
    assert a.headroom.wait_caps(20.0).sheddable == 0.5  # standard demand protects itself
    assert isinstance(a.admit(call("x", prio=SHED), IDLE, 20.0), Enqueue)


def test_held_mask_is_the_finite_wait_caps() -> None:
    rng = random.Random(7)
    no_std_cap = PerClass(critical=1, standard=INF, sheddable=2)
    seen = set()
    for config in (HeadroomConfig(), HeadroomConfig(max_wait_s=no_std_cap)):
        d, now = HeadroomDemand(config), 0.0
        for _ in range(400):
            now += rng.choice((0.5, 0.5, 0.5, 45.0))  # now and then past the demand window
            if rng.random() < 0.5:
                d.note(rng.choice((CRIT, STD, SHED)), rng.choice((None, 0.5, 2.0, INF)), now)
            caps = d.wait_caps(now)
            want = (not math.isinf(caps.standard), not math.isinf(caps.sheddable))
            assert d.held_mask(now) == want
            seen.add(want)
    # every reachable combination came up (a hold on standard also holds sheddable)
    assert seen == {(False, False), (False, True), (True, True)}


def test_critical_demand_holds_standard_until_the_window_passes() -> None:
    a = adm(StubPredictor(wait_s=1.5), headroom=WAIT_CAP)  # window 30 s by default
    assert isinstance(a.admit(call("s0", prio=STD), IDLE, 0.0), Admit)
    assert isinstance(a.admit(call("c", prio=CRIT), IDLE, 1.0), Admit)
    assert isinstance(a.admit(call("s1", prio=STD, arrival=2.0), IDLE, 2.0), Enqueue)  # 1.5 > 1
    assert a.poll(30.0, lambda m: IDLE) == []  # critical seen 29 s ago: still held
    out = a.poll(31.5, lambda m: IDLE)  # 30.5 s: the hold lifts, the queue drains
    assert [e.item.request_id for e in out] == ["s1"]


def test_cap_follows_the_ttft_budgets_of_higher_classes() -> None:
    a = adm(StubPredictor(wait_s=1.5), headroom=WAIT_CAP)  # shares 0.5 / 0.25
    a.note_arrival(call("c", prio=CRIT, ttft_budget_s=4.0), 0.0)  # e.g. a 2x slower fleet
    caps = a.headroom.wait_caps(0.0)
    assert (caps.critical, caps.standard) == (INF, 2.0)
    assert caps.sheddable == 1.0  # min over critical (0.25 x 4) and standard (none yet)
    assert isinstance(a.admit(call("s", prio=STD), IDLE, 0.0), Admit)  # 1.5 <= 2.0
    assert isinstance(a.admit(call("x", prio=SHED), IDLE, 0.0), Enqueue)  # 1.5 > 1.0
    tight = adm(StubPredictor(wait_s=1.5), headroom=WAIT_CAP)
    tight.note_arrival(call("c", prio=CRIT, ttft_budget_s=2.0), 0.0)
    assert isinstance(tight.admit(call("s", prio=STD), IDLE, 0.0), Enqueue)  # 1.5 > 1.0


def test_budget_mean_moves_with_calls_and_ignores_nonsense() -> None:
    d = HeadroomDemand(HeadroomConfig(budget_share=PerClass(critical=1, standard=1, sheddable=1)))
    d.note(CRIT, 2.0, 0.0)
    for budget in (-1.0, 0.0, math.inf, math.nan, None):
        d.note(CRIT, budget, 0.0)
    assert d.wait_caps(0.0).standard == 2.0
    for _ in range(200):
        d.note(CRIT, 6.0, 1.0)
    assert 5.9 < d.wait_caps(1.0).standard <= 6.0
    assert d.wait_caps(1.0 + 30.0 + 1e-6).standard == INF  # the window passed


def test_retry_budgets_lower_the_cap_by_a_bounded_step() -> None:
    d = HeadroomDemand(HeadroomConfig())
    for _ in range(50):
        d.note(CRIT, 2.0, 0.0)
    d.note(CRIT, 0.1, 0.0)  # a retry with little budget left moves the mean by 10% only
    assert d.wait_caps(0.0).standard > 0.9


def _critical_chat(d: HeadroomDemand | None = None) -> HeadroomDemand:
    """Critical chat as in bench/overload_live.py: 2 s TTFT, 30 s end to end, 100 tokens."""
    d = d or HeadroomDemand(HeadroomConfig())
    d.note(CRIT, 2.0, 0.0, e2e_budget_s=30.0, num_output_tokens=100)
    return d


def test_decode_need_is_time_left_after_ttft_per_output_token() -> None:
    needs = _critical_chat().tpot_needs(0.0)  # needs 28 s / 100 tokens = 0.28 s per token
    assert needs.critical == INF
    assert math.isclose(needs.standard, 0.28) and math.isclose(needs.sheddable, 0.28)
    assert HeadroomDemand(HeadroomConfig()).tpot_needs(0.0).standard == INF  # no demand
    no_deadline = HeadroomDemand(HeadroomConfig())
    no_deadline.note(CRIT, 2.0, 0.0)  # a budget but no deadline: nothing to decode against
    assert no_deadline.tpot_needs(0.0).standard == INF
    assert _critical_chat().tpot_needs(31.0).standard == INF  # the window passed


def _cap(share: float, need_s: float = 0.28) -> float:
    """The stub's cap: its batch of one (PRIOR) plus ``share`` of the slack to the need."""
    return decode_cap_s(need_s, PRIOR.decode_base_s + PRIOR.decode_per_seq_s, share)


def test_engines_too_slow_to_decode_critical_answers_hold_lower_classes() -> None:
    share = HeadroomConfig().tpot_share  # of the slack: standard's over sheddable's
    assert _cap(share.sheddable) < 0.07 < _cap(share.standard) < 0.2
    slow = adm(StubPredictor(wait_s=0.0, tpot_s=0.2), headroom=WAIT_CAP)
    _critical_chat(slow.headroom)
    assert isinstance(slow.admit(call("s", prio=STD), IDLE, 0.0), Enqueue)
    assert isinstance(slow.admit(call("c", prio=CRIT), IDLE, 0.0), Admit)  # never held
    assert slow.poll(1.0, lambda m: IDLE) == []  # still too slow: stays queued
    fast = adm(StubPredictor(wait_s=0.0, tpot_s=0.07), headroom=WAIT_CAP)
    _critical_chat(fast.headroom)
    assert isinstance(fast.admit(call("s", prio=STD), IDLE, 0.0), Admit)
    assert isinstance(fast.admit(call("x", prio=SHED), IDLE, 0.0), Enqueue)


def test_the_decode_hold_lifts_when_tpot_recovers() -> None:
    stub = StubPredictor(wait_s=0.0, tpot_s=0.2)
    a = adm(stub, headroom=WAIT_CAP)
    a.admit(call("c", prio=CRIT, deadline_s=30.0, ttft_budget_s=2.0), IDLE, 0.0)
    assert isinstance(a.admit(call("s", prio=STD), IDLE, 0.0), Enqueue)
    stub.tpot_s = 0.01  # the engines' batches drained
    assert [e.item.request_id for e in a.poll(1.0, lambda m: IDLE)] == ["s"]


def test_the_need_follows_the_tightest_calls_and_rises_slowly() -> None:
    d = _critical_chat()  # 28 s for 100 tokens
    d.note(CRIT, 2.0, 1.0, e2e_budget_s=30.0, num_output_tokens=1100)  # halfway in rate
    assert math.isclose(d.tpot_needs(1.0).standard, 28.0 / 600.0)
    before = d.tpot_needs(1.0).standard
    for i in range(10):  # ten looser calls raise it by 2% of the rate gap each
        d.note(CRIT, 2.0, 2.0 + i, e2e_budget_s=30.0, num_output_tokens=100)
    tokens = 28.0 / d.tpot_needs(12.0).standard
    assert 500 < tokens < 600
    assert d.tpot_needs(12.0).standard > before


def test_the_cap_is_a_share_of_the_slack_above_a_batch_of_one() -> None:
    # Deadlines 2x the full-batch time on engines whose batch of one takes most of it (the
    # peers' 16-slot fleet): a share of the need (0.4 x 0.16) sat under the floor (0.07).
    assert math.isclose(decode_cap_s(0.16, 0.07, 0.4), 0.07 + 0.4 * 0.09)
    assert decode_cap_s(0.05, 0.07, 0.4) == 0.07  # need under the floor: the floor
    assert decode_cap_s(INF, 0.07, 0.4) == INF  # nothing to protect
    assert decode_cap_s(0.16, 0.07, 5.0) == 0.16  # never above the need itself


def _est(tpot_s: float, raw_tpot_s: float) -> LatencyEstimate:
    return LatencyEstimate(0.1, tpot_s, 0.0, 0.1, 0.1, raw_tpot_s)


def test_held_only_while_no_endpoint_is_within_its_cap() -> None:
    prior = EndpointPrior(decode_base_s=0.07, decode_per_seq_s=0.0)
    # calibrated 2x slower than its prior: floor 0.14, cap 0.14 + 0.4 x (0.3 - 0.14) = 0.204
    slow = (_est(0.21, 0.105), prior)
    ok = (_est(0.08, 0.08), prior)  # floor 0.07, cap 0.162
    assert decode_held(0.3, 0.4, [slow])
    assert not decode_held(0.3, 0.4, [slow, ok])
    assert not decode_held(0.3, 0.4, [(_est(0.2, 0.1), prior)])  # 0.2 <= 0.204
    assert not decode_held(0.3, 0.4, [])  # no endpoint takes work: nothing to protect here
    assert not decode_held(INF, 0.4, [slow])
