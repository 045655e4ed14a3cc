"""The paged block pool: chained hashing, prefix hits, LRU eviction, ref counts."""

from __future__ import annotations

import pytest

from inferplane.engine.kvcache import BlockPool


def _cache_chain(pool: BlockPool, tokens: list[int]) -> tuple[list[int], list[int]]:
    """Allocate blocks for ``tokens``, register the full ones; (block ids, hashes)."""
    hashes: list[int] = []
    pool.extend_hashes(hashes, tokens, len(tokens))
    blocks = pool.allocate(-(-len(tokens) // pool.block_size))
    for b, h in zip(blocks, hashes, strict=False):
        assert pool.register(b, h)
    return blocks, hashes


def test_chained_hash_depends_on_parent_tokens_and_seed() -> None:
    pool = BlockPool(8, 4, seed=1)
    block = (1, 2, 3, 4)
    h = pool.hash_block(None, block)
    assert 0 <= h < 2**64
    assert pool.hash_block(None, block) == h
    assert pool.hash_block(h, block) != h
    assert pool.hash_block(None, (1, 2, 3, 5)) != h
    assert BlockPool(8, 4, seed=2).hash_block(None, block) != h
    assert BlockPool(8, 4, seed=1).hash_block(None, block) == h


def test_extend_hashes_covers_full_blocks_only_and_is_incremental() -> None:
    pool = BlockPool(8, 4)
    tokens = list(range(100, 111))  # 2 full blocks + 3 tokens
    one_shot: list[int] = []
    pool.extend_hashes(one_shot, tokens, len(tokens))
    assert len(one_shot) == 2
    step: list[int] = []
    for n in range(len(tokens) + 1):
        pool.extend_hashes(step, tokens, n)
    assert step == one_shot
    assert one_shot[1] == pool.hash_block(one_shot[0], tuple(tokens[4:8]))


def test_prefix_lookup_finds_the_longest_leading_run() -> None:
    pool = BlockPool(16, 4)
    blocks, hashes = _cache_chain(pool, list(range(12)))
    assert pool.lookup(hashes) == blocks
    other: list[int] = []
    pool.extend_hashes(other, [*range(8), 99, 99, 99, 99], 12)
    assert other[:2] == hashes[:2] and other[2] != hashes[2]
    assert pool.lookup(other) == blocks[:2]
    shifted: list[int] = []  # same later blocks behind another first block: no hit
    pool.extend_hashes(shifted, [99, 99, 99, 99, *range(4, 12)], 12)
    assert pool.lookup(shifted) == []


def test_ref_counts_keep_shared_blocks_in_use() -> None:
    pool = BlockPool(4, 4)
    blocks, hashes = _cache_chain(pool, list(range(8)))
    pool.touch(pool.lookup(hashes))  # a second request shares both blocks
    assert [pool.ref_count(b) for b in blocks] == [2, 2]
    pool.free(blocks)
    assert pool.num_used == 2 and pool.num_cached_free == 0
    pool.free(blocks)
    assert pool.num_used == 0 and pool.num_cached_free == 2
    pool.touch(blocks[:1])  # a hit on a free cached block takes it out of the LRU
    assert pool.num_cached_free == 1 and pool.num_free == 3


def test_empty_blocks_go_first_then_lru_cached_tail_first() -> None:
    pool = BlockPool(6, 2)
    a_blocks, a_hashes = _cache_chain(pool, [1, 2, 3, 4])
    b_blocks, b_hashes = _cache_chain(pool, [5, 6, 7, 8])
    pool.free(a_blocks)  # freed first: least recently used; tail before head
    pool.free(b_blocks)
    assert pool.num_cached_free == 4
    first = pool.allocate(2)  # the two never-used blocks
    assert set(first).isdisjoint(a_blocks + b_blocks)
    assert pool.pop_removed() == []
    pool.allocate(1)
    assert pool.pop_removed() == [a_hashes[1]]  # A's tail block goes first
    pool.allocate(2)
    assert pool.pop_removed() == [a_hashes[0], b_hashes[1]]
    assert pool.lookup(b_hashes) == [b_blocks[0]]
    assert pool.cached_hashes() == {b_hashes[0]}


def test_duplicate_content_is_cached_once() -> None:
    pool = BlockPool(4, 2)
    _blocks, hashes = _cache_chain(pool, [1, 2])
    other = pool.allocate(1)[0]
    assert not pool.register(other, hashes[0])
    assert pool.block_hash(other) is None
    pool.free([other])
    assert pool.num_cached_free == 0  # an uncached block returns to the empty stack


def test_allocate_more_than_free_raises_and_clear_resets() -> None:
    pool = BlockPool(3, 2)
    _cache_chain(pool, [1, 2, 3, 4])
    with pytest.raises(ValueError):
        pool.allocate(2)
    pool.clear()
    assert pool.num_free == 3 and pool.cached_hashes() == frozenset()
    assert len(pool.allocate(3)) == 3


def test_free_blocks_are_conserved_through_churn() -> None:
    pool = BlockPool(10, 2)
    held: list[list[int]] = []
    for i in range(30):
        if pool.num_free >= 3:
            blocks, _ = _cache_chain(pool, [i, i + 1, i + 2, i + 3, i + 4, i + 5])
            held.append(blocks)
        if i % 2:
            pool.free(held.pop(0))
        assert pool.num_free + sum(len(h) for h in held) == pool.num_blocks


def test_known_prompt_keys_give_the_hashes_hashing_gives() -> None:
    """A pool's hashes are its salted chain keys, the gateway's own block keys: a caller
    that passes a prompt's keys gets the very hashes the pool would compute."""
    from inferplane.core.prefix_blocks import block_keys

    pool = BlockPool(64, 16, seed=3)
    tokens = [16 + (i * 7919) % 30_000 for i in range(200)]  # 12 full blocks + 8
    hashed: list[int] = []
    pool.extend_hashes(hashed, tokens, len(tokens))
    keys = block_keys(tokens[:150])  # the prompt: 9 full blocks; the rest was generated
    given: list[int] = []
    pool.extend_hashes(given, tokens, 100, keys)  # incremental, keys beyond num_tokens
    pool.extend_hashes(given, tokens, len(tokens), keys)
    assert given == hashed and len(hashed) == 12
    assert [pool._key(h) for h in hashed] == block_keys(tokens)
    assert BlockPool(64, 16, seed=4).hash_block(None, tuple(tokens[:16])) != hashed[0]


def test_eviction_order_matches_a_reference_lru_through_random_churn() -> None:
    """The linked LRU against an ``OrderedDict`` model: under random allocation, prefix
    hits and frees, blocks with cached content are evicted least recently freed first, and
    the counts agree at every step."""
    import random
    from collections import OrderedDict

    rng = random.Random(7)
    pool = BlockPool(24, 1)
    model: OrderedDict[int, None] = OrderedDict()  # free blocks with content, oldest first
    held: list[list[int]] = []
    evicted = 0
    for step in range(3000):
        op = rng.random()
        if op < 0.45 and pool.num_free >= 3:
            before = frozenset(model)
            blocks = pool.allocate(rng.randint(1, 3))
            taken = [b for b in blocks if b in before]  # content evicted, in eviction order
            assert taken == list(model)[: len(taken)]
            for b in taken:
                del model[b]
            evicted += len(taken)
            for b in blocks:
                pool.register(b, step * 100 + b)
            held.append(blocks)
        elif op < 0.6 and model:  # a prefix hit on free cached blocks
            hit = rng.sample(list(model), min(len(model), rng.randint(1, 2)))
            pool.touch(hit)
            for b in hit:
                del model[b]
            held.append(hit)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free(blocks)
            for b in reversed(blocks):
                if pool.ref_count(b) == 0 and pool.block_hash(b) is not None:
                    model[b] = None
        assert pool.num_cached_free == len(model)
    assert evicted > 100  # the churn did reach eviction
