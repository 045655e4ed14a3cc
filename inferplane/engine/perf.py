"""The performance model: how long one engine step takes, from first principles.

A step of a vLLM-like engine runs a batch of decodes (one token each, reading their whole
KV context) and prefill chunks (many tokens, attending to themselves and to the context
already cached) through the model once. Its time is a roofline (REFERENCE §2):

* compute: ``2 * P`` FLOPs per token through the weights, plus attention ``4 * L * d``
  FLOPs per (query, key) pair, at ``mfu * peak`` (times TP and its efficiency);
* memory: the weights once, plus every KV byte read (decode contexts, prefill prior
  context) or written (the new tokens), at ``eta * HBM bandwidth``;
* the step takes the larger of the two (compute and memory traffic overlap on a GPU;
  Sarathi-style chunked prefill relies on decodes riding free on a compute-bound step),
  plus the engine's CPU overhead (fixed + per running sequence) and, with tensor
  parallelism, two all-reduces per layer (latency + ring traffic over the interconnect).

``PerfModel.roofline(profile)`` is the physical lower bound of the same formula (MFU = 1,
eta = 1, perfect TP, no overhead): the model is never allowed to beat it.
Pure arithmetic: no clock, no state beyond constants precomputed from the profile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from inferplane.engine.profiles import EngineProfile

#: From this many steps on, ``decode_stretch_end`` prices the steps as numpy arrays.
_ARRAY_MIN_STEPS = 64


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """``num_new_tokens`` prompt tokens computed on top of ``num_context_tokens`` cached."""

    num_new_tokens: int
    num_context_tokens: int = 0


class PerfModel:
    """Step time in seconds of the modelled GPU(s) (before any time scale)."""

    __slots__ = (
        "_allreduce_bytes_per_token_s",
        "_allreduce_fixed_s",
        "_attn_flops_per_pair",
        "_flops_per_token",
        "_flops_s",
        "_kv_bytes_per_token",
        "_mem_bytes_s",
        "_overhead_per_seq_s",
        "_overhead_s",
        "_weight_bytes",
        "profile",
    )

    def __init__(self, profile: EngineProfile, *, ideal: bool = False) -> None:
        self.profile = profile
        model, gpu, tp = profile.model, profile.gpu, profile.tensor_parallel
        tp_eff = 1.0 if ideal or tp == 1 else profile.tp_efficiency
        mfu = 1.0 if ideal else profile.mfu
        eta = 1.0 if ideal else profile.eta
        self._flops_s = mfu * gpu.peak_flops * tp * tp_eff
        self._mem_bytes_s = eta * gpu.hbm_bandwidth_bytes_s * tp * tp_eff
        self._flops_per_token = 2.0 * model.num_params
        self._attn_flops_per_pair = 4.0 * model.num_layers * model.hidden_size
        self._weight_bytes = float(model.weight_bytes)
        self._kv_bytes_per_token = float(model.kv_bytes_per_token)
        self._overhead_s = 0.0 if ideal else profile.step_overhead_s
        self._overhead_per_seq_s = 0.0 if ideal else profile.step_overhead_per_seq_s
        if ideal or tp == 1:
            self._allreduce_fixed_s = 0.0
            self._allreduce_bytes_per_token_s = 0.0
        else:
            num_allreduces = 2 * model.num_layers
            ring_bytes_per_token = 2.0 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
            self._allreduce_fixed_s = num_allreduces * profile.allreduce_latency_s
            self._allreduce_bytes_per_token_s = (
                num_allreduces * ring_bytes_per_token / gpu.interconnect_bandwidth_bytes_s
            )

    @classmethod
    def roofline(cls, profile: EngineProfile) -> PerfModel:
        """The physical lower bound: MFU = 1, eta = 1, perfect TP, no overhead."""
        return cls(profile, ideal=True)

    def step_time_s(
        self,
        num_decode_seqs: int,
        num_decode_context_tokens: int,
        num_prefill_seqs: int = 0,
        num_prefill_tokens: int = 0,
        num_prefill_context_tokens: int = 0,
        prefill_attention_pairs: float = 0.0,
    ) -> float:
        """One step: decodes (total context S) plus prefill chunks, as aggregates.

        ``num_prefill_context_tokens`` is the cached context the chunks attend to (read from
        KV); ``prefill_attention_pairs`` the (query, key) pairs of their attention, see
        ``prefill_pairs``. Aggregates keep the engine's per-step cost O(batch).
        """
        num_tokens = num_decode_seqs + num_prefill_tokens
        if num_tokens == 0:
            return 0.0
        pairs = num_decode_context_tokens + prefill_attention_pairs
        flops = self._flops_per_token * num_tokens + self._attn_flops_per_pair * pairs
        kv_tokens = num_decode_context_tokens + num_prefill_context_tokens + num_prefill_tokens
        mem_bytes = self._weight_bytes + self._kv_bytes_per_token * kv_tokens
        busy_s = max(flops / self._flops_s, mem_bytes / self._mem_bytes_s)
        num_seqs = num_decode_seqs + num_prefill_seqs
        return (
            busy_s
            + self._overhead_s
            + self._overhead_per_seq_s * num_seqs
            + self._allreduce_fixed_s
            + self._allreduce_bytes_per_token_s * num_tokens
        )

    def decode_step_s(self, batch_size: int, context_tokens_per_seq: int) -> float:
        """A pure decode step of ``batch_size`` sequences of equal context."""
        return self.step_time_s(batch_size, batch_size * context_tokens_per_seq)

    def prefill_s(self, num_tokens: int, num_context_tokens: int = 0) -> float:
        """One prefill of ``num_tokens`` in a single step (no chunking)."""
        return self.mixed_step_s(0, 0, (PrefillChunk(num_tokens, num_context_tokens),))

    def mixed_step_s(
        self,
        num_decode_seqs: int,
        num_decode_context_tokens: int,
        chunks: Iterable[PrefillChunk],
    ) -> float:
        """A chunked-prefill step: decodes plus explicit prefill chunks."""
        num_chunks = new = ctx = 0
        pairs = 0.0
        for chunk in chunks:
            num_chunks += 1
            new += chunk.num_new_tokens
            ctx += chunk.num_context_tokens
            pairs += prefill_pairs(chunk.num_new_tokens, chunk.num_context_tokens)
        return self.step_time_s(
            num_decode_seqs, num_decode_context_tokens, num_chunks, new, ctx, pairs
        )

    def decode_step_ends(
        self,
        start_s: float,
        num_seqs: int,
        context_tokens: int,
        max_steps: int,
        scale: tuple[float, float],
        stop_s: float = float("inf"),
    ) -> list[float]:
        """End times of back-to-back pure-decode steps of an unchanged batch, each ``<= stop_s``.

        Step ``j`` starts at the previous end (the first at ``start_s``), decodes ``num_seqs``
        sequences over ``context_tokens + j * num_seqs`` tokens of context and lasts
        ``step_time_s(...) * scale[0] * scale[1]``. The arithmetic is ``step_time_s``'s, in the
        same order, inlined: the results are bit-identical to stepping one call at a time (a
        test holds it to that), without a call and its zero arguments per step.
        """
        flops_tokens = self._flops_per_token * num_seqs
        per_seq = self._overhead_per_seq_s * num_seqs
        per_token = self._allreduce_bytes_per_token_s * num_seqs
        attn, kv_bytes, weights = (
            self._attn_flops_per_pair,
            self._kv_bytes_per_token,
            self._weight_bytes,
        )
        flops_s, mem_s = self._flops_s, self._mem_bytes_s
        overhead, allreduce = self._overhead_s, self._allreduce_fixed_s
        time_scale, slowdown = scale
        ends: list[float] = []
        t, context = start_s, context_tokens
        for _ in range(max_steps):
            compute_s = (flops_tokens + attn * (context + 0.0)) / flops_s
            memory_s = (weights + kv_bytes * context) / mem_s
            busy_s = compute_s if compute_s > memory_s else memory_s
            step_s = busy_s + overhead + per_seq + allreduce + per_token
            t = t + step_s * time_scale * slowdown
            if t > stop_s:
                break
            ends.append(t)
            context += num_seqs
        return ends

    def decode_stretch_end(
        self,
        start_s: float,
        num_seqs: int,
        context_tokens: int,
        num_steps: int,
        scale: tuple[float, float],
    ) -> float:
        """``decode_step_ends(...)[-1]`` for ``num_steps >= 1``, bit-identical (tested).

        For a long stretch the step times are numpy arrays, the same operations in the same
        order per step (IEEE float64 either way), summed by ``np.add.accumulate``, which
        adds in sequence as the loop does: one wake-up's leap to the first finish of a
        batch (~130 steps at 1,000 engines) costs ~10 us instead of ~22 (at 30 steps the
        loop is faster: 5 us against 9).
        """
        if num_steps < _ARRAY_MIN_STEPS:
            ends = self.decode_step_ends(start_s, num_seqs, context_tokens, num_steps, scale)
            return ends[-1]
        context = context_tokens + num_seqs * np.arange(num_steps, dtype=np.float64)
        compute_s = (self._flops_per_token * num_seqs + self._attn_flops_per_pair * context) / (
            self._flops_s
        )
        memory_s = (self._weight_bytes + self._kv_bytes_per_token * context) / self._mem_bytes_s
        busy_s = np.where(compute_s > memory_s, compute_s, memory_s)
        step_s = (
            busy_s
            + self._overhead_s
            + self._overhead_per_seq_s * num_seqs
            + self._allreduce_fixed_s
            + self._allreduce_bytes_per_token_s * num_seqs
        )
        increments = np.empty(num_steps + 1, dtype=np.float64)
        increments[0] = start_s
        increments[1:] = step_s * scale[0] * scale[1]
        return float(np.add.accumulate(increments)[-1])


def prefill_pairs(num_new_tokens: int, num_context_tokens: int) -> float:
    """Causal attention (query, key) pairs of a chunk: each new token sees the cached
    context and the new tokens up to itself. ``4*L*d`` FLOPs per pair gives REFERENCE's
    ``2*L*n^2*d`` for a fresh prompt."""
    n = num_new_tokens
    return n * num_context_tokens + n * (n + 1) / 2.0
