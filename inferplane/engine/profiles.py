"""Model, GPU and engine-knob specs, loaded from the ``profiles.yaml`` data file.

Profiles are data, not code: the shapes of the models, the data-sheet figures of the
GPUs and the calibrated knobs of the performance model live in ``profiles.yaml`` (package
data). This module validates them once into frozen values and derives what follows from
them (per-GPU weight share, KV capacity in tokens and blocks, cold-start time, price).

    profile = load_profile("llama-3-8b", "h100")          # tp from the data file's default
    profile = load_profile("llama-3-70b", "h200", tensor_parallel=4)
    profile = load_profile("llama-3-8b", "a100", overrides={"mfu": 0.45})
    available_models(), available_gpus()
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

_DATA_FILE = "profiles.yaml"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a dense transformer: enough to price its FLOPs and bytes."""

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
        """K and V, every layer, every KV head (bf16: 128 KiB for Llama-3-8B)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's data-sheet figures and what it costs to rent."""

    name: str
    peak_flops: float
    hbm_bandwidth_bytes_s: float
    hbm_bytes: float
    price_per_hour_usd: float
    storage_bandwidth_bytes_s: float = 2.0e9
    interconnect_bandwidth_bytes_s: float = 450.0e9


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """A model served on ``tensor_parallel`` GPUs with the engine's knobs."""

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
    step_overhead_per_seq_s: float = 0.0
    mean_output_tokens: int = 256
    tp_efficiency: float = 1.0
    allreduce_latency_s: float = 0.0

    @property
    def name(self) -> str:
        """``model@gpu`` or ``model@gpuxTP``."""
        tp = f"x{self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return f"{self.model.name}@{self.gpu.name}{tp}"

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Tensor parallelism splits the weights evenly across the GPUs."""
        return self.model.weight_bytes / self.tensor_parallel

    @property
    def kv_capacity_tokens(self) -> int:
        """(util * HBM * tp - weights) / KV bytes per token (REFERENCE §2)."""
        free_bytes = (
            self.gpu_memory_utilization * self.gpu.hbm_bytes * self.tensor_parallel
            - self.model.weight_bytes
        )
        return max(0, int(free_bytes // self.model.kv_bytes_per_token))

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def load_time_s(self) -> float:
        """Cold start: each GPU reads its weight share in parallel, then warms up."""
        return self.weight_bytes_per_gpu / self.load_bandwidth_bytes_s + self.warmup_s

    @property
    def price_per_hour_usd(self) -> float:
        return self.gpu.price_per_hour_usd * self.tensor_parallel


#: The profile knobs a deployment may override (vLLM flags and fitted constants), by type.
_KNOB_TYPES: dict[str, type] = {
    "mfu": float,
    "eta": float,
    "step_overhead_s": float,
    "step_overhead_per_seq_s": float,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "block_size": int,
    "gpu_memory_utilization": float,
    "load_bandwidth_bytes_s": float,
    "warmup_s": float,
    "mean_output_tokens": int,
    "tp_efficiency": float,
    "allreduce_latency_s": float,
}

#: Names of the overridable knobs, for config validation.
KNOB_NAMES: frozenset[str] = frozenset(_KNOB_TYPES)


@functools.cache
def _data() -> dict[str, Any]:
    text = resources.files("inferplane.engine").joinpath(_DATA_FILE).read_text("utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not {"defaults", "models", "gpus"} <= data.keys():
        raise ValueError(f"{_DATA_FILE}: needs 'defaults', 'models' and 'gpus' sections")
    return data


def _typed(value: object, kind: type, where: str) -> Any:
    try:
        converted = kind(float(value)) if kind is int else kind(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{_DATA_FILE}: {where}: expected a number, got {value!r}") from None
    if kind is int and float(value) != converted:  # type: ignore[arg-type]
        raise ValueError(f"{_DATA_FILE}: {where}: expected an integer, got {value!r}")
    return converted


def _build(cls: type, name: str, raw: Mapping[str, object], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    unknown = set(raw) - set(fields) - {"tensor_parallel", "knobs"}
    if unknown:
        raise ValueError(f"{_DATA_FILE}: {where}: unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {}
    for key, field in fields.items():
        if key in raw:
            kind = int if field.type in ("int", int) else float
            values[key] = _typed(raw[key], kind, f"{where}.{key}")
    try:
        return cls(name=name, **values)
    except TypeError as exc:
        raise ValueError(f"{_DATA_FILE}: {where}: {exc}") from None


def available_models() -> tuple[str, ...]:
    return tuple(sorted(_data()["models"]))


def available_gpus() -> tuple[str, ...]:
    return tuple(sorted(_data()["gpus"]))


def model_spec(model: str) -> ModelSpec:
    raw = _data()["models"].get(model)
    if raw is None:
        raise ValueError(f"unknown model {model!r}; available: {', '.join(available_models())}")
    spec: ModelSpec = _build(ModelSpec, model, raw, f"models.{model}")
    return spec


def gpu_spec(gpu: str) -> GpuSpec:
    raw = _data()["gpus"].get(gpu)
    if raw is None:
        raise ValueError(f"unknown gpu {gpu!r}; available: {', '.join(available_gpus())}")
    spec: GpuSpec = _build(GpuSpec, gpu, raw, f"gpus.{gpu}")
    return spec


def _knobs(model: str, gpu: str, overrides: Mapping[str, object]) -> dict[str, Any]:
    data = _data()
    layers: list[tuple[str, Mapping[str, object]]] = [
        ("defaults", data["defaults"]),
        (f"models.{model}.knobs", data["models"][model].get("knobs") or {}),
        (f"gpus.{gpu}.knobs", data["gpus"][gpu].get("knobs") or {}),
        (f"overrides.{model}@{gpu}", (data.get("overrides") or {}).get(f"{model}@{gpu}") or {}),
        ("overrides", overrides),
    ]
    knobs: dict[str, Any] = {}
    for where, layer in layers:
        for key, value in layer.items():
            if key not in _KNOB_TYPES:
                raise ValueError(f"{where}: unknown engine knob {key!r}")
            knobs[key] = _typed(value, _KNOB_TYPES[key], f"{where}.{key}")
    return knobs


def load_profile(
    model: str,
    gpu: str,
    tensor_parallel: int | None = None,
    *,
    overrides: Mapping[str, object] | None = None,
) -> EngineProfile:
    """The profile of ``model`` on ``gpu``; ValueError names what is unknown or does not fit."""
    model_ = model_spec(model)
    gpu_ = gpu_spec(gpu)
    if tensor_parallel is None:
        tp_table = _data()["models"][model].get("tensor_parallel") or {}
        tensor_parallel = int(tp_table.get(gpu, 1))
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    knobs = _knobs(model, gpu, overrides or {})
    knobs.setdefault("load_bandwidth_bytes_s", gpu_.storage_bandwidth_bytes_s)
    if tensor_parallel == 1:
        knobs["tp_efficiency"] = 1.0
    profile = EngineProfile(model=model_, gpu=gpu_, tensor_parallel=tensor_parallel, **knobs)
    _check_fits(profile)
    return profile


def _check_fits(profile: EngineProfile) -> None:
    usable = profile.gpu_memory_utilization * profile.gpu.hbm_bytes
    if profile.weight_bytes_per_gpu >= usable:
        raise ValueError(
            f"{profile.name}: {profile.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU "
            f"do not fit in {usable / 1e9:.1f} GB; raise tensor_parallel"
        )
    blocks_needed = math.ceil(profile.model.max_model_len / profile.block_size)
    if profile.num_gpu_blocks < blocks_needed:
        raise ValueError(
            f"{profile.name}: KV cache holds {profile.kv_capacity_tokens} tokens, less than "
            f"max_model_len {profile.model.max_model_len}; raise tensor_parallel"
        )
