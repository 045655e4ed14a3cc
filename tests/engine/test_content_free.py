"""The content-free generator changes what ``ignore_eos`` requests say, never when or what KV.

The simulator's engines use :class:`ContentFreeGenerator` (nobody reads their answers). Driven
by the same calls, an engine with it and one with the greedy generator must agree on every
event's time, kind and request, every usage count, every KV event's shape (how many blocks,
whether chained to a parent) and the KV counters; only token values and hashes differ.
"""

from __future__ import annotations

import random

import pytest

from inferplane.engine.generation import ContentFreeGenerator, TokenGenerator, fill
from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.types import (
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EngineRequest,
    TokensGenerated,
)

SMALL_KV = load_profile(
    "llama-3.2-1b",
    "h100",
    overrides={"max_num_batched_tokens": 512, "max_num_seqs": 16, "mean_output_tokens": 40},
)


def _drive(model: EngineModel, seed: int, emit_tokens: bool) -> list[EngineEvent]:
    """Random ``ignore_eos`` arrivals over shared prefixes, repeats, advances at random times."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(16, 32_000) for _ in range(300))
    prompts: list[tuple[int, ...]] = []
    events: list[EngineEvent] = []
    now = 0.0
    for i in range(60):
        now += rng.expovariate(8.0)
        events += model.advance(now, emit_tokens=emit_tokens)
        if prompts and rng.random() < 0.15:
            prompt = rng.choice(prompts)  # the same context again: duplicate blocks
        else:
            body = tuple(rng.randrange(16, 32_000) for _ in range(rng.randrange(1, 400)))
            prompt = system + body if rng.random() < 0.6 else body
            prompts.append(prompt)
        model.submit(EngineRequest(f"r{i}", prompt, rng.randrange(1, 300), 0, True), now)
    while (t := model.next_wake_time()) is not None:
        events += model.advance(t, emit_tokens=emit_tokens)
    return events


def _shape(event: EngineEvent) -> object:
    """An event without its token values and hashes."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash is None
        return ("stored", event.time_s, len(event.block_hashes), parent, len(event.token_ids))
    if isinstance(event, BlockRemoved):
        return ("removed", event.time_s, len(event.block_hashes))
    if isinstance(event, TokensGenerated):
        return ("tokens", event.time_s, event.request_id, len(event.token_ids))
    return event


@pytest.mark.parametrize(
    ("seed", "num_blocks", "emit_tokens"),
    [(1, None, False), (2, 120, False), (3, 60, False), (4, 60, True)],
)
def test_content_free_engine_keeps_times_and_kv(
    seed: int, num_blocks: int | None, emit_tokens: bool
) -> None:
    def make(content_free: bool) -> EngineModel:
        return EngineModel(
            SMALL_KV, seed=seed, num_gpu_blocks=num_blocks, content_free=content_free
        )

    greedy, free = make(False), make(True)
    a, b = _drive(greedy, seed, emit_tokens), _drive(free, seed, emit_tokens)
    assert [_shape(e) for e in a] == [_shape(e) for e in b]
    assert any(isinstance(e, BlockRemoved) for e in a) == (num_blocks is not None)
    assert greedy.stats() == free.stats()
    assert len(greedy.cached_block_hashes()) == len(free.cached_block_hashes())


def test_content_free_tokens_are_a_function_of_the_context() -> None:
    gen = ContentFreeGenerator(40)
    for start in (0, 5, 16, 31):
        tokens = list(range(100, 100 + start))
        stepped = list(tokens)
        for _ in range(50):
            gen.extend(0, stepped, True)
        leapt, _ = gen.run(0, tokens[len(tokens) - len(tokens) % 16 :], 50, True)
        assert stepped[start:] == leapt == fill(start, 50)
    assert fill(3, 40) == fill(19, 40) != fill(4, 40)


def test_content_free_generator_is_greedy_without_ignore_eos() -> None:
    greedy, free = TokenGenerator(5), ContentFreeGenerator(5)
    prompt = list(range(200, 237))
    assert free.generate(prompt, 300) == greedy.generate(prompt, 300)
    a, b = list(prompt), list(prompt)
    assert greedy.extend(0, a, False) == free.extend(0, b, False)
    assert a == b


def test_load_is_what_stats_say_and_range_checks_can_be_waived() -> None:
    model = EngineModel(SMALL_KV, seed=1)
    model.submit(EngineRequest("a", tuple(range(16, 116)), 500, 0, True), 0.0)
    model.advance(0.01)
    stats = model.stats()
    assert model.load() == (stats.num_waiting, stats.num_running, stats.kv_usage)
    assert stats.num_running == 1
    bad = EngineRequest("b", (5, 40_000), 4, 0, True)
    with pytest.raises(ValueError, match="token ids"):
        model.submit(bad, 0.1)
    trusting = EngineModel(SMALL_KV, seed=1, check_token_ids=False)
    trusting.submit(bad, 0.1)  # the caller vouches for its ids (the simulator's prompts)
    assert trusting.load()[0] == 1
