"""STUB (contract only): model and GPU specs as data; replaced by the real implementation.

    profile = load_profile("llama-3-8b", "h100")         # tp from the data file's default
    profile = load_profile("llama-3-70b", "h200", tensor_parallel=4)
    profile.model.max_model_len, profile.model.kv_bytes_per_token, profile.gpu.name, ...
    available_models(), available_gpus()
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    weight_bytes: float
    max_model_len: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    peak_flops: float
    hbm_bandwidth_bytes_s: float
    hbm_bytes: float
    price_per_hour_usd: float


@dataclass(frozen=True, slots=True)
class EngineProfile:
    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel: int
    mfu: float
    eta: float
    step_overhead_s: float
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    load_bandwidth_bytes_s: float
    warmup_s: float


def load_profile(model: str, gpu: str, tensor_parallel: int | None = None) -> EngineProfile:
    raise NotImplementedError


def available_models() -> tuple[str, ...]:
    raise NotImplementedError


def available_gpus() -> tuple[str, ...]:
    raise NotImplementedError
