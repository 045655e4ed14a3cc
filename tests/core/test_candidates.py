"""Candidate sets for routing over a large pool: prefix holders, affinity, d at random."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.candidates import candidates, deepest_held
from inferplane.core.prefix_index import IndexSource, PrefixIndex
from tests.core.routing_helpers import view

POOL = [view(f"e{i}") for i in range(40)]


class _Held:
    """A holder index over a dict key -> endpoint names."""

    def __init__(self, held: dict[int, list[str]]) -> None:
        self.held = held

    def is_held(self, key: int) -> bool:
        return bool(self.held.get(key))

    def holders(self, key: int) -> list[str]:
        return list(self.held.get(key, []))


def test_a_pool_no_larger_than_d_is_returned_whole_in_order() -> None:
    assert candidates(POOL[:8], 8, random.Random(1)) == POOL[:8]
    assert candidates(POOL[:8], 0, random.Random(1)) == POOL[:8]  # 0: sampling off
    assert candidates(POOL, 50, random.Random(1)) == POOL


def test_d_random_endpoints_in_pool_order_and_seeded() -> None:
    picked = candidates(POOL, 5, random.Random(7))
    assert len(picked) == 5 and len({v.name for v in picked}) == 5
    positions = [POOL.index(v) for v in picked]
    assert positions == sorted(positions)
    assert candidates(POOL, 5, random.Random(7)) == picked
    others = {tuple(v.name for v in candidates(POOL, 5, random.Random(s))) for s in range(20)}
    assert len(others) > 10  # the draw moves with the seed


def test_deepest_held_bisects_to_the_longest_held_prefix() -> None:
    keys = list(range(100, 120))
    assert deepest_held(keys, _Held({})) == 0
    held = {k: ["e1"] for k in keys[:13]}
    assert deepest_held(keys, _Held(held)) == 13
    assert deepest_held(keys, _Held({k: ["e1"] for k in keys})) == 20


def test_the_deepest_holders_and_the_affinity_endpoint_are_always_in() -> None:
    keys = list(range(10))
    held = {k: ["e3", "e30"] for k in keys[:6]} | {k: ["e3"] for k in keys[6:9]}
    for seed in range(30):
        picked = candidates(
            POOL, 4, random.Random(seed), keys=keys, index=_Held(held), affinity_endpoint="e17"
        )
        names = {v.name for v in picked}
        assert {"e3", "e17"} <= names  # e3 holds the deepest block; e30 only a shorter run
        assert len(picked) == 6


def test_holders_are_capped_and_an_unknown_affinity_is_ignored() -> None:
    keys = [1, 2]
    held = {1: [f"e{i}" for i in range(20)], 2: [f"e{i}" for i in range(20)]}
    picked = candidates(
        POOL, 3, random.Random(2), keys=keys, index=_Held(held), affinity_endpoint="gone",
        max_holders=4,
    )  # fmt: skip
    assert len(picked) == 7
    assert sum(1 for v in picked if int(v.name[1:]) < 20) >= 4


def test_when_picks_and_d_cover_the_pool_it_is_returned_whole() -> None:
    held = {1: ["e0", "e1"]}
    assert candidates(POOL[:5], 3, random.Random(1), keys=[1], index=_Held(held)) == POOL[:5]


def test_a_real_prefix_index_names_the_endpoint_a_prompt_was_routed_to() -> None:
    index = PrefixIndex()
    for v in POOL:
        index.add_endpoint(v.name, IndexSource.APPROXIMATE)
    keys = [11, 12, 13, 14]
    index.record_route("e25", keys, 0.0)
    index.record_route("e9", keys[:2], 0.0)
    assert index.is_held(13) and not index.is_held(99)
    assert index.holders(12) == ["e9", "e25"]
    assert deepest_held(keys, index) == 4
    picked = candidates(POOL, 2, random.Random(3), keys=keys, index=index)
    assert "e25" in {v.name for v in picked}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), d=st.integers(0, 45), seed=st.integers(0, 10**6))
def test_candidates_are_a_subset_in_pool_order_of_the_expected_size(
    n: int, d: int, seed: int
) -> None:
    pool = POOL[:n]
    picked = candidates(pool, d, random.Random(seed))
    positions = [pool.index(v) for v in picked]
    assert positions == sorted(set(positions))
    assert len(picked) == (n if d <= 0 or d >= n else d)
