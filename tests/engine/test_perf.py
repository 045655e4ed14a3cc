"""Performance model and profiles: REFERENCE §2 lower bounds, capacities, monotonicity."""

from __future__ import annotations

import itertools

import pytest

from inferplane.engine.perf import PerfModel, PrefillChunk, prefill_pairs
from inferplane.engine.profiles import (
    available_gpus,
    available_models,
    load_profile,
)

ALL_PROFILES = [
    load_profile(m, g) for m, g in itertools.product(available_models(), available_gpus())
]


def test_reference_lower_bounds_8b_h100() -> None:
    profile = load_profile("llama-3-8b", "h100")
    roof, model = PerfModel.roofline(profile), PerfModel(profile)
    assert roof.decode_step_s(1, 0) >= 4.8e-3
    assert roof.decode_step_s(1, 0) == pytest.approx(16.1e9 / 3.35e12)
    assert roof.prefill_s(1024) >= 16e-3
    assert model.decode_step_s(1, 0) > roof.decode_step_s(1, 0)
    assert model.prefill_s(1024) > roof.prefill_s(1024)


def test_prefill_flops_follow_the_reference_formula() -> None:
    profile = load_profile("llama-3-8b", "h100")
    m = profile.model
    n = 4096
    flops = 2 * m.num_params * n + 2 * m.num_layers * n * n * m.hidden_size
    # the causal pair count n(n+1)/2 differs from n^2/2 by n/2: well under 0.1 %
    assert PerfModel.roofline(profile).prefill_s(n) == pytest.approx(
        flops / profile.gpu.peak_flops, rel=1e-3
    )


@pytest.mark.parametrize(("gpu", "tokens"), [("h100", 427_000), ("h200", 846_000)])
def test_kv_capacity_matches_reference(gpu: str, tokens: int) -> None:
    profile = load_profile("llama-3-8b", gpu)
    assert profile.model.kv_bytes_per_token == 128 * 1024
    assert profile.kv_capacity_tokens == pytest.approx(tokens, rel=0.02)
    assert profile.num_gpu_blocks == profile.kv_capacity_tokens // 16


def test_tensor_parallel_splits_weights_and_pools_memory() -> None:
    tp4 = load_profile("llama-3-70b", "h100")
    assert tp4.tensor_parallel == 4
    assert tp4.weight_bytes_per_gpu == pytest.approx(141e9 / 4)
    expected = (0.9 * 80e9 * 4 - 141e9) / (320 * 1024)
    assert tp4.kv_capacity_tokens == pytest.approx(expected, abs=1)
    tp8 = load_profile("llama-3-70b", "h100", tensor_parallel=8)
    assert PerfModel(tp8).decode_step_s(1, 0) < PerfModel(tp4).decode_step_s(1, 0)
    assert tp8.price_per_hour_usd == pytest.approx(2 * tp4.price_per_hour_usd)


def test_profile_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="tensor_parallel"):
        load_profile("llama-3-70b", "a100", tensor_parallel=1)


def test_unknown_names_and_knobs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gpt-9'.*llama-3-8b"):
        load_profile("gpt-9", "h100")
    with pytest.raises(ValueError, match="unknown gpu"):
        load_profile("llama-3-8b", "tpu")
    with pytest.raises(ValueError, match="unknown engine knob"):
        load_profile("llama-3-8b", "h100", overrides={"turbo": 1})


def test_overrides_change_the_knob() -> None:
    base = load_profile("llama-3-8b", "a100")
    slow = load_profile("llama-3-8b", "a100", overrides={"mfu": base.mfu / 2})
    assert slow.mfu == pytest.approx(base.mfu / 2)
    assert PerfModel(slow).prefill_s(2048) > PerfModel(base).prefill_s(2048)


def test_cold_start_time_from_weights_and_storage() -> None:
    p = load_profile("llama-3-8b", "h100")
    assert p.load_time_s == pytest.approx(16.1e9 / p.load_bandwidth_bytes_s + p.warmup_s)
    assert 10 < p.load_time_s < 300  # tens of seconds to minutes


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p.name)
def test_never_faster_than_the_roofline(profile: object) -> None:
    from inferplane.engine.profiles import EngineProfile

    assert isinstance(profile, EngineProfile)
    model, roof = PerfModel(profile), PerfModel.roofline(profile)
    for batch, ctx in [(1, 0), (1, 4000), (64, 1000), (256, 500)]:
        assert model.decode_step_s(batch, ctx) > roof.decode_step_s(batch, ctx)
    for n, ctx in [(1, 0), (512, 0), (2048, 4096)]:
        assert model.prefill_s(n, ctx) > roof.prefill_s(n, ctx)


def test_decode_grows_with_batch_and_context() -> None:
    model = PerfModel(load_profile("llama-3-8b", "h100"))
    assert model.decode_step_s(64, 1000) > model.decode_step_s(1, 1000)
    assert model.decode_step_s(64, 4000) > model.decode_step_s(64, 1000)
    # memory-bound decode: 64 sequences cost far less than 64 single-sequence steps
    assert model.decode_step_s(64, 1000) < 4 * model.decode_step_s(1, 1000)


def test_cached_context_makes_prefill_cheaper_than_recomputing_it() -> None:
    model = PerfModel(load_profile("llama-3-8b", "h100"))
    with_cache = model.prefill_s(512, num_context_tokens=3584)
    from_scratch = model.prefill_s(4096)
    assert with_cache < from_scratch / 4
    assert with_cache > model.prefill_s(512)  # attention to the prior context costs


def test_mixed_step_is_no_cheaper_than_its_parts() -> None:
    model = PerfModel(load_profile("llama-3-8b", "h100"))
    mixed = model.mixed_step_s(64, 64 * 500, [PrefillChunk(1024, 0)])
    assert mixed >= model.decode_step_s(64, 500)
    assert mixed >= model.prefill_s(1024)
    # but cheaper than running them as two steps (weights are read once)
    assert mixed < model.decode_step_s(64, 500) + model.prefill_s(1024)


def test_prefill_pairs() -> None:
    assert prefill_pairs(1, 0) == 1
    assert prefill_pairs(4, 0) == 10
    assert prefill_pairs(2, 10) == 23
