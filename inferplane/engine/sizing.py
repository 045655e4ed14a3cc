"""Replica sizing for the autoscaler: what one replica of a model on a GPU type is worth.

The autoscaler buys capacity in tokens per second with whole replicas; it needs, per GPU type,
the tokens per second one replica sustains at a latency-respecting batch, its hourly price and
how long it takes from start to serving. All three follow from the engine profile (the same
performance model the emulated engine and the simulator run), so the live gateway and the
simulator size pools from the same numbers.

    option = gpu_option("llama-3-8b", "h100")                  # real GPU seconds
    option = gpu_option("llama-3-8b", "h100", time_scale=4)    # engines emulated 4x slower
"""

from __future__ import annotations

from inferplane.core.autoscaler import GpuOption
from inferplane.engine.perf import PerfModel, PrefillChunk
from inferplane.engine.profiles import load_profile

__all__ = ["gpu_option", "replica_tokens_per_s"]


def replica_tokens_per_s(
    model: str,
    gpu: str,
    *,
    tensor_parallel: int | None = None,
    batch_size: int = 48,
    prompt_tokens: int = 1000,
    output_tokens: int = 200,
) -> float:
    """Prompt plus output tokens per second of one replica serving ``batch_size`` calls at once.

    A round of the batch: every call's prompt is prefilled (in chunks of the step budget,
    alongside the running decodes), then ``output_tokens`` decode steps at the mean context.
    """
    profile = load_profile(model, gpu, tensor_parallel)
    perf = PerfModel(profile)
    budget = profile.max_num_batched_tokens
    prefill_s = 0.0
    remaining = batch_size * prompt_tokens
    while remaining > 0:
        chunk = min(budget, remaining)
        prefill_s += perf.mixed_step_s(0, 0, (PrefillChunk(chunk, 0),))
        remaining -= chunk
    context = prompt_tokens + output_tokens // 2
    decode_s = output_tokens * perf.decode_step_s(batch_size, context)
    return batch_size * (prompt_tokens + output_tokens) / (prefill_s + decode_s)


def gpu_option(
    model: str,
    gpu: str,
    *,
    tensor_parallel: int | None = None,
    time_scale: float = 1.0,
    price_per_hour_usd: float | None = None,
    batch_size: int = 48,
) -> GpuOption:
    """The autoscaler's view of one replica of ``model`` on ``gpu``.

    ``time_scale`` is the emulated engine's: every modelled duration lasts ``time_scale`` times
    longer (4: four times slower than the real GPU), so throughput divides and cold start
    multiplies by it.
    """
    profile = load_profile(model, gpu, tensor_parallel)
    rate = replica_tokens_per_s(
        model, gpu, tensor_parallel=profile.tensor_parallel, batch_size=batch_size
    )
    return GpuOption(
        gpu=gpu,
        price_per_hour_usd=(
            profile.price_per_hour_usd if price_per_hour_usd is None else price_per_hour_usd
        ),
        tokens_per_s=rate / time_scale,
        cold_start_s=profile.load_time_s * time_scale,
    )
