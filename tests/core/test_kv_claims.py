"""KV claims (core/kv_claims.py) and the placement of new agent sessions by them (issue 4)."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.kv_claims import KVClaims
from inferplane.core.prefix_index import IndexSource, PrefixIndex
from inferplane.core.routing import route
from inferplane.core.routing_config import RoutingConfig
from tests.core.routing_helpers import FixedMatcher, call, view

KEYS = tuple(range(100))  # a 1600-token prompt in 16-token blocks


class ClaimingMatcher(FixedMatcher):
    """A prefix index stand-in that also reports fixed KV claims (blocks) per endpoint."""

    def __init__(self, blocks: dict[str, int], claims: dict[str, float]) -> None:
        super().__init__(blocks)
        self.claimed = claims

    def kv_claims(self, endpoints: Iterable[str], now: float) -> dict[str, float]:
        return {e: self.claimed.get(e, 0.0) for e in endpoints}


def test_distinct_blocks_are_claimed_once_and_decay_with_the_half_life() -> None:
    claims = KVClaims(half_life_s=4.0)
    claims.touch("a", range(100), 0.0)
    claims.touch("a", range(50, 150), 0.0)  # 50 shared blocks count once
    assert claims.claim_blocks("a", 0.0) == pytest.approx(150)
    assert claims.claim_blocks("a", 4.0) == pytest.approx(75)
    assert claims.claim_blocks("a", 8.0) == pytest.approx(37.5)
    claims.touch("a", range(100), 8.0)  # touched again: those weigh 1 again
    assert claims.claim_blocks("a", 8.0) == pytest.approx(100 + 50 / 4)
    assert claims.claim_blocks("b", 8.0) == 0.0


def test_blocks_past_the_horizon_leave_and_the_set_is_bounded() -> None:
    claims = KVClaims(half_life_s=1.0, horizon_half_lives=3.0, max_blocks_per_endpoint=64)
    claims.touch("a", range(10), 0.0)
    claims.touch("a", range(10, 20), 2.0)
    assert claims.working_set_size("a") == 20
    assert claims.claim_blocks("a", 2.5) == pytest.approx(10 * 2**-2.5 + 10 * 2**-0.5)
    assert claims.claim_blocks("a", 3.5) == pytest.approx(10 * 2**-1.5)  # the first ten left
    assert claims.working_set_size("a") == 10
    assert claims.claim_blocks("a", 100.0) == 0.0 and claims.working_set_size("a") == 0
    claims.touch("b", range(100), 0.0)
    assert claims.working_set_size("b") == 64
    assert claims.claim_blocks("b", 0.0) == pytest.approx(64)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.floats(0, 3)), max_size=40))
def test_claim_equals_the_decayed_sum_over_last_touches(
    touches: list[tuple[int, int, float]],
) -> None:
    """Incremental bookkeeping == the definition, recomputed from scratch."""
    claims = KVClaims(half_life_s=2.0, horizon_half_lives=50.0, reserve_growth=False)
    last: dict[int, float] = {}
    now = 0.0
    for start, length, step_s in touches:
        now += step_s
        keys = range(start * 10, start * 10 + length)
        claims.touch("a", keys, now)
        last.update(dict.fromkeys(keys, now))
    expected = sum(2 ** (-(now - t) / 2.0) for t in last.values())
    assert claims.claim_blocks("a", now) == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_a_new_session_reserves_the_growth_sessions_showed_and_follow_ups_consume_it() -> None:
    """Sessions are chains of prompts, each extending the last one's final block (its tip).
    Their growth past the tip, over the sessions begun, is reserved for each new one."""
    claims = KVClaims(half_life_s=1e9, reserve_half_life_s=1e9, growth_half_life_s=1e9)
    shared = list(range(10))  # a system prompt every session starts with
    claims.touch("a", [*shared, 100], 0.0)  # session 1 begins: nothing seen grow yet
    assert claims.expected_growth_blocks(0.0) == 0.0
    assert claims.claim_blocks("a", 0.0) == pytest.approx(11)
    claims.touch("a", [*shared, 100, 101, 102], 1.0)  # its follow-up adds 2 past the tip
    claims.touch("a", [*shared, 100, 101, 102, 103, 104, 105, 106], 2.0)  # and 4 more
    assert claims.expected_growth_blocks(2.0) == pytest.approx(6)  # 6 blocks / 1 session
    claims.touch("b", [*shared, 200], 3.0)  # session 2 begins on b: reserves 6
    assert claims.claim_blocks("b", 3.0) == pytest.approx(11 + 6)
    claims.touch("b", [*shared, 200, 201, 202, 203], 4.0)  # grows 3: 3 left reserved
    assert claims.claim_blocks("b", 4.0) == pytest.approx(14 + 3)
    claims.touch("b", [*shared, 200, 201, 202, 203], 5.0)  # a retry: neither new nor grown
    assert claims.claim_blocks("b", 5.0) == pytest.approx(14 + 3)
    assert claims.expected_growth_blocks(5.0) == pytest.approx(9 / 2)


def test_reservations_decay_and_a_burst_of_new_sessions_reserves_each() -> None:
    claims = KVClaims(half_life_s=1e9, reserve_half_life_s=2.0, growth_half_life_s=1e9)
    claims.touch("a", [1, 2], 0.0)
    claims.touch("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.0)  # grew 8: 8 per session
    for session in range(3):  # each begun session lowers the estimate (not seen grow yet)
        claims.touch("b", [1, 100 + session], 1.0)
    reserved = 8 + 8 / 2 + 8 / 3
    assert claims.claim_blocks("b", 1.0) == pytest.approx(4 + reserved)
    assert claims.claim_blocks("b", 3.0) == pytest.approx(4 + reserved / 2)
    off = KVClaims(reserve_growth=False)
    off.touch("a", [1, 2], 0.0)
    off.touch("a", [1, 2, 3, 4], 0.0)
    off.touch("a", [1, 9], 0.0)
    assert off.claim_blocks("a", 0.0) == pytest.approx(5)


def test_the_prefix_index_claims_what_was_routed_to_each_endpoint() -> None:
    index = PrefixIndex()
    index.add_endpoint("a", IndexSource.PRECISE)
    index.record_route("a", KEYS, 0.0)
    index.record_route("b", KEYS[:40], 0.0)  # approximate: registered on first route
    assert callable(getattr(index, "kv_claims", None))  # what routing checks (structural)
    assert index.kv_claims(["a", "b", "c"], 0.0) == {"a": 100.0, "b": 40.0, "c": 0.0}
    index.remove_endpoint("a")
    assert index.kv_claims(["a"], 0.0) == {"a": 0.0}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 200), min_size=2, max_size=6, unique=True), st.integers(0, 99))
def test_with_equal_scores_a_new_session_goes_to_the_smallest_kv_claim(
    tens: list[int], seed: int
) -> None:
    claimed = [10.0 * t for t in tens]  # in blocks, at least 10 apart
    names = [f"e{i}" for i in range(len(claimed))]
    matcher = ClaimingMatcher({}, dict(zip(names, claimed, strict=True)))
    views = [view(n) for n in names]
    first = call(prompt=1600, keys=KEYS, workflow_id="w")
    decision = route(first, views, 0.0, random.Random(seed), prefix_index=matcher)
    assert decision.primary == names[claimed.index(min(claimed))]


def test_a_new_session_joins_its_shared_prefix_unless_its_holder_is_much_fuller() -> None:
    """Copying a shared system prompt to one more engine costs its KV there for as long as
    sessions of that kind run, so a small difference in claims keeps the session with the
    prefix; a large one sends it to the emptier engine."""
    views = [view("holder"), view("empty")]
    first = call(prompt=1600, keys=KEYS, workflow_id="w")
    close = ClaimingMatcher({"holder": 80}, {"holder": 300.0, "empty": 200.0})
    assert route(first, views, 0.0, random.Random(1), prefix_index=close).primary == "holder"
    far = ClaimingMatcher({"holder": 80}, {"holder": 1500.0, "empty": 100.0})
    assert route(first, views, 0.0, random.Random(1), prefix_index=far).primary == "empty"


def test_an_established_session_stays_affine_under_light_load_whatever_the_claims() -> None:
    views = [view("home", running=2), view("empty")]
    matcher = ClaimingMatcher({"home": 95}, {"home": 1500.0, "empty": 0.0})
    later = call(prompt=1600, keys=KEYS, workflow_id="w")
    cfg = RoutingConfig(explain_top=2)
    decision = route(later, views, 0.0, random.Random(1), prefix_index=matcher,
                     affinity_endpoint="home", config=cfg)  # fmt: skip
    assert decision.primary == "home"
    assert all(a.axis != "kv_claim" for r in decision.ranked for a in r.axes)


def test_calls_outside_workflows_ignore_claims() -> None:
    views = [view("holder"), view("empty")]
    matcher = ClaimingMatcher({"holder": 95}, {"holder": 5000.0})
    plain = call(prompt=1600, keys=KEYS)
    assert route(plain, views, 0.0, random.Random(1), prefix_index=matcher).primary == "holder"


def test_the_new_sessions_claim_axis_is_explained() -> None:
    views = [view("a"), view("b")]
    matcher = ClaimingMatcher({}, {"a": 10.0, "b": 138.0})
    first = call(prompt=1600, keys=KEYS, workflow_id="w")
    decision = route(first, views, 0.0, random.Random(1), prefix_index=matcher,
                     config=RoutingConfig(explain_top=2))  # fmt: skip
    axes = {r.name: {a.axis: a for a in r.axes} for r in decision.ranked}
    assert decision.primary == "a"
    assert axes["a"]["kv_claim"].score == 1.0
    assert axes["b"]["kv_claim"].score == pytest.approx(0.5)  # 128 blocks more: halved
    assert "(+128)" in axes["b"]["kv_claim"].reason
