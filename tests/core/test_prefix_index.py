"""The prefix index against hand-built engine events and a brute-force reference."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from inferplane.core.prefix_index import (
    IndexSource,
    PrefixIndex,
    PrefixIndexConfig,
    block_keys,
    root_key,
)

BS = 16


def engine_hashes(seed: int, tokens: list[int]) -> list[int]:
    """A fake engine's own chained hashes, seeded per process like vLLM's."""
    rng_hash = seed
    out = []
    for start in range(0, len(tokens) // BS * BS, BS):
        rng_hash = hash(("engine", rng_hash, tuple(tokens[start : start + BS]))) & (2**64 - 1)
        out.append(rng_hash)
    return out


def store(
    tokens: list[int], seed: int, first: int = 0, last: int | None = None, medium: str = "GPU"
) -> BlockStored:
    """BlockStored for blocks [first, last) of a prompt, chained to block first-1."""
    hashes = engine_hashes(seed, tokens)
    last = len(hashes) if last is None else last
    return BlockStored(
        block_hashes=tuple(hashes[first:last]),
        parent_block_hash=hashes[first - 1] if first else None,
        token_ids=tuple(tokens[first * BS : last * BS]),
        block_size=BS,
        medium=medium,
    )


def prompt(rng: random.Random, num_blocks: int, prefix: list[int] | None = None) -> list[int]:
    head = list(prefix or [])
    return head + [rng.randrange(32_000) for _ in range(num_blocks * BS - len(head))]


def test_block_keys_chain_and_prefix_property() -> None:
    rng = random.Random(1)
    tokens = prompt(rng, 4)
    keys = block_keys([*tokens, 5, 6, 7])  # a partial block has no key
    assert len(keys) == 4
    assert block_keys(tokens[: 2 * BS]) == keys[:2]
    other = tokens[:]
    other[BS] += 1  # change block 1: blocks 1.. differ, block 0 does not
    changed = block_keys(other)
    assert changed[0] == keys[0] and all(a != b for a, b in zip(changed[1:], keys[1:], strict=True))
    assert block_keys(tokens, parent=root_key("adapter-a"))[0] != keys[0]
    assert root_key("adapter-a") == root_key("adapter-a") != root_key("adapter-b")


def test_precise_match_is_independent_of_engine_seeds() -> None:
    rng = random.Random(2)
    tokens = prompt(rng, 6)
    index = PrefixIndex()
    index.apply_events("a", [store(tokens, seed=11, last=2), store(tokens, 11, 2, 5)], now=0.0)
    index.apply_events("b", [store(tokens, seed=22, last=3)], now=0.0)
    keys = block_keys(tokens)
    assert index.match(keys, ["a", "b", "c"]) == {"a": 5, "b": 3, "c": 0}
    assert index.endpoint_stats("a") is not None
    assert index.endpoint_stats("a").source is IndexSource.PRECISE  # type: ignore[union-attr]


def test_removal_cuts_the_run_and_clear_empties() -> None:
    rng = random.Random(3)
    tokens = prompt(rng, 5)
    hashes = engine_hashes(7, tokens)
    index = PrefixIndex()
    index.apply_events("a", [store(tokens, 7)], now=0.0)
    index.apply_events("a", [BlockRemoved(block_hashes=(hashes[2],), medium="GPU")], now=0.0)
    assert index.match(block_keys(tokens), ["a"]) == {"a": 2}
    index.apply_events("a", [AllBlocksCleared()], now=0.0)
    assert index.match(block_keys(tokens), ["a"]) == {"a": 0}
    assert index.stats().num_entries == 0 and index.stats().num_engine_hashes == 0


def test_orphans_and_foreign_block_sizes_are_skipped_and_counted() -> None:
    rng = random.Random(4)
    tokens = prompt(rng, 4)
    index = PrefixIndex()
    index.apply_events("a", [store(tokens, 5, first=2)], now=0.0)  # parent never stored
    big = BlockStored(block_hashes=(1,), parent_block_hash=None, token_ids=(1,) * 32, block_size=32)
    index.apply_events("a", [big], now=0.0)
    stats = index.endpoint_stats("a")
    assert stats is not None
    assert stats.orphan_blocks == 2 and stats.skipped_events == 1
    assert index.stats().num_entries == 0


def test_cpu_tier_weighs_less_and_gpu_removal_keeps_cpu_copy() -> None:
    rng = random.Random(5)
    tokens = prompt(rng, 4)
    hashes = engine_hashes(3, tokens)
    index = PrefixIndex(PrefixIndexConfig(cpu_weight=0.8))
    index.apply_events("a", [store(tokens, 3), store(tokens, 3, medium="CPU")], now=0.0)
    index.apply_events("a", [BlockRemoved(block_hashes=tuple(hashes[2:]), medium="GPU")], now=0)
    keys = block_keys(tokens)
    assert index.match(keys, ["a"]) == {"a": 4}  # blocks 2, 3 still in CPU memory
    assert index.weighted_match(keys, ["a"])["a"] == pytest.approx(2 + 2 * 0.8)
    index.apply_events("a", [BlockRemoved(block_hashes=tuple(hashes[3:]), medium="CPU")], now=0)
    assert index.match(keys, ["a"]) == {"a": 3}


def test_speculative_entries_expire_unless_confirmed() -> None:
    rng = random.Random(6)
    tokens = prompt(rng, 4)
    keys = block_keys(tokens)
    index = PrefixIndex(PrefixIndexConfig(speculative_ttl_s=2.0))
    index.add_endpoint("a", IndexSource.PRECISE)
    index.add_endpoint("b", IndexSource.PRECISE)
    index.record_route("a", keys, now=10.0)
    index.record_route("b", keys, now=10.0)
    assert index.match(keys, ["a", "b"]) == {"a": 4, "b": 4}
    index.apply_events("a", [store(tokens, 9, last=3)], now=11.0)  # a confirms 3 of 4
    index.expire(11.9)
    assert index.match(keys, ["a", "b"]) == {"a": 4, "b": 4}
    index.expire(12.0)
    assert index.match(keys, ["a", "b"]) == {"a": 3, "b": 0}
    assert index.stats().expirations == 5


def test_approximate_entries_live_longer_and_expire_in_lru_order() -> None:
    index = PrefixIndex(PrefixIndexConfig(approximate_ttl_s=60.0))
    k1, k2 = block_keys(list(range(32))), block_keys(list(range(100, 132)))
    index.record_route("x", k1, now=0.0)
    index.record_route("x", k2, now=30.0)
    assert index.endpoint_stats("x").source is IndexSource.APPROXIMATE  # type: ignore[union-attr]
    index.expire(59.0)
    assert index.match(k1, ["x"])["x"] == 2
    index.expire(61.0)
    assert index.match(k1, ["x"])["x"] == 0 and index.match(k2, ["x"])["x"] == 2
    index.record_route("x", k2, now=85.0)  # touching renews
    index.expire(100.0)
    assert index.match(k2, ["x"])["x"] == 2


def test_events_upgrade_an_approximate_endpoint_and_drop_its_guesses() -> None:
    tokens = list(range(64))
    keys = block_keys(tokens)
    index = PrefixIndex()
    index.record_route("x", keys, now=0.0)
    index.apply_events("x", [store(tokens, 1, last=1)], now=0.0)
    assert index.match(keys, ["x"]) == {"x": 1}
    index.record_route("x", keys, now=1.0)  # now speculative, not approximate
    index.expire(1.0 + index.config.speculative_ttl_s)
    assert index.match(keys, ["x"]) == {"x": 1}


def test_remove_endpoint_frees_its_bit_for_reuse() -> None:
    keys = block_keys(list(range(32)))
    index = PrefixIndex()
    index.record_route("a", keys, now=0.0)
    index.remove_endpoint("a")
    index.record_route("b", keys[:1], now=0.0)
    assert index.match(keys, ["a", "b"]) == {"a": 0, "b": 1}
    assert index.endpoints() == ["b"]


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        PrefixIndexConfig(max_entries=0)
    with pytest.raises(ValueError):
        PrefixIndexConfig(cpu_weight=1.5)


# -- properties against a brute-force reference -------------------------------------

ENDPOINTS = ["e0", "e1", "e2"]
operation = st.tuples(
    st.sampled_from(["store", "remove", "route", "clear"]),
    st.integers(0, len(ENDPOINTS) - 1),
    st.integers(0, 5),  # which prompt
    st.integers(0, 6),  # how many blocks / which block
)


def make_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = prompt(rng, 3)
    return [prompt(rng, 6, shared[: (i % 4) * BS]) for i in range(6)]


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, max_size=40), st.integers(0, 3))
def test_match_equals_brute_force(ops: list[tuple[str, int, int, int]], seed: int) -> None:
    prompts = make_prompts(seed)
    index = PrefixIndex()
    held: dict[str, set[int]] = {e: set() for e in ENDPOINTS}  # reference: own keys held
    engine: dict[str, dict[int, int]] = {e: {} for e in ENDPOINTS}  # engine hash -> own key
    for kind, e, p, n in ops:
        name, tokens = ENDPOINTS[e], prompts[p]
        keys, hashes = block_keys(tokens), engine_hashes(e, tokens)
        if kind == "store" and n:
            index.apply_events(name, [store(tokens, e, last=n)], now=0.0)
            held[name].update(keys[:n])
            engine[name].update(zip(hashes[:n], keys[:n], strict=True))
        elif kind == "remove" and n < len(hashes):
            index.apply_events(name, [BlockRemoved(block_hashes=(hashes[n],))], now=0.0)
            if hashes[n] in engine[name]:
                held[name].discard(engine[name].pop(hashes[n]))
        elif kind == "clear":
            index.apply_events(name, [AllBlocksCleared()], now=0.0)
            held[name].clear()
            engine[name].clear()
    for tokens in prompts:
        keys = block_keys(tokens)
        expected = {}
        for name in ENDPOINTS:
            run = 0
            while run < len(keys) and keys[run] in held[name]:
                run += 1
            expected[name] = run
        assert index.match(keys, ENDPOINTS) == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(operation, max_size=40), st.integers(5, 30))
def test_memory_bound_is_respected(ops: list[tuple[str, int, int, int]], bound: int) -> None:
    prompts = make_prompts(0)
    index = PrefixIndex(PrefixIndexConfig(max_entries=bound))
    for i, (kind, e, p, n) in enumerate(ops):
        if kind in ("store", "remove") and n:
            index.apply_events(ENDPOINTS[e], [store(prompts[p], e, last=n)], now=float(i))
        else:
            index.record_route(ENDPOINTS[e], block_keys(prompts[p]), now=float(i))
        stats = index.stats()
        assert stats.num_entries <= bound
        assert sum(s.num_entries for s in map(index.endpoint_stats, ENDPOINTS) if s) <= bound


@settings(max_examples=40, deadline=None)
@given(st.lists(operation, max_size=25), st.integers(0, 5), st.integers(1, 6))
def test_store_then_remove_restores_previous_state(
    ops: list[tuple[str, int, int, int]], p: int, n: int
) -> None:
    prompts = make_prompts(1)
    index = PrefixIndex()
    fresh = prompt(random.Random(99), 6)  # blocks nobody holds yet
    for kind, e, q, m in ops:
        if kind == "store" and m:
            index.apply_events(ENDPOINTS[e], [store(prompts[q], e, last=m)], now=0.0)
    before = [index.match(block_keys(t), ENDPOINTS) for t in [*prompts, fresh]]
    stats_before = index.stats()
    tokens = fresh if p == 5 else fresh[:BS] + prompts[p][BS:]
    index.apply_events("e1", [store(tokens, 1, last=n)], now=0.0)
    removed = tuple(engine_hashes(1, tokens)[:n])
    index.apply_events("e1", [BlockRemoved(block_hashes=removed)], now=0.0)
    assert [index.match(block_keys(t), ENDPOINTS) for t in [*prompts, fresh]] == before
    after = index.stats()
    assert (after.num_entries, after.num_keys, after.num_engine_hashes) == (
        stats_before.num_entries,
        stats_before.num_keys,
        stats_before.num_engine_hashes,
    )


def test_long_prompts_match_across_chunk_boundaries() -> None:
    rng = random.Random(8)
    tokens = prompt(rng, 300)
    keys = block_keys(tokens)
    index = PrefixIndex()
    runs = {"a": 0, "b": 63, "c": 64, "d": 65, "e": 128, "f": 299, "g": 300}
    for seed, (name, run) in enumerate(runs.items()):
        if run:
            index.apply_events(name, [store(tokens, seed, last=run)], now=0.0)
    index.apply_events("h", [store(tokens, 50)], now=0.0)
    hashes_h = engine_hashes(50, tokens)
    index.apply_events("h", [BlockRemoved(block_hashes=(hashes_h[200],))], now=0.0)
    assert index.match(keys, [*runs, "h"]) == {**runs, "h": 200}


def test_removal_from_a_tier_that_never_held_the_block_keeps_it() -> None:
    tokens = prompt(random.Random(9), 2)
    hashes = engine_hashes(4, tokens)
    index = PrefixIndex()
    index.apply_events("a", [store(tokens, 4)], now=0.0)
    index.apply_events("a", [BlockRemoved(block_hashes=tuple(hashes), medium="CPU")], now=0.0)
    assert index.match(block_keys(tokens), ["a"]) == {"a": 2}
    index.apply_events("a", [BlockRemoved(block_hashes=tuple(hashes))], now=0.0)
    assert index.match(block_keys(tokens), ["a"]) == {"a": 0}
    assert index.stats().num_engine_hashes == 0


def test_eviction_takes_the_oldest_entry_of_the_largest_endpoint() -> None:
    index = PrefixIndex(PrefixIndexConfig(max_entries=6))
    big, small = block_keys(list(range(4 * BS))), block_keys(list(range(500, 500 + 2 * BS)))
    index.record_route("big", big, now=0.0)
    index.record_route("small", small, now=0.0)
    index.record_route("big", big[:1], now=1.0)  # touch block 0: block 1 is now the oldest
    index.record_route("small", block_keys(list(range(900, 900 + BS))), now=2.0)
    assert index.stats().num_entries == 6 and index.stats().evictions == 1
    assert index.match(big, ["big"]) == {"big": 1}  # block 1 went, so the run stops there
    assert index.match(small, ["small"]) == {"small": 2}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=30))
def test_batch_eviction_takes_what_one_at_a_time_from_the_largest_would(
    routes: list[tuple[int, int]],
) -> None:
    """The index evicts max_entries / 1024 entries per overflow (one heap build per batch);
    each must be the oldest entry of the then largest endpoint, ties in registration order,
    exactly as evicting one at a time by scanning every endpoint did."""
    bound = 2048 + 64  # batches of 2
    index = PrefixIndex(PrefixIndexConfig(max_entries=bound))
    model: dict[str, list[int]] = {}  # the reference: per endpoint, keys oldest first
    batch = bound >> 10
    next_key = 0
    for step, (e, n) in enumerate(routes):
        name = ENDPOINTS[e % len(ENDPOINTS)]
        keys = list(range(next_key, next_key + n * 20))
        next_key += len(keys)
        index.record_route(name, keys, now=0.0)
        for key in keys:
            model.setdefault(name, []).append(key)
            if sum(map(len, model.values())) > bound:
                for _ in range(batch):
                    victim = max((k for k in model if model[k]), key=lambda k: len(model[k]))
                    model[victim].pop(0)
        for endpoint, held in model.items():
            stats = index.endpoint_stats(endpoint)
            assert stats is not None and stats.num_entries == len(held), step
            if held:
                assert index.match(held[:1], [endpoint]) == {endpoint: 1}
                assert index.holders(held[0]) == [endpoint]
    assert index.stats().num_entries <= bound


def test_a_keys_first_holder_stores_its_endpoints_own_bit_not_a_new_mask() -> None:
    """At 1,000 endpoints a holder mask is a ~90-byte int: a key held by one endpoint keeps a
    reference to that endpoint's bit (stored or routed), not an equal copy of it. Endpoint
    70's bit is past 2**62, so the compiled build shares it too."""
    index = PrefixIndex(PrefixIndexConfig(block_size=BS))
    names = [f"e{i}" for i in range(72)]
    for name in names:
        index.add_endpoint(name, IndexSource.PRECISE)
    rng = random.Random(3)
    stored, routed = prompt(rng, 3), prompt(rng, 3)
    index.apply_events("e70", [store(stored, seed=70)], now=0.0)
    index.record_route("e71", block_keys(routed), now=0.0)
    bits = {name: ep.bit for name, ep in index._endpoints.items()}
    for key in block_keys(stored):
        assert index._holders[key] is bits["e70"] and index.holders(key) == ["e70"]
    for key in block_keys(routed):
        assert index._holders[key] is bits["e71"] and index.holders(key) == ["e71"]
    index.record_route("e70", block_keys(routed), now=0.0)  # a second holder: a new mask
    assert index.holders(block_keys(routed)[0]) == ["e70", "e71"]
    assert index.match(block_keys(routed), names) == {n: 3 if n in ("e70", "e71") else 0
                                                      for n in names}  # fmt: skip
