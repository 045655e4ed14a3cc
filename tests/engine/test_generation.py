"""Deterministic greedy generation: a pure function of the context, continuable."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.engine.generation import (
    GEN_BLOCK_TOKENS,
    TokenGenerator,
    chain_block,
    context_hash,
    context_state,
    empty_context_hash,
    mix,
)
from inferplane.engine.types import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE

tokens = st.integers(min_value=FIRST_TEXT_TOKEN_ID, max_value=VOCAB_SIZE - 1)


def test_context_hash_folds_tokens_then_chains_full_blocks() -> None:
    prompt = [17, 500, 31_999, 16, 2]
    h = empty_context_hash()
    for t in prompt:
        h = mix(h, t)
    assert context_hash(prompt) == h  # no full block: a fold of mix
    assert context_state(prompt) == (empty_context_hash(), h)
    block = list(range(100, 100 + GEN_BLOCK_TOKENS))
    chain = chain_block(empty_context_hash(), block)
    assert context_state(block) == (chain, chain)
    h = chain
    for t in prompt:
        h = mix(h, t)
    assert context_state(block + prompt) == (chain, h)
    assert 0 <= h < 2**64
    assert context_hash(prompt[:-1]) != context_hash(prompt)
    assert context_hash([1, 2]) != context_hash([2, 1])  # order matters
    swapped = [block[1], block[0], *block[2:]]
    assert context_hash(swapped + prompt) != context_hash(block + prompt)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(tokens, min_size=0, max_size=80), extra=st.lists(tokens, max_size=40))
def test_extend_one_token_at_a_time_equals_hashing_in_one_piece(
    prompt: list[int], extra: list[int]
) -> None:
    chain, h = context_state(prompt)
    context = list(prompt)
    for t in extra:  # extend draws its own token: fold ``t`` in the way it does
        context.append(t)
        if len(context) % GEN_BLOCK_TOKENS:
            h = mix(h, t)
        else:
            chain = h = chain_block(chain, context[-GEN_BLOCK_TOKENS:])
        assert (chain, h) == context_state(context)
    gen = TokenGenerator(30)
    context = list(prompt)
    chain, h = context_state(context)
    for _ in range(40):
        token, chain, h = gen.extend(chain, h, context, True)
        assert context[-1] == token
        assert (chain, h) == context_state(context)


def test_same_context_same_output_and_tokens_in_range() -> None:
    gen = TokenGenerator(mean_output_tokens=256)
    prompt = list(range(100, 160))
    out = gen.generate(prompt, 200, ignore_eos=True)
    assert out == TokenGenerator(256).generate(prompt, 200, ignore_eos=True)
    assert len(out) == 200
    assert all(FIRST_TEXT_TOKEN_ID <= t < VOCAB_SIZE for t in out)
    assert len(set(out)) > 150  # looks like text, not a constant
    assert gen.generate(prompt[:-1], 200, ignore_eos=True) != out


@settings(max_examples=40, deadline=None)
@given(
    prompt=st.lists(tokens, min_size=1, max_size=40),
    max_tokens=st.integers(min_value=1, max_value=120),
    cut=st.integers(min_value=0, max_value=120),
    ignore_eos=st.booleans(),
)
def test_continuation_equality(
    prompt: list[int], max_tokens: int, cut: int, ignore_eos: bool
) -> None:
    gen = TokenGenerator(mean_output_tokens=30)
    full = gen.generate(prompt, max_tokens, ignore_eos=ignore_eos)
    n = min(cut, len(full))
    if n == len(full) and full and full[-1] == EOS_TOKEN_ID:
        n -= 1  # EOS ends the run; continue from before it
    rest = gen.generate(prompt + full[:n], max_tokens - n, ignore_eos=ignore_eos)
    assert full[:n] + rest == full


def test_eos_rate_follows_the_mean() -> None:
    gen = TokenGenerator(mean_output_tokens=50)
    rng = random.Random(7)
    lengths = []
    for _ in range(400):
        prompt = [rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE) for _ in range(8)]
        out = gen.generate(prompt, 10_000)
        assert out[-1] == EOS_TOKEN_ID
        assert EOS_TOKEN_ID not in out[:-1]
        lengths.append(len(out))
    mean = sum(lengths) / len(lengths)
    assert 40 < mean < 62  # geometric with mean 50; sd of the mean ~2.5


def test_ignore_eos_never_stops() -> None:
    gen = TokenGenerator(mean_output_tokens=1)  # EOS would be drawn every time
    assert gen.generate([100], 5) == [EOS_TOKEN_ID]
    out = gen.generate([100], 50, ignore_eos=True)
    assert len(out) == 50 and EOS_TOKEN_ID not in out


def test_extend_draws_next_token() -> None:
    gen = TokenGenerator(mean_output_tokens=3)
    context = [40, 41, 42]
    chain, h = context_state(context)
    for ignore_eos in (False, True):
        for _ in range(50):
            expected = gen.next_token(h, ignore_eos=ignore_eos)
            token, chain, h = gen.extend(chain, h, context, ignore_eos)
            assert token == expected == context[-1]
