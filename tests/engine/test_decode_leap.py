"""The decode leap and the engine model's other fast paths give exactly what stepping gives.

``advance(emit_tokens=False)`` completes stretches of pure-decode steps in one go
(``decode_leap``); ``emit_tokens=True`` steps one at a time. Driven by the same calls, the two
must agree on every event (bar the later tokens), every time, the KV state and the counters.
"""

from __future__ import annotations

import random

import pytest

from inferplane.engine import decode_leap
from inferplane.engine import model as model_module
from inferplane.engine.generation import TokenGenerator, context_chain, open_block
from inferplane.engine.kvcache import BlockPool
from inferplane.engine.model import EngineModel
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.scheduler import Scheduler
from inferplane.engine.types import EngineEvent, EngineRequest, TokensGenerated

SMALL_KV = load_profile(
    "llama-3.2-1b",
    "h100",
    overrides={"max_num_batched_tokens": 512, "max_num_seqs": 16, "mean_output_tokens": 40},
)


def _drive(model: EngineModel, seed: int, emit_tokens: bool) -> list[EngineEvent]:
    """Random arrivals (shared prefixes, some with EOS) and advances at random times."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(16, 32_000) for _ in range(300))
    events: list[EngineEvent] = []
    now = 0.0
    for i in range(60):
        now += rng.expovariate(8.0)
        events += model.advance(now, emit_tokens=emit_tokens)
        body = tuple(rng.randrange(16, 32_000) for _ in range(rng.randrange(1, 400)))
        prompt = system + body if rng.random() < 0.6 else body
        priority = rng.randrange(3) if model.scheduler.priority_scheduling else 0
        request = EngineRequest(
            f"r{i}", prompt, rng.randrange(1, 300), priority, rng.random() < 0.7
        )
        model.submit(request, now)
        if rng.random() < 0.05:
            events += model.abort(f"r{rng.randrange(i + 1)}", now)
    while (t := model.next_wake_time()) is not None:
        events += model.advance(t, emit_tokens=emit_tokens)
    return events


def _first_tokens_only(events: list[EngineEvent]) -> list[EngineEvent]:
    seen: set[str] = set()
    out = []
    for e in events:
        if isinstance(e, TokensGenerated):
            if e.request_id in seen:
                continue
            seen.add(e.request_id)
        out.append(e)
    return out


@pytest.mark.parametrize(
    ("seed", "num_blocks", "priority"),
    [(1, None, False), (2, 120, False), (3, 60, False), (4, 60, True)],
)
def test_leap_matches_stepping(
    seed: int, num_blocks: int | None, priority: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaps: list[int] = []

    def counted(sched: Scheduler, ends: list[float], events: list[EngineEvent]) -> int:
        done = decode_leap.run_decode_stretch(sched, ends, events)
        leaps.append(done)
        return done

    def make() -> EngineModel:
        return EngineModel(
            SMALL_KV, seed=seed, num_gpu_blocks=num_blocks, priority_scheduling=priority
        )

    stepped = make()
    expected = _first_tokens_only(_drive(stepped, seed, emit_tokens=True))
    assert leaps == []  # emitting every token never leaps
    monkeypatch.setattr(model_module, "run_decode_stretch", counted)
    leaped = make()
    got = _drive(leaped, seed, emit_tokens=False)
    assert sum(leaps) > 40  # the leap ran, over many steps (44 to ~3,000 per seed here)
    assert got == expected
    assert leaped.stats() == stepped.stats()
    assert leaped.cached_block_hashes() == stepped.cached_block_hashes()


@pytest.mark.parametrize(
    ("model", "gpu", "tp"), [("llama-3-8b", "h100", 1), ("llama-3-70b", "h200", 4)]
)
def test_decode_step_ends_are_bit_identical_to_stepping(model: str, gpu: str, tp: int) -> None:
    perf = PerfModel(load_profile(model, gpu, tp))
    rng = random.Random(7)
    for _ in range(20):
        n, context = rng.randrange(1, 256), rng.randrange(0, 500_000)
        scale = (rng.choice([1.0, 0.01, 3.3]), rng.choice([1.0, 2.5]))
        start = rng.uniform(0, 1e5)
        ends = perf.decode_step_ends(start, n, context, 50, scale)
        t, expected = start, []
        for j in range(50):
            t = t + perf.step_time_s(n, context + j * n, 0, 0, 0, 0.0) * scale[0] * scale[1]
            expected.append(t)
        assert ends == expected
        assert perf.decode_step_ends(start, n, context, 50, scale, expected[9]) == expected[:10]


@pytest.mark.parametrize(
    ("model", "gpu", "tp"), [("llama-3-8b", "h100", 1), ("llama-3-70b", "h100", 4)]
)
def test_decode_stretch_end_is_the_last_step_end_bit_for_bit(model: str, gpu: str, tp: int) -> None:
    perf = PerfModel(load_profile(model, gpu, tp))
    rng = random.Random(11)
    for steps in (1, 2, 63, 64, 65, 131, 700):
        for _ in range(10):
            n, context = rng.randrange(1, 256), rng.randrange(0, 500_000)
            scale = (rng.choice([1.0, 0.01, 3.3, 100.0]), rng.choice([1.0, 2.5]))
            start = rng.uniform(0, 1e5)
            last = perf.decode_step_ends(start, n, context, steps, scale)[-1]
            assert perf.decode_stretch_end(start, n, context, steps, scale) == last


def test_run_is_repeated_extend() -> None:
    gen = TokenGenerator(5)
    for length in (3, 15, 16, 17, 40):
        prompt = list(range(20, 20 + length))
        for ignore_eos in (False, True):
            chain0 = context_chain(prompt)
            tokens, chain_end = gen.run(chain0, open_block(prompt), 40, ignore_eos)
            context, chain = list(prompt), chain0
            for _ in range(40):
                token, chain = gen.extend(chain, context, ignore_eos)
                if token == 2:
                    break
            assert (tokens, chain_end) == (context[length:], chain)
            assert chain == context_chain(context)
    chain0 = context_chain([20, 21, 22])
    assert len(gen.run(chain0, [20, 21, 22], 40, False)[0]) < 40  # mean 5: EOS early


def test_pool_hands_out_fresh_blocks_in_order_after_freed_ones() -> None:
    pool = BlockPool(6, 4)
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.num_free == 3
    pool.free([first[1]])
    assert pool.allocate(2) == [1, 3] and pool.num_free == 2
    pool.clear()
    assert pool.num_free == 6 and pool.allocate(1) == [0]
