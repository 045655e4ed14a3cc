"""``EngineModel.load_at``: the load an advance would leave, read without advancing.

A simulator's sync reads every engine's load; an engine that would only decode quietly
(pure-decode steps, no finish, no eviction) is read in closed form and advanced later. Two
engines driven by the same calls, one advanced at every probe and one only when ``load_at``
declines, must read the same loads and report the same events, in the same order.
"""

from __future__ import annotations

import random

import pytest

from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.types import EngineEvent, EngineRequest


def _profile(num_blocks: int) -> EngineModel:
    profile = load_profile(
        "llama-3.2-1b",
        "h100",
        overrides={"max_num_batched_tokens": 512, "max_num_seqs": 16, "mean_output_tokens": 40},
    )
    return EngineModel(profile, seed=3, num_gpu_blocks=num_blocks, content_free=True)


def _requests(seed: int) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    system = tuple(rng.randrange(16, 32_000) for _ in range(300))
    out, now = [], 0.0
    for i in range(40):
        now += rng.expovariate(4.0)
        body = tuple(rng.randrange(16, 32_000) for _ in range(rng.randrange(1, 400)))
        prompt = system + body if rng.random() < 0.6 else body
        out.append((now, EngineRequest(f"r{i}", prompt, rng.randrange(20, 300), 0, True)))
    return out


@pytest.mark.parametrize("num_blocks", [120, 400, 5000])
@pytest.mark.parametrize("seed", range(4))
def test_load_at_reads_what_advance_would_leave(num_blocks: int, seed: int) -> None:
    stepped, lazy = _profile(num_blocks), _profile(num_blocks)
    got: list[EngineEvent] = []
    want: list[EngineEvent] = []
    read = 0
    probes = sorted({round(0.01 * k, 2) for k in range(1, 1500)})
    arrivals = _requests(seed)
    for t in probes:
        while arrivals and arrivals[0][0] <= t:
            at, request = arrivals.pop(0)
            want += stepped.advance(at, emit_tokens=False)
            got += lazy.advance(at, emit_tokens=False)
            stepped.submit(request, at)
            lazy.submit(request, at)
        want += stepped.advance(t, emit_tokens=False)
        quiet = lazy.load_at(t)
        if quiet is None:
            got += lazy.advance(t, emit_tokens=False)
            assert lazy.load() == stepped.load()
        else:
            read += 1
            assert quiet == stepped.load()
    end = probes[-1] + 1000.0
    want += stepped.advance(end, emit_tokens=False)
    got += lazy.advance(end, emit_tokens=False)
    assert got == want
    assert lazy.stats() == stepped.stats()
    assert read > 0  # the closed form was taken


def test_load_at_declines_before_the_first_advance_and_off_ready() -> None:
    engine = _profile(5000)
    assert engine.load_at(1.0) is None  # token mode until an advance says otherwise
    engine.advance(0.0, emit_tokens=False)
    assert engine.load_at(1.0) == engine.load()  # idle
    engine.reset(1.0, cold=True)
    assert engine.load_at(2.0) is None
