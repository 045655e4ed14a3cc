"""Deterministic greedy generation: a pure function of the context, continuable."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.engine.generation import (
    GEN_BLOCK_TOKENS,
    TokenGenerator,
    block_draw,
    chain_block,
    context_chain,
    empty_chain,
    open_block,
)
from inferplane.engine.types import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE

tokens = st.integers(min_value=FIRST_TEXT_TOKEN_ID, max_value=VOCAB_SIZE - 1)


def test_context_chain_chains_full_blocks_only() -> None:
    prompt = [17, 500, 31_999, 16, 2]
    assert context_chain(prompt) == empty_chain()  # no full block yet
    assert list(open_block(prompt)) == prompt
    block = list(range(100, 100 + GEN_BLOCK_TOKENS))
    chain = chain_block(empty_chain(), block)
    assert context_chain(block) == context_chain(block + prompt) == chain
    assert list(open_block(block + prompt)) == prompt and not open_block(block)
    assert 0 <= chain < 2**64
    swapped = [block[1], block[0], *block[2:]]
    assert context_chain(swapped) != chain  # order matters
    assert context_chain(block + block) == chain_block(chain, block)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(tokens, min_size=0, max_size=80), ignore_eos=st.booleans())
def test_extend_one_token_at_a_time_equals_run_and_the_chain_of_the_whole(
    prompt: list[int], ignore_eos: bool
) -> None:
    gen = TokenGenerator(30)
    context = list(prompt)
    chain = context_chain(context)
    for _ in range(40):
        token, chain = gen.extend(chain, context, ignore_eos)
        assert context[-1] == token
        assert chain == context_chain(context)
        if token == EOS_TOKEN_ID:
            break
    start = context_chain(prompt)
    out, end = gen.run(start, open_block(prompt), 40, ignore_eos)
    assert (out, end) == (context[len(prompt) :], chain)


def test_after_a_block_boundary_the_chain_draw_spells_the_next_block() -> None:
    gen = TokenGenerator(10**9)  # EOS practically never
    prompt = list(range(200, 200 + 2 * GEN_BLOCK_TOKENS))
    texts, _ = block_draw(context_chain(prompt))
    assert gen.generate(prompt, GEN_BLOCK_TOKENS, ignore_eos=True) == texts
    off = gen.generate(prompt[:-1], GEN_BLOCK_TOKENS, ignore_eos=True)  # mid-block prompt
    assert off != texts[:GEN_BLOCK_TOKENS]


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
    chain = context_chain(context)
    for ignore_eos in (False, True):
        for _ in range(50):
            expected = gen.next_token(chain, open_block(context), ignore_eos=ignore_eos)
            token, chain = gen.extend(chain, context, ignore_eos)
            assert token == expected == context[-1]
