"""Latency priors of emulated endpoints, read off the engine profile they run.

The predictor starts every endpoint from a prior (prefill rate, decode step cost, batch
slots) and calibrates it online. For a real engine the prior comes from the routing
config (per ``model@gpu`` or GPU). For an emulated engine we know better: it runs the
performance model of :mod:`inferplane.engine.perf` at ``time_scale`` x real time, so its
prior is that model's own figures: the prefill rate of a full chunk, the decode step at
batch 1 and its growth per sequence and with a full KV cache, and the output rate at
saturation. A calibrated predictor from the first call means routing and admission get the
demo fleet right before any traffic has taught them.
"""

from __future__ import annotations

from inferplane.config import EndpointConfig
from inferplane.core.routing_config import EndpointPrior
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import EngineProfile, load_profile

#: Context per sequence assumed for the decode figures (a typical chat turn).
_TYPICAL_CONTEXT_TOKENS = 1024
_BATCH_PROBE = 64


def prior_from_profile(profile: EngineProfile, time_scale: float = 1.0) -> EndpointPrior:
    """The predictor prior of an engine running ``profile`` at ``time_scale``."""
    perf = PerfModel(profile)
    chunk = profile.max_num_batched_tokens
    prefill_s = perf.prefill_s(chunk) * time_scale
    one_s = perf.decode_step_s(1, _TYPICAL_CONTEXT_TOKENS) * time_scale
    probe = min(_BATCH_PROBE, profile.max_num_seqs)
    many_s = perf.decode_step_s(probe, _TYPICAL_CONTEXT_TOKENS) * time_scale
    per_seq_s = max(0.0, (many_s - one_s) / max(1, probe - 1))
    full_kv_s = max(0.0, perf.step_time_s(1, profile.kv_capacity_tokens) * time_scale - one_s)
    seqs_that_fit = profile.kv_capacity_tokens // _TYPICAL_CONTEXT_TOKENS
    batch = max(1, min(profile.max_num_seqs, seqs_that_fit))
    saturated_s = perf.decode_step_s(batch, _TYPICAL_CONTEXT_TOKENS) * time_scale
    return EndpointPrior(
        prefill_tokens_per_s=chunk / prefill_s,
        chunk_tokens=chunk,
        decode_base_s=one_s,
        decode_per_seq_s=per_seq_s,
        decode_full_kv_s=full_kv_s,
        throughput_tokens_per_s=batch / saturated_s,
        max_num_seqs=profile.max_num_seqs,
        mean_output_tokens=float(profile.mean_output_tokens),
    )


def prior_for_endpoint(endpoint: EndpointConfig) -> EndpointPrior | None:
    """The prior of an emulated endpoint; None for a real one or an unknown profile."""
    emulated = endpoint.emulated
    if emulated is None:
        return None
    model = emulated.engine_model or endpoint.models[0]
    try:
        profile = load_profile(
            model, endpoint.gpu, endpoint.tensor_parallel, overrides=emulated.overrides
        )
    except (KeyError, ValueError):
        return None
    return prior_from_profile(profile, emulated.time_scale)
